// The charts of a run's HTML report, computed from its per-request records (DESIGN.md §5 "Pictures"; library
// mc_report_html): `mc-trace-replay report --html`, `mc-sim --html` and the final run of `mc-plan capacity --html`.
// One run or several (one curve per run):
//   ttft_cdf, tbt_cdf  the CDFs of TTFT and of the per-request TBT statistic (completed requests)
//   ttft_time          TTFT against submit time; rejected and failed requests marked at 0
//   queue              per prefill instance, the requests waiting before their prefill (each request's
//                      ledger.queue_ms laid from its submit time), mean over each time bin
//   load               per instance, the requests in flight: on the prefill instance from submit to the first
//                      token, on the decode instance from the first token to the last; mean over each time bin
//   hit_time           the prefix-cache hit ratio over time (requests by submit time), split local/remote/SSD
//   gpu_s              prefill GPU-seconds spent against saved, per run
//   slo                SLO attainment (of offered requests) at each (TTFT, TBT) threshold pair, per run
// Times are the run's clock: seconds since the run started (modelled time for the simulator and for a replay with
// --time-scale). A chart whose data no record carries is left out with a note saying why.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mc/report/chart.hpp"
#include "mc/report/page.hpp"
#include "mc/report/report.hpp"

namespace mc::replay {

using Points = std::vector<std::pair<double, double>>;

// The empirical CDF of `values` as (value, % of values <= it), at most max_points points (evenly spaced ranks,
// the first and the last always kept). Non-finite values are dropped.
Points cdf_points(std::vector<double> values, size_t max_points = 200);

// Intervals [start, end) in seconds -> the mean number open over each of `bins` equal bins of [0, t_end): points
// (bin centre, mean). Intervals with end <= start add nothing.
Points mean_occupancy(const std::vector<std::pair<double, double>>& intervals, double t_end, int bins);

// The hit ratio per time bin, tokens of each tier / prompt tokens of the requests submitted in the bin (%). Bins
// without prompt tokens are left out. A tier's series is empty when no record reports that tier.
struct HitRatioSeries {
  Points local, remote, ssd;
};
HitRatioSeries hit_ratio_over_time(const std::vector<RequestRecord>& records, double t_end, int bins);

// Prefill GPU-seconds of a run from its records: spent = sum of ledger.prefill_ms x gpus_per_instance; saved =
// the avoided prefill tokens at the run's own mean cost per computed token (spent / (prompt - avoided tokens)), an
// estimate (attention makes long prefixes cost more per token). nullopt when no record has prefill_ms.
struct GpuSeconds {
  double spent = 0, saved = 0;
  bool saved_estimated = true;
};
std::optional<GpuSeconds> gpu_seconds(const std::vector<RequestRecord>& records, double gpus_per_instance);

struct RunRecords {
  std::string label;
  std::vector<RequestRecord> records;
  Summary summary;
  std::optional<GpuSeconds> gpu_s;  // known exactly (the simulator's ledger); nullopt: estimated from the records
};

struct RunChartOptions {
  double gpus_per_instance = 1;       // GPUs of one prefill instance (GPU-seconds = instance-seconds x this)
  int64_t max_scatter_points = 2500;  // per series of ttft_time; above it every k-th request is drawn
  int time_bins = 60;                 // bins of the over-time charts
  size_t max_series = 16;             // per chart; the rest are named in a note
};

// The charts above for `runs` (at least one); `notes` receives a sentence per chart or series left out.
std::vector<mc::report::Chart> run_charts(const std::vector<RunRecords>& runs, const RunChartOptions& options,
                                          std::vector<std::string>& notes);

// The whole page: title, info, the comparison table (comparison_rows) and run_charts.
mc::report::Page run_page(const std::string& title, const RunInfo& info, const std::vector<RunRecords>& runs,
                          const RunChartOptions& options);

}  // namespace mc::replay
