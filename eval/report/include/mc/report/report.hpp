// Per-request records and the run summary of a trace replay (DESIGN.md §5; library mc_report, namespace
// mc::replay), shared by the live replay (mc-trace-replay), the cluster simulator and the capacity planner
// (mc_sim): all fill RequestRecords, write them as JSONL, and summarise them with summarize() into the
// same table / JSON document.
//
// Definitions (DESIGN.md §5; the paper, Mooncake FAST'25 §2 and §8):
//   TTFT  submit -> first output token.
//   TBT   the gaps between consecutive output tokens; the per-request SLO statistic is the paper's:
//         the mean of the longest 10 % of a request's gaps (at least one gap: ceil(0.1 * gaps)).
//   TPOT  (E2E - TTFT) / (output tokens - 1), on the tokens actually produced (DESIGN.md §13.16), never
//         on the trace's requested output_length.
//   E2E   submit -> last output token.
// A time never measured is absent (std::nullopt; no key in JSON), never 0. All times are milliseconds
// as doubles, measured on the caller's clock (wall for the live replay, virtual for the simulator).
//
// SLO attainment: the fraction of *offered* requests that completed with TTFT <= ttft limit and the
// TBT statistic <= tbt limit (a request with a single output token has no gap and meets any TBT limit);
// reported also among accepted requests. Goodput: such requests per second of the run's span.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/report.hpp"
#include "mc/common/status.hpp"

namespace mc::replay {

// What became of one offered request.
enum class Outcome {
  kCompleted,  // accepted, and the last token arrived
  kRejected,   // refused before any work (early rejection, validation): `reason` says why
  kFailed,     // accepted but did not complete (abort, lost instance, drain timeout): `reason` says why
};
std::string_view outcome_name(Outcome outcome);  // "completed" | "rejected" | "failed"
Result<Outcome> parse_outcome(std::string_view name);

// The paper's TBT statistics of one request, from its inter-token gaps.
struct TbtStats {
  int64_t gaps = 0;  // output tokens - 1 (timed gaps)
  double mean_ms = 0;
  double max_ms = 0;
  double top10_mean_ms = 0;  // mean of the longest ceil(10 %) gaps: the SLO statistic
};
// Statistics of `gaps_ms`; nullopt when there is no gap.
std::optional<TbtStats> tbt_stats(std::span<const double> gaps_ms);

// The cache/compute ledger of one request (DESIGN.md §5). Fields that the reporting component did not
// provide stay absent.
struct Ledger {
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> hit_tokens_local;        // prefix found on the chosen prefill instance itself
  std::optional<int64_t> hit_tokens_remote;       // fetched from the pool's DRAM on another node
  std::optional<int64_t> hit_tokens_ssd;          // fetched from an SSD tier
  std::optional<int64_t> avoided_prefill_tokens;  // tokens not recomputed thanks to the cache
  std::optional<int64_t> transfer_bytes;  // KV bytes moved for this request (pool -> prefill, prefill -> decode)
  std::optional<double> transfer_ms;
  std::optional<double> queue_ms;  // waiting before prefill started
  std::optional<double> prefill_ms;
  std::optional<std::string> decision;      // fetch | recompute | reject
  std::optional<double> predicted_ttft_ms;  // the conductor's prediction when it placed the request
  // At placement: the prefix tokens the conductor planned to reuse, and the longest prefix the pool
  // held (complete blocks). planned < pool: recomputing the rest was predicted faster than fetching it;
  // hit < planned: blocks planned were missing or failed when the prefill fetched them.
  std::optional<int64_t> planned_hit_tokens;
  std::optional<int64_t> pool_prefix_tokens;
  // The conductor's predicted decode step time for it (its TBT), against the request's measured mean gap.
  std::optional<double> predicted_tbt_ms;
  // A prefill pipelined over a group (chunked pipeline parallelism, DESIGN.md §18): its stages, and the best single
  // instance's predicted TTFT it was weighed against. Absent for a prefill on one instance.
  std::optional<int64_t> pipeline_stages;
  std::optional<double> single_ttft_ms;

