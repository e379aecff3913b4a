// The Conductor's decision procedure (paper §6–7; DESIGN.md §3 step 2), as pure code: the cluster
// state, the prefix index and the predictors are owned here, time comes from an injected mc::Clock,
// and nothing here does I/O, sleeps or starts threads. The daemon (mc-conductor) and the simulator
// (eval/sim) drive the same object: register/heartbeat/expire, apply KV events, decide, commit,
// and feed back job reports.
//
// decide(request):
//  1. validate; look the request's block hashes up in the prefix index once;
//  2. price every live prefill instance (PrefillEstimate): for each k in 0..longest pool prefix,
//     TTFT(k) = queue + prefill(input - k*B, k*B) + sum over blocks < k of transfer by the block's
//     cheapest path class from that host (same host 0-copy-ish, remote pool, SSD); keep the best k
//     (k = 0 is recompute: a short prefix can cost more to move than to recompute). A remote block is
//     read from its holder with the fastest measured path to the instance's host, and the remote part
//     costs fixed + sum over source hosts of (that host's send backlog + bytes) / path bandwidth: a link
//     measured slow, or a sender already loaded with the fetches placed on it, turns fetches into
//     recomputes or into reads of a nearer replica (DESIGN.md §16 "Bandwidth decides, live");
//     A pending prefix (SchedulerConfig::pending_prefix) extends the pool's prefix on one instance: the blocks an
//     accepted request queued or running there will compute, which this request reads from that host's memory once
//     it has run, since it queues behind it there (its queue key is never below that request's); DESIGN.md §10;
//     The queue term is priced under the queue discipline in force (queue_discipline.hpp, --queue): the work ahead
//     of the job's place in the instance's order; the chosen instance's prediction adds the work expected to
//     overtake it later (slo), bounded by its slack;
//  3. the policy chooses the prefill instance;
//  4. for each live decode instance predict, at the time this prefill finishes, the batch, the KV
//     reserved (input + output tokens of every request still running then: future growth counted)
//     and the step time with this request added; take the feasible one with the smallest TBT;
//  5. early rejection: reject when TTFT > SLO, or TTFT > the target (1 - slo_headroom) x SLO with a predicted wait
//     over slo_headroom x SLO (ttft_admissible), or (kvcache) when its service x the load ratio passes
//     shed_limit x SLO (load shedding, DESIGN.md §10), or no decode instance meets TBT / fits the KV
//     (with early rejection off only impossible requests are rejected: KV larger than any decode
//     instance's capacity, or no live instance);
//  6. hot prefix: when the instance holding the longest prefix on its own host is overloaded and
//     the chosen one fetches that prefix from the pool, replicate_prefix is set.
// decide() changes nothing but the policy's own state; commit() books an accepted decision into
// the ledgers (queue and decode reservations) so the next decision sees it.
//
// Thread-safety: none (one owner). Errors: Status values, never aborts on bad input.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/common/status.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/sched/cluster_state.hpp"
#include "mc/sched/policy.hpp"
#include "mc/sched/predictors.hpp"
#include "mc/sched/prefix_index.hpp"
#include "mc/sched/queue_discipline.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

// A finished prefill, from the worker's job report (DESIGN.md §5 ledger).
struct PrefillReport {
  std::string request_id;
  std::string instance_id;
  int64_t prefilled_tokens = 0;                      // computed
  int64_t reused_tokens = 0;                         // loaded from cache
  double prefill_ms = 0;                             // compute time only
  int64_t transfer_bytes[kNumTransferClasses] = {};  // by PathClass
  int64_t transfer_ns[kNumTransferClasses] = {};
  bool ok = true;  // false: failed; the ledger entry is dropped
  // The host every remote byte of transfer_bytes[kRemote] came from, when it was one host: a sample of the
  // path from there to the instance's host. Empty: no path sample (several sources, or none).
  std::string remote_source_host{};
};

// One measured decode step on a decode instance: its batch, the context tokens of that batch and its time.
struct DecodeStepReport {
  std::string instance_id;
  int64_t batch_requests = 0;
  int64_t context_tokens = 0;
  double step_ms = 0;
};

