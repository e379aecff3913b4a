// The page of `mc-trace-replay analyze --html` (analyze.hpp: analyze_page).
#include <algorithm>
#include <cmath>

#include "mc/common/report.hpp"
#include "mc/replay/analyze.hpp"
#include "mc/report/run_charts.hpp"

namespace mc::replay {

using mc::report::Chart;
using mc::report::Series;
using mc::report::SeriesStyle;

namespace {

Series series(const std::string& title, int point_type, const std::string& color) {
  Series s;
  s.title = title;
  s.point_type = point_type;
  s.color = color;
  return s;
}

}  // namespace

mc::report::Page analyze_page(const TraceAnalysis& a, const RunInfo& info, int64_t block_size) {
  mc::report::Page page;
  page.title = "mc-trace-replay analyze";
  page.subtitle = std::to_string(a.requests) + " requests over " + mc::report::fixed(a.span_s, 1) + " s of trace (" +
                  mc::report::fixed(a.arrival_rate_rps, 2) + " req/s); blocks of " + std::to_string(block_size) +
                  " tokens. No cluster: what the trace itself allows.";
  page.info = info;
  page.table = {
      {"figure", "value"},
      {"requests", std::to_string(a.requests)},
      {"input tokens, mean / p90",
       a.input_tokens ? mc::report::fixed(a.input_tokens->mean, 0) + " / " + mc::report::fixed(a.input_tokens->p90, 0)
                      : "-"},
      {"output tokens, mean / p90", a.output_tokens ? mc::report::fixed(a.output_tokens->mean, 0) + " / " +
                                                          mc::report::fixed(a.output_tokens->p90, 0)
                                                    : "-"},
      {"hit ratio, infinite cache (% of tokens, complete blocks)", mc::report::pct(a.infinite.tokens_full_blocks)},
      {"hit ratio, infinite cache, earlier arrivals only (%)", mc::report::pct(a.infinite_earlier.tokens_full_blocks)}};

  Chart curve;
  curve.id = "capacity_curve";
  curve.title = "Capacity curve: prefix-cache hit ratio against cache size";
  curve.x_label = "cache capacity (tokens, log scale)";
  curve.y_label = "prompt tokens found cached (%)";
  curve.log_x = true;
  curve.y_max = 100;
  curve.key = "top left";
  Series lru = series("LRU, complete blocks", 7, "#0072b2");
  Series lru_tokens = series("LRU, with partial last blocks", 5, "#56b4e9");
  for (const LruPoint& p : a.lru) {
    if (p.capacity_tokens <= 0) continue;
    lru.points.emplace_back(static_cast<double>(p.capacity_tokens), 100 * p.hit.tokens_full_blocks);
    lru_tokens.points.emplace_back(static_cast<double>(p.capacity_tokens), 100 * p.hit.tokens);
  }
  if (!lru.points.empty()) {
    std::sort(lru.points.begin(), lru.points.end());
    std::sort(lru_tokens.points.begin(), lru_tokens.points.end());
    const double lo = lru.points.front().first, hi = lru.points.back().first;
    Series inf = series("infinite cache", 4, "#7f7f7f");
    inf.points = {{lo, 100 * a.infinite.tokens_full_blocks}, {hi, 100 * a.infinite.tokens_full_blocks}};
    Series earlier = series("infinite, earlier arrivals only", 2, "#d55e00");
    earlier.points = {{lo, 100 * a.infinite_earlier.tokens_full_blocks},
                      {hi, 100 * a.infinite_earlier.tokens_full_blocks}};
    curve.series = {std::move(lru), std::move(lru_tokens), std::move(inf), std::move(earlier)};
    page.charts.push_back(std::move(curve));
  }

  Chart lengths;
  lengths.id = "lengths";
  lengths.title = "Request lengths";
  lengths.x_label = "tokens (log scale)";
  lengths.y_label = "requests at or below (%)";
  lengths.log_x = true;
  lengths.y_max = 100;
  lengths.key = "bottom right";
  auto positive = [](std::vector<double> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !(x > 0); }), v.end());
    return v;
  };
  Series in = series("input (prompt)", 7, "#0072b2");
  in.points = cdf_points(positive(a.samples.input_tokens));
  in.point_size = 0.35;
  Series out = series("output", 5, "#e69f00");
  out.points = cdf_points(positive(a.samples.output_tokens));
  out.point_size = 0.35;
  for (Series* s : {&in, &out}) {
    if (!s->points.empty()) lengths.series.push_back(std::move(*s));
  }
  if (!lengths.series.empty()) page.charts.push_back(std::move(lengths));

  Chart arrivals;
  arrivals.id = "arrivals";
  arrivals.title = "Arrivals over the window";
  arrivals.x_label = "trace time (s since the first request)";
  arrivals.y_label = "requests per second (mean per bin)";
  arrivals.key = "top right";
  if (!a.samples.arrival_s.empty()) {
    const double end = std::max(1e-3, a.span_s);
    const int bins = static_cast<int>(std::clamp<double>(std::ceil(end), 1, 60));
    const double w = end / bins;
    std::vector<double> n(static_cast<size_t>(bins), 0);
    for (double t : a.samples.arrival_s) n[std::min(static_cast<size_t>(std::max(0.0, t) / w), n.size() - 1)] += 1;
    Series rate = series("arrival rate", 7, "#009e73");
    for (size_t i = 0; i < n.size(); ++i) rate.points.emplace_back((static_cast<double>(i) + 0.5) * w, n[i] / w);
    arrivals.series.push_back(std::move(rate));
    arrivals.caption = "Requests arriving in each of " + std::to_string(bins) + " bins of the window, per second.";
    page.charts.push_back(std::move(arrivals));
  }
  for (Chart& c : page.charts) {
    if (c.id == "capacity_curve") {
      c.caption =
          "The share of prompt tokens an LRU prefix cache of each size would serve from cache (--capacity-"
          "tokens gives the sizes), against an infinite cache and the infinite cache when a request reuses "
          "only blocks of strictly earlier arrivals (what a live replay can reach).";
    } else if (c.id == "lengths") {
      c.caption = "Empirical CDFs of the prompt and output lengths of the window's requests.";
    }
  }
  if (a.lru.empty()) page.notes.push_back("No capacity curve: --capacity-tokens gave no capacity.");
  return page;
}

}  // namespace mc::replay