  int64_t hit_tokens() const;  // sum of the three tiers present (0 when none is)
};

struct RequestRecord {
  std::string request_id;
  int64_t trace_line = 0;             // 1-based line of the trace row
  int64_t trace_timestamp_ms = 0;     // arrival in trace time (before --speed / --rate-scale)
  std::optional<double> submit_ms;    // when it was sent, ms since the run started (run clock)
  std::optional<double> send_lag_ms;  // actual - scheduled send time (open loop); > late threshold = late
  // When the record closed (its terminal event: done, error or rejection; or the drain timeout), ms since the
  // run started (run clock): with submit_ms, how long a fault took to reach each request (docs/RELIABILITY.md).
  std::optional<double> end_ms;
  // Wall clock (Unix ms) when its terminal event arrived (or the drain timeout closed it): for lining a run up
  // against faults injected from outside, e.g. examples/fault-matrix.sh (docs/RELIABILITY.md).
  std::optional<int64_t> end_unix_ms;

  int64_t input_tokens = 0;
  int64_t output_tokens_requested = 0;   // the trace's output_length
  std::optional<int64_t> output_tokens;  // actually produced
  // Where output_tokens came from: "usage" (the server's final count) or "counted" (streamed tokens
  // counted because the server reported none: flagged, DESIGN.md §13.16).
  std::string output_tokens_source;

  Outcome outcome = Outcome::kRejected;
  std::string reason;  // why rejected/failed; empty when completed
  // Whether the Conductor accepted it (answered its submit with "accepted"). false: rejected, or failed before
  // any answer (its submit failed, e.g. the Conductor was down): such a failure is not an accepted request
  // (Summary::submit_failed). Absent in records of older runs: then every record not rejected counts as accepted.
  std::optional<bool> accepted;
  std::string prefill_instance;  // empty when never placed
  std::string decode_instance;

  std::optional<double> ttft_ms;
  std::optional<double> e2e_ms;
  std::optional<double> tpot_ms;
  std::optional<TbtStats> tbt;

  std::vector<uint32_t> output_token_ids;  // only when the run recorded them (--record-token-ids)

  Ledger ledger;
};

// Fills ttft_ms, e2e_ms, tbt, output_tokens(+source) and tpot_ms of `record` from the arrival times of
// its output tokens, in ms since submit, one entry per token in order (a batch of n tokens delivered at
// once is n equal entries). `reported_tokens` is the server's final count when it sent one; it wins over
// the count of streamed tokens (tokens may be coalesced), which is used and flagged otherwise.
// Empty `token_ms` leaves the times absent. Does not change outcome.
void apply_token_times(RequestRecord& record, std::span<const double> token_ms, std::optional<int64_t> reported_tokens);
// TPOT per DESIGN.md §5; nullopt when fewer than 2 tokens or a time is missing.
std::optional<double> tpot_ms(std::optional<double> ttft_ms, std::optional<double> e2e_ms, int64_t tokens);

nlohmann::json to_json(const RequestRecord& record);
// Inverse of to_json (used to re-summarise a JSONL file and in tests); kInvalidArgument naming the key.
Result<RequestRecord> record_from_json(const nlohmann::json& j);

// ---- summary ----

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // in the unit named by the field holding it
};
// Linear-interpolated percentiles (as numpy's default); nullopt for no values.
std::optional<Distribution> distribution(std::vector<double> values);
// The q-quantile (0..1) of sorted values, linear interpolation between closest ranks.
double quantile_sorted(std::span<const double> sorted, double q);

struct SloResult {
  double ttft_ms = 0;
  double tbt_ms = 0;
  int64_t met = 0;                 // completed within both limits
  double attainment = 0;           // met / offered
  double attainment_accepted = 0;  // met / accepted
  double goodput_rps = 0;          // met / span_s
};

