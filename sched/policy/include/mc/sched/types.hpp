// Vocabulary of the Conductor's policy library (mc_sched): media, path classes, the request as the
// scheduler sees it, the configuration, and the Decision with its reasons and predictions.
//
// Units: times in milliseconds (double) unless the name says _ns; sizes in bytes; lengths in tokens.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/medium.hpp"
#include "mc/common/status.hpp"

namespace mc::sched {

// Where a cached KV block lives: mc::Medium (mc/common/medium.hpp), found here by ordinary lookup.

// How a prefill instance obtains one block of a cached prefix, cheapest first.
//   kSameHost  : the block is in memory (GPU or DRAM) on the prefill instance's own host
//   kRemote    : in memory on another host of the pool (RDMA / TCP through the transfer engine)
//   kSsd       : only on a disk tier somewhere in the pool
//   kRecompute : nowhere usable; the prefill computes it
enum class PathClass : uint8_t { kSameHost = 0, kRemote = 1, kSsd = 2, kRecompute = 3 };
inline constexpr int kNumTransferClasses = 3;   // kSameHost, kRemote, kSsd
std::string_view path_class_name(PathClass c);  // "same_host" | "remote" | "ssd" | "recompute"

enum class Role : uint8_t { kPrefill = 0, kDecode = 1 };
std::string_view role_name(Role r);  // "prefill" | "decode"
Result<Role> parse_role(std::string_view s);

// A request as the scheduler sees it (DESIGN.md §3 step 1). block_hashes are the prefix-chained
// seq hashes (block_key.hpp) of the request's *complete* blocks, in order; a trailing partial block
// has no key and is always prefilled.
struct Request {
  std::string request_id;
  int64_t input_tokens = 0;   // prompt length, >= 1
  int64_t output_tokens = 0;  // tokens to generate, >= 0 (reserved on the decode instance)
  std::vector<uint64_t> block_hashes;
  double slo_ttft_ms = 0;  // 0: use SchedulerConfig::slo.ttft_ms
  double slo_tbt_ms = 0;   // 0: use SchedulerConfig::slo.tbt_ms
  // A new decision for an accepted request whose attempt was lost (the Conductor's re-dispatch, slo_ttft_ms then its
  // remaining budget): it was admitted already, so load shedding does not turn it away.
  bool redispatch = false;
};

struct SloConfig {
  double ttft_ms = 30'000;  // paper §8: TTFT <= 30 s
  double tbt_ms = 100;      // paper: 100 / 200 / 300 ms; compared with the predicted decode step time
  // Prediction-based early rejection (paper §7.?, "early rejection based on prediction"). When false,
  // a request is rejected only when it cannot run at all (no live instance, or its KV does not fit in
  // any decode instance even when empty); otherwise it is placed on the best pair even if it will
  // miss its SLO. Switch off to measure what early rejection buys.
  bool early_reject = true;
};

// Shape of the model's KV cache and of the keyed blocks.
struct KvShape {
  int64_t kv_bytes_per_token = 327'680;  // LLaMA3-70B BF16: 2*80*8*128*2 (DESIGN.md §1)
  int64_t block_size_tokens = 512;       // tokens per keyed block (the traces' 512)
  int64_t block_bytes() const { return kv_bytes_per_token * block_size_tokens; }
};

// Chunked pipeline parallelism (DESIGN.md §18): a long prompt may run on a group of group_size prefill instances,
// the model's layers split evenly into that many stages (mc/model/pipeline.hpp gives the recursion). The group is
// formed per request from the live instances with the shortest queues, in registration order. It is chosen only
// when every rule below holds (DESIGN.md §18 (a)-(e)): a group occupies X instances and idles them in its fill and
// bubbles, so a small gain for one request costs the requests behind it more (docs/REPRODUCTION.md §6). A prompt
// of one chunk never runs on a group.
struct PipelineConfig {
  int64_t group_size = 1;                  // instances per group; <= 1: off
  int64_t chunk_tokens = 8192;             // most new tokens of one chunk
  int64_t model_layers = 80;               // LLaMA3-70B
  int64_t hidden_bytes_per_token = 16384;  // activations crossing a stage boundary per token (8192 x BF16)
  double link_bytes_per_s = 25e9;          // between consecutive stages (200 Gbit/s)
  double link_latency_ms = 0.02;           // fixed cost of one crossing
  double min_ttft_gain = 0.3;              // fraction of the single instance's TTFT a group must save
  // The least fraction of the members' held time (from each one's queue end to its last chunk) spent computing:
  // the rest is the pipeline's fill, its bubbles, and a member with a short queue waiting for one with a long one.
  // Less: no group (a prompt of few chunks on many stages wastes most of them).
  double min_efficiency = 0.7;
  // The longest member queue (with its share of the prefix fetch), as a fraction of the group's own prefill span;
  // longer: no group (a group on busy members idles them while the queues behind them grow).
  double max_queue_fraction = 0.5;
  // Instances about free (by the rule above) needed, as a multiple of the group size: the group's members and as
  // many again for the requests arriving while it holds them. 1: the members only.
  double reserve_factor = 2.0;
  // The group's waste (its members' held time minus their compute: fill, bubbles, waiting for a slower member) must
  // cost less than this request gains, times this weight: the queues behind the members pay for that waste.
  double waste_weight = 1.0;
};

// Queue discipline of the prefill instances (queue_discipline.hpp; DESIGN.md §10 "Queue discipline").
enum class QueueDiscipline : uint8_t { kFcfs = 0, kSlo = 1 };

struct QueueConfig {
  std::string discipline;     // "fcfs" | "slo"; "": the policy's default (slo for kvcache, fcfs for the baselines)
  double aging_weight = 4.0;  // slo: key = now + aging_weight x predicted service (ms); >= 0 (0: FCFS with the guard)
  double guard_ms = 3'000;    // slo: slack kept before each queued job's deadline (ms); >= 0
  // Arrivals per prefill instance remembered for the overtaking estimate (the most recent ones); >= 1.
  int64_t overtake_history = 64;
  // Preemption at chunk boundaries (DESIGN.md §10 "Preemption"): > 0, the prefill instances compute a job this many
  // tokens at a time and yield after a chunk to a waiting job of a smaller key, so the ledger orders the running job
  // with the waiting ones (a new job may go ahead of it, and the deadline guard protects it too). 0: off (a started
  // job runs to its end, the default: measured no gain, docs/REPRODUCTION.md §7.4). Tokens, in [0, 2^24]. Only the
  // simulator's instances preempt so far (mc-sim --preempt-chunk-tokens); mc-prefill does not.
  int64_t preempt_chunk_tokens = 0;
};

struct SchedulerConfig {
  std::string policy = "kvcache";  // see policy_names()
  uint64_t seed = 1;               // for the random policy
  SloConfig slo;
  KvShape kv;
  // A prefill instance is "overloaded" for hot-prefix replication when its predicted queue exceeds
  // this; a request whose best prefix holder is overloaded and that is placed elsewhere fetches a copy.
  double overload_queue_ms = 1'000;
  // The paper's KV-cache balancing threshold (Mooncake Algorithm 1; DESIGN.md §10 "Balancing threshold"): a plan
  // reads blocks from another host only when its prefix is more than this many times the instance's own same-host
  // prefix (1: any longer prefix, priced by TTFT alone). In [1, 1000].
  double balancing_threshold = 1.0;
  // Liveness (DESIGN.md §13.12): a worker silent for longer than this is dead and removed (with its
  // cached blocks); a registered worker that has not reported load yet is *unknown* (treated as
  // empty plus what the Conductor itself assigned), never as busy.
  int64_t heartbeat_timeout_ms = 3'000;
  // The decode model's envelope (predictors.hpp DecodePredictor): reported decode steps may move it up to this
  // many times the cost model's step time (or 50 ms more); 0: no envelope, for a backend the cost model does not
  // describe (the CPU reference backend).
  double decode_envelope_factor = 4.0;
  // Candidates kept in a Decision (sorted by predicted TTFT) for the decision log; 0 keeps none.
  int max_logged_candidates = 4;
  // Pending prefixes (DESIGN.md §10 "Pending prefixes"): blocks an accepted request will compute count as cached on
  // the instance computing them, for a later request that extends them and queues behind it there (a session's next
  // turn arriving before its previous turn's prefill ran). "on" | "off" | "" (the policy's default: on for kvcache,
  // off for the paper's baselines, which price the pool as it is).
  std::string pending_prefix;
  // Load-priced placement (kvcache; DESIGN.md §10): the weight of a placement's prefill service against its TTFT is
  // this times the mean predicted queue over the mean service of recent jobs (policy.hpp PlacementContext); in
  // [0, 1000]; 0: the paper's rule (smallest TTFT).
  double placement_load_weight = 1.0;
  // SLO headroom (kvcache; DESIGN.md §10 "SLO headroom"): the fraction of the TTFT SLO the Conductor keeps free. It
  // schedules to the target (1 - slo_headroom) x SLO: placement, the queue order's deadlines and the overtaking bound
  // use the target, and a request predicted past it is admitted only when it still meets the SLO and waits no longer
  // than slo_headroom x SLO before its prefill starts (ttft_admissible()). In [0, 0.9]; 0: the paper's rule (admit
  // up to the SLO itself).
  double slo_headroom = 0.2;
  // Load shedding (kvcache; DESIGN.md §10 "Load shedding"): a request whose prefill would delay the requests queued
  // after it by more than shed_limit x its TTFT SLO in all is turned away early (reason "load_shed"). The delay it
  // makes is its predicted service (prefill + prefix transfer) times the load ratio, the mean predicted queue of the
  // prefill instances over the mean service of recent jobs (the M/M/1 rho / (1 - rho) the load-priced placement
  // uses): 0 on an idle cluster, so only the largest prompts of a burst are shed. In [0, 1000]; 0: off (the paper).
  double shed_limit = 5.0;
  PipelineConfig pipeline;
  QueueConfig queue;
};

// Pricing of one prefill instance for one request (DESIGN.md §3 step 2):
//   ttft_ms = queue_ms + prefill_ms(uncached tokens, reused tokens) + transfer_ms(bytes of the reused
//   prefix that is not on the same host ... priced per path class).
// reused_blocks is the chosen prefix length: the plan that minimises ttft_ms among "reuse the first
// k blocks" for every k the pool can supply (k = 0: recompute everything).
// Bytes a plan reads from one source host over the remote path class (host: a ClusterState host index).
struct SourceBytes {
  uint32_t host = 0;
  int64_t bytes = 0;
};

struct PrefillEstimate {
  std::string instance_id;
  double queue_ms = 0;
  double prefill_ms = 0;
  double transfer_ms = 0;
  double ttft_ms = 0;
  int64_t reused_blocks = 0;
  int64_t blocks_by_class[4] = {0, 0, 0, 0};  // indexed by PathClass, over the reused blocks
  int64_t longest_same_host_blocks = 0;       // longest prefix in memory on this host (cache_aware)
  int64_t longest_pool_blocks = 0;            // longest prefix anywhere in the pool
  // Of reused_blocks, those an earlier accepted request queued or running on this very instance computes first (a
  // pending prefix, SchedulerConfig::pending_prefix): read from this host's memory once it has run (same_host class).
  int64_t pending_blocks = 0;
  int64_t transfer_bytes = 0;
  // The remote blocks' bytes by the host each is read from (the holder with the fastest path to this
  // instance's host, DESIGN.md §16 "Bandwidth decides, live"); empty when nothing is fetched remotely. Filled in
  // the Decision's chosen estimate only (Scheduler::last_estimates() and the logged candidates leave it empty).
  std::vector<SourceBytes> remote_sources;
  bool load_known = false;  // false: registered, no load report yet (#12)
  // The queue discipline's figures (queue_discipline.hpp): queue_ms = the work ahead of it in the order + the work
  // expected to overtake it later (overtake_ms, bounded by its slack); its queue key (Scheduler's clock, ns) and
  // how many queued jobs the deadline guard kept it behind.
  double overtake_ms = 0;
  int64_t queue_key_ns = 0;
  int64_t queue_position = 0;  // jobs before it in the instance's queue, the running one included
  int64_t kept_behind = 0;
};

// One stage of a pipelined prefill (Decision::stages): its instance, its layers and when, from the decision, it is
// ready (its queue plus its share of the prefix fetch) and free again (its last chunk done), in ms.
struct StageEstimate {
  std::string instance_id;
  int64_t first_layer = 0;
  int64_t layers = 0;
  double ready_ms = 0;
  double end_ms = 0;
};

struct DecodeEstimate {
  std::string instance_id;
  double tbt_ms = 0;               // predicted decode step time with this request in the batch
  int64_t batch_requests = 0;      // predicted batch when the prefill finishes, this request included
  int64_t kv_reserved_tokens = 0;  // predicted reservation then, this request's input+output included
  int64_t kv_capacity_tokens = 0;
  bool fits_kv = false;
  bool meets_tbt = false;
};

enum class RejectReason : uint8_t {
  kNone = 0,
  kNoPrefillInstance,  // no live prefill instance
  kNoDecodeInstance,   // no live decode instance
  kTtftSlo,            // the chosen TTFT is not admissible: > SLO, or > its target after too long a wait (§10)
  kTbtSlo,             // no decode instance keeps predicted TBT within the SLO
  kKvCapacity,         // no decode instance can reserve input+output tokens (now, or ever)
  kInvalidRequest,     // input_tokens < 1, more block hashes than blocks, ...
  kLoadShed,           // admissible, but its prefill would delay the requests after it too much (shed_limit, §10)
};
inline constexpr RejectReason kLastRejectReason = RejectReason::kLoadShed;
std::string_view reject_reason_name(RejectReason r);  // "ttft_slo", "kv_capacity", ...

// The outcome of Scheduler::decide(). Every field is a prediction made at decision time.
struct Decision {
  std::string request_id;
  bool accepted = false;
  RejectReason reject_reason = RejectReason::kNone;
  std::string reason;  // human-readable: why this pair, or why rejected (names instances, values)
  std::string policy;
  int64_t decided_at_ns = 0;  // Clock::now_ns() when decided
  double slo_ttft_ms = 0;     // the TTFT SLO applied (the request's, else the configured one)
  double ttft_target_ms = 0;  // the TTFT the Conductor scheduled to: slo_ttft_ms x (1 - Scheduler::slo_headroom())
  bool early_reject = true;   // whether prediction-based early rejection was on

