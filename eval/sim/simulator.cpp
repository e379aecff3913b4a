#include "mc/sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <unordered_map>
#include <utility>

#include "mc/common/block_key.hpp"
#include "mc/common/log.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/model/pipeline.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/sched/scheduler.hpp"
#include "mc/sim/block_cache.hpp"
#include "mc/sim/event_queue.hpp"
#include "mc/sim/instances.hpp"
#include "mc/sim/network.hpp"
#include "mc/sim/node_capacity.hpp"

namespace mc::sim {

namespace {

double ns_to_ms(int64_t ns) { return static_cast<double>(ns) * 1e-6; }

// ---------------------------------------------------------------------------------------------
// Sources

class ReaderSource final : public RequestSource {
 public:
  explicit ReaderSource(std::unique_ptr<trace::Reader> reader) : reader_(std::move(reader)) {}
  Result<std::optional<trace::Request>> next() override { return reader_->next(); }
  const trace::ReaderStats* reader_stats() const override { return &reader_->stats(); }

 private:
  std::unique_ptr<trace::Reader> reader_;
};

class VectorSource final : public RequestSource {
 public:
  explicit VectorSource(const std::vector<trace::Request>& rows) : rows_(rows) {}
  Result<std::optional<trace::Request>> next() override {
    if (pos_ >= rows_.size()) return std::optional<trace::Request>();
    return std::optional<trace::Request>(rows_[pos_++]);
  }

 private:
  const std::vector<trace::Request>& rows_;
  size_t pos_ = 0;
};

// Applies a TraceWindow to a source: skip before start, stop at the end or the count.
class Windowed {
 public:
  Windowed(RequestSource& src, const TraceWindow& w) : src_(src), w_(w) {}
  Result<std::optional<trace::Request>> next() {
    if (done_ || (w_.max_requests > 0 && offered_ >= w_.max_requests)) return std::optional<trace::Request>();
    const double start_ms = w_.start_s * 1e3;
    while (true) {
      MC_ASSIGN_OR_RETURN(std::optional<trace::Request> row, src_.next());
      if (!row) {
        done_ = true;
        return row;
      }
      const auto ts = static_cast<double>(row->timestamp_ms);
      if (ts < start_ms) continue;
      if (w_.duration_s > 0 && ts >= start_ms + w_.duration_s * 1e3) {
        done_ = true;
        return std::optional<trace::Request>();
      }
      ++offered_;
      return row;
    }
  }
  // Arrival in virtual ns since the window start.
  int64_t arrival_ns(const trace::Request& r) const {
    return static_cast<int64_t>(
        std::llround((static_cast<double>(r.timestamp_ms) - w_.start_s * 1e3) / w_.rate_scale * 1e6));
  }

 private:
  RequestSource& src_;
  TraceWindow w_;
  int64_t offered_ = 0;
  bool done_ = false;
};

// ---------------------------------------------------------------------------------------------
// The infer/ cost model behind the simulator's interface.

class InferCostModel final : public CostModel {
 public:
  InferCostModel(model::ModelConfig model, model::GpuSpec gpu) : model_(std::move(model)), gpu_(std::move(gpu)) {}
  double prefill_time_s(int64_t new_tokens, int64_t cached_tokens) const override {
    return model::prefill_time_s(model_, gpu_, new_tokens, cached_tokens);
  }
  double decode_step_time_s(int64_t batch_size, int64_t context_tokens) const override {
    return model::decode_step_time_s(model_, gpu_, batch_size, context_tokens);
  }
  int64_t kv_bytes_per_token() const override { return model_.kv_bytes_per_token(); }
  int64_t num_layers() const override { return model_.num_layers; }
  int64_t hidden_bytes_per_token() const override { return model_.hidden_size * model_.dtype_bytes; }

 private:
  model::ModelConfig model_;
  model::GpuSpec gpu_;
};

// The scheduler's prior coefficients, read off the cost model itself by the same functions mc-conductor
// uses (sched/predictors.hpp), so it starts from the model the simulated GPUs follow and refits from there.
//   prefill_ms(n, c) = w0 + w1*n + w2*n*(c + (n+1)/2)   (sched/predictors.hpp)
//   step_ms(b, t)    = v0 + v1*b + v2*t
sched::PrefillCostPrior prefill_prior(const CostModel& m) {
  return sched::prefill_prior_from_cost_model([&](int64_t n, int64_t c) { return m.prefill_time_s(n, c) * 1e3; });
}

sched::DecodeCostPrior decode_prior(const CostModel& m) {
  return sched::decode_prior_from_cost_model([&](int64_t b, int64_t t) { return m.decode_step_time_s(b, t) * 1e3; });
}

// ---------------------------------------------------------------------------------------------
// One simulation.

class Sim {
 public:
  Sim(const SimOptions& opt, const CostModel& model, int64_t gpu_count)
      : opt_(opt),
        cfg_(opt.cluster),
        model_(model),
        gpu_count_(gpu_count),
        events_(clock_),
        kv_bytes_(model.kv_bytes_per_token()),
        block_(cfg_.block_size) {}

