// Offline analysis of a Mooncake JSONL trace (no cluster): counts, arrival rate, length percentiles,
// blocks total/distinct, and the prefix-cache hit ratio with an infinite cache and under LRU for a
// sweep of capacities in tokens (`mc-trace-replay analyze`).
//
// Hit ratios (DESIGN.md §1, §6; the conversation trace's README):
//   blocks  hit blocks / all blocks. With an infinite cache a block hits when its id was seen before
//           (ids encode the whole prefix, so a seen id implies its prefix was seen: the 36.6 % figure).
//   tokens  hit blocks x block_size, capped at input_length, / all input tokens (the 37.4 % figure).
//   tokens_full_blocks  the same counting only complete blocks: a block-keyed store never keys the
//           partial last block (DESIGN.md §13.19), so this is what a live cluster can reach at most.
//   infinite_earlier  the infinite cache when a request can reuse only blocks of requests that arrived
//           strictly before it (the trace's timestamps come in 3 s buckets, and requests of one bucket
//           run concurrently in a live cluster: none has stored its blocks when the others look up).
//           This is the figure a live replay is compared with.
// Under LRU a request hits the longest prefix of its blocks still cached (a prefix cache cannot use a
// block whose parent is gone); afterwards every block of the request is inserted or refreshed, oldest
// evicted first. Capacity in tokens is converted to floor(capacity / block_size) blocks.
// The window (start_s, duration_s, max_requests) selects the same rows as the live replay.
//
// Thread-safety: pure functions over the input stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/report/page.hpp"
#include "mc/report/report.hpp"
#include "mc/trace/trace.hpp"

namespace mc::replay {

// Which rows of a trace a run uses, in trace time.
struct Window {
  double start_s = 0;        // skip rows with timestamp < start_s
  double duration_s = 0;     // <= 0: to the end; else rows with timestamp < start_s + duration_s
  int64_t max_requests = 0;  // <= 0: no limit
  // True when `row` lies in the window (the count limit is applied by the caller).
  bool contains(const trace::Request& row) const;
};

// The rows of `reader` inside `window`, in order (a strict reader's first error is returned). The live
// replay and analyze() both select rows with it, so they see the same window.
Result<std::vector<trace::Request>> read_window(trace::Reader& reader, const Window& window);
// The error of every command given a trace window without a valid row (kInvalidArgument: exit 2, like
// any bad input): "no request to <action>: <source> has no valid row in the window (...)".
Status empty_window_error(std::string_view action, const std::string& source_name);

struct AnalyzeOptions {
  trace::ReaderOptions reader;  // mode, trace block size, source name
  Window window;
  std::vector<int64_t> capacity_tokens = {1'000'000, 3'000'000, 10'000'000, 50'000'000};
  bool keep_samples = false;  // keep every row's lengths and arrival (TraceAnalysis::samples, for the pictures)
};

struct HitRatios {
  double blocks = 0;
  double tokens = 0;
  double tokens_full_blocks = 0;
};

struct LruPoint {
  int64_t capacity_tokens = 0;
  HitRatios hit;
};

struct TraceAnalysis {
  int64_t requests = 0;
  int64_t lines = 0, skipped_rows = 0;  // from the reader (lenient mode skips)
  double first_timestamp_s = 0, last_timestamp_s = 0;
  double span_s = 0;            // last - first arrival
  double arrival_rate_rps = 0;  // requests / span (0 for a single instant)
  std::optional<Distribution> input_tokens, output_tokens, blocks_per_request;
  int64_t total_input_tokens = 0;
  int64_t total_blocks = 0;
  int64_t distinct_blocks = 0;
  HitRatios infinite;
  HitRatios infinite_earlier;  // infinite cache, blocks of strictly earlier arrivals only
  std::vector<LruPoint> lru;
  // With AnalyzeOptions::keep_samples: per row of the window, in order.
  struct Samples {
    std::vector<double> input_tokens, output_tokens, arrival_s;  // arrival: trace seconds since the first row
  } samples;
};

// Reads the whole window of `reader` (strict-mode errors are returned as they are).
Result<TraceAnalysis> analyze(trace::Reader& reader, const AnalyzeOptions& options);
Result<TraceAnalysis> analyze_file(const std::string& path, const AnalyzeOptions& options);

nlohmann::json to_json(const TraceAnalysis& analysis, const RunInfo& info = {});
// The HTML page of `analyze --html` (analyze_page.cpp; mc/report/page.hpp): the capacity curve (hit ratio against
// cache tokens: the LRU sweep, the infinite cache), the input and output length distributions and the arrival rate
// over the window. The lengths and arrivals need an analysis run with keep_samples.
mc::report::Page analyze_page(const TraceAnalysis& analysis, const RunInfo& info, int64_t block_size);
void print_table(std::ostream& out, const TraceAnalysis& analysis, const RunInfo& info = {});

// Prefix-cache hit accounting of one trace, shared by the infinite and LRU simulations: feed rows in
// arrival order. capacity_blocks <= 0 means infinite. With earlier_arrivals_only, the blocks of a row
// become visible only to rows with a later timestamp (rows of one timestamp do not hit each other).
class PrefixCacheModel {
 public:
  PrefixCacheModel(int64_t capacity_blocks, int64_t block_size, bool earlier_arrivals_only = false);
  ~PrefixCacheModel();
  PrefixCacheModel(const PrefixCacheModel&) = delete;
  PrefixCacheModel& operator=(const PrefixCacheModel&) = delete;
  // Looks up the row's prefix, counts the hit, then inserts/refreshes all its blocks.
  void add(const trace::Request& row);
  HitRatios ratios() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc::replay
