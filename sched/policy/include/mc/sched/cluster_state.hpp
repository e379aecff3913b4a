// The Conductor's view of the cluster: prefill and decode instances with their hosts, liveness and
// load, and the cache backends (storage segments, instance-local caches) with the host each sits on.
//
// Load is kept from two sources and combined:
//  * the ledger: jobs the Conductor itself assigned and that are not reported done (assign_prefill /
//    assign_decode, finish_prefill / finish_decode). Queue time = the predicted work of the queued
//    prefill jobs, minus the time the head job has already run (paper §5: "queue time = sum of the
//    predicted prefill times of the requests queued");
//  * the worker's own report (heartbeat): what it has queued or running that the ledger does not know
//    (another Conductor, a restart). Only the excess over the ledger is added.
// Field report #12: a worker that has registered but not yet reported load is *unknown*: its load is
// what the ledger holds (0 when fresh), never a made-up large value. A worker that misses heartbeats
// for longer than the timeout is *dead*: expire() removes it, and the caller drops its cached blocks.
//
// Pure: no I/O, no threads; time comes in as arguments (ns, from an injected mc::Clock).
// Thread-safety: none; one owner (the daemon's loop or the simulator).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

inline constexpr uint32_t kNoHost = UINT32_MAX;

// What a worker reports in its heartbeat (protocol.hpp: ConductorHeartbeat).
struct LoadReport {
  // prefill
  int64_t queued_prefill_tokens = 0;  // tokens of jobs queued or running, not yet prefilled
  int64_t queued_prefill_jobs = 0;
  // decode
  int64_t running_requests = 0;    // in the continuous batch
  int64_t kv_reserved_tokens = 0;  // reserved KV (admitted requests' input+output)
  int64_t context_tokens = 0;      // sum of the batch's current context lengths
};

struct InstanceInfo {
  std::string id;  // unique instance name ("prefill-0")
  Role role = Role::kPrefill;
  std::string host;                  // host name: instances and segments on one host share memory bandwidth
  std::string endpoint;              // where the Conductor dispatches jobs (opaque to the policy)
  std::string backend_id;            // its own KV-event backend id (GPU prefix cache); empty: same as id
  int64_t kv_capacity_tokens = 0;    // decode: KV tokens it can reserve; prefill: unused
  bool runs_pipeline_stages = true;  // prefill: may be a stage of a pipelined group (DESIGN.md §18)
};

// One queued prefill job in the ledger. The queue keeps its waiting jobs (all but the head, which runs) in queue-key
// order (mc/common/queue_order.hpp; queue_discipline.hpp decides the keys).
struct PrefillJob {
  std::string request_id;
  double predicted_ms = 0;
  int64_t tokens = 0;               // uncached tokens to prefill
  int64_t queue_key_ns = 0;         // its place in the order (the Scheduler's clock); FCFS: the decision time
  int64_t deadline_ns = INT64_MAX;  // its TTFT target (SLO less headroom): the deadline guard protects it; none: max
};

// One request in a decode instance's ledger, from admission to completion.
struct DecodeJob {
  std::string request_id;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t start_ns = 0;          // predicted (then actual) arrival in the batch = end of its prefill
  int64_t predicted_end_ns = 0;  // start + output_tokens * predicted step
};

struct Instance {
  InstanceInfo info;
  uint32_t host_index = kNoHost;
  int64_t registered_ns = 0;
  int64_t last_seen_ns = 0;    // register or heartbeat
  bool load_known = false;     // a heartbeat with load has arrived
  LoadReport reported;         // last report (zeros while unknown)
  LoadReport reported_excess;  // the part of the report the ledger did not account for
  // ledger
  std::deque<PrefillJob> prefill_queue;
  int64_t head_started_ns = 0;  // when the current head of prefill_queue started running
  std::vector<DecodeJob> decode_jobs;
  // The worker announced a drain (SIGTERM, conductor.drain): registered and heard as before, its requests run to
  // their end, but nothing new is placed on it (placeable() is false). Kept across a re-registration.
  bool draining = false;
  int64_t draining_since_ns = 0;
};

// Whether new requests may be placed on `inst` at now_ns: not draining, and heard within timeout_ms (a silent
// instance is not eligible, field report #12). The one rule Scheduler::decide applies to prefill and decode alike.
bool placeable(const Instance& inst, int64_t now_ns, int64_t timeout_ms);

