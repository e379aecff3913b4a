#include "mc/sched/scheduler.hpp"

#include "mc/model/pipeline.hpp"
#include "mc/proto/kv_events.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

namespace mc::sched {

namespace {

constexpr int64_t kSendEntryLingerNs = 600'000'000'000;
constexpr double kMaxServiceWeight = 1'000;  // PlacementContext::service_weight's bound
// Load shedding judges the load ratio only once the mean service has this many jobs behind it: one job's service
// is no mean (a Conductor restarted under reported load would shed everything above it).
constexpr int64_t kShedMinSamples = 64;

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::create(SchedulerConfig config, const Clock* clock,
                                                     PrefillCostPrior prefill_prior, DecodeCostPrior decode_prior,
                                                     BandwidthPriors bandwidth_priors) {
  if (clock == nullptr) return error(Code::kInvalidArgument, "scheduler: no clock given");
  if (config.kv.block_size_tokens <= 0) {
    return error(Code::kInvalidArgument,
                 "scheduler: block_size_tokens must be > 0 (got " + std::to_string(config.kv.block_size_tokens) + ")");
  }
  if (config.kv.kv_bytes_per_token <= 0) {
    return error(Code::kInvalidArgument, "scheduler: kv_bytes_per_token must be > 0 (got " +
                                             std::to_string(config.kv.kv_bytes_per_token) + ")");
  }
  if (!(config.slo.ttft_ms > 0) || !(config.slo.tbt_ms > 0)) {
    return error(Code::kInvalidArgument, "scheduler: SLOs must be > 0 ms");
  }
  MC_ASSIGN_OR_RETURN(auto policy, make_policy(config.policy, config.seed));
  QueueDiscipline discipline = default_queue_discipline(config.policy);
  if (!config.queue.discipline.empty()) {
    MC_ASSIGN_OR_RETURN(discipline, parse_queue_discipline(config.queue.discipline));
  }
  if (!(config.queue.aging_weight >= 0) || !(config.queue.aging_weight <= 1e6) || !(config.queue.guard_ms >= 0) ||
      !(config.queue.guard_ms <= 86'400'000) || config.queue.overtake_history < 1 ||
      !(config.placement_load_weight >= 0) || !(config.placement_load_weight <= 1000) || !(config.slo_headroom >= 0) ||
      !(config.slo_headroom <= 0.9) || config.queue.overtake_history > 1'000'000 || !(config.shed_limit >= 0) ||
      !(config.shed_limit <= 1000) || !(config.balancing_threshold >= 1) || !(config.balancing_threshold <= 1000) ||
      config.queue.preempt_chunk_tokens < 0 || config.queue.preempt_chunk_tokens > (int64_t{1} << 24)) {
    return error(Code::kInvalidArgument,
                 "scheduler: queue aging weight must be in [0, 1e6], guard in [0, 24 h] ms, overtake history in [1, "
                 "1e6], preemption chunk in [0, 2^24] tokens, placement load weight in [0, 1000], SLO headroom in "
                 "[0, 0.9], shed limit in [0, 1000], balancing threshold in [1, 1000]");
  }
  if (config.queue.preempt_chunk_tokens > 0 && config.pipeline.group_size > 1) {
    return error(Code::kInvalidArgument,
                 "scheduler: preemption (preempt_chunk_tokens " + std::to_string(config.queue.preempt_chunk_tokens) +
                     ") and pipelined groups (group size " + std::to_string(config.pipeline.group_size) +
                     ") together are not modelled: a held stage never yields; turn one off");
  }
  if (config.pending_prefix != "" && config.pending_prefix != "on" && config.pending_prefix != "off") {
    return error(Code::kInvalidArgument,
                 "scheduler: pending prefix must be on or off (or empty: the policy's "
                 "default), not '" +
                     config.pending_prefix + "'");
  }
  const bool pending = config.pending_prefix.empty() ? config.policy == "kvcache" : config.pending_prefix == "on";
  auto s = std::unique_ptr<Scheduler>(
      new Scheduler(std::move(config), clock, std::move(policy), prefill_prior, decode_prior, bandwidth_priors));
  s->discipline_ = discipline;
  s->pending_prefix_ = pending;
  return s;
}

Scheduler::Scheduler(SchedulerConfig config, const Clock* clock, std::unique_ptr<Policy> policy,
                     PrefillCostPrior prefill_prior, DecodeCostPrior decode_prior, BandwidthPriors bandwidth_priors)
    : config_(std::move(config)),
      clock_(clock),
      policy_(std::move(policy)),
      prefill_(prefill_prior),
      decode_(decode_prior, 0.995, config_.decode_envelope_factor),
      bandwidth_(bandwidth_priors) {
  cluster_.set_kv_block_tokens(config_.kv.block_size_tokens);
  cluster_.set_prefill_preemption(config_.queue.preempt_chunk_tokens > 0);
}

Status Scheduler::register_instance(const InstanceInfo& info) {
  MC_RETURN_IF_ERROR(cluster_.register_instance(info, clock_->now_ns()));
  const Instance* inst = cluster_.find(info.id);
  index_.set_backend_host(inst->info.backend_id, inst->host_index);
  return Status::ok();
}

Status Scheduler::heartbeat(const std::string& id, const LoadReport& load) {
  return cluster_.heartbeat(id, load, clock_->now_ns());
}

void Scheduler::drop_instance_blocks(const Instance& inst) { index_.remove_backend(inst.info.backend_id); }

std::vector<std::string> Scheduler::expire() {
  const int64_t now = clock_->now_ns();
  const int64_t timeout_ns = config_.heartbeat_timeout_ms * 1'000'000;
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    for (const Instance* inst : cluster_.instances(role)) {
      if (now - inst->last_seen_ns > timeout_ns) drop_instance_blocks(*inst);
    }
  }
  std::vector<std::string> dead = cluster_.expire(now, config_.heartbeat_timeout_ms);
  counters_.expired_instances += dead.size();
  return dead;
}

Status Scheduler::drain_instance(const std::string& id) { return cluster_.set_draining(id, clock_->now_ns()); }

Status Scheduler::remove_instance(const std::string& id) {
  const Instance* inst = cluster_.find(id);
  if (inst != nullptr) drop_instance_blocks(*inst);
  return cluster_.remove_instance(id);
}

void Scheduler::set_backend_host(const std::string& backend_id, const std::string& host) {
  index_.set_backend_host(backend_id, cluster_.host_index(host));
}

Status Scheduler::apply_event(const proto::KvEvent& event, const std::string& stream) {
  return index_.apply(event, stream);
}

double Scheduler::queue_ms(const Instance& inst) const {
  return cluster_.prefill_queue_ms(inst, clock_->now_ns(), prefill_.ms_per_token());
}

DecodeEstimate Scheduler::predict_decode(const Request& request, const Instance& inst, int64_t start_ns,
                                         double slo_tbt_ms) const {
  DecodeEstimate d;
  d.instance_id = inst.info.id;
  d.kv_capacity_tokens = inst.info.kv_capacity_tokens;
  int64_t batch = inst.reported_excess.running_requests;
  int64_t kv = inst.reported_excess.kv_reserved_tokens;
  int64_t ctx = inst.reported_excess.context_tokens;
  // KV: the decode instance reserves this request's KV now, at dispatch, so every request in the ledger
  // counts at its full reservation (input + output: future growth, in whole blocks), even one predicted
  // to finish before this prefill ends: the instance checks exactly that and refuses otherwise. A ledger
  // entry leaves when the request's done report arrives, or at the first heartbeat after its predicted
  // end (the report then carries what still runs, in reported_excess).
  // TBT: only requests not predicted to have finished by the time this one joins the batch are in it,
  // each with its context at that time.
  for (const DecodeJob& j : inst.decode_jobs) {
    kv += cluster_.kv_reservation_tokens(j.input_tokens + j.output_tokens);
    if (j.predicted_end_ns <= start_ns) continue;
    ++batch;
    double progress = 0;
    if (start_ns > j.start_ns && j.predicted_end_ns > j.start_ns) {
      progress = static_cast<double>(start_ns - j.start_ns) / static_cast<double>(j.predicted_end_ns - j.start_ns);
    }
    ctx += j.input_tokens + static_cast<int64_t>(progress * static_cast<double>(j.output_tokens));
  }
  d.batch_requests = batch + 1;
  d.kv_reserved_tokens = kv + cluster_.kv_reservation_tokens(request.input_tokens + request.output_tokens);
  // The step time this request sees at its longest context (its own growth counted).
  d.tbt_ms = decode_.step_ms(d.batch_requests, ctx + request.input_tokens + request.output_tokens);
  d.fits_kv = d.kv_reserved_tokens <= d.kv_capacity_tokens;
  d.meets_tbt = d.tbt_ms <= slo_tbt_ms;
  return d;
}

Decision Scheduler::decide(const Request& request) {
  const int64_t now = clock_->now_ns();
  Decision d;
  d.request_id = request.request_id;
  d.policy = std::string(policy_->name());
  d.decided_at_ns = now;
  ++counters_.decisions;
  estimates_.clear();
  if (std::optional<std::string> why = request_problem(request)) {
    return reject(d, RejectReason::kInvalidRequest, std::move(*why));
  }
  const double slo_ttft = request.slo_ttft_ms > 0 ? request.slo_ttft_ms : config_.slo.ttft_ms;
  const double slo_tbt = request.slo_tbt_ms > 0 ? request.slo_tbt_ms : config_.slo.tbt_ms;
  d.slo_ttft_ms = slo_ttft;
  // The target this decision schedules to (SLO headroom, DESIGN.md §10): placement, the overtaking bound and the
  // queue deadline use it; the admission rule below also lets a long prefill that waits little reach the SLO itself.
  ttft_target_ms_ = slo_ttft * (1.0 - slo_headroom());
  d.ttft_target_ms = ttft_target_ms_;
  d.early_reject = config_.slo.early_reject;
  d.shed_limit = shed_limit();
  d.shed_slo_ms = config_.slo.ttft_ms;
  d.queue = std::string(queue_discipline_name(discipline_));

  // ---- 1. index lookup, once (send backlog entries stay until their prefill reports, for on_fetch_progress; one
  // whose request was never closed goes 10 minutes after its predicted end) ----
  const int64_t max_reuse = look_up_prefix(request);
  max_reuse_ = max_reuse;
  look_up_pending(request, now);
  for (auto it = send_backlog_.begin(); it != send_backlog_.end();) {
    std::erase_if(it->second, [now](const SendEntry& e) { return e.end_ns + kSendEntryLingerNs <= now; });
    it = it->second.empty() ? send_backlog_.erase(it) : std::next(it);
  }
  d.pool_prefix_tokens = static_cast<int64_t>(lookup_.size()) * config_.kv.block_size_tokens;

  // ---- 2. price every live prefill instance ----
  price_prefill_instances(request, now, max_reuse);
  if (estimates_.empty()) {
    return reject(d, RejectReason::kNoPrefillInstance, "no live prefill instance is registered (or every one drains)");
  }

  // ---- 3. the policy's choice; 3b. a pipelined group when it is faster ----
  choose_prefill(request, d);
  consider_pipeline(request, d);

  // ---- 6. hot prefix: the longest same-host prefix sits on an overloaded instance ----
  const PrefillEstimate* holder = mark_hot_prefix(d);
  const std::string prefill_why = explain_prefill(d, holder);

  // ---- 5a. early rejection on TTFT ----
  const double wait_ms = d.prefill.queue_ms;  // the work ahead and the overtaking (choose_prefill added it)
  if (config_.slo.early_reject && !ttft_admissible(d.prefill.ttft_ms, wait_ms, slo_ttft, ttft_target_ms_)) {
    std::string why =
        d.prefill.ttft_ms > slo_ttft
            ? fmt("predicted TTFT %.1f ms exceeds the SLO %.1f ms (best: ", d.prefill.ttft_ms, slo_ttft)
            : fmt("predicted TTFT %.1f ms exceeds the target %.1f ms (SLO %.1f ms less %.0f %% headroom) after a "
                  "wait of %.1f ms, more than the headroom (best: ",
                  d.prefill.ttft_ms, ttft_target_ms_, slo_ttft, 100 * slo_headroom(), wait_ms);
    return reject(d, RejectReason::kTtftSlo, why + prefill_why + ")");
  }
  // Load shedding (kvcache, DESIGN.md §10): the waiting this prefill adds to the requests queued after it, priced
  // with its service on one instance (a pipelined group holds several: never less than that), against the others'
  // budget, the Conductor's TTFT SLO (a request's own SLO, however long it asks, exempts it from nothing); a
  // re-dispatch was admitted already.
  const double service_ms = single_service_ms_;
  const double others_slo_ms = d.shed_slo_ms;
  if (config_.slo.early_reject && shed_limit() > 0 && !request.redispatch && service_samples_ >= kShedMinSamples &&
      d.load_ratio * service_ms > shed_limit() * others_slo_ms) {
    return reject(d, RejectReason::kLoadShed,
                  fmt("shed under load: its prefill (%.1f ms of service) would add about %.1f s of waiting to the "
                      "requests queued after it (x %.2f, the mean queue over the mean service), more than %g x the "
                      "Conductor's TTFT SLO %.1f ms; retry later, or send a shorter prompt (best: ",
                      service_ms, d.load_ratio * service_ms / 1e3, d.load_ratio, shed_limit(), others_slo_ms) +
                      prefill_why + ")");
  }

  // ---- 4. decode choice at the time the prefill finishes ----
  const int64_t start_ns = now + static_cast<int64_t>(d.prefill.ttft_ms * 1e6);
  predict_decode_instances(request, now, start_ns, slo_tbt);

  // ---- 5b. early rejection on TBT and KV capacity ----
  DecodePick pick = pick_decode(request, slo_tbt);
  if (pick.estimate == nullptr) return reject(d, pick.reject_reason, std::move(pick.why));
  return accept(d, *pick.estimate, prefill_why);
}

Decision Scheduler::reject(Decision& d, RejectReason reason, std::string why) {
  d.accepted = false;
  d.reject_reason = reason;
  d.reason = std::move(why);
  ++counters_.rejected[static_cast<size_t>(reason)];
  return std::move(d);
}

std::optional<std::string> Scheduler::request_problem(const Request& request) const {
  const int64_t B = config_.kv.block_size_tokens;
  if (request.input_tokens >= 1 && request.output_tokens >= 0 &&
      static_cast<int64_t>(request.block_hashes.size()) * B <= request.input_tokens) {
    return std::nullopt;
  }
  return fmt(
      "invalid request '%s': input_tokens %lld, output_tokens %lld, %zu complete-block hashes at "
      "block size %lld (need input_tokens >= 1 and hashes * block size <= input_tokens)",
      request.request_id.c_str(), static_cast<long long>(request.input_tokens),
      static_cast<long long>(request.output_tokens), request.block_hashes.size(), static_cast<long long>(B));
}

int64_t Scheduler::look_up_prefix(const Request& request) {
  const int64_t B = config_.kv.block_size_tokens;
  index_.lookup(request.block_hashes, lookup_);
  const auto pool_len = static_cast<int64_t>(lookup_.size());
  // At least one token is always prefilled: it produces the first output token.
  const int64_t max_reuse = std::min(pool_len, (request.input_tokens - 1) / B);

  // Per block: the best class for a host that holds none of it in memory ("elsewhere"), and the
  // hosts holding it in memory (for which it is same-host).
  block_class_scratch_.assign(static_cast<size_t>(max_reuse), PathClass::kRecompute);
  hosts_scratch_.clear();
  for (int64_t i = 0; i < max_reuse; ++i) {
    PathClass best = PathClass::kRecompute;
    for (const Holder& h : lookup_[static_cast<size_t>(i)]) {
      if (h.medium == Medium::kDisk) {
        if (best == PathClass::kRecompute) best = PathClass::kSsd;
      } else {
        best = PathClass::kRemote;
        uint32_t host = index_.backend_host(h.backend);
        if (host != kUnknownHost &&
            std::find(hosts_scratch_.begin(), hosts_scratch_.end(), host) == hosts_scratch_.end()) {
          hosts_scratch_.push_back(host);
        }
      }
    }
    block_class_scratch_[static_cast<size_t>(i)] = best;
  }
  return max_reuse;
}

void Scheduler::look_up_pending(const Request& request, int64_t now) {
  pending_instance_.clear();
  pending_run_ = 0;
  pending_keys_.clear();
  if (!pending_prefix_ || pending_.empty()) return;
  const int64_t B = config_.kv.block_size_tokens;
  const auto pool_len = static_cast<int64_t>(lookup_.size());
  // Only right after the pool's prefix (a shorter cap leaves nothing to extend), and only one instance's blocks: the
  // chained hashes make block j pending only where its whole prefix was asked for.
  if (max_reuse_ < pool_len) return;
  const int64_t limit = std::min(static_cast<int64_t>(request.block_hashes.size()), (request.input_tokens - 1) / B);
  for (int64_t j = pool_len; j < limit; ++j) {
    auto it = pending_.find(request.block_hashes[static_cast<size_t>(j)]);
    if (it == pending_.end()) break;
    const PendingBlock& b = it->second;
    if (!is_in_flight(*b.request_id)) {  // its request ended without a report (cancelled, expired): never computed
      pending_.erase(it);
      break;
    }
    if (pending_run_ == 0) {
      const Instance* inst = cluster_.find(*b.instance_id);
      if (inst == nullptr || !placeable(*inst, now, config_.heartbeat_timeout_ms)) return;
      pending_instance_ = *b.instance_id;
    } else if (*b.instance_id != pending_instance_) {
      break;
    }
    pending_keys_.push_back(std::max(pending_keys_.empty() ? INT64_MIN : pending_keys_.back(), b.queue_key_ns));
    ++pending_run_;
  }
}

void Scheduler::book_pending(const Request& request, const Decision& d, InFlight& f) {
  if (!pending_prefix_ || !d.stages.empty()) return;  // a pipeline's blocks come from every stage: not booked
  const auto n = static_cast<int64_t>(request.block_hashes.size());
  const int64_t first = std::max<int64_t>(0, d.prefill.reused_blocks);
  if (first >= n) return;
  const PendingBlock b{std::make_shared<const std::string>(d.prefill_id),
                       std::make_shared<const std::string>(request.request_id), d.prefill.queue_key_ns};
  for (int64_t j = first; j < n; ++j) {
    const uint64_t h = request.block_hashes[static_cast<size_t>(j)];
    if (pending_.try_emplace(h, b).second) f.pending_hashes.push_back(h);
  }
}

void Scheduler::forget_pending(const std::string& request_id, std::vector<uint64_t>& hashes) {
  for (uint64_t h : hashes) {
    auto it = pending_.find(h);
    if (it != pending_.end() && *it->second.request_id == request_id) pending_.erase(it);
  }
  hashes.clear();
}

Scheduler::HostPlan Scheduler::plan_for_host(const Request& request, uint32_t host, int64_t max_reuse,
                                             int64_t now) const {
  const int64_t B = config_.kv.block_size_tokens;
  const int64_t block_bytes = config_.kv.block_bytes();
  const auto remote = static_cast<size_t>(PathClass::kRemote);
  HostPlan p;
  int64_t bytes[kNumTransferClasses] = {0, 0, 0};
  int64_t count[4] = {0, 0, 0, 0};
  bool same_host_run = true;
  // Remote bytes by source host, each with its path bandwidth and send backlog (fixed once per plan).
  std::vector<PlanSource>& sources = sources_scratch_;
  sources.clear();
  const bool by_path = priced_by_path();
  p.prefill_ms = prefill_.predict_ms(request.input_tokens, 0);
  p.cost_ms = p.prefill_ms;
  for (int64_t k = 1; k <= max_reuse; ++k) {
    PathClass cls = block_class_scratch_[static_cast<size_t>(k - 1)];
    uint32_t src = kUnknownHost;
    if (cls == PathClass::kRemote) {
      double best_bw = -1;
      for (const Holder& h : lookup_[static_cast<size_t>(k - 1)]) {
        if (h.medium == Medium::kDisk) continue;
        const uint32_t hh = index_.backend_host(h.backend);
        if (host != kUnknownHost && hh == host) {
          cls = PathClass::kSameHost;
          break;
        }
        // Each holder host's path once per plan (PlanSource keeps it, bytes 0 until a block is read from there).
        auto known = std::find_if(sources.begin(), sources.end(), [hh](const PlanSource& x) { return x.host == hh; });
        if (known == sources.end()) {
          sources.push_back(PlanSource{hh, 0, bandwidth_.path_bytes_per_s(hh, host, now),
                                       hh == kUnknownHost || !by_path ? 0 : send_backlog_bytes(hh, now)});
          known = sources.end() - 1;
        }
        const double bw = known->bytes_per_s;
        if (bw > best_bw) {
          best_bw = bw;
          src = hh;
        }
      }
    }
    if (cls != PathClass::kSameHost) same_host_run = false;
    if (same_host_run) p.longest_same_host_blocks = k;
    bytes[static_cast<size_t>(cls)] += block_bytes;
    ++count[static_cast<size_t>(cls)];
    double transfer = 0;
    for (int c = 0; c < kNumTransferClasses; ++c) {
      if (by_path && c == static_cast<int>(remote)) continue;
      transfer += bandwidth_.transfer_ms(static_cast<PathClass>(c), bytes[c]);
    }
    if (cls == PathClass::kRemote) {  // the sources are booked on commit even when not priced by path
      auto it = std::find_if(sources.begin(), sources.end(), [src](const PlanSource& x) { return x.host == src; });
      if (it != sources.end()) it->bytes += block_bytes;
    }
    if (by_path && bytes[remote] > 0) {
      // fixed once, then each source's backlog and bytes at its path's bandwidth, one after the other.
      double ms = bandwidth_.fixed_ms(PathClass::kRemote);
      for (const PlanSource& x : sources) {
        if (x.bytes > 0) ms += static_cast<double>(x.backlog + x.bytes) / x.bytes_per_s * 1e3;
      }
      transfer += ms;
    }
    // The balancing threshold: a remote read only for a prefix more than that many times the same-host one.
    if (bytes[remote] > 0 &&
        !(static_cast<double>(k) > config_.balancing_threshold * static_cast<double>(p.longest_same_host_blocks))) {
      continue;
    }
    double prefill = prefill_.predict_ms(request.input_tokens - k * B, k * B);
    if (prefill + transfer < p.cost_ms) {
      p.cost_ms = prefill + transfer;
      p.prefill_ms = prefill;
      p.transfer_ms = transfer;
      p.reused_blocks = k;
      std::copy(count, count + 4, p.blocks_by_class);
      p.transfer_bytes = bytes[0] + bytes[1] + bytes[2];
      p.remote_sources.clear();
      for (const PlanSource& x : sources) {
        if (x.host != kUnknownHost && x.bytes > 0) p.remote_sources.push_back(SourceBytes{x.host, x.bytes});
      }
    }
  }
  return p;
}

void Scheduler::price_queue(const Instance& inst, int64_t now, double service_ms, double slo_ttft_ms,
                            int64_t not_before_key_ns, PrefillEstimate& e) const {
  // Work the instance reported beyond the ledger runs first (ClusterState::prefill_queue_ms bounds it the same way).
  const double extra =
      std::min(ClusterState::kMaxUnledgeredQueueMs, static_cast<double>(inst.reported_excess.queued_prefill_tokens) *
                                                        std::max(0.0, prefill_.ms_per_token()));
  const double chunk_ms = config_.queue.preempt_chunk_tokens > 0
                              ? prefill_.predict_ms(config_.queue.preempt_chunk_tokens, 0)
                              : 0.0;  // preemption: a job ahead of the running head waits for its chunk's end
  const QueuePlacement p = place_job(inst.prefill_queue, inst.head_started_ns, now, service_ms, extra, discipline_,
                                     config_.queue, not_before_key_ns, chunk_ms);
  double overtake = 0;
  if (discipline_ == QueueDiscipline::kSlo) {
    auto it = arrivals_.find(inst.info.id);
    if (it != arrivals_.end()) {
      const std::vector<QueueArrival> recent(it->second.begin(), it->second.end());
      overtake = expected_overtake_ms(recent, now, service_ms, discipline_, config_.queue);
    }
    // The guard keeps later jobs from making this one late: no more than its slack.
    overtake = std::min(overtake, std::max(0.0, slo_ttft_ms - config_.queue.guard_ms - p.ahead_ms - service_ms));
  }
  // The placement compares the work ahead (queue_ms); the chosen instance's prediction adds the overtaking
  // (choose_prefill): an estimate of later arrivals is no reason to prefer one instance over another.
  e.queue_ms = p.ahead_ms;
  e.overtake_ms = overtake;
  e.queue_key_ns = p.key_ns;
  e.queue_position = static_cast<int64_t>(p.position);
  e.kept_behind = static_cast<int64_t>(p.kept_behind);
}

void Scheduler::price_prefill_instances(const Request& request, int64_t now, int64_t max_reuse) {
  const double slo_ttft_ms = ttft_target_ms_;  // decide() set it: the target, the SLO less its headroom
  const auto pool_len = static_cast<int64_t>(lookup_.size());
  estimates_.clear();
  plans_scratch_.clear();
  generic_plan_.reset();
  pending_plan_.reset();
  estimate_plans_.clear();
  plans_scratch_.reserve(cluster_.instances(Role::kPrefill).size());  // estimate_plans_ points into it
  // A host holding none of the prefix and with no measured path into it gets the generic plan (the class
  // estimates, and the send backlogs); the others each get their own.
  for (const Instance* inst : cluster_.instances(Role::kPrefill)) {
    if (!placeable(*inst, now, config_.heartbeat_timeout_ms)) continue;  // draining, or silent (#12)
    const HostPlan* plan = nullptr;
    const bool pending = pending_run_ > 0 && inst->info.id == pending_instance_;
    if (pending) {
      // The pool's prefix as any instance on this host sees it, then the pending blocks from this host's memory.
      block_class_scratch_.resize(static_cast<size_t>(max_reuse + pending_run_), PathClass::kSameHost);
      pending_plan_ = plan_for_host(request, inst->host_index, max_reuse + pending_run_, now);
      block_class_scratch_.resize(static_cast<size_t>(max_reuse));
      plan = &*pending_plan_;
    }
    bool holds = std::find(hosts_scratch_.begin(), hosts_scratch_.end(), inst->host_index) != hosts_scratch_.end();
    if (plan != nullptr) {
      // priced above
    } else if (!holds && !bandwidth_.has_paths_to(inst->host_index)) {
      if (!generic_plan_) generic_plan_ = plan_for_host(request, kUnknownHost, max_reuse, now);
      plan = &*generic_plan_;
    } else {
      for (const auto& [h, p] : plans_scratch_) {
        if (h == inst->host_index) plan = &p;
      }
      if (plan == nullptr) {
        plans_scratch_.emplace_back(inst->host_index, plan_for_host(request, inst->host_index, max_reuse, now));
        plan = &plans_scratch_.back().second;
      }
    }
    PrefillEstimate e;
    e.instance_id = inst->info.id;
    const bool behind = pending && plan->reused_blocks > max_reuse;
    // Strictly after the last job computing a block it reads (equal keys keep arrival order, and this job's message
    // may reach the instance first).
    const int64_t after_key =
        behind ? pending_keys_[static_cast<size_t>(plan->reused_blocks - max_reuse - 1)] + 1 : INT64_MIN;
    price_queue(*inst, now, plan->cost_ms, slo_ttft_ms, after_key, e);
    e.pending_blocks = behind ? plan->reused_blocks - max_reuse : 0;
    e.prefill_ms = plan->prefill_ms;
    e.transfer_ms = plan->transfer_ms;
    e.ttft_ms = e.queue_ms + plan->cost_ms;
    e.reused_blocks = plan->reused_blocks;
    std::copy(plan->blocks_by_class, plan->blocks_by_class + 4, e.blocks_by_class);
    e.longest_same_host_blocks = plan->longest_same_host_blocks;
    e.longest_pool_blocks = pool_len;
    e.transfer_bytes = plan->transfer_bytes;
    e.load_known = inst->load_known;
    estimates_.push_back(std::move(e));
    estimate_plans_.push_back(plan);
  }
}

void Scheduler::choose_prefill(const Request& request, Decision& d) {
  // The weight of service against TTFT (load-priced placement, DESIGN.md §10): the mean predicted queue over the
  // mean service of recent jobs, the M/M/1 ratio rho / (1 - rho): one ms of service placed now makes that many ms
  // of queueing for the requests after it. 0 on an idle cluster (the paper's rule), bounded so that a queue left by
  // a stalled instance cannot make TTFT irrelevant.
  PlacementContext ctx;
  ctx.slo_ttft_ms = ttft_target_ms_;  // among instances admissible at the target (the SLO less its headroom)
  ctx.admit_slo_ms = request.slo_ttft_ms > 0 ? request.slo_ttft_ms : config_.slo.ttft_ms;
  if (service_ewma_ms_ > 0) {
    double queue_sum = 0;
    for (const PrefillEstimate& e : estimates_) queue_sum += e.queue_ms;
    const double mean_queue = queue_sum / static_cast<double>(estimates_.size());
    ctx.service_weight = std::min(kMaxServiceWeight, placement_load_weight() * mean_queue / service_ewma_ms_);
    d.load_ratio = std::min(kMaxServiceWeight, mean_queue / service_ewma_ms_);  // load shedding's (step 5a)
  }
  d.service_weight = ctx.service_weight;
  size_t chosen = policy_->choose(request, estimates_, ctx);
  if (chosen >= estimates_.size()) chosen = 0;
  d.prefill = estimates_[chosen];
  single_service_ms_ = d.prefill.prefill_ms + d.prefill.transfer_ms;   // before a pipelined group may replace it
  d.prefill.remote_sources = estimate_plans_[chosen]->remote_sources;  // only the chosen one's (commit books them)
  d.prefill.queue_ms += d.prefill.overtake_ms;
  d.prefill.ttft_ms += d.prefill.overtake_ms;
  d.predicted_ttft_ms = d.prefill.ttft_ms;
  if (config_.max_logged_candidates > 0) {
    size_t n = std::min(estimates_.size(), static_cast<size_t>(config_.max_logged_candidates));
    d.candidates.resize(n);
    std::partial_sort_copy(estimates_.begin(), estimates_.end(), d.candidates.begin(), d.candidates.end(),
                           [](const PrefillEstimate& a, const PrefillEstimate& b) { return a.ttft_ms < b.ttft_ms; });
  }
}

void Scheduler::consider_pipeline(const Request& request, Decision& d) const {
  const PipelineConfig& pc = config_.pipeline;
  const auto x = static_cast<size_t>(std::max<int64_t>(pc.group_size, 1));
  if (x < 2 || pc.chunk_tokens < 1 || pc.model_layers < static_cast<int64_t>(x)) return;
  auto decline = [&d](const char* rule, double group_ttft_ms = 0) {
    d.pipeline_declined = rule;
    d.group_ttft_ms = group_ttft_ms;
  };
  if (estimates_.size() < x) return decline("members");
  const int64_t B = config_.kv.block_size_tokens;
  // The members: the x shortest queues, kept in registration order (the pipeline order: every group's stages
  // ascend in one order, so two groups never wait on each other's stages, DESIGN.md §18).
  // Only instances whose backend runs stages (ref live; every simulated one) can be members.
  std::vector<size_t> order;
  for (size_t i = 0; i < estimates_.size(); ++i) {
    const Instance* inst = cluster_.find(estimates_[i].instance_id);
    if (inst != nullptr && inst->info.runs_pipeline_stages) order.push_back(i);
  }
  if (order.size() < x) return decline("members");
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return estimates_[a].queue_ms < estimates_[b].queue_ms; });
  order.resize(x);
  std::sort(order.begin(), order.end());
  // The prefix plan: the lead's (stage 0's host; each stage fetches its own layers' share of it at once).
  const size_t plan_of = order[0];
  const PrefillEstimate& plan = estimates_[plan_of];
  // A pending prefix exists only behind its job on that one instance; a group starts at its decision time's key.
  if (plan.pending_blocks > 0) return decline("pending_prefix");
  const int64_t cached = std::min(plan.reused_blocks * B, request.input_tokens - 1);
  const int64_t fresh = request.input_tokens - cached;
  if (fresh <= pc.chunk_tokens) return decline("one_chunk");  // nothing to overlap
  model::PipelineShape shape;
  shape.stage_layers = model::even_stage_layers(pc.model_layers, static_cast<int64_t>(x)).value();
  shape.chunk_tokens = pc.chunk_tokens;
  shape.link_bytes_per_s = pc.link_bytes_per_s;
  shape.link_latency_s = pc.link_latency_ms * 1e-3;
  std::vector<double> ready_s(x);
  for (size_t s = 0; s < x; ++s) {
    const double share = static_cast<double>(shape.stage_layers[s]) / static_cast<double>(pc.model_layers);
    ready_s[s] = (estimates_[order[s]].queue_ms + share * plan.transfer_ms) * 1e-3;
  }
  const model::PipelineTiming t =
      model::pipeline_timing([this](int64_t n, int64_t c) { return prefill_.predict_ms(n, c) * 1e-3; }, shape,
                             pc.model_layers, pc.hidden_bytes_per_token, fresh, cached, ready_s);
  const double ttft_ms = t.ttft_s * 1e3;
  const double single_ttft_ms = d.prefill.ttft_ms;
  double held_s = 0, busy_s = 0;
  for (size_t s = 0; s < x; ++s) {
    held_s += std::max(0.0, t.stage_end_s[s] - ready_s[s]);
    busy_s += t.stage_busy_s[s];
  }
  if (busy_s < pc.min_efficiency * held_s) return decline("efficiency", ttft_ms);
  // Only on members about free: behind long queues (a saturated cluster) a group's idle time costs the queue
  // more than it saves this request.
  const double latest_ready_s = *std::max_element(ready_s.begin(), ready_s.end());
  const double free_bound_ms = pc.max_queue_fraction * (t.ttft_s - latest_ready_s) * 1e3;
  if (latest_ready_s * 1e3 > free_bound_ms) return decline("queue", ttft_ms);
  // And as many others about free beside them (reserve_factor x X in all): while the group holds X instances the
  // requests arriving meanwhile have only the rest, and on a busy pool that is where their TTFT goes.
  const auto free = static_cast<size_t>(std::count_if(
      estimates_.begin(), estimates_.end(), [&](const PrefillEstimate& e) { return e.queue_ms <= free_bound_ms; }));
  if (static_cast<double>(free) < pc.reserve_factor * static_cast<double>(x)) return decline("reserve", ttft_ms);
  if (ttft_ms > (1.0 - pc.min_ttft_gain) * single_ttft_ms) return decline("gain", ttft_ms);
  // What the group takes from the requests behind its members: its members' held time beyond the work itself (fill,
  // bubbles, waiting for a slower member). Worth it only when this request gains more than that.
  if (single_ttft_ms - ttft_ms < pc.waste_weight * (held_s - busy_s) * 1e3) return decline("waste", ttft_ms);
  PrefillEstimate lead = estimates_[order[0]];
  lead.remote_sources = estimate_plans_[plan_of]->remote_sources;
  lead.reused_blocks = plan.reused_blocks;
  std::copy(plan.blocks_by_class, plan.blocks_by_class + 4, lead.blocks_by_class);
  lead.transfer_bytes = plan.transfer_bytes;
  lead.transfer_ms = plan.transfer_ms;
  lead.queue_ms = *std::max_element(ready_s.begin(), ready_s.end()) * 1e3 - plan.transfer_ms;
  lead.queue_ms = std::max(0.0, lead.queue_ms);
  lead.ttft_ms = ttft_ms;
  lead.queue_key_ns = d.decided_at_ns;  // commit() books every stage at the decision time's key
  lead.overtake_ms = 0;
  lead.prefill_ms = std::max(0.0, ttft_ms - lead.queue_ms - lead.transfer_ms);
  d.prefill = std::move(lead);
  d.predicted_ttft_ms = ttft_ms;
  d.single_ttft_ms = single_ttft_ms;
  d.pipeline_declined.clear();
  d.group_ttft_ms = 0;
  d.stages.clear();
  int64_t first_layer = 0;
  for (size_t s = 0; s < x; ++s) {
    d.stages.push_back(StageEstimate{estimates_[order[s]].instance_id, first_layer, shape.stage_layers[s],
                                     ready_s[s] * 1e3, t.stage_end_s[s] * 1e3});
    first_layer += shape.stage_layers[s];
  }
}