struct SchedulerCounters {
  uint64_t decisions = 0;
  uint64_t accepted = 0;
  uint64_t rejected[static_cast<size_t>(kLastRejectReason) + 1] = {};  // by RejectReason
  uint64_t fetch = 0;                                                  // accepted with reused_blocks > 0
  uint64_t recompute = 0;                                              // accepted with reused_blocks == 0
  uint64_t fetch_remote = 0;      // of fetch: some blocks read from another host's memory
  uint64_t recompute_cached = 0;  // of recompute: the pool held a reusable prefix, recomputing was priced cheaper
  uint64_t replicate = 0;
  uint64_t fetch_pending = 0;  // of fetch: some reused blocks are a pending prefix on the chosen instance
  uint64_t expired_instances = 0;
  uint64_t refused_decode_steps = 0;  // decode step samples above the plausibility gate (on_decode_steps)
  uint64_t path_samples = 0;          // remote fetches measured on one (source host, instance host) path
  uint64_t path_caps = 0;             // path estimates lowered by a fetch still running (on_fetch_progress)
};

class Scheduler {
 public:
  // kInvalidArgument for an unknown policy or a non-positive block size / KV size.
  static Result<std::unique_ptr<Scheduler>> create(SchedulerConfig config, const Clock* clock,
                                                   PrefillCostPrior prefill_prior = {},
                                                   DecodeCostPrior decode_prior = {},
                                                   BandwidthPriors bandwidth_priors = {});

  // ---- registry and liveness ----
  // Registers (or re-registers) an instance; its own cache backend is placed on its host.
  Status register_instance(const InstanceInfo& info);
  Status heartbeat(const std::string& id, const LoadReport& load);
  // Removes instances silent past heartbeat_timeout_ms and every block cached by their own backend
  // (InstanceInfo::backend_id); storage segments go when the store says so (events / resync).
  // Returns their ids.
  std::vector<std::string> expire();
  Status remove_instance(const std::string& id);
  // The instance drains (conductor.drain): decide() places nothing new on it from now on; it stays registered
  // with its ledger (ClusterState::set_draining). kNotFound for an unregistered id.
  Status drain_instance(const std::string& id);
  // A storage segment (KV-event backend) and its host: same-host pricing for instances there.
  void set_backend_host(const std::string& backend_id, const std::string& host);

  // ---- prefix index ----
  Status apply_event(const proto::KvEvent& event, const std::string& stream = "");

  // ---- decisions ----
  Decision decide(const Request& request);
  // Books an accepted decision into the ledgers at now; no-op for a rejected one.
  void commit(const Request& request, const Decision& decision);
  // decide + commit.
  Decision schedule(const Request& request);

  // ---- feedback ----
  // Refits the prefill model and the bandwidth estimates, and ends the request's fetches in the send backlog.
  void on_prefill_done(const PrefillReport& report);
  // One stage of a pipelined prefill finished its last chunk (Decision::stages): its ledger entry ends. The
  // request's prefill report (on_prefill_done, from the last stage, with prefill_ms < 0: a pipeline's span is no
  // sample of one instance's pass) closes the rest.
  void on_stage_done(const std::string& instance_id, const std::string& request_id);
  // A measured decode step: its predicted step time (before the refit) against the measured one goes into
  // decode_step_error(), then the decode predictor refits. Ignored when the batch is empty or a figure is
  // negative or not finite. Same as on_decode_steps() with one step.
  void on_decode_step(const DecodeStepReport& report);
  // The steps of one heartbeat. A step above the decode model's envelope (predictors.hpp DecodePredictor: 4x
  // the cost model's prior, or 50 ms a step more) is refused and counted (SchedulerCounters::
  // refused_decode_steps), never refitted, and no prediction exceeds the envelope either: neither an absurd
  // sample (a worker's bug, a forged heartbeat) nor any run of plausible-looking ones can price every decode
  // step out of the TBT SLO. Who may send heartbeats at all is issue 18's (keys bound to instance ids).
  void on_decode_steps(std::span<const DecodeStepReport> reports);
  // A prefill instance's heartbeat says `request_id`'s prefix fetch has been running for elapsed_ns: when the
  // request reads its remote blocks from one source host, that path moved its bytes no faster than
  // bytes / elapsed, and its estimate is capped there (BandwidthEstimator::cap_path; counted in path_caps).
  // Without this a link slowed down is learnt only when its slow fetches end. Ignored for an unknown request,
  // another instance's request, or elapsed_ns <= 0.
  void on_fetch_progress(const std::string& instance_id, const std::string& request_id, int64_t elapsed_ns);
  // The first token reached the client: actual TTFT (ms since submit) against the prediction.
  void on_first_token(const std::string& request_id, double actual_ttft_ms);
  // The request finished (or failed) on its decode instance: its reservation is released.
  void on_request_done(const std::string& request_id);

