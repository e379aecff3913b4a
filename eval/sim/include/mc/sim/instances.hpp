// The simulated instances: a prefill instance (one server whose waiting jobs run in queue-key order,
// mc/common/queue_order.hpp: FCFS when every key is the submit time; it fetches the prefix it was told to
// fetch over its NIC, then computes the rest, chunk by chunk) and a decoding instance (KV admission by
// reservation, continuous batching with the cost model's step times).
//
// Both run on the event queue: methods schedule events and report through callbacks, which run from
// the event queue (never from inside the call that caused them). Units: ns of virtual time, tokens,
// bytes, seconds for predictions. Thread-safety: none (one simulation per thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "mc/sim/cost_model.hpp"
#include "mc/sim/event_queue.hpp"
#include "mc/sim/network.hpp"

namespace mc::sim {

// One piece of a prefix fetched from another instance's cache.
struct Fetch {
  int src_nic = -1;
  int64_t bytes = 0;
};

// One request's prefill work as placed by the scheduler.
struct PrefillJob {
  uint64_t request = 0;        // simulator's id, opaque to the instance
  int64_t input_tokens = 0;    // prompt length
  int64_t cached_tokens = 0;   // prefix reused (local + fetched); input_tokens - cached_tokens computed
  std::vector<Fetch> fetches;  // remote prefix parts, moved in parallel before computing
  double local_load_s = 0;     // loading the local part of the prefix into HBM (after the fetches)
  // A stage of a pipelined prefill (DESIGN.md §18): at the head of the queue it runs on_start and then holds the
  // instance, fetching and computing nothing itself, until release_held() says when its last chunk ends.
  bool held = false;
  double held_predicted_s = 0;  // its predicted service, for predicted_queue_s()
  // Its place in the queue (the Conductor's queue key, Decision::prefill.queue_key_ns): waiting jobs run in key
  // order, equal keys in submit order. FCFS: the submit time.
  int64_t queue_key_ns = 0;
  // Filled in by the instance (ns of virtual time).
  int64_t enqueue_ns = -1;
  int64_t start_ns = -1;          // left the queue: fetches start
  int64_t compute_start_ns = -1;  // prefix in HBM, compute starts
  int64_t finish_ns = -1;         // last layer of the last chunk done: the first token exists
  int64_t preempted_ns = 0;       // time between compute_start_ns and finish_ns spent yielded to other jobs
};

class PrefillInstance {
 public:
  using Callback = std::function<void(const PrefillJob&)>;
  // Runs when the job leaves the queue, before its fetches: it may revise the prefix plan
  // (cached_tokens, fetches, local_load_s) against the caches as they are now.
  using StartHook = std::function<void(PrefillJob&)>;
  struct Hooks {
    StartHook on_start;
    Callback on_compute_start;  // layer-wise KV streaming to decode starts here
    Callback on_done;           // the first token exists
  };

  // `nic` is this instance's NIC in `network`. chunk_tokens <= 0: no chunking. All references are
  // borrowed and must outlive the instance.
  PrefillInstance(int nic, EventQueue& queue, Network& network, const CostModel& model, int64_t chunk_tokens);
  // Preemption at chunk boundaries (DESIGN.md §10 "Preemption"): with chunk_tokens > 0 the instance computes a job
  // chunk_tokens at a time and, after each chunk, yields to a waiting job of a smaller queue key (the preempted job's
  // KV stays on the instance; it resumes where it stopped when its key is again the smallest). 0: off (a started job
  // runs to its end). Set before the first submit.
  void set_preempt_chunk_tokens(int64_t chunk_tokens) { preempt_chunk_tokens_ = chunk_tokens > 0 ? chunk_tokens : 0; }
  int64_t preemptions() const { return preemptions_; }

  // Queues a job at its key's place (after every waiting job of a smaller or equal key); the hooks (each may be
  // empty) run as documented on Hooks.
  void submit(PrefillJob job, Hooks hooks);

  // Ends the held job at the head (PrefillJob::held) at end_ns (>= now), having computed busy_s of it from
  // compute_start_ns; its on_done runs then. Ignored when the head is not a held job.
  void release_held(int64_t compute_start_ns, int64_t end_ns, double busy_s);
  bool holding() const { return running_ && current_.job.held; }

  // Compute seconds of a job (chunked as configured).
  double compute_time_s(int64_t input_tokens, int64_t cached_tokens) const;
  // Predicted seconds before a job submitted now would start: the rest of the running job plus the
  // predicted service of every queued one (fetches at full NIC bandwidth + local load + compute).
  double predicted_queue_s() const;
  int64_t queued_jobs() const { return static_cast<int64_t>(queue_.size()) + (running_ ? 1 : 0); }
  // The waiting job that starts next (null when none waits); valid until the queue changes.
  const PrefillJob* next_job() const { return queue_.empty() ? nullptr : &queue_.front().job; }
  // Tokens still to compute in queued and running jobs.
  int64_t queued_tokens() const { return queued_tokens_; }
  int64_t busy_compute_ns() const;  // time spent computing, up to now
  int64_t jobs_done() const { return jobs_done_; }
  int nic() const { return nic_; }