const PrefillEstimate* Scheduler::mark_hot_prefix(Decision& d) const {
  const PrefillEstimate* holder = nullptr;
  for (const auto& e : estimates_) {
    if (e.longest_same_host_blocks == 0) continue;
    if (holder == nullptr || e.longest_same_host_blocks > holder->longest_same_host_blocks ||
        (e.longest_same_host_blocks == holder->longest_same_host_blocks && e.queue_ms < holder->queue_ms)) {
      holder = &e;
    }
  }
  if (holder != nullptr) {
    d.best_holder_id = holder->instance_id;
    d.replicate_prefix = holder->instance_id != d.prefill.instance_id && holder->queue_ms > config_.overload_queue_ms &&
                         d.prefill.longest_same_host_blocks < holder->longest_same_host_blocks &&
                         d.prefill.blocks_by_class[static_cast<size_t>(PathClass::kRemote)] +
                                 d.prefill.blocks_by_class[static_cast<size_t>(PathClass::kSsd)] >
                             0;
  }
  return holder;
}

std::string Scheduler::explain_prefill(const Decision& d, const PrefillEstimate* holder) const {
  const auto pool_len = static_cast<int64_t>(lookup_.size());
  std::string group;
  if (!d.stages.empty()) {
    group = fmt("; pipelined over %zu stages (single best %.1f ms):", d.stages.size(), d.single_ttft_ms);
    for (const StageEstimate& st : d.stages) {
      group += fmt(" %s layers %lld-%lld ready %.1f end %.1f ms", st.instance_id.c_str(),
                   static_cast<long long>(st.first_layer), static_cast<long long>(st.first_layer + st.layers - 1),
                   st.ready_ms, st.end_ms);
    }
  } else if (d.group_ttft_ms > 0) {
    group =
        fmt("; no pipelined group (rule %s; the group's ttft %.1f ms)", d.pipeline_declined.c_str(), d.group_ttft_ms);
  }
  return explain_single(d, holder, pool_len) + group;
}