  // ---- inspection ----
  const ClusterState& cluster() const { return cluster_; }
  ClusterState& cluster() { return cluster_; }
  const PrefixIndex& index() const { return index_; }
  PrefixIndex& index() { return index_; }
  const PrefillPredictor& prefill_predictor() const { return prefill_; }
  const DecodePredictor& decode_predictor() const { return decode_; }
  const BandwidthEstimator& bandwidth() const { return bandwidth_; }
  const PredictionErrorStats& ttft_error() const { return ttft_error_; }
  const PredictionErrorStats& decode_step_error() const { return decode_error_; }
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerConfig& config() const { return config_; }
  // The queue discipline in force (config().queue.discipline, or the policy's default).
  QueueDiscipline queue_discipline() const { return discipline_; }
  // Whether pending prefixes are priced (config().pending_prefix, or the policy's default).
  bool pending_prefix() const { return pending_prefix_; }
  // The load-priced placement's weight in force: config().placement_load_weight for kvcache, 0 for the baselines
  // (they do not price TTFT, so no weight is computed or logged for them).
  double placement_load_weight() const { return config_.policy == "kvcache" ? config_.placement_load_weight : 0.0; }
  // The SLO headroom in force: config().slo_headroom for kvcache, 0 for the baselines (the paper's admission rule).
  double slo_headroom() const { return config_.policy == "kvcache" ? config_.slo_headroom : 0.0; }
  // The load-shedding limit in force: config().shed_limit for kvcache, 0 (never) for the baselines.
  double shed_limit() const { return config_.policy == "kvcache" ? config_.shed_limit : 0.0; }
  // Every live prefill instance as the last decide() priced it, in registration order: the policy's input
  // (empty when that decision was rejected before pricing). Valid until the next decide().
  std::span<const PrefillEstimate> last_estimates() const { return estimates_; }
  const Clock& clock() const { return *clock_; }
  // Predicted queue time of a prefill instance now (ms).
  double queue_ms(const Instance& inst) const;
  // Bytes placed on a source host's send backlog whose predicted fetch has not ended at now_ns.
  int64_t send_backlog_bytes(uint32_t host, int64_t now_ns) const;
  // Requests accepted and not yet done.
  size_t in_flight() const { return in_flight_.size(); }
  // Blocks registered as a pending prefix (computed by an accepted request whose prefill has not reported yet).
  size_t pending_prefix_blocks() const { return pending_.size(); }
  bool is_in_flight(const std::string& request_id) const { return in_flight_.count(request_id) != 0; }

 private:
  Scheduler(SchedulerConfig config, const Clock* clock, std::unique_ptr<Policy> policy, PrefillCostPrior prefill_prior,
            DecodeCostPrior decode_prior, BandwidthPriors bandwidth_priors);