  Status init() {
    const auto P = static_cast<int>(cfg_.prefill_instances);
    const auto D = static_cast<int>(cfg_.decode_instances);
    std::vector<double> nics(static_cast<size_t>(P + D));
    for (size_t i = 0; i < nics.size(); ++i) nics[i] = cfg_.nic_bandwidth_of(i);
    network_ = std::make_unique<Network>(events_, std::move(nics));
    sched::SchedulerConfig sc;
    sc.policy = cfg_.policy;
    sc.seed = cfg_.seed;
    sc.slo.ttft_ms = cfg_.slo_ttft_ms;
    sc.slo.tbt_ms = cfg_.slo_tbt_ms;
    sc.slo.early_reject = cfg_.early_rejection;
    sc.queue.discipline = cfg_.queue;
    sc.queue.aging_weight = cfg_.queue_aging_weight;
    sc.queue.guard_ms = cfg_.queue_guard_ms;
    sc.queue.preempt_chunk_tokens = cfg_.preempt_chunk_tokens;
    sc.pending_prefix = cfg_.pending_prefix;
    sc.placement_load_weight = cfg_.placement_load_weight;
    sc.slo_headroom = cfg_.slo_headroom;
    sc.shed_limit = cfg_.shed_limit;
    sc.balancing_threshold = cfg_.balancing_threshold;
    sc.kv.kv_bytes_per_token = kv_bytes_;
    sc.kv.block_size_tokens = block_;
    sc.heartbeat_timeout_ms = std::max<int64_t>(3'000, 10 * opt_.heartbeat_ms);
    if (cfg_.pipeline_group > model_.num_layers()) {
      return error(Code::kInvalidArgument, "pipeline_group " + std::to_string(cfg_.pipeline_group) +
                                               ": a group has one stage per instance and at least one layer per "
                                               "stage; the model has " +
                                               std::to_string(model_.num_layers()) + " layers");
    }
    sc.pipeline.group_size = cfg_.pipeline_group;
    sc.pipeline.chunk_tokens = cfg_.pipeline_chunk_tokens;
    sc.pipeline.reserve_factor = cfg_.pipeline_reserve_factor;
    sc.pipeline.min_ttft_gain = cfg_.pipeline_min_gain;
    sc.pipeline.model_layers = model_.num_layers();
    sc.pipeline.hidden_bytes_per_token = model_.hidden_bytes_per_token();
    sc.pipeline.link_bytes_per_s = cfg_.nic_bandwidth_bytes_per_s;
    sc.pipeline.link_latency_ms = 0;
    sched::BandwidthPriors bw;
    bw.same_host_bytes_per_s = opt_.local_load_bytes_per_s;
    // "local" cache mode: no path between hosts for KV, so the Conductor prices any remote block
    // as unreachable and only ever reuses an instance's own cache.
    bw.remote_bytes_per_s = cfg_.cache_mode == CacheMode::kGlobal ? cfg_.nic_bandwidth_bytes_per_s : 1e-9;
    bw.fixed_ms[0] = bw.fixed_ms[1] = bw.fixed_ms[2] = 0;
    MC_ASSIGN_OR_RETURN(scheduler_,
                        sched::Scheduler::create(sc, &clock_, prefill_prior(model_), decode_prior(model_), bw));
    const int64_t cache_blocks = cfg_.cache_capacity_tokens / block_;
    for (int i = 0; i < P; ++i) {
      prefill_.push_back(std::make_unique<PrefillInstance>(i, events_, *network_, model_, cfg_.chunk_tokens));
      prefill_.back()->set_preempt_chunk_tokens(scheduler_->config().queue.preempt_chunk_tokens);
      caches_.push_back(std::make_unique<BlockCache>(cache_blocks));
      prefill_stats_.emplace_back();
      sched::InstanceInfo info;
      info.id = "prefill-" + std::to_string(i);
      info.role = sched::Role::kPrefill;
      info.host = "node-p" + std::to_string(i);
      MC_RETURN_IF_ERROR(scheduler_->register_instance(info));
      ids_.emplace(info.id, i);
      names_.push_back(info.id);
    }
    for (int j = 0; j < D; ++j) {
      decode_.push_back(
          std::make_unique<DecodeInstance>(events_, model_, cfg_.decode_kv_capacity_tokens, cfg_.decode_max_batch));
      if (opt_.refit_predictors) {
        const size_t name_at = static_cast<size_t>(P) + static_cast<size_t>(j);  // after the P prefill names
        decode_.back()->set_step_observer([this, name_at](int64_t batch, int64_t ctx, double step_s) {
          scheduler_->on_decode_step(sched::DecodeStepReport{names_[name_at], batch, ctx, step_s * 1e3});
        });
      }
      sched::InstanceInfo info;
      info.id = "decode-" + std::to_string(j);
      info.role = sched::Role::kDecode;
      info.host = "node-d" + std::to_string(j);
      info.kv_capacity_tokens = cfg_.decode_kv_capacity_tokens;
      MC_RETURN_IF_ERROR(scheduler_->register_instance(info));
      ids_.emplace(info.id, P + j);
      names_.push_back(info.id);
    }
    stream_event_ids_.assign(static_cast<size_t>(P), 0);
    return Status::ok();
  }

  Result<SimResult> run(RequestSource& source, const replay::SummaryOptions& sopt) {
    const auto wall_start = std::chrono::steady_clock::now();
    Windowed window(source, opt_.window);
    window_ = &window;
    MC_RETURN_IF_ERROR(schedule_next_arrival());
    heartbeat();
    // Bounded: every event is either an arrival (one per row), a heartbeat (only while requests are
    // pending) or work of an in-flight request, each of which ends.
    while (events_.step()) {
      if (!status_.is_ok()) return status_;
    }
    if (!status_.is_ok()) return status_;
    if (!live_.empty()) {
      return error(Code::kInternal, "simulation ended with " + std::to_string(live_.size()) + " requests in flight");
    }
    if (opt_.progress) std::cerr << "\n";

    SimResult out;
    out.totals = totals_;
    out.totals.events = events_.executed();
    out.totals.span_s = clock_.now_s();
    out.totals.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    out.totals.replicated_prefixes = static_cast<int64_t>(scheduler_->counters().replicate);
    out.totals.pipelined_prefills = pipelined_;
    for (const auto& p : prefill_) out.totals.prefill_preemptions += p->preemptions();
    out.cluster = cfg_.to_json();
    out.cluster["kv_bytes_per_token"] = kv_bytes_;
    out.cluster["local_load_bytes_per_s"] = opt_.local_load_bytes_per_s;
    out.cluster["refit_predictors"] = opt_.refit_predictors;
    const double span = std::max(out.totals.span_s, 1e-9);
    for (size_t i = 0; i < prefill_.size(); ++i) {
      InstanceReport r = prefill_stats_[i];
      r.id = names_[i];
      r.role = "prefill";
      r.busy_s = static_cast<double>(prefill_[i]->busy_compute_ns()) * 1e-9;
      r.jobs = prefill_[i]->jobs_done();
      r.cache_blocks = caches_[i]->size_blocks();
      r.cache_evictions = caches_[i]->evictions();
      fill_nic(r, static_cast<int>(i));
      r.utilization = r.busy_s / span;
      out.instances.push_back(r);
    }
    for (size_t j = 0; j < decode_.size(); ++j) {
      InstanceReport r;
      r.id = names_[prefill_.size() + j];
      r.role = "decode";
      r.busy_s = static_cast<double>(decode_[j]->busy_ns()) * 1e-9;
      r.jobs = decode_jobs_[j];
      r.tokens = decode_[j]->tokens_produced();
      fill_nic(r, static_cast<int>(prefill_.size() + j));
      r.utilization = r.busy_s / span;
      out.instances.push_back(r);
    }
    out.records = std::move(records_);
    out.summary = replay::summarize(out.records, sopt);
    return out;
  }

 private:
  struct Live {
    size_t record = 0;           // index into records_
    std::vector<uint64_t> keys;  // seq hashes of the complete blocks
    int64_t arrival_ns = 0;
    int prefill = -1, decode = -1;
    int64_t planned_blocks = 0;
    bool replicate = false;
    int64_t reserve_tokens = 0;
    int64_t output_tokens = 1;
    bool reserved = false, kv_arrived = false, prefill_done = false;
    int64_t first_token_ns = -1;
  };

  void fill_nic(InstanceReport& r, int nic) const {
    NicStats s = network_->stats(nic);
    r.nic_tx_bytes = s.tx_bytes;
    r.nic_rx_bytes = s.rx_bytes;
    r.nic_busy_s = static_cast<double>(s.busy_ns) * 1e-9;
  }

  Status schedule_next_arrival() {
    MC_ASSIGN_OR_RETURN(std::optional<trace::Request> row, window_->next());
    if (!row) {
      arrivals_done_ = true;
      return Status::ok();
    }
    const int64_t at = window_->arrival_ns(*row);
    events_.schedule_at(at, [this, r = std::move(*row)]() mutable { arrive(std::move(r)); });
    return Status::ok();
  }

  void heartbeat() {
    for (size_t i = 0; i < prefill_.size(); ++i) {
      sched::LoadReport l;
      l.queued_prefill_tokens = prefill_[i]->queued_tokens();
      l.queued_prefill_jobs = prefill_[i]->queued_jobs();
      (void)scheduler_->heartbeat(names_[i], l);
    }
    for (size_t j = 0; j < decode_.size(); ++j) {
      sched::LoadReport l;
      l.running_requests = decode_[j]->batch_size();
      l.kv_reserved_tokens = decode_[j]->reserved_tokens();
      l.context_tokens = decode_[j]->context_tokens();
      (void)scheduler_->heartbeat(names_[prefill_.size() + j], l);
    }
    if (!arrivals_done_ || !live_.empty())
      events_.schedule_after(opt_.heartbeat_ms * 1'000'000, [this] { heartbeat(); });
  }

  void progress() {
    if (!opt_.progress || (arrived_ % 500) != 0) return;
    std::cerr << "\rmc-sim: " << arrived_ << " requests, virtual " << static_cast<int64_t>(clock_.now_s()) << " s, "
              << live_.size() << " in flight" << std::flush;
  }

  void arrive(trace::Request row) {
    ++arrived_;
    progress();
    replay::RequestRecord rec;
    rec.request_id = std::to_string(row.line_no);
    rec.trace_line = row.line_no;
    rec.trace_timestamp_ms = row.timestamp_ms;
    rec.submit_ms = clock_.now_s() * 1e3;
    rec.input_tokens = row.input_length;
    rec.output_tokens_requested = row.output_length;
    records_.push_back(rec);
    const size_t idx = records_.size() - 1;

    // Prefix-chained keys of the complete blocks only (DESIGN.md §13.19: the partial last block is
    // never cached nor counted as a hit).
    const int64_t full = std::min<int64_t>(row.input_length / block_, static_cast<int64_t>(row.hash_ids.size()));
    std::vector<uint64_t> keys(static_cast<size_t>(full));
    uint64_t parent = 0;
    for (int64_t i = 0; i < full; ++i) {
      parent = i == 0 ? row.hash_ids[0] : chain_hash(parent, row.hash_ids[static_cast<size_t>(i)], 0);
      keys[static_cast<size_t>(i)] = parent;
    }

    if (row.input_length > cfg_.max_context_tokens) {
      reject(idx, "input_too_long", std::nullopt);
    } else {
      sched::Request req;
      req.request_id = records_[idx].request_id;
      req.input_tokens = row.input_length;
      req.output_tokens = std::max<int64_t>(1, row.output_length);
      req.block_hashes = keys;
      sched::Decision d = scheduler_->schedule(req);
      if (!d.accepted) {
        reject(idx, std::string(sched::reject_reason_name(d.reject_reason)), d.predicted_ttft_ms);
      } else {
        accept(idx, std::move(keys), req, d);
      }
    }
    Status s = schedule_next_arrival();
    if (!s.is_ok()) status_ = s;
  }

  void reject(size_t idx, std::string reason, std::optional<double> predicted_ttft_ms) {
    replay::RequestRecord& rec = records_[idx];
    rec.outcome = replay::Outcome::kRejected;
    rec.reason = std::move(reason);
    rec.ledger.decision = "reject";
    rec.ledger.predicted_ttft_ms = predicted_ttft_ms;
    write_record(rec);
  }

  void accept(size_t idx, std::vector<uint64_t> keys, const sched::Request& req, const sched::Decision& d) {
    const uint64_t id = next_live_++;
    Live& lv = live_[id];
    lv.record = idx;
    lv.keys = std::move(keys);
    lv.arrival_ns = clock_.now_ns();
    lv.prefill = ids_.at(d.prefill_id);
    lv.decode = ids_.at(d.decode_id) - static_cast<int>(prefill_.size());
    lv.planned_blocks = d.prefill.reused_blocks;
    lv.replicate = d.replicate_prefix;
    lv.output_tokens = req.output_tokens;
    lv.reserve_tokens = req.input_tokens + req.output_tokens;
    totals_.hit_tokens_planned += d.hit_tokens;
    replay::RequestRecord& rec = records_[idx];
    rec.outcome = replay::Outcome::kCompleted;
    rec.prefill_instance = d.prefill_id;
    rec.decode_instance = d.decode_id;
    rec.ledger.predicted_ttft_ms = d.predicted_ttft_ms;
    rec.ledger.planned_hit_tokens = d.hit_tokens;
    if (!d.stages.empty()) {
      rec.ledger.pipeline_stages = static_cast<int64_t>(d.stages.size());
      rec.ledger.single_ttft_ms = d.single_ttft_ms;
    }
    rec.ledger.pool_prefix_tokens = d.pool_prefix_tokens;
    rec.ledger.prompt_tokens = req.input_tokens;

    decode_[static_cast<size_t>(lv.decode)]->reserve_or_wait(lv.reserve_tokens, [this, id] {
      Live& l = live_.at(id);
      l.reserved = true;
      maybe_join(id);
    });
    if (!d.stages.empty()) return submit_group(id, req, d);
    PrefillJob job;
    job.request = id;
    job.input_tokens = req.input_tokens;
    job.cached_tokens = d.hit_tokens;
    job.queue_key_ns = d.prefill.queue_key_ns;  // the Conductor's order (queue discipline)
    PrefillInstance::Hooks hooks;
    hooks.on_start = [this, id](PrefillJob& j) { plan_prefix(id, j); };
    hooks.on_compute_start = [this, id](const PrefillJob& j) { stream_kv(id, j); };
    hooks.on_done = [this, id](const PrefillJob& j) { prefill_done(id, j); };
    prefill_[static_cast<size_t>(lv.prefill)]->submit(std::move(job), std::move(hooks));
  }

  // ---- chunked pipeline parallelism (DESIGN.md §18) ----
  // A pipelined prefill: one held job per stage, queued on each stage's instance. The prefix plan is re-checked
  // when the first stage reaches the head of its queue; each stage, on reaching its head, fetches its layers'
  // share of the prefix (the lead's own blocks over the lead's NIC) and is then ready. Its chunks run by the
  // recursion of mc/model/pipeline.hpp from its ready time and the previous stage's chunk ends, and it is freed at
  // its last chunk's end: a stage waits only for stages before it, which sit on instances earlier in one order, so
  // two groups never wait on each other. Each stage streams its layers' KV to the decode instance from its first
  // chunk; the new blocks are kept whole in the lead's cache.
  struct Group {
    std::vector<int> stages;  // prefill instance indices, pipeline order
    std::vector<int64_t> layers;
    bool planned = false;           // the prefix plan was re-checked (at the first stage's start)
    std::vector<int> fetching;      // per stage: flows left (+1 while starting them)
    std::vector<int64_t> ready_ns;  // per stage: prefix in, ready to compute (-1: not yet)
    size_t computed = 0;            // stages whose chunks are computed (a prefix of the pipeline)
    int kv_flows = 0;               // KV flows to the decode instance still running
    bool kv_counted = false;        // the KV bytes are in the ledger
    PrefillJob lead;                // the prefix plan and the request's figures
    int64_t first_start_ns = -1;    // the first stage left its queue
    int64_t compute_start_ns = -1;  // the first chunk started
    double busy_s = 0;
  };

  void submit_group(uint64_t id, const sched::Request& req, const sched::Decision& d) {
    Group& g = groups_[id];
    g.lead.request = id;
    g.lead.input_tokens = req.input_tokens;
    g.lead.cached_tokens = d.hit_tokens;
    const int64_t fresh = req.input_tokens - d.hit_tokens;
    g.fetching.assign(d.stages.size(), 0);
    g.ready_ns.assign(d.stages.size(), -1);
    for (size_t s = 0; s < d.stages.size(); ++s) {
      const sched::StageEstimate& st = d.stages[s];
      const int inst = ids_.at(st.instance_id);
      g.stages.push_back(inst);
      g.layers.push_back(st.layers);
      PrefillJob job;
      job.request = id;
      job.input_tokens = fresh * st.layers / model_.num_layers();
      job.held = true;
      job.held_predicted_s = std::max(0.0, st.end_ms - st.ready_ms) * 1e-3;
      job.queue_key_ns = d.prefill.queue_key_ns;  // one key on every stage: groups keep one order
      PrefillInstance::Hooks hooks;
      hooks.on_start = [this, id, s](PrefillJob&) { stage_start(id, s); };
      hooks.on_done = [this, id, s](const PrefillJob&) { stage_done(id, s); };
      prefill_[static_cast<size_t>(inst)]->submit(std::move(job), std::move(hooks));
    }
  }

  double stage_share(const Group& g, size_t s) const {
    return static_cast<double>(g.layers[s]) / static_cast<double>(model_.num_layers());
  }

  // Stage s left its queue: its share of the prefix comes in (remote parts from their holders, the lead's own
  // blocks from the lead), then it is ready.
  void stage_start(uint64_t id, size_t s) {
    Group& g = groups_.at(id);
    if (!g.planned) {
      g.planned = true;
      g.first_start_ns = clock_.now_ns();
      g.lead.start_ns = g.first_start_ns;
      plan_prefix(id, g.lead);
      ++pipelined_;
    }
    const double share = stage_share(g, s);
    const double local_bytes =
        static_cast<double>(records_[live_.at(id).record].ledger.hit_tokens_local.value_or(0) * kv_bytes_);
    g.fetching[s] = 1;
    for (const Fetch& f : g.lead.fetches) {
      const auto bytes = static_cast<int64_t>(static_cast<double>(f.bytes) * share);
      if (bytes <= 0) continue;
      ++g.fetching[s];
      network_->start_flow(f.src_nic, g.stages[s], bytes, [this, id, s](int64_t) { stage_fetch_done(id, s); });
    }
    if (s > 0 && local_bytes > 0) {
      ++g.fetching[s];
      network_->start_flow(g.stages[0], g.stages[s], static_cast<int64_t>(local_bytes * share),
                           [this, id, s](int64_t) { stage_fetch_done(id, s); });
    }
    stage_fetch_done(id, s);
  }

  void stage_fetch_done(uint64_t id, size_t s) {
    Group& g = groups_.at(id);
    if (--g.fetching[s] > 0) return;
    const double load_s = s == 0 ? g.lead.local_load_s * stage_share(g, 0) : 0.0;
    events_.schedule_after(seconds_to_ns(load_s), [this, id, s] {
      Group& gr = groups_.at(id);
      gr.ready_ns[s] = clock_.now_ns();
      compute_stages(id);
    });
  }

  // Computes every stage whose predecessors are computed and which is ready, by the recursion of
  // mc/model/pipeline.hpp over stages 0..s (a stage's chunks depend only on the stages before it) from their ready
  // times, and releases it at its last chunk's end.
  void compute_stages(uint64_t id) {
    Group& g = groups_.at(id);
    model::PipelineShape shape;
    shape.chunk_tokens = cfg_.pipeline_chunk_tokens;
    shape.link_bytes_per_s = cfg_.nic_bandwidth_bytes_per_s;
    for (int inst : g.stages)
      shape.link_bytes_per_s = std::min(shape.link_bytes_per_s, network_->bandwidth_bytes_per_s(inst));
    shape.link_latency_s = 0;
    Live& lv = live_.at(id);
    while (g.computed < g.stages.size() && g.ready_ns[g.computed] >= 0) {
      const size_t s = g.computed;
      const double share = stage_share(g, s);
      const int64_t origin =
          *std::min_element(g.ready_ns.begin(), g.ready_ns.begin() + static_cast<std::ptrdiff_t>(s) + 1);
      std::vector<double> ready_s(s + 1);
      for (size_t k = 0; k <= s; ++k) ready_s[k] = static_cast<double>(g.ready_ns[k] - origin) * 1e-9;
      shape.stage_layers.assign(g.layers.begin(), g.layers.begin() + static_cast<std::ptrdiff_t>(s) + 1);
      const model::PipelineTiming t = model::pipeline_timing(
          [this](int64_t n, int64_t c) { return model_.prefill_time_s(n, c); }, shape, model_.num_layers(),
          model_.hidden_bytes_per_token(), g.lead.input_tokens - g.lead.cached_tokens, g.lead.cached_tokens, ready_s);
      const int64_t first_start = origin + seconds_to_ns(t.stage_start_s[s]);
      const int64_t end = origin + seconds_to_ns(t.stage_end_s[s]);
      const double busy = t.stage_busy_s[s];
      totals_.pipeline_bubble_s += std::max(0.0, t.stage_end_s[s] - t.stage_start_s[s] - busy);
      g.busy_s += busy;
      if (s == 0) {
        g.compute_start_ns = first_start;
        g.lead.compute_start_ns = first_start;
      }
      prefill_[static_cast<size_t>(g.stages[s])]->release_held(first_start, end, busy);
      // This stage's layers of the KV stream to the decode instance from its first chunk.
      const auto bytes = static_cast<int64_t>(static_cast<double>(g.lead.input_tokens * kv_bytes_) * share);
      ++g.kv_flows;
      events_.schedule_at(std::max(first_start, clock_.now_ns()), [this, id, s, bytes] {
        Group& gr = groups_.at(id);
        const int dst = static_cast<int>(prefill_.size()) + live_.at(id).decode;
        network_->start_flow(gr.stages[s], dst, bytes, [this, id](int64_t) {
          Group& gg = groups_.at(id);
          if (--gg.kv_flows > 0 || gg.computed < gg.stages.size()) return;
          Live& l = live_.at(id);
          l.kv_arrived = true;
          maybe_join(id);
        });
      });
      ++g.computed;
    }
    if (g.computed == g.stages.size() && !g.kv_counted) {
      g.kv_counted = true;
      const int64_t bytes = g.lead.input_tokens * kv_bytes_;
      totals_.transfer_bytes_kv += bytes;
      records_[lv.record].ledger.transfer_bytes =
          bytes + records_[lv.record].ledger.hit_tokens_remote.value_or(0) * kv_bytes_;
    }
  }

  void stage_done(uint64_t id, size_t s) {
    Group& g = groups_.at(id);
    const std::string& rid = records_[live_.at(id).record].request_id;
    if (s + 1 < g.stages.size()) {
      scheduler_->on_stage_done(names_[static_cast<size_t>(g.stages[s])], rid);
      return;
    }
    // The last stage's last chunk: the first token exists.
    Live& lv = live_.at(id);
    const int64_t now = clock_.now_ns();
    lv.prefill_done = true;
    lv.first_token_ns = now;
    replay::RequestRecord& rec = records_[lv.record];
    rec.ttft_ms = ns_to_ms(now - lv.arrival_ns);
    rec.ledger.prefill_ms = static_cast<double>(now - g.compute_start_ns) * 1e-6;
    rec.ledger.transfer_ms = static_cast<double>(g.compute_start_ns - g.first_start_ns) * 1e-6;
    const auto gpus = static_cast<double>(gpu_count_);
    const auto lead = static_cast<size_t>(g.stages[0]);
    totals_.prefill_gpu_s += g.busy_s * gpus;
    const double full_s = prefill_[lead]->compute_time_s(g.lead.input_tokens, 0);
    totals_.prefill_gpu_s_without_cache += full_s * gpus;
    totals_.prefill_gpu_s_saved += (full_s - g.busy_s) * gpus;
    const auto reused = static_cast<size_t>(g.lead.cached_tokens / block_);
    std::span<const uint64_t> keep(lv.keys);
    if (!lv.replicate) keep = keep.subspan(std::min(reused, keep.size()));
    cache_insert(lead, keep, std::span<const uint64_t>(lv.keys.data(), std::min(reused, lv.keys.size())));
    sched::PrefillReport rep;
    rep.request_id = rec.request_id;
    rep.instance_id = names_[static_cast<size_t>(g.stages[s])];
    rep.prefilled_tokens = g.lead.input_tokens - g.lead.cached_tokens;
    rep.reused_tokens = g.lead.cached_tokens;
    rep.prefill_ms = -1.0;  // a pipeline's span is no sample of one instance's pass
    scheduler_->on_prefill_done(rep);
    scheduler_->on_first_token(rec.request_id, *rec.ttft_ms);
    maybe_join(id);
  }

  // The job leaves the queue: re-check the planned prefix against the caches as they are now. A block
  // evicted since the decision is recomputed (it costs time, never correctness); remote blocks are
  // fetched from the instance holding the longest run of them.
  void plan_prefix(uint64_t id, PrefillJob& job) {
    Live& lv = live_.at(id);
    const auto self = static_cast<size_t>(lv.prefill);
    BlockCache& own = *caches_[self];
    const int64_t max_blocks = std::min<int64_t>(lv.planned_blocks, (job.input_tokens - 1) / block_);
    int64_t local = 0, remote = 0, blocks = 0;
    std::vector<int64_t> bytes_by_src(prefill_.size(), 0);
    int src = -1;
    for (int64_t i = 0; i < max_blocks; ++i) {
      const uint64_t k = lv.keys[static_cast<size_t>(i)];
      if (own.contains(k)) {
        ++local;
      } else if (cfg_.cache_mode == CacheMode::kGlobal) {
        if (src < 0 || !caches_[static_cast<size_t>(src)]->contains(k)) src = best_holder(lv.keys, i, self);
        if (src < 0) break;
        ++remote;
        bytes_by_src[static_cast<size_t>(src)] += block_ * kv_bytes_;
      } else {
        break;
      }
      ++blocks;
    }
    totals_.hit_tokens_lost += (lv.planned_blocks - blocks) * block_;
    job.cached_tokens = blocks * block_;
    job.fetches.clear();
    for (size_t s = 0; s < bytes_by_src.size(); ++s) {
      if (bytes_by_src[s] > 0) job.fetches.push_back(Fetch{static_cast<int>(s), bytes_by_src[s]});
    }
    job.local_load_s = static_cast<double>(local * block_ * kv_bytes_) / opt_.local_load_bytes_per_s;
    // Reading a block makes it recently used wherever it was read from.
    std::span<const uint64_t> used(lv.keys.data(), static_cast<size_t>(blocks));
    own.touch(used, blocks);
    for (const Fetch& f : job.fetches) caches_[static_cast<size_t>(f.src_nic)]->touch(used, blocks);

    replay::RequestRecord& rec = records_[lv.record];
    rec.ledger.hit_tokens_local = local * block_;
    rec.ledger.hit_tokens_remote = remote * block_;
    rec.ledger.avoided_prefill_tokens = blocks * block_;
    rec.ledger.decision = blocks > 0 ? "fetch" : "recompute";
    rec.ledger.queue_ms = ns_to_ms(clock_.now_ns() - lv.arrival_ns);
    InstanceReport& st = prefill_stats_[self];
    st.hit_tokens_local += local * block_;
    st.hit_tokens_remote += remote * block_;
    st.prompt_tokens += job.input_tokens;
    st.tokens += job.input_tokens - job.cached_tokens;
    totals_.prompt_tokens += job.input_tokens;
    totals_.hit_tokens_local += local * block_;
    totals_.hit_tokens_remote += remote * block_;
    totals_.transfer_bytes_prefix += remote * block_ * kv_bytes_;
  }

  // The holder (other than `self`) of keys[i] holding the longest run from i; -1 when none.
  int best_holder(const std::vector<uint64_t>& keys, int64_t i, size_t self) const {
    int best = -1;
    int64_t best_run = 0;
    for (size_t h = 0; h < caches_.size(); ++h) {
      if (h == self) continue;
      int64_t run = 0;
      while (i + run < static_cast<int64_t>(keys.size()) && caches_[h]->contains(keys[static_cast<size_t>(i + run)]))
        ++run;
      if (run > best_run ||
          (run == best_run && run > 0 && network_->active_flows(static_cast<int>(h)) < network_->active_flows(best))) {
        best = static_cast<int>(h);
        best_run = run;
      }
    }
    return best;
  }

  // Layer-wise streaming of the prompt's KV to the decode instance, from the start of the compute.
  void stream_kv(uint64_t id, const PrefillJob& job) {
    Live& lv = live_.at(id);
    const int64_t bytes = job.input_tokens * kv_bytes_;
    totals_.transfer_bytes_kv += bytes;
    const int dst = static_cast<int>(prefill_.size()) + lv.decode;
    records_[lv.record].ledger.transfer_bytes =
        bytes + records_[lv.record].ledger.hit_tokens_remote.value_or(0) * kv_bytes_;
    network_->start_flow(lv.prefill, dst, bytes, [this, id](int64_t) {
      Live& l = live_.at(id);
      l.kv_arrived = true;
      maybe_join(id);
    });
  }

  void prefill_done(uint64_t id, const PrefillJob& job) {
    Live& lv = live_.at(id);
    const auto self = static_cast<size_t>(lv.prefill);
    const int64_t now = clock_.now_ns();
    lv.prefill_done = true;
    lv.first_token_ns = now;
    replay::RequestRecord& rec = records_[lv.record];
    // Time yielded to other jobs (preemption at chunk boundaries) is waiting, not computing: the ledger's queue.
    const double compute_s = static_cast<double>(now - job.compute_start_ns - job.preempted_ns) * 1e-9;
    const double fetch_s = static_cast<double>(job.compute_start_ns - job.start_ns) * 1e-9;
    rec.ttft_ms = ns_to_ms(now - lv.arrival_ns);
    rec.ledger.prefill_ms = compute_s * 1e3;
    if (job.preempted_ns > 0) rec.ledger.queue_ms = rec.ledger.queue_ms.value_or(0) + ns_to_ms(job.preempted_ns);
    rec.ledger.transfer_ms = fetch_s * 1e3;
    const auto g = static_cast<double>(gpu_count_);
    totals_.prefill_gpu_s += compute_s * g;
    const double full_s = prefill_[self]->compute_time_s(job.input_tokens, 0);
    totals_.prefill_gpu_s_without_cache += full_s * g;
    totals_.prefill_gpu_s_saved += (full_s - compute_s) * g;

    // Keep the new complete blocks (and the fetched prefix when the scheduler asked for a replica). The job that
    // starts next here reads its planned prefix right after: its blocks here are used now, not evicted by this insert.
    if (const PrefillJob* next = prefill_[self]->next_job(); next != nullptr) {
      auto it = live_.find(next->request);
      if (it != live_.end()) caches_[self]->touch(it->second.keys, it->second.planned_blocks);
    }
    const auto reused = static_cast<size_t>(job.cached_tokens / block_);
    std::span<const uint64_t> keep(lv.keys);
    if (!lv.replicate) keep = keep.subspan(std::min(reused, keep.size()));
    cache_insert(self, keep, std::span<const uint64_t>(lv.keys.data(), std::min(reused, lv.keys.size())));

    sched::PrefillReport rep;
    rep.request_id = rec.request_id;
    rep.instance_id = names_[self];
    rep.prefilled_tokens = job.input_tokens - job.cached_tokens;
    rep.reused_tokens = job.cached_tokens;
    // A negative time is ignored by the refit (predictors.hpp) while the ledger still closes the job.
    rep.prefill_ms = opt_.refit_predictors ? compute_s * 1e3 : -1.0;
    const int64_t local_bytes = rec.ledger.hit_tokens_local.value_or(0) * kv_bytes_;
    const int64_t remote_bytes = rec.ledger.hit_tokens_remote.value_or(0) * kv_bytes_;
    if (opt_.refit_predictors) {
      rep.transfer_bytes[static_cast<int>(sched::PathClass::kSameHost)] = local_bytes;
      rep.transfer_ns[static_cast<int>(sched::PathClass::kSameHost)] = seconds_to_ns(job.local_load_s);
      rep.transfer_bytes[static_cast<int>(sched::PathClass::kRemote)] = remote_bytes;
      rep.transfer_ns[static_cast<int>(sched::PathClass::kRemote)] = seconds_to_ns(fetch_s - job.local_load_s);
    }
    scheduler_->on_prefill_done(rep);
    scheduler_->on_first_token(rec.request_id, *rec.ttft_ms);
    maybe_join(id);
  }

  // Inserts `chain` into a prefill instance's cache and tells the index (stored, then removed).
  // `protect` (already present) is touched after the insert so it is not the eviction victim.
  void cache_insert(size_t inst, std::span<const uint64_t> chain, std::span<const uint64_t> protect) {
    stored_.clear();
    removed_.clear();
    BlockCache& c = *caches_[inst];
    c.touch(protect, static_cast<int64_t>(protect.size()));
    c.insert(
        chain, [this](uint64_t k) { stored_.push_back(k); }, [this](uint64_t k) { removed_.push_back(k); });
    publish(inst, proto::kKvEventStored, stored_);
    publish(inst, proto::kKvEventRemoved, removed_);
  }

  void publish(size_t inst, const char* type, const std::vector<uint64_t>& keys) {
    if (keys.empty()) return;
    proto::KvEvent ev;
    ev.type = type;
    ev.event_id = ++stream_event_ids_[inst];
    ev.ts_unix_ms = clock_.now_ms();
    ev.seq_hashes = keys;
    ev.backend_id = names_[inst];
    ev.medium = "cpu";
    Status s = scheduler_->apply_event(ev, names_[inst]);
    if (!s.is_ok()) status_ = s.with_context("applying a simulated KV event");
  }

  void maybe_join(uint64_t id) {
    Live& lv = live_.at(id);
    if (!lv.reserved || !lv.kv_arrived || !lv.prefill_done) return;
    DecodeJob job;
    job.request = id;
    job.context_tokens = records_[lv.record].input_tokens;
    job.decode_tokens = lv.output_tokens - 1;
    job.first_token_ns = lv.first_token_ns;
    decode_[static_cast<size_t>(lv.decode)]->join(job, [this, id](const DecodeResult& r) { finish(id, r); });
  }

  void finish(uint64_t id, const DecodeResult& r) {
    Live& lv = live_.at(id);
    replay::RequestRecord& rec = records_[lv.record];
    rec.output_tokens = 1 + r.tokens;
    rec.output_tokens_source = "usage";
    rec.e2e_ms = ns_to_ms(r.last_token_ns - lv.arrival_ns);
    rec.tbt = replay::tbt_stats(r.gaps_ms);
    rec.tpot_ms = replay::tpot_ms(rec.ttft_ms, rec.e2e_ms, *rec.output_tokens);
    decode_[static_cast<size_t>(lv.decode)]->release(lv.reserve_tokens);
    ++decode_jobs_[static_cast<size_t>(lv.decode)];
    scheduler_->on_request_done(rec.request_id);
    write_record(rec);
    live_.erase(id);
    groups_.erase(id);
  }

  void write_record(const replay::RequestRecord& rec) {
    if (opt_.records_jsonl != nullptr) *opt_.records_jsonl << replay::to_json(rec).dump() << '\n';
  }

  const SimOptions& opt_;
  ClusterConfig cfg_;
  const CostModel& model_;
  int64_t gpu_count_;
  ManualClock clock_;
  EventQueue events_;
  int64_t kv_bytes_;
  int64_t block_;
  std::unique_ptr<Network> network_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::vector<std::unique_ptr<PrefillInstance>> prefill_;
  std::vector<std::unique_ptr<BlockCache>> caches_;
  std::vector<InstanceReport> prefill_stats_;
  std::vector<std::unique_ptr<DecodeInstance>> decode_;
  std::vector<int64_t> decode_jobs_ = std::vector<int64_t>(static_cast<size_t>(cfg_.decode_instances), 0);
  std::vector<std::string> names_;  // prefill 0..P-1, then decode
  std::unordered_map<std::string, int> ids_;
  std::vector<uint64_t> stream_event_ids_;
  std::vector<uint64_t> stored_, removed_;
  std::unordered_map<uint64_t, Live> live_;
  std::unordered_map<uint64_t, Group> groups_;  // pipelined prefills by live id (erased with the request)
  int64_t pipelined_ = 0;
  uint64_t next_live_ = 1;
  std::vector<replay::RequestRecord> records_;
  SimTotals totals_;
  Windowed* window_ = nullptr;
  bool arrivals_done_ = false;
  int64_t arrived_ = 0;
  Status status_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

Status TraceWindow::validate() const {
  if (!(start_s >= 0)) return error(Code::kInvalidArgument, "--start-s must be >= 0");
  if (!(duration_s >= 0)) return error(Code::kInvalidArgument, "--duration-s must be >= 0 (0: to the end)");
  if (max_requests < 0) return error(Code::kInvalidArgument, "--max-requests must be >= 0 (0: no limit)");
  if (!(rate_scale > 0) || !std::isfinite(rate_scale)) return error(Code::kInvalidArgument, "--rate-scale must be > 0");
  return Status::ok();
}

Result<std::unique_ptr<RequestSource>> open_trace(const std::string& path, trace::ReaderOptions options) {
  if (options.source_name == "-" && path != "-") options.source_name = path;
  MC_ASSIGN_OR_RETURN(std::unique_ptr<trace::Reader> reader, trace::Reader::open(path, options));
  return std::unique_ptr<RequestSource>(std::make_unique<ReaderSource>(std::move(reader)));
}

std::unique_ptr<RequestSource> vector_source(const std::vector<trace::Request>& rows) {
  return std::make_unique<VectorSource>(rows);
}

Result<std::vector<trace::Request>> load_window(RequestSource& source, const TraceWindow& window) {
  MC_RETURN_IF_ERROR(window.validate());
  Windowed w(source, window);
  std::vector<trace::Request> rows;
  while (true) {
    MC_ASSIGN_OR_RETURN(std::optional<trace::Request> row, w.next());
    if (!row) break;
    rows.push_back(std::move(*row));
  }
  return rows;
}

double SimTotals::hit_ratio() const {
  return prompt_tokens > 0
             ? static_cast<double>(hit_tokens_local + hit_tokens_remote) / static_cast<double>(prompt_tokens)
             : 0.0;
}

Result<std::unique_ptr<CostModel>> make_infer_cost_model(const std::string& model, const std::string& gpu) {
  MC_ASSIGN_OR_RETURN(model::ModelConfig m, model::load_model(model));
  MC_ASSIGN_OR_RETURN(model::GpuSpec g, model::gpu_preset(gpu));
  return std::unique_ptr<CostModel>(std::make_unique<InferCostModel>(std::move(m), std::move(g)));
}

Result<SimResult> simulate_with(const SimOptions& options, RequestSource& source, const CostModel& model,
                                int64_t gpu_count, const replay::SummaryOptions& summary_options) {
  MC_RETURN_IF_ERROR(options.cluster.validate());
  MC_RETURN_IF_ERROR(options.window.validate());
  if (options.cluster.decode_kv_capacity_tokens <= 0) {
    return error(Code::kInvalidArgument, "decode_kv_capacity_tokens must be set (> 0) when the cost model is injected");
  }
  if (!(options.local_load_bytes_per_s > 0) || options.heartbeat_ms < 1) {
    return error(Code::kInvalidArgument, "local_load_bytes_per_s must be > 0 and heartbeat_ms >= 1");
  }
  Sim sim(options, model, gpu_count);
  MC_RETURN_IF_ERROR(sim.init());
  return sim.run(source, summary_options);
}

Result<SimResult> simulate(const SimOptions& options, RequestSource& source,
                           const replay::SummaryOptions& summary_options) {
  MC_ASSIGN_OR_RETURN(model::ModelConfig m, model::load_model(options.cluster.model));
  MC_ASSIGN_OR_RETURN(model::GpuSpec g, model::gpu_preset(options.cluster.gpu));
  SimOptions opt = options;
  if (opt.cluster.decode_kv_capacity_tokens <= 0) {
    // HBM left after the weights, 90 % of it usable for KV (node_capacity.hpp: the launcher sizes live instances
    // with the same formula).
    MC_ASSIGN_OR_RETURN(opt.cluster.decode_kv_capacity_tokens, decode_kv_capacity_tokens(m, g));
  }
  InferCostModel model(m, g);
  return simulate_with(opt, source, model, g.gpu_count, summary_options);
}

}  // namespace mc::sim