std::string Scheduler::explain_single(const Decision& d, const PrefillEstimate* holder, int64_t pool_len) const {
  return fmt(
      "%s: %s ttft %.1f ms (queue %.1f + prefill %.1f + transfer %.1f; reuse %lld/%lld pool blocks: %lld same_host, "
      "%lld remote, %lld ssd%s)%s",
      d.policy.c_str(), d.prefill.instance_id.c_str(), d.prefill.ttft_ms, d.prefill.queue_ms, d.prefill.prefill_ms,
      d.prefill.transfer_ms, static_cast<long long>(d.prefill.reused_blocks), static_cast<long long>(pool_len),
      static_cast<long long>(d.prefill.blocks_by_class[0]), static_cast<long long>(d.prefill.blocks_by_class[1]),
      static_cast<long long>(d.prefill.blocks_by_class[2]),
      d.prefill.pending_blocks > 0 ? fmt("; %lld of them computed first by a request queued there",
                                         static_cast<long long>(d.prefill.pending_blocks))
                                         .c_str()
                                   : "",
      d.replicate_prefix ? fmt("; replicating the prefix held by overloaded %s (queue %.1f ms)",
                               holder->instance_id.c_str(), holder->queue_ms)
                               .c_str()
                         : "");
}

void Scheduler::predict_decode_instances(const Request& request, int64_t now, int64_t start_ns, double slo_tbt) {
  decode_scratch_.clear();
  for (const Instance* inst : cluster_.instances(Role::kDecode)) {
    if (!placeable(*inst, now, config_.heartbeat_timeout_ms)) continue;  // draining, or silent
    decode_scratch_.push_back(predict_decode(request, *inst, start_ns, slo_tbt));
  }
}