  // The cheapest "reuse the first k blocks" plan for one host (queue excluded: it is additive).
  struct HostPlan {
    int64_t reused_blocks = 0;
    double cost_ms = 0;  // prefill + transfer
    double prefill_ms = 0;
    double transfer_ms = 0;
    int64_t blocks_by_class[4] = {0, 0, 0, 0};
    int64_t transfer_bytes = 0;
    int64_t longest_same_host_blocks = 0;
    std::vector<SourceBytes> remote_sources;  // at reused_blocks
  };
  struct InFlight {
    std::string prefill_id, decode_id;
    double predicted_ttft_ms = 0;
    int64_t decided_at_ns = 0;
    bool first_token_seen = false;
    std::vector<uint32_t> send_hosts;      // hosts whose send backlog holds this request's fetch
    std::vector<std::string> stage_ids;    // a pipelined prefill's stages after the first (their ledgers)
    std::vector<uint64_t> pending_hashes;  // the blocks it registered as a pending prefix (pending_)
  };
  // A block an accepted request computes on its prefill instance and no prefill report has closed yet. The ids are
  // shared by every block of the request (one copy each, however long the prompt).
  struct PendingBlock {
    std::shared_ptr<const std::string> instance_id;
    std::shared_ptr<const std::string> request_id;
    int64_t queue_key_ns = 0;  // that request's queue key there: a request reusing the block queues behind it
  };
  // One accepted fetch on a source host's send backlog: its bytes until its predicted end (the prefill's
  // queue plus its transfer after the decision).
  struct SendEntry {
    std::string request_id;
    int64_t bytes = 0;
    int64_t end_ns = 0;
  };
  // The decision procedure by step (see decide() above); each step reads what the previous one left in the
  // scratch members below.
  // The decode instance to take, or why none is (reject_reason, why) when `estimate` is null.
  struct DecodePick {
    const DecodeEstimate* estimate = nullptr;  // into decode_scratch_
    RejectReason reject_reason = RejectReason::kNone;
    std::string why;
  };
  // Marks `d` rejected with `reason` and `why`, counts it, and returns it.
  Decision reject(Decision& d, RejectReason reason, std::string why);
  // Validation: why `request` cannot be decided on (kInvalidRequest), nullopt when it can.
  std::optional<std::string> request_problem(const Request& request) const;
  // Step 1: looks the request's block hashes up once (lookup_) and fills block_class_scratch_ (each leading
  // block's cheapest class from a host holding none of it in memory) and hosts_scratch_ (the hosts holding
  // some of them in memory). Returns how many leading blocks may be reused (one token is always prefilled).
  int64_t look_up_prefix(const Request& request);
  // Step 1b (pending prefixes on): the blocks after the pool's prefix that one instance's queued or running request
  // computes, into pending_instance_ / pending_run_ / pending_keys_ (run 0: none).
  void look_up_pending(const Request& request, int64_t now_ns);
  // Registers the blocks an accepted single-instance decision computes (commit), and drops a request's registration.
  void book_pending(const Request& request, const Decision& d, InFlight& f);
  void forget_pending(const std::string& request_id, std::vector<uint64_t>& hashes);
  // The cheapest "reuse the first k <= max_reuse blocks" plan from `host` (kUnknownHost: a host holding none and
  // no path estimate: the generic plan).
  HostPlan plan_for_host(const Request& request, uint32_t host, int64_t max_reuse, int64_t now_ns) const;
  // Remote fetches are priced per source host (path bandwidth, send backlog) once a path is measured or a fetch
  // is booked; before, by the remote class alone (the same figures, computed the cheaper way).
  bool priced_by_path() const { return bandwidth_.has_paths() || !send_backlog_.empty(); }
  // Drops `request_id`'s entries from the send backlogs of the hosts in `hosts`.
  void end_sends(const std::string& request_id, const std::vector<uint32_t>& hosts);
  // Step 2a: e's queue figures on `inst` under the discipline for a job of service_ms (queue_discipline.hpp).
  // not_before_key_ns: a pending prefix's request on `inst`, which this job must queue behind (INT64_MIN: none).
  void price_queue(const Instance& inst, int64_t now_ns, double service_ms, double slo_ttft_ms,
                   int64_t not_before_key_ns, PrefillEstimate& e) const;
  // Step 2: one PrefillEstimate per live prefill instance into estimates_ (plans shared by host).
  void price_prefill_instances(const Request& request, int64_t now_ns, int64_t max_reuse);
  // Step 3: the policy's choice among estimates_ into d.prefill (and the logged candidates).
  void choose_prefill(const Request& request, Decision& d);
  // Step 3b (PipelineConfig): a group of the config's size over the live instances with the shortest queues,
  // priced by the pipeline recursion (mc/model/pipeline.hpp, DESIGN.md §18); replaces d's single instance when
  // its TTFT is smaller. Nothing for a prompt of one chunk or with fewer live instances than the group.
  void consider_pipeline(const Request& request, Decision& d) const;
  // Step 6: sets d.best_holder_id and d.replicate_prefix; returns the instance whose host holds the longest
  // prefix (null when none does).
  const PrefillEstimate* mark_hot_prefix(Decision& d) const;
  // The prefill half of the decision's reason: the chosen instance's TTFT breakdown (and the replication).
  std::string explain_prefill(const Decision& d, const PrefillEstimate* holder) const;
  std::string explain_single(const Decision& d, const PrefillEstimate* holder, int64_t pool_len) const;
  // Step 4: every live decode instance at `start_ns`, when the chosen prefill finishes, into decode_scratch_.
  void predict_decode_instances(const Request& request, int64_t now_ns, int64_t start_ns, double slo_tbt_ms);
  // Step 5b: the feasible decode instance with the smallest TBT, or (early rejection off) the best that fits.
  DecodePick pick_decode(const Request& request, double slo_tbt_ms) const;
  // Marks `d` accepted on `pick` (commit() books it), writes the reason, counts it, and returns it.
  Decision accept(Decision& d, const DecodeEstimate& pick, const std::string& prefill_why);
  DecodeEstimate predict_decode(const Request& request, const Instance& inst, int64_t start_ns,
                                double slo_tbt_ms) const;
  void drop_instance_blocks(const Instance& inst);