class ClusterState {
 public:
  // Decode instances reserve KV in whole blocks of this many tokens (the request's input + output,
  // rounded up): the ledger counts reservations the same way. 1 = exact tokens.
  void set_kv_block_tokens(int64_t tokens) { kv_block_tokens_ = tokens > 0 ? tokens : 1; }
  // Whether the prefill instances preempt at chunk boundaries (QueueConfig::preempt_chunk_tokens > 0): then
  // assign_prefill may put a job ahead of the running head (which keeps the rest of its work).
  void set_prefill_preemption(bool on) { preemptive_ = on; }
  bool prefill_preemption() const { return preemptive_; }
  int64_t kv_reservation_tokens(int64_t tokens) const {
    return (tokens + kv_block_tokens_ - 1) / kv_block_tokens_ * kv_block_tokens_;
  }
  // Adds or re-registers (same id: info replaced, ledger kept, liveness refreshed).
  // kInvalidArgument for an empty id or host, or a decode instance without KV capacity.
  Status register_instance(const InstanceInfo& info, int64_t now_ns);
  // Removes an instance and its ledger; kNotFound when unknown.
  Status remove_instance(const std::string& id);
  // Marks an instance draining (DESIGN.md §10 "Drain"): nothing new is placed on it, everything else about it stays
  // (ledger, heartbeats, liveness). Idempotent (the first time is kept). kNotFound for an unregistered id.
  Status set_draining(const std::string& id, int64_t now_ns);
  // Records a heartbeat (and its load). kNotFound for an unregistered id: the worker must register.
  Status heartbeat(const std::string& id, const LoadReport& load, int64_t now_ns);
  // The most queue time (ms) that reported prefill work beyond the ledger (reported_excess) adds to
  // prefill_queue_ms(): 10 s (DESIGN.md §10, bounds on what workers report).
  static constexpr double kMaxUnledgeredQueueMs = 10'000;
  // Removes every instance silent for longer than timeout_ms; returns their ids (for index cleanup).
  std::vector<std::string> expire(int64_t now_ns, int64_t timeout_ms);
  // The observer itself did not run for stall_ns (its loop stalled: descheduled, or blocked in a call): that
  // long a silence is not the instances' fault, so every last_seen_ns moves forward by it (never past now_ns).
  void excuse_silence(int64_t stall_ns, int64_t now_ns);

  // Host names interned to dense indices (PrefixIndex stores a host index per backend).
  uint32_t host_index(const std::string& host);  // interns
  std::optional<uint32_t> find_host(const std::string& host) const;
  const std::string& host_name(uint32_t index) const;

  // Ledger. The job joins the queue at its key's place (after the running head, after equal keys); into an empty
  // queue it runs from now_ns. With preemption on, a key smaller than the head's puts the job at the head from
  // now_ns: the old head keeps its predicted work less the time it has run.
  void assign_prefill(const std::string& id, PrefillJob job, int64_t now_ns);
  // Removes the job (wherever it is in the queue); the next head starts at now_ns. No-op if absent.
  void finish_prefill(const std::string& id, const std::string& request_id, int64_t now_ns);
  void assign_decode(const std::string& id, DecodeJob job);
  // Moves a decode job's start (its prefill finished at a different time than predicted).
  void start_decode(const std::string& id, const std::string& request_id, int64_t start_ns, double step_ms);
  void finish_decode(const std::string& id, const std::string& request_id);

  // Predicted queue time (ms) of a prefill instance at now_ns: ledger queue (head's elapsed time
  // subtracted) plus the reported excess tokens priced by ms_per_token. 0 for an unknown fresh worker.
  double prefill_queue_ms(const Instance& inst, int64_t now_ns, double ms_per_token) const;

  const Instance* find(const std::string& id) const;
  Instance* find(const std::string& id);
  // Instances of a role, in registration order (stable: round_robin and tests rely on it).
  const std::vector<Instance*>& instances(Role role) const { return role == Role::kPrefill ? prefill_ : decode_; }
  size_t size() const { return by_id_.size(); }

 private:
  int64_t kv_block_tokens_ = 1;
  bool preemptive_ = false;
  void rebuild_role_lists();
  void update_excess(Instance& inst);

  std::unordered_map<std::string, std::unique_ptr<Instance>> by_id_;
  std::vector<std::string> order_;  // registration order
  std::vector<Instance*> prefill_, decode_;
  std::vector<std::string> hosts_;
  std::unordered_map<std::string, uint32_t> host_ids_;
};

}  // namespace mc::sched