Scheduler::DecodePick Scheduler::pick_decode(const Request& request, double slo_tbt) const {
  if (decode_scratch_.empty()) {
    return {nullptr, RejectReason::kNoDecodeInstance, "no live decode instance is registered (or every one drains)"};
  }
  const DecodeEstimate* best = nullptr;       // fits and meets TBT
  const DecodeEstimate* best_fit = nullptr;   // fits KV now
  const DecodeEstimate* best_ever = nullptr;  // could fit when empty
  const int64_t kv_tokens_needed = request.input_tokens + request.output_tokens;
  for (const auto& de : decode_scratch_) {
    if (de.fits_kv && de.meets_tbt && (best == nullptr || de.tbt_ms < best->tbt_ms)) best = &de;
    if (de.fits_kv && (best_fit == nullptr || de.tbt_ms < best_fit->tbt_ms)) best_fit = &de;
    if (kv_tokens_needed <= de.kv_capacity_tokens &&
        (best_ever == nullptr || de.kv_reserved_tokens - de.kv_capacity_tokens <
                                     best_ever->kv_reserved_tokens - best_ever->kv_capacity_tokens)) {
      best_ever = &de;
    }
  }
  if (best != nullptr) return {best, RejectReason::kNone, ""};
  if (best_ever == nullptr) {
    int64_t max_cap = 0;
    for (const auto& de : decode_scratch_) max_cap = std::max(max_cap, de.kv_capacity_tokens);
    return {nullptr, RejectReason::kKvCapacity,
            fmt("request needs %lld KV tokens (input %lld + output %lld) but the largest decode instance "
                "holds %lld",
                static_cast<long long>(kv_tokens_needed), static_cast<long long>(request.input_tokens),
                static_cast<long long>(request.output_tokens), static_cast<long long>(max_cap))};
  }
  if (config_.slo.early_reject) {
    if (best_fit == nullptr) {
      return {nullptr, RejectReason::kKvCapacity,
              fmt("no decode instance can reserve %lld KV tokens when the prefill finishes (least loaded: %s "
                  "at %lld/%lld tokens)",
                  static_cast<long long>(kv_tokens_needed), best_ever->instance_id.c_str(),
                  static_cast<long long>(best_ever->kv_reserved_tokens),
                  static_cast<long long>(best_ever->kv_capacity_tokens))};
    }
    return {nullptr, RejectReason::kTbtSlo,
            fmt("predicted TBT %.1f ms on the best decode instance %s exceeds the SLO %.1f ms (batch %lld)",
                best_fit->tbt_ms, best_fit->instance_id.c_str(), slo_tbt,
                static_cast<long long>(best_fit->batch_requests))};
  }
  return {best_fit != nullptr ? best_fit : best_ever, RejectReason::kNone, ""};
}

