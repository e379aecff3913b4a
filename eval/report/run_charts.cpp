#include "mc/report/run_charts.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "mc/common/report.hpp"

namespace mc::replay {

using mc::report::Chart;
using mc::report::Series;
using mc::report::SeriesStyle;

namespace {

// One colour per run, the same in every chart (chart.cpp's palette order).
constexpr const char* kRunColors[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000"};
const char* run_color(size_t i) { return kRunColors[i % (sizeof(kRunColors) / sizeof(kRunColors[0]))]; }

// Seconds since the run started when the record's last event happened (0 when nothing is known).
double record_end_s(const RequestRecord& r) {
  if (r.end_ms) return *r.end_ms / 1e3;
  if (r.submit_ms && r.e2e_ms) return (*r.submit_ms + *r.e2e_ms) / 1e3;
  if (r.submit_ms) return *r.submit_ms / 1e3;
  return 0;
}

double runs_end_s(const std::vector<RunRecords>& runs) {
  double t = 0;
  for (const RunRecords& run : runs) {
    for (const RequestRecord& r : run.records) t = std::max(t, record_end_s(r));
  }
  return t;
}

// A CDF is drawn on a log axis when its values are positive and spread over more than two decades.
bool wants_log(const std::vector<Series>& series) {
  double lo = INFINITY, hi = 0;
  for (const Series& s : series) {
    for (const auto& p : s.points) {
      lo = std::min(lo, p.first);
      hi = std::max(hi, p.first);
    }
  }
  return lo > 0 && hi / lo > 100;
}

Chart make_chart(const std::string& id, const std::string& title, const std::string& x_label,
                 const std::string& y_label) {
  Chart c;
  c.id = id;
  c.title = title;
  c.x_label = x_label;
  c.y_label = y_label;
  return c;
}

Series make_series(const std::string& title, SeriesStyle style, Points points, int point_type, double point_size,
                   const std::string& color) {
  Series s;
  s.title = title;
  s.style = style;
  s.points = std::move(points);
  s.point_type = point_type;
  s.point_size = point_size;
  s.color = color;
  return s;
}

std::string series_name(const std::vector<RunRecords>& runs, size_t run, const std::string& what) {
  return runs.size() > 1 ? runs[run].label + ": " + what : what;
}

// Keeps at most options.max_series series of `c`, naming the dropped ones in `notes`.
void cap_series(Chart& c, size_t max_series, std::vector<std::string>& notes) {
  if (c.series.size() <= max_series) return;
  std::string dropped;
  for (size_t i = max_series; i < c.series.size(); ++i) dropped += (dropped.empty() ? "" : ", ") + c.series[i].title;
  notes.push_back("Chart '" + c.title + "' shows " + std::to_string(max_series) + " of " +
                  std::to_string(c.series.size()) + " series; not drawn: " + dropped + ".");
  c.series.resize(max_series);
}

std::string ms_label(double ms) {
  if (ms >= 1000 && std::fmod(ms, 1000) == 0) return mc::report::fixed(ms / 1000, 0) + " s";
  if (ms >= 1000) return mc::report::fixed(ms / 1000, 1) + " s";
  return mc::report::fixed(ms, 0) + " ms";
}

Chart cdf_chart(const std::vector<RunRecords>& runs, const std::string& id, const std::string& title,
                const std::string& x_label, const std::string& caption,
                const std::function<std::optional<double>(const RequestRecord&)>& value) {
  Chart c = make_chart(id, title, x_label, "requests at or below (%)");
  c.y_max = 100;
  c.key = "bottom right";
  c.caption = caption;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<double> v;
    for (const RequestRecord& r : runs[i].records) {
      if (r.outcome != Outcome::kCompleted) continue;
      if (auto x = value(r)) v.push_back(*x);
    }
    Series s = make_series(runs[i].label, SeriesStyle::kLinesPoints, Points{}, 7, 0.45, "");
    s.points = cdf_points(std::move(v));
    s.color = run_color(i);
    s.point_size = 0.35;
    if (!s.points.empty()) c.series.push_back(std::move(s));
  }
  c.log_x = wants_log(c.series);
  if (c.log_x) c.x_label += ", log scale";
  return c;
}

}  // namespace

Points cdf_points(std::vector<double> values, size_t max_points) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); }), values.end());
  Points out;
  if (values.empty() || max_points == 0) return out;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const size_t k = std::min(n, std::max<size_t>(max_points, 2));
  out.reserve(k);
  for (size_t j = 0; j < k; ++j) {
    // Evenly spaced ranks, the first and the last included.
    const size_t idx = k == 1 ? n - 1 : (j * (n - 1) + (k - 1) / 2) / (k - 1);
    out.emplace_back(values[idx], 100.0 * static_cast<double>(idx + 1) / static_cast<double>(n));
  }
  return out;
}

