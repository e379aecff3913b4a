// The cluster simulator: replays a request trace through N prefill and M decode instances in virtual
// time, with the Conductor's own policy library (mc::sched::Scheduler) making every decision on the
// simulated clock, and writes the same per-request records and summary as a live replay
// (mc::replay::RequestRecord, summarize), plus per-instance utilisation, cache hit ratios (local,
// global pool) and the prefill GPU-seconds spent and saved.
//
// What is modelled (and how a request flows):
//  1. Arrival at its trace time, shifted by the window start and divided by rate_scale. Prompts longer
//     than max_context_tokens are rejected before any work (DESIGN.md §13.14).
//  2. The Scheduler decides (and commits) with the cluster's true prefix index (every cache insert and
//     eviction is applied as a KV event) and the load the instances report every heartbeat_ms.
//     Rejected requests end here.
//  3. The decode instance reserves prompt + output tokens (or the request waits for room, FIFO, when
//     early rejection is off). The prefill instance serves its queue FIFO; when a job starts, its prefix
//     plan is re-checked against the caches as they are *then* (an evicted block is recomputed, never
//     an error), the remote part is fetched from the holders' NICs (max-min fair sharing), the local
//     part loaded at local_load_bytes_per_s, and the rest prefilled (chunked when chunk_tokens > 0)
//     with the cost model's time. The first token exists when the prefill ends (TTFT).
//  4. The KV of the prompt streams layer by layer to the decode instance's NIC from the start of the
//     compute; the request joins the continuous batch at the first step boundary after all of it has
//     arrived and produces output_length - 1 more tokens at the cost model's step times.
//  5. The prefill instance keeps the prompt's new complete blocks in its DRAM cache (LRU), and the
//     fetched ones too when the Scheduler asked for a hot-prefix replica. In "local" cache mode an
//     instance can only reuse its own cache (the scheduler is given no remote path).
//  Partial last blocks are never cached or counted as hits (DESIGN.md §13.19).
//
// Determinism: one thread, events ordered by (time, sequence), the random policy seeded from the
// config: the same inputs give byte-identical records. Memory: per in-flight request plus one record
// per request (for the summary), the caches' capacity and the scheduler's index; the trace is read
// one row ahead.
// Thread-safety: none; independent simulations may run on different threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/report/report.hpp"
#include "mc/sim/cluster_config.hpp"
#include "mc/sim/cost_model.hpp"
#include "mc/trace/trace.hpp"