Decision Scheduler::accept(Decision& d, const DecodeEstimate& pick, const std::string& prefill_why) {
  d.accepted = true;
  d.prefill_id = d.prefill.instance_id;
  d.decode = pick;
  d.decode_id = pick.instance_id;
  d.predicted_tbt_ms = pick.tbt_ms;
  d.hit_tokens = d.prefill.reused_blocks * config_.kv.block_size_tokens;
  d.reason =
      prefill_why + fmt("; %s tbt %.1f ms (batch %lld, KV %lld/%lld tokens)%s", d.decode_id.c_str(), pick.tbt_ms,
                        static_cast<long long>(pick.batch_requests), static_cast<long long>(pick.kv_reserved_tokens),
                        static_cast<long long>(pick.kv_capacity_tokens),
                        (pick.fits_kv && pick.meets_tbt) ? "" : " (SLO not met; early rejection is off)");
  ++counters_.accepted;
  if (d.prefill.reused_blocks > 0) {
    ++counters_.fetch;
    if (d.prefill.blocks_by_class[static_cast<size_t>(PathClass::kRemote)] > 0) ++counters_.fetch_remote;
  } else {
    ++counters_.recompute;
    if (max_reuse_ > 0) ++counters_.recompute_cached;
  }
  if (d.replicate_prefix) ++counters_.replicate;
  if (d.prefill.pending_blocks > 0 && d.stages.empty()) ++counters_.fetch_pending;
  return std::move(d);
}

