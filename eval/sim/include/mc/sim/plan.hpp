// Capacity planning (mc-plan): the fetch-vs-recompute bandwidth threshold of a model on a GPU preset,
// and the smallest cluster that meets a trace's SLOs, found by simulation.
//
// Threshold (DESIGN.md §1; paper §2/§4): reusing a cached prefix of p tokens saves
//   saved_s(p) = prefill_time(p + n, 0) - prefill_time(n, p)        (n: the new tokens after it)
// of prefill, and costs p * kv_bytes_per_token / bandwidth of transfer; fetching wins when
//   bandwidth > p * kv_bytes_per_token / saved_s(p).
// With the linear term alone this is kv_bytes_per_token * prefill_rate (the paper's ~6 GB/s on
// 8xA800, ~19 GB/s on 8xH800, at peak FLOP/s); the attention term makes long prefixes costlier to
// recompute, so the threshold falls as p grows. Both the preset's efficiency and the at-peak figure are
// reported.
//
// Capacity (issue 8): for a trace window and SLOs, with early rejection off (attainment then measures
// capacity, not admission):
//   1. cache: the smallest total capacity (of the candidates) whose global-LRU hit ratio reaches
//      cache_fraction of the infinite-cache ratio on the window (replay's PrefixCacheModel);
//   2. prefill: the fewest prefill instances reaching `accept` of TTFT attainment, decode and NIC
//      generous (binary search, attainment assumed monotonic in the count);
//   3. decode: the fewest decode instances keeping attainment (TTFT and TBT) >= accept;
//   4. NIC: the slowest candidate bandwidth that keeps it;
//   5. a final simulation of the plan, whose attainment is reported.
// Every simulation run is listed (trials), so the search can be audited.
// Thread-safety: none needed (pure functions over values).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/report/page.hpp"
#include "mc/sim/cluster_config.hpp"
#include "mc/sim/simulator.hpp"
#include "mc/trace/trace.hpp"

namespace mc::sim {

struct ThresholdRow {
  int64_t prefix_tokens = 0;
  int64_t prefix_bytes = 0;
  double saved_s = 0;                        // prefill time the prefix avoids (preset efficiency)
  double threshold_bytes_per_s = 0;          // fetch beats recompute above this (preset efficiency)
  double threshold_at_peak_bytes_per_s = 0;  // same at 100 % of peak FLOP/s (the paper's arithmetic)
};

struct ThresholdReport {
  std::string model, gpu;
  int64_t kv_bytes_per_token = 0;
  int64_t new_tokens = 0;
  double compute_efficiency = 0;
  double linear_threshold_bytes_per_s = 0;          // kv_bytes_per_token x prefill rate (preset)
  double linear_threshold_at_peak_bytes_per_s = 0;  // same at peak
  std::optional<double> paper_bytes_per_s;          // a800x8: 6e9, h800x8: 19e9 (paper §2)
  std::vector<ThresholdRow> rows;
};

Result<ThresholdReport> fetch_threshold(const std::string& model, const std::string& gpu,
                                        const std::vector<int64_t>& prefix_tokens, int64_t new_tokens);
nlohmann::json to_json(const ThresholdReport& report);
void print_threshold(std::ostream& out, const ThresholdReport& report);

struct CapacityOptions {
  ClusterConfig base;  // model, gpu, policy, block size ... (counts are searched)
  TraceWindow window;
  double accept = 0.99;        // attainment to reach, fraction of offered requests
  int64_t max_instances = 64;  // search bound per role
  std::vector<int64_t> cache_total_tokens = {1'000'000, 3'000'000, 10'000'000, 30'000'000, 50'000'000, 100'000'000};
  double cache_fraction = 0.95;  // of the infinite-cache hit ratio
  std::vector<double> nic_bytes_per_s = {12.5e9, 25e9, 50e9, 100e9};
  bool progress = false;  // one line per trial on stderr
};

struct CapacityTrial {
  std::string step;  // prefill | decode | nic | final
  int64_t prefill_instances = 0, decode_instances = 0;
  int64_t cache_capacity_tokens = 0;  // per prefill instance
  double nic_bandwidth_bytes_per_s = 0;
  double attainment = 0;       // TTFT and TBT, of offered
  double ttft_attainment = 0;  // TTFT only
  double wall_s = 0;
};

struct CapacityPlan {
  bool feasible = false;  // the final run meets `accept`
  int64_t prefill_instances = 0, decode_instances = 0;
  int64_t cache_total_tokens = 0, cache_capacity_tokens = 0;  // total, per prefill instance
  int64_t cache_total_bytes = 0;
  double cache_hit_ratio = 0, cache_hit_ratio_infinite = 0;  // LRU at the chosen capacity, infinite
  std::vector<std::pair<int64_t, double>> cache_curve;       // (total tokens, LRU hit ratio) of every candidate
  double nic_bandwidth_bytes_per_s = 0;
  double attainment = 0;
  std::vector<CapacityTrial> trials;
  SimResult final_run;
  ClusterConfig cluster;  // the plan as a CLUSTER.json
};

// Errors: a bad option or trace (kInvalidArgument), or kResourceExhausted when even max_instances of
// each role cannot reach `accept` (the message gives the attainment reached).
Result<CapacityPlan> plan_capacity(const std::vector<trace::Request>& rows, const CapacityOptions& options);
nlohmann::json to_json(const CapacityPlan& plan, const replay::RunInfo& info = {});
void print_plan(std::ostream& out, const CapacityPlan& plan, const replay::RunInfo& info = {});
// The plan's HTML page (mc/report/page.hpp): the capacity curve (hit ratio against cache tokens, the infinite
// cache and the target fraction), the attainment of every trial against `accept`, then the final run's charts
// (mc/report/run_charts.hpp).
report::Page plan_page(const CapacityPlan& plan, double accept, double cache_fraction,
                       const replay::RunInfo& info = {});

}  // namespace mc::sim