 private:
  struct Entry {
    PrefillJob job;
    Hooks hooks;
    double predicted_service_s = 0;
    int64_t done_tokens = 0;  // preemption: tokens of the job already computed (its KV kept on the instance)
    bool resumed = false;     // preempted once: its start hooks, fetches and local load have run
    int64_t yielded_ns = 0;   // when it last yielded
  };
  double predicted_service_s(const PrefillJob& job) const;
  void start_next();
  void start_compute();
  void fetch_done();
  void run_chunk();  // preemption: computes the running job's next chunk, then ends, yields or goes on
  double rest_compute_s(const Entry& e) const;
  // The running job ends at end_ns: books it, runs its on_done hook, then starts the next waiting job.
  void finish_current(int64_t end_ns);

  int nic_;
  EventQueue& events_;
  Network& network_;
  const CostModel& model_;
  int64_t chunk_tokens_;
  std::deque<Entry> queue_;
  bool running_ = false;
  Entry current_;
  int64_t current_predicted_end_ns_ = 0;
  int64_t queued_tokens_ = 0;
  int64_t busy_ns_ = 0;
  int64_t compute_started_ns_ = -1;
  int64_t jobs_done_ = 0;
  int fetches_left_ = 0;
  int64_t preempt_chunk_tokens_ = 0;
  int64_t preemptions_ = 0;
};

// A request on a decoding instance.
struct DecodeJob {
  uint64_t request = 0;
  int64_t context_tokens = 0;  // KV tokens at join (the prompt)
  int64_t decode_tokens = 0;   // tokens to produce here (output_length - 1: prefill made the first)
  int64_t first_token_ns = 0;  // when the first token was produced (the first TBT gap starts there)
};

struct DecodeResult {
  uint64_t request = 0;
  int64_t tokens = 0;    // produced here
  int64_t join_ns = -1;  // first step that included it began
  int64_t last_token_ns = -1;
  std::vector<double> gaps_ms;  // one per token produced here: since the previous token (the first
                                // one since the prefill's first token)
};

class DecodeInstance {
 public:
  using Done = std::function<void(const DecodeResult&)>;
  using Reserved = std::function<void()>;
  // Told of every step as it starts: batch size, KV tokens of the batch, modelled step seconds (the
  // worker's step report to the Conductor).
  using StepObserver = std::function<void(int64_t batch_size, int64_t context_tokens, double step_s)>;

  // kv_capacity_tokens: HBM left for KV after the weights; max_batch: requests per step (<= 0: no cap).
  DecodeInstance(EventQueue& queue, const CostModel& model, int64_t kv_capacity_tokens, int64_t max_batch);

  // Admission: holds `tokens` of KV (prompt + every output token: the request's future growth) if they
  // fit beside everything already reserved. False (and nothing held) otherwise.
  bool try_reserve(int64_t tokens);
  // Like try_reserve, but when it does not fit the request waits (FIFO) until releases make room;
  // `on_reserved` runs (from the event queue) once the tokens are held. Requests larger than the whole
  // capacity are held as soon as the instance is otherwise empty (never starved forever).
  void reserve_or_wait(int64_t tokens, Reserved on_reserved);
  void release(int64_t tokens);
  void set_step_observer(StepObserver observer) { observer_ = std::move(observer); }

  // Joins a request (its KV reserved and arrived) to the batch at the next step boundary.
  // decode_tokens == 0 completes at once.
  void join(DecodeJob job, Done on_done);

  int64_t reserved_tokens() const { return reserved_tokens_; }
  int64_t kv_capacity_tokens() const { return kv_capacity_tokens_; }
  int64_t batch_size() const { return static_cast<int64_t>(running_.size() + joining_.size()); }
  int64_t context_tokens() const { return context_tokens_; }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Step time of the batch as it is now (0 when idle).
  double current_step_s() const;
  int64_t busy_ns() const;
  int64_t steps() const { return steps_; }
  int64_t tokens_produced() const { return tokens_produced_; }

 private:
  struct Running {
    DecodeJob job;
    Done on_done;
    int64_t produced = 0;
    int64_t last_token_ns = 0;
    int64_t join_ns = -1;
    std::vector<double> gaps_ms;
  };
  bool fits(int64_t tokens) const;
  void maybe_start_step();
  void end_step();
  void admit_waiting();

  EventQueue& events_;
  const CostModel& model_;
  int64_t kv_capacity_tokens_;
  int64_t max_batch_;
  int64_t reserved_tokens_ = 0;
  std::deque<std::pair<int64_t, Reserved>> waiting_;
  std::vector<Running> running_;
  std::deque<Running> joining_;
  int64_t context_tokens_ = 0;  // of running_
  bool stepping_ = false;
  int64_t step_started_ns_ = 0;
  int64_t busy_ns_ = 0;
  int64_t steps_ = 0;
  int64_t tokens_produced_ = 0;
  StepObserver observer_;
};

}  // namespace mc::sim