void Scheduler::commit(const Request& request, const Decision& d) {
  if (!d.accepted) return;
  const int64_t now = clock_->now_ns();
  std::vector<std::string> stage_ids;
  const double target_ms = d.ttft_target_ms > 0 ? d.ttft_target_ms : d.slo_ttft_ms;
  const int64_t deadline_ns = now + static_cast<int64_t>(std::min(target_ms, 8.64e7) * 1e6);
  if (d.stages.empty()) {
    const double service_ms = d.prefill.prefill_ms + d.prefill.transfer_ms;
    if (service_ms > 0 && std::isfinite(service_ms)) {
      service_ewma_ms_ = service_ewma_ms_ <= 0 ? service_ms : 0.99 * service_ewma_ms_ + 0.01 * service_ms;
      ++service_samples_;
    }
    cluster_.assign_prefill(d.prefill_id,
                            PrefillJob{request.request_id, service_ms, request.input_tokens - d.hit_tokens,
                                       d.prefill.queue_key_ns, deadline_ns},
                            now);
    std::deque<QueueArrival>& recent = arrivals_[d.prefill_id];
    recent.push_back(QueueArrival{now, service_ms});
    while (static_cast<int64_t>(recent.size()) > config_.queue.overtake_history) recent.pop_front();
  } else {
    // Each stage is booked from the end of its own queue until its last chunk is done.
    for (const StageEstimate& st : d.stages) {
      const Instance* inst = cluster_.find(st.instance_id);
      const double queue = inst != nullptr ? cluster_.prefill_queue_ms(*inst, now, prefill_.ms_per_token()) : 0.0;
      const int64_t tokens =
          (request.input_tokens - d.hit_tokens) * st.layers / std::max<int64_t>(1, config_.pipeline.model_layers);
      // Every stage at its decision time's key: groups keep one order on every member (DESIGN.md §18).
      cluster_.assign_prefill(
          st.instance_id, PrefillJob{request.request_id, std::max(0.0, st.end_ms - queue), tokens, now, deadline_ns},
          now);
      if (st.instance_id != d.prefill_id) stage_ids.push_back(st.instance_id);
    }
  }
  const int64_t start_ns = now + static_cast<int64_t>(d.prefill.ttft_ms * 1e6);
  cluster_.assign_decode(
      d.decode_id,
      DecodeJob{request.request_id, request.input_tokens, request.output_tokens, start_ns,
                start_ns + static_cast<int64_t>(static_cast<double>(request.output_tokens) * d.decode.tbt_ms * 1e6)});
  InFlight& f = in_flight_[request.request_id];
  if (!f.send_hosts.empty()) end_sends(request.request_id, f.send_hosts);  // a re-decided request
  forget_pending(request.request_id, f.pending_hashes);
  f = InFlight{d.prefill_id, d.decode_id, d.predicted_ttft_ms, now, false, {}, std::move(stage_ids), {}};
  book_pending(request, d, f);
  // Its remote fetches load their senders from the end of its queue until its predicted TTFT.
  const int64_t fetch_end_ns = now + static_cast<int64_t>((d.prefill.queue_ms + d.prefill.transfer_ms) * 1e6);
  for (const SourceBytes& src : d.prefill.remote_sources) {
    send_backlog_[src.host].push_back(SendEntry{request.request_id, src.bytes, fetch_end_ns});
    f.send_hosts.push_back(src.host);
  }
}