namespace mc::sim {

// Requests in arrival order.
class RequestSource {
 public:
  virtual ~RequestSource() = default;
  // The next row; nullopt at the end; an error stops the simulation (strict trace mode).
  virtual Result<std::optional<trace::Request>> next() = 0;
  // What a trace file's reader found (format, timestamp unit, epoch shift, ...); nullptr for rows in memory.
  virtual const trace::ReaderStats* reader_stats() const { return nullptr; }
};

// A trace file (or "-") through the foundation's reader.
Result<std::unique_ptr<RequestSource>> open_trace(const std::string& path, trace::ReaderOptions options);
// Rows held in memory (sweeps run many simulations over one loaded window). `rows` must outlive it.
std::unique_ptr<RequestSource> vector_source(const std::vector<trace::Request>& rows);

// The trace window, with mc-trace-replay's meaning: rows with timestamp < start_s are skipped, rows at
// or after start_s + duration_s end the window (duration_s <= 0: no end), at most max_requests rows
// (<= 0: no limit) are offered, and arrival times (timestamp - start) are divided by rate_scale
// (2 = twice the request rate).
struct TraceWindow {
  double start_s = 0;
  double duration_s = 0;
  int64_t max_requests = 0;
  double rate_scale = 1.0;
  Status validate() const;
};

// Reads a whole window into memory (for sweeps). Rows keep their trace timestamps.
Result<std::vector<trace::Request>> load_window(RequestSource& source, const TraceWindow& window);

struct SimOptions {
  ClusterConfig cluster;
  TraceWindow window;
  double local_load_bytes_per_s = 8 * 25e9;  // DRAM -> HBM on the prefill's own host (8 x PCIe 4 x16)
  int64_t heartbeat_ms = 100;                // load reports to the Scheduler, virtual ms
  // Feed measured prefill and decode-step times back into the Scheduler's online refit, as the
  // daemons do. Off: the Scheduler keeps the priors read off the cost model (exact in simulation).
  // docs/REPRODUCTION.md runs with it on; Reproduction.RefitOnDoesNotDriftUnderOverload checks that the refit
  // stays within 10 % of the priors' mean TTFT on the whole conversation trace at 2.5x load.
  bool refit_predictors = true;
  std::ostream* records_jsonl = nullptr;  // one replay::RequestRecord per line, in completion order
  bool progress = false;                  // progress line on stderr (callers set it when stderr is a tty)
};

struct InstanceReport {
  std::string id;                 // "prefill-0", "decode-3"
  std::string role;               // "prefill" | "decode"
  double busy_s = 0;              // computing (prefill) or stepping (decode)
  double utilization = 0;         // busy / span
  int64_t jobs = 0;               // prefills done, or requests decoded
  int64_t tokens = 0;             // prompt tokens prefilled (computed), or output tokens produced
  int64_t hit_tokens_local = 0;   // prefill: prefix reused from its own cache
  int64_t hit_tokens_remote = 0;  // prefill: prefix fetched from another instance's cache
  int64_t prompt_tokens = 0;      // prefill: prompts served
  int64_t cache_blocks = 0;       // prefill: blocks in its cache at the end
  int64_t cache_evictions = 0;
  int64_t nic_tx_bytes = 0, nic_rx_bytes = 0;
  double nic_busy_s = 0;
};

struct SimTotals {
  int64_t prompt_tokens = 0;  // of accepted requests
  int64_t hit_tokens_local = 0;
  int64_t hit_tokens_remote = 0;
  int64_t hit_tokens_planned = 0;  // what the Scheduler planned to reuse
  int64_t hit_tokens_lost = 0;     // planned but evicted before the job started: recomputed
  double prefill_gpu_s = 0;        // GPU-seconds of prefill compute spent (instance s x GPUs)
  double prefill_gpu_s_saved = 0;  // GPU-seconds the reused prefixes avoided
  double prefill_gpu_s_without_cache = 0;
  int64_t transfer_bytes_prefix = 0;  // pool -> prefill
  int64_t transfer_bytes_kv = 0;      // prefill -> decode
  int64_t events = 0;                 // discrete events run
  double span_s = 0;                  // virtual: first arrival -> last event
  double wall_s = 0;                  // host time the simulation took
  int64_t replicated_prefixes = 0;
  int64_t pipelined_prefills = 0;  // prefills run on a group of pipeline_group instances (DESIGN.md §18)
  double pipeline_bubble_s = 0;    // sum over those of the stages' idle time between their chunks
  int64_t prefill_preemptions =
      0;                     // jobs that yielded at a chunk boundary (preempt_chunk_tokens > 0), counted per yield
  double hit_ratio() const;  // (local + remote) / prompt tokens
};

struct SimResult {
  std::vector<replay::RequestRecord> records;  // in arrival order
  replay::Summary summary;
  std::vector<InstanceReport> instances;
  SimTotals totals;
  nlohmann::json cluster;  // the effective config (presets resolved)
};

// Runs one simulation with the cost model of the config's model and GPU presets (infer/).
// Errors: kInvalidArgument for a bad config/window or a bad trace row (strict), kNotFound for an
// unknown preset.
Result<SimResult> simulate(const SimOptions& options, RequestSource& source,
                           const replay::SummaryOptions& summary_options = {});
// Same with an injected cost model (tests, what-if studies); gpu_count scales GPU-seconds.
Result<SimResult> simulate_with(const SimOptions& options, RequestSource& source, const CostModel& model,
                                int64_t gpu_count, const replay::SummaryOptions& summary_options = {});

// The cost model of infer/ for a model and GPU preset (or model JSON file).
Result<std::unique_ptr<CostModel>> make_infer_cost_model(const std::string& model, const std::string& gpu);

// JSON document of a run: {"cluster", "summary" (replay's), "instances", "totals"}; units in keys.
nlohmann::json to_json(const SimResult& result, const replay::RunInfo& info = {});
// Human-readable report: replay's summary table, then per-instance and cache tables.
void print_report(std::ostream& out, const SimResult& result, const replay::RunInfo& info = {});

}  // namespace mc::sim