Points mean_occupancy(const std::vector<std::pair<double, double>>& intervals, double t_end, int bins) {
  Points out;
  if (bins <= 0 || !(t_end > 0)) return out;
  const double w = t_end / bins;
  std::vector<double> busy(static_cast<size_t>(bins), 0.0);
  for (const auto& [start, end] : intervals) {
    if (!(end > start) || !std::isfinite(start) || !std::isfinite(end)) continue;
    const double a = std::max(0.0, start), b = std::min(t_end, end);
    if (b <= a) continue;
    const auto first = static_cast<size_t>(std::clamp(std::floor(a / w), 0.0, static_cast<double>(bins - 1)));
    const auto last = static_cast<size_t>(std::clamp(std::floor(b / w), 0.0, static_cast<double>(bins - 1)));
    for (size_t i = first; i <= last; ++i) {
      const double lo = static_cast<double>(i) * w, hi = lo + w;
      busy[i] += std::max(0.0, std::min(b, hi) - std::max(a, lo));
    }
  }
  out.reserve(busy.size());
  for (size_t i = 0; i < busy.size(); ++i) out.emplace_back((static_cast<double>(i) + 0.5) * w, busy[i] / w);
  return out;
}

HitRatioSeries hit_ratio_over_time(const std::vector<RequestRecord>& records, double t_end, int bins) {
  HitRatioSeries out;
  if (bins <= 0 || !(t_end > 0)) return out;
  const double w = t_end / bins;
  struct Bin {
    double prompt = 0, local = 0, remote = 0, ssd = 0;
  };
  std::vector<Bin> b(static_cast<size_t>(bins));
  bool has_local = false, has_remote = false, has_ssd = false;
  for (const RequestRecord& r : records) {
    if (!r.submit_ms || !r.ledger.prompt_tokens || *r.ledger.prompt_tokens <= 0) continue;
    const double t = *r.submit_ms / 1e3;
    if (!(t >= 0) || t > t_end) continue;
    Bin& x = b[std::min(static_cast<size_t>(t / w), b.size() - 1)];
    x.prompt += static_cast<double>(*r.ledger.prompt_tokens);
    has_local |= r.ledger.hit_tokens_local.has_value();
    has_remote |= r.ledger.hit_tokens_remote.has_value();
    has_ssd |= r.ledger.hit_tokens_ssd.has_value();
    x.local += static_cast<double>(r.ledger.hit_tokens_local.value_or(0));
    x.remote += static_cast<double>(r.ledger.hit_tokens_remote.value_or(0));
    x.ssd += static_cast<double>(r.ledger.hit_tokens_ssd.value_or(0));
  }
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i].prompt <= 0) continue;
    const double t = (static_cast<double>(i) + 0.5) * w;
    if (has_local) out.local.emplace_back(t, 100 * b[i].local / b[i].prompt);
    if (has_remote) out.remote.emplace_back(t, 100 * b[i].remote / b[i].prompt);
    if (has_ssd) out.ssd.emplace_back(t, 100 * b[i].ssd / b[i].prompt);
  }
  return out;
}