int64_t Scheduler::send_backlog_bytes(uint32_t host, int64_t now) const {
  auto it = send_backlog_.find(host);
  if (it == send_backlog_.end()) return 0;
  int64_t sum = 0;
  for (const SendEntry& e : it->second) {
    if (e.end_ns > now) sum += e.bytes;
  }
  return sum;
}

void Scheduler::end_sends(const std::string& request_id, const std::vector<uint32_t>& hosts) {
  for (uint32_t h : hosts) {
    auto it = send_backlog_.find(h);
    if (it == send_backlog_.end()) continue;
    std::erase_if(it->second, [&](const SendEntry& e) { return e.request_id == request_id; });
    if (it->second.empty()) send_backlog_.erase(it);
  }
}

Decision Scheduler::schedule(const Request& request) {
  Decision d = decide(request);
  commit(request, d);
  return d;
}

void Scheduler::on_prefill_done(const PrefillReport& r) {
  const int64_t now = clock_->now_ns();
  if (r.ok) {
    prefill_.observe(r.prefilled_tokens, r.reused_tokens, r.prefill_ms);
    // A remote sample from one known host is that path's (the class estimate stays what unmeasured paths are
    // priced at: one slow link must not make every path look slow); the others refit their class.
    const auto remote = static_cast<size_t>(PathClass::kRemote);
    const Instance* inst = cluster_.find(r.instance_id);
    std::optional<uint32_t> src =
        r.remote_source_host.empty() ? std::nullopt : cluster_.find_host(r.remote_source_host);
    const bool path = inst != nullptr && src && inst->host_index != kNoHost && r.transfer_bytes[remote] > 0 &&
                      r.transfer_ns[remote] > 0;
    if (path) {
      bandwidth_.observe_path(*src, inst->host_index, r.transfer_bytes[remote], r.transfer_ns[remote], now);
      ++counters_.path_samples;
    }
    for (int c = 0; c < kNumTransferClasses; ++c) {
      if (path && c == static_cast<int>(remote)) continue;
      bandwidth_.observe(static_cast<PathClass>(c), r.transfer_bytes[c], r.transfer_ns[c]);
    }
  }
  cluster_.finish_prefill(r.instance_id, r.request_id, now);
  auto it = in_flight_.find(r.request_id);
  if (it == in_flight_.end()) return;
  for (const std::string& stage : it->second.stage_ids) cluster_.finish_prefill(stage, r.request_id, now);
  if (r.instance_id != it->second.prefill_id) cluster_.finish_prefill(it->second.prefill_id, r.request_id, now);
  end_sends(r.request_id, it->second.send_hosts);
  it->second.send_hosts.clear();
  forget_pending(r.request_id, it->second.pending_hashes);  // stored now (KV events), or never: recomputed
  if (!r.ok) {
    cluster_.finish_decode(it->second.decode_id, r.request_id);
    in_flight_.erase(it);
    return;
  }
  const Instance* dec = cluster_.find(it->second.decode_id);
  if (dec != nullptr) {
    for (const auto& j : dec->decode_jobs) {
      if (j.request_id != r.request_id) continue;
      double step =
          j.output_tokens > 0 && j.predicted_end_ns > j.start_ns
              ? static_cast<double>(j.predicted_end_ns - j.start_ns) * 1e-6 / static_cast<double>(j.output_tokens)
              : 0.0;
      cluster_.start_decode(it->second.decode_id, r.request_id, now, step);
      break;
    }
  }
}