  SchedulerConfig config_;
  QueueDiscipline discipline_ = QueueDiscipline::kFcfs;
  bool pending_prefix_ = false;  // config().pending_prefix, or the policy's default
  const Clock* clock_;
  std::unique_ptr<Policy> policy_;
  ClusterState cluster_;
  PrefixIndex index_;
  PrefillPredictor prefill_;
  DecodePredictor decode_;
  BandwidthEstimator bandwidth_;
  PredictionErrorStats ttft_error_;
  PredictionErrorStats decode_error_;  // predicted vs measured decode step ms
  SchedulerCounters counters_;
  std::unordered_map<std::string, InFlight> in_flight_;
  std::unordered_map<uint32_t, std::vector<SendEntry>> send_backlog_;  // by source host index
  std::unordered_map<uint64_t, PendingBlock> pending_;                 // by block hash (the first registrant's)
  // The latest arrivals booked on each prefill instance (QueueConfig::overtake_history of them), for the overtaking
  // estimate of the slo order (queue_discipline.hpp expected_overtake_ms).
  std::unordered_map<std::string, std::deque<QueueArrival>> arrivals_;
  // scratch, reused by decide()
  std::vector<std::span<const Holder>> lookup_;
  std::vector<PathClass> block_class_scratch_;
  std::vector<PrefillEstimate> estimates_;
  std::vector<uint32_t> hosts_scratch_;
  std::vector<std::pair<uint32_t, HostPlan>> plans_scratch_;
  std::vector<DecodeEstimate> decode_scratch_;
  // Mean predicted service (prefill + transfer, ms) of the recent single-instance jobs booked (an exponential moving
  // average over about 100 jobs; 0 before the first): the scale of PlacementContext::service_weight.
  double service_ewma_ms_ = 0;
  int64_t service_samples_ = 0;
  double single_service_ms_ = 0;  // decide(): the chosen single instance's service (load shedding's price)  // jobs in
                                  // service_ewma_ms_: load shedding waits for kShedMinSamples of them
  int64_t max_reuse_ = 0;         // the current decision's reusable prefix (blocks)
  double ttft_target_ms_ = 0;     // the current decision's TTFT target (Decision::ttft_target_ms)
  std::string pending_instance_;  // the current decision's pending prefix: its instance,
  int64_t pending_run_ = 0;       // its blocks after the pool's prefix (0: none),
  // and, for each of them, the largest queue key of the requests computing it and the blocks before it there
  std::vector<int64_t> pending_keys_;
  std::optional<HostPlan> pending_plan_;  // that instance's plan (the pool's prefix plus the pending blocks)
  struct PlanSource {
    uint32_t host;
    int64_t bytes;
    double bytes_per_s;
    int64_t backlog;
  };
  mutable std::vector<PlanSource> sources_scratch_;  // plan_for_host's remote bytes by source host
  std::optional<HostPlan> generic_plan_;             // the plan of hosts without a plan of their own
  std::vector<const HostPlan*> estimate_plans_;      // estimates_[i]'s plan (into plans_scratch_ / generic_plan_)
};

}  // namespace mc::sched