std::optional<GpuSeconds> gpu_seconds(const std::vector<RequestRecord>& records, double gpus_per_instance) {
  double prefill_ms = 0;
  int64_t computed = 0, avoided = 0;
  bool any = false;
  for (const RequestRecord& r : records) {
    if (!r.ledger.prefill_ms) continue;
    any = true;
    prefill_ms += *r.ledger.prefill_ms;
    const int64_t a = r.ledger.avoided_prefill_tokens.value_or(0);
    avoided += a;
    computed += std::max<int64_t>(0, r.ledger.prompt_tokens.value_or(r.input_tokens) - a);
  }
  if (!any) return std::nullopt;
  GpuSeconds g;
  g.spent = prefill_ms / 1e3 * gpus_per_instance;
  g.saved = computed > 0 ? g.spent / static_cast<double>(computed) * static_cast<double>(avoided) : 0;
  return g;
}

std::vector<Chart> run_charts(const std::vector<RunRecords>& runs, const RunChartOptions& options,
                              std::vector<std::string>& notes) {
  std::vector<Chart> charts;
  if (runs.empty()) return charts;
  auto keep = [&](Chart c, const std::string& why_empty) {
    mc::report::drop_zero_bars(c);
    cap_series(c, options.max_series, notes);
    if (c.series.empty()) {
      notes.push_back("No chart '" + c.title + "': " + why_empty + ".");
      return;
    }
    charts.push_back(std::move(c));
  };
  const double t_end = runs_end_s(runs);
  const int bins = std::max(1, options.time_bins);

  keep(cdf_chart(runs, "ttft_cdf", "TTFT distribution", "TTFT (ms)",
                 "Empirical CDF of the time to first token of the completed requests, one curve per run.",
                 [](const RequestRecord& r) { return r.ttft_ms; }),
       "no completed request has a TTFT");
  keep(cdf_chart(runs, "tbt_cdf", "TBT distribution", "TBT: mean of the slowest 10 % of gaps (ms)",
                 "Empirical CDF of each completed request's TBT statistic (the mean of its longest 10 % of "
                 "inter-token gaps, the SLO figure), one curve per run.",
                 [](const RequestRecord& r) -> std::optional<double> {
                   if (!r.tbt) return std::nullopt;
                   return r.tbt->top10_mean_ms;
                 }),
       "no completed request has two output tokens");

  {  // TTFT over time, rejections marked
    Chart c = make_chart("ttft_time", "TTFT over the run", "submit time (s since the run started)", "TTFT (ms)");
    c.key = "top left";
    bool thinned = false;
    for (size_t i = 0; i < runs.size(); ++i) {
      Points done, rejected, failed;
      for (const RequestRecord& r : runs[i].records) {
        if (!r.submit_ms) continue;
        const double t = *r.submit_ms / 1e3;
        if (r.outcome == Outcome::kCompleted && r.ttft_ms) done.emplace_back(t, *r.ttft_ms);
        if (r.outcome == Outcome::kRejected) rejected.emplace_back(t, 0.0);
        if (r.outcome == Outcome::kFailed) failed.emplace_back(t, 0.0);
      }
      const auto limit = static_cast<size_t>(std::max<int64_t>(1, options.max_scatter_points));
      if (done.size() > limit) {
        const size_t k = (done.size() + limit - 1) / limit;
        Points every;
        for (size_t j = 0; j < done.size(); j += k) every.push_back(done[j]);
        done = std::move(every);
        thinned = true;
      }
      if (!done.empty()) {
        c.series.push_back(make_series(series_name(runs, i, "completed"), SeriesStyle::kPoints, std::move(done), 7, 0.3,
                                       run_color(i)));
      }
      if (!rejected.empty()) {
        c.series.push_back(make_series(series_name(runs, i, "rejected (at 0)"), SeriesStyle::kPoints,
                                       std::move(rejected), 2, 0.7, run_color(i)));
      }
      if (!failed.empty()) {
        c.series.push_back(make_series(series_name(runs, i, "failed (at 0)"), SeriesStyle::kPoints, std::move(failed),
                                       6, 0.7, run_color(i)));
      }
    }
    c.caption =
        "Each completed request's TTFT at its submit time (dots); rejected (×-like crosses) and failed "
        "(circles) requests are drawn at 0 at their submit time.";
    if (thinned) {
      c.caption += " More than " + std::to_string(options.max_scatter_points) +
                   " completed requests in a run: every k-th is drawn.";
    }
    keep(std::move(c), "no record has a submit time");
  }

  // Per-instance queue and load: one chart of each per run (the instances of two runs would not tell apart).
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string suffix = runs.size() > 1 ? "_" + std::to_string(i + 1) : "";
    const std::string of_run = runs.size() > 1 ? " (" + runs[i].label + ")" : "";
    Chart queue = make_chart("queue" + suffix, "Prefill queue per instance" + of_run, "time (s since the run started)",
                             "requests waiting (mean per bin)");
    Chart load = make_chart("load" + suffix, "Load per instance" + of_run, "time (s since the run started)",
                            "requests in flight (mean per bin)");
    std::map<std::string, std::vector<std::pair<double, double>>> waiting, prefill, decode;
    for (const RequestRecord& r : runs[i].records) {
      if (!r.submit_ms) continue;
      const double s = *r.submit_ms / 1e3;
      if (!r.prefill_instance.empty() && r.ledger.queue_ms) {
        waiting[r.prefill_instance].emplace_back(s, s + *r.ledger.queue_ms / 1e3);
      }
      if (!r.prefill_instance.empty() && r.ttft_ms) prefill[r.prefill_instance].emplace_back(s, s + *r.ttft_ms / 1e3);
      if (!r.decode_instance.empty() && r.ttft_ms && r.e2e_ms) {
        decode[r.decode_instance].emplace_back(s + *r.ttft_ms / 1e3, s + *r.e2e_ms / 1e3);
      }
    }
    for (const auto& [inst, iv] : waiting) {
      queue.series.push_back(make_series(inst, SeriesStyle::kLinesPoints, mean_occupancy(iv, t_end, bins), 7, 0.3, ""));
    }
    int type = 7;
    for (const auto* m : {&prefill, &decode}) {
      for (const auto& [inst, iv] : *m) {
        load.series.push_back(
            make_series(inst, SeriesStyle::kLinesPoints, mean_occupancy(iv, t_end, bins), type, 0.3, ""));
      }
      type = 5;  // decode instances: open circles
    }
    for (Chart* c : {&queue, &load}) c->key = c->series.size() > 5 ? "outside right top" : "top right";
    queue.caption =
        "Requests waiting for their prefill on each prefill instance: each request's queue time "
        "(ledger queue_ms) laid from its submit time, averaged over " +
        std::to_string(bins) + " bins of the run.";
    load.caption =
        "Requests in flight on each instance: on its prefill instance (filled dots) from submit to the "
        "first token, on its decode instance (open circles) from the first token to the last; averaged "
        "over " +
        std::to_string(bins) + " bins.";
    keep(std::move(queue), "no record" + of_run + " has a prefill instance with a queue time (ledger queue_ms)");
    keep(std::move(load), "no record" + of_run + " names its instances with TTFT and E2E");
  }

  {  // hit ratio over time
    Chart c = make_chart("hit_time", "Prefix-cache hit ratio over the run", "submit time (s since the run started)",
                         "prompt tokens found cached (%)");
    c.y_max = 100;
    c.key = "top right";
    std::string absent;
    for (size_t i = 0; i < runs.size(); ++i) {
      HitRatioSeries h = hit_ratio_over_time(runs[i].records, t_end, bins);
      const std::pair<const char*, Points*> tiers[] = {{"local", &h.local}, {"remote", &h.remote}, {"SSD", &h.ssd}};
      int type = 0;
      for (const auto& [name, pts] : tiers) {
        ++type;
        if (pts->empty()) {
          if (runs.size() == 1) absent += std::string(absent.empty() ? "" : ", ") + name;
          continue;
        }
        c.series.push_back(make_series(series_name(runs, i, name), SeriesStyle::kLinesPoints, std::move(*pts),
                                       type == 1 ? 7 : (type == 2 ? 5 : 9), 0.4, ""));
      }
    }
    c.caption = "Of the prompt tokens of the requests submitted in each of " + std::to_string(bins) +
                " bins, the share found in the prefill instance's own cache (local), fetched from the pool "
                "(remote) or from SSD.";
    if (!absent.empty()) c.caption += " Not in these records: " + absent + ".";
    keep(std::move(c), "no record has a ledger with prompt tokens and a submit time");
  }

  {  // GPU-seconds spent against saved
    Chart c = make_chart("gpu_s", "Prefill GPU-seconds: spent and saved by the cache", "", "GPU-seconds");
    c.key = "below";
    Series spent = make_series("spent", SeriesStyle::kBars, Points{}, 7, 0.45, "#0072b2");
    Series saved = make_series("saved by reused prefixes", SeriesStyle::kBars, Points{}, 7, 0.45, "#009e73");
    bool estimated = false, exact = false;
    for (size_t i = 0; i < runs.size(); ++i) {
      c.categories.push_back(runs[i].label);
      std::optional<GpuSeconds> g =
          runs[i].gpu_s ? runs[i].gpu_s : gpu_seconds(runs[i].records, options.gpus_per_instance);
      if (!g) continue;
      (runs[i].gpu_s ? exact : estimated) = true;
      spent.points.emplace_back(static_cast<double>(i), g->spent);
      saved.points.emplace_back(static_cast<double>(i), g->saved);
    }
    if (!spent.points.empty()) {
      c.series.push_back(std::move(spent));
      c.series.push_back(std::move(saved));
    }
    c.caption = "Prefill compute per run. ";
    if (exact) c.caption += "Simulated runs: the simulator's own ledger (cost model). ";
    if (estimated) {
      c.caption += "From records: spent = the sum of ledger prefill_ms x " +
                   mc::report::fixed(options.gpus_per_instance, 0) +
                   " GPUs per instance; saved = the avoided prefill tokens at the run's mean cost per computed "
                   "token (an estimate: long prefixes cost more per token).";
    }
    keep(std::move(c), "no record has ledger prefill_ms");
  }

  {  // SLO attainment at each threshold
    Chart c = make_chart("slo", "SLO attainment", "", "requests within both limits (% of offered)");
    c.y_max = 100;
    c.key = "below";
    const std::vector<SloResult>& first = runs.front().summary.slo;
    for (const SloResult& s : first) {
      c.categories.push_back("TTFT≤" + ms_label(s.ttft_ms) + "\nTBT≤" + ms_label(s.tbt_ms));
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      Series s = make_series(runs[i].label, SeriesStyle::kBars, Points{}, 7, 0.45, run_color(i));
      const std::vector<SloResult>& slo = runs[i].summary.slo;
      for (size_t j = 0; j < slo.size() && j < first.size(); ++j) {
        s.points.emplace_back(static_cast<double>(j), 100 * slo[j].attainment);
      }
      if (!s.points.empty()) c.series.push_back(std::move(s));
    }
    c.caption =
        "The share of offered requests that completed within both limits, at each (TTFT, TBT) pair of "
        "--slo-ttft-ms x --slo-tbt-ms.";
    keep(std::move(c), "no SLO threshold given");
  }
  return charts;
}

mc::report::Page run_page(const std::string& title, const RunInfo& info, const std::vector<RunRecords>& runs,
                          const RunChartOptions& options) {
  mc::report::Page page;
  page.title = title;
  std::string labels;
  for (const RunRecords& r : runs) labels += (labels.empty() ? "" : ", ") + r.label;
  page.subtitle = std::to_string(runs.size()) + (runs.size() == 1 ? " run: " : " runs: ") + labels +
                  ". Times in milliseconds of the run's clock.";
  page.info = info;
  std::vector<std::pair<std::string, Summary>> summaries;
  summaries.reserve(runs.size());
  for (const RunRecords& r : runs) summaries.emplace_back(r.label, r.summary);
  page.table = comparison_rows(summaries);
  page.charts = run_charts(runs, options, page.notes);
  return page;
}

}  // namespace mc::replay