void Scheduler::on_stage_done(const std::string& instance_id, const std::string& request_id) {
  cluster_.finish_prefill(instance_id, request_id, clock_->now_ns());
}

void Scheduler::on_decode_step(const DecodeStepReport& r) { on_decode_steps({&r, 1}); }

void Scheduler::on_decode_steps(std::span<const DecodeStepReport> reports) {
  for (const DecodeStepReport& r : reports) {
    if (r.batch_requests <= 0 || r.context_tokens < 0 || !std::isfinite(r.step_ms) || r.step_ms < 0) continue;
    // The error of the model as it stood before this step: what a decision made just then would have predicted.
    const double predicted = decode_.step_ms(r.batch_requests, r.context_tokens);
    if (!decode_.observe(r.batch_requests, r.context_tokens, r.step_ms)) {
      ++counters_.refused_decode_steps;
      continue;
    }
    decode_error_.add(predicted, r.step_ms);
  }
}

void Scheduler::on_fetch_progress(const std::string& instance_id, const std::string& request_id, int64_t elapsed_ns) {
  auto it = in_flight_.find(request_id);
  if (elapsed_ns <= 0 || it == in_flight_.end() || it->second.prefill_id != instance_id ||
      it->second.send_hosts.size() != 1) {
    return;
  }
  const Instance* inst = cluster_.find(instance_id);
  auto b = send_backlog_.find(it->second.send_hosts.front());
  if (inst == nullptr || inst->host_index == kNoHost || b == send_backlog_.end()) return;
  for (const SendEntry& e : b->second) {
    if (e.request_id != request_id) continue;
    const double bound = static_cast<double>(e.bytes) / (static_cast<double>(elapsed_ns) * 1e-9);
    if (bandwidth_.cap_path(b->first, inst->host_index, bound, clock_->now_ns())) ++counters_.path_caps;
    return;
  }
}

void Scheduler::on_first_token(const std::string& request_id, double actual_ttft_ms) {
  auto it = in_flight_.find(request_id);
  if (it == in_flight_.end() || it->second.first_token_seen) return;
  it->second.first_token_seen = true;
  ttft_error_.add(it->second.predicted_ttft_ms, actual_ttft_ms);
}

void Scheduler::on_request_done(const std::string& request_id) {
  auto it = in_flight_.find(request_id);
  if (it == in_flight_.end()) return;
  const int64_t now = clock_->now_ns();
  cluster_.finish_prefill(it->second.prefill_id, request_id, now);
  for (const std::string& stage : it->second.stage_ids) cluster_.finish_prefill(stage, request_id, now);
  cluster_.finish_decode(it->second.decode_id, request_id);
  end_sends(request_id, it->second.send_hosts);
  forget_pending(request_id, it->second.pending_hashes);
  in_flight_.erase(it);
}

}  // namespace mc::sched