  std::string prefill_id;  // empty when rejected before a prefill was chosen
  std::string decode_id;
  PrefillEstimate prefill;
  DecodeEstimate decode;
  double predicted_ttft_ms = 0;  // = prefill.ttft_ms (also set on rejection: the best seen)
  double service_weight = 0;     // the policy's PlacementContext::service_weight for this decision
  double load_ratio = 0;         // mean predicted queue / mean service of recent jobs (load shedding), <= 1000
  double shed_limit = 0;         // the shed limit in force (Scheduler::shed_limit(); 0: none)
  double shed_slo_ms = 0;        // the TTFT SLO it multiplies: the Conductor's (SloConfig::ttft_ms), not the request's
  double predicted_tbt_ms = 0;
  int64_t hit_tokens = 0;          // reused_blocks * block_size_tokens, capped at input_tokens - 1
  int64_t pool_prefix_tokens = 0;  // the longest prefix held anywhere in the pool: blocks * block_size_tokens
  // Hot-prefix replication (paper §6.?): the longest prefix sits on an overloaded instance's host, so
  // the chosen instance fetches a copy, which the store keeps near it.
  bool replicate_prefix = false;
  std::string best_holder_id;               // the prefill instance whose host holds the longest prefix
  std::vector<PrefillEstimate> candidates;  // best first, at most max_logged_candidates
  // Chunked pipeline parallelism (PipelineConfig): empty when one instance prefills (prefill_id); else the group's
  // stages in pipeline order, stages[0] being prefill_id. prefill then holds the group's figures: queue_ms its
  // start (the last stage ready), prefill_ms the pipeline's span, ttft_ms the last stage's end.
  std::vector<StageEstimate> stages;
  double single_ttft_ms = 0;  // the best single instance's predicted TTFT when a group was chosen, else 0
  // With grouping on (group_size > 1) and no group chosen: the rule that declined it (PipelineConfig's order):
  // "members" (fewer instances running stages than group_size), "pending_prefix", "one_chunk", "efficiency",
  // "queue" (max_queue_fraction), "reserve", "gain" (min_ttft_gain), "waste"; else empty. group_ttft_ms: the
  // group's predicted TTFT when the rule was reached after the group's timing was computed (else 0).
  std::string pipeline_declined;
  double group_ttft_ms = 0;
  // The queue discipline applied ("fcfs" | "slo"); the job's queue key is prefill.queue_key_ns (sent to the prefill
  // instance with the job, prefill_job.queue_key_ns) and its deadline decided_at_ns + ttft_target_ms.
  std::string queue;
};

}  // namespace mc::sched