struct CacheSummary {
  int64_t prompt_tokens = 0;  // over requests whose ledger has prompt_tokens
  int64_t hit_tokens_local = 0, hit_tokens_remote = 0, hit_tokens_ssd = 0;
  int64_t avoided_prefill_tokens = 0;
  int64_t transfer_bytes = 0;
  int64_t requests_with_ledger = 0;
  double hit_ratio() const;  // (local + remote + ssd) / prompt tokens; 0 when no prompt tokens
  double ratio(int64_t tokens) const;
};

struct PredictionSummary {
  int64_t count = 0;  // completed requests with both the predicted and the measured figure
  double mean_abs_error_ms = 0;
  double mean_error_ms = 0;  // measured - predicted (positive: the conductor was optimistic)
  double p90_abs_error_ms = 0;
  double mean_abs_pct_error = 0;  // |measured - predicted| / measured, as a fraction
};

struct SummaryOptions {
  std::vector<double> slo_ttft_ms = {30000.0};
  std::vector<double> slo_tbt_ms = {100.0, 200.0, 300.0};
  double late_send_threshold_ms = 10.0;  // a send later than this behind schedule counts as late
  // Span of the run for goodput, seconds; <= 0 derives it from the records (first submit -> last token).
  double span_s = 0;
};

struct Summary {
  // offered = accepted + rejected + submit_failed; failed counts every failed record, submit_failed those of them
  // the Conductor never accepted (their submit failed). accepted = completed + (failed - submit_failed).
  int64_t offered = 0, accepted = 0, rejected = 0, completed = 0, failed = 0, submit_failed = 0;
  std::map<std::string, int64_t> reasons;  // rejected/failed reasons -> count
  // The same by kind: the text before a reason's first ": " ("kv_capacity", "ttft_slo", "decode_refused"; a colon
  // inside an endpoint is no cut), or the whole reason when it has none; each with its count and one full reason as an
  // example.
  std::map<std::string, std::pair<int64_t, std::string>> reason_kinds;
  int64_t late_sends = 0;
  std::optional<double> max_send_lag_ms;
  double span_s = 0;
  int64_t output_tokens_requested = 0;  // of completed requests
  int64_t output_tokens = 0;            // actually produced, completed requests
  int64_t output_tokens_counted = 0;    // requests whose token count was counted, not reported (flagged)
  std::optional<Distribution> ttft_ms, tbt_ms, tpot_ms, e2e_ms;  // tbt: per-request top-10 % statistic
  std::vector<SloResult> slo;                                    // every (ttft, tbt) pair of the options, ttft-major
  CacheSummary cache;
  PredictionSummary prediction;      // TTFT
  PredictionSummary tbt_prediction;  // predicted decode step (ledger predicted_tbt_ms) vs the measured mean gap
};

Summary summarize(std::span<const RequestRecord> records, const SummaryOptions& options);

// `config`: what the header line names (tool, build, host, trace, speed, ...), printed in order.
using RunInfo = ::mc::report::RunInfo;

nlohmann::json to_json(const Summary& summary, const RunInfo& info = {});
// The human-readable report: a header line, then tables with units in the column headers.
void print_table(std::ostream& out, const Summary& summary, const RunInfo& info = {});

// One row per run (label, summary): offered, accepted, completed, TTFT mean/p90, TBT p90, the first
// SLO pair's attainment and goodput, cache hit ratio, avoided prefill tokens. For comparing policies.
void print_comparison(std::ostream& out, const std::vector<std::pair<std::string, Summary>>& runs);
// The rows print_comparison prints, header row first (the HTML report's table).
std::vector<std::vector<std::string>> comparison_rows(const std::vector<std::pair<std::string, Summary>>& runs);

// Reads a JSONL file of records (as written by to_json), e.g. to re-summarise a finished run.
Result<std::vector<RequestRecord>> read_records_jsonl(std::istream& in, const std::string& source_name);

}  // namespace mc::replay
