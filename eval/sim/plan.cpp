#include "mc/sim/plan.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "mc/common/report.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/replay/analyze.hpp"
#include "mc/report/format.hpp"
#include "mc/report/run_charts.hpp"

namespace mc::sim {

using mc::report::fixed;
using mc::report::pct;

// ---------------------------------------------------------------------------------------------
// Threshold

Result<ThresholdReport> fetch_threshold(const std::string& model, const std::string& gpu,
                                        const std::vector<int64_t>& prefix_tokens, int64_t new_tokens) {
  if (new_tokens < 1) return error(Code::kInvalidArgument, "--new-tokens must be >= 1");
  if (prefix_tokens.empty()) return error(Code::kInvalidArgument, "--prefix-tokens needs at least one length");
  MC_ASSIGN_OR_RETURN(model::ModelConfig m, model::load_model(model));
  MC_ASSIGN_OR_RETURN(model::GpuSpec g, model::gpu_preset(gpu));
  const model::GpuSpec peak = g.at_peak();
  ThresholdReport r;
  r.model = m.name;
  r.gpu = g.name;
  r.kv_bytes_per_token = m.kv_bytes_per_token();
  r.new_tokens = new_tokens;
  r.compute_efficiency = g.compute_efficiency;
  r.linear_threshold_bytes_per_s = model::fetch_threshold_bytes_per_s(m, g);
  r.linear_threshold_at_peak_bytes_per_s = model::fetch_threshold_bytes_per_s(m, peak);
  if (g.name == "a800x8") r.paper_bytes_per_s = 6e9;
  if (g.name == "h800x8") r.paper_bytes_per_s = 19e9;
  for (int64_t p : prefix_tokens) {
    if (p < 1) return error(Code::kInvalidArgument, "--prefix-tokens: lengths must be >= 1, got " + std::to_string(p));
    ThresholdRow row;
    row.prefix_tokens = p;
    row.prefix_bytes = p * r.kv_bytes_per_token;
    row.saved_s = model::recompute_saved_s(m, g, new_tokens, p);
    row.threshold_bytes_per_s = static_cast<double>(row.prefix_bytes) / row.saved_s;
    row.threshold_at_peak_bytes_per_s =
        static_cast<double>(row.prefix_bytes) / model::recompute_saved_s(m, peak, new_tokens, p);
    r.rows.push_back(row);
  }
  return r;
}

nlohmann::json to_json(const ThresholdReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ThresholdRow& x : r.rows) {
    rows.push_back({{"prefix_tokens", x.prefix_tokens},
                    {"prefix_bytes", x.prefix_bytes},
                    {"saved_s", x.saved_s},
                    {"threshold_bytes_per_s", x.threshold_bytes_per_s},
                    {"threshold_at_peak_bytes_per_s", x.threshold_at_peak_bytes_per_s}});
  }
  nlohmann::json j = {{"model", r.model},
                      {"gpu", r.gpu},
                      {"kv_bytes_per_token", r.kv_bytes_per_token},
                      {"new_tokens", r.new_tokens},
                      {"compute_efficiency", r.compute_efficiency},
                      {"linear_threshold_bytes_per_s", r.linear_threshold_bytes_per_s},
                      {"linear_threshold_at_peak_bytes_per_s", r.linear_threshold_at_peak_bytes_per_s},
                      {"rows", std::move(rows)}};
  if (r.paper_bytes_per_s) j["paper_bytes_per_s"] = *r.paper_bytes_per_s;
  return j;
}

void print_threshold(std::ostream& out, const ThresholdReport& r) {
  out << "model=" << r.model << "  gpu=" << r.gpu << "  kv_bytes_per_token=" << r.kv_bytes_per_token
      << "  new_tokens=" << r.new_tokens << "  compute_efficiency=" << fixed(r.compute_efficiency, 2)
      << "  (GB = 1e9 bytes)\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"prefix_tokens", "prefix_GB", "recompute_saved_s", "threshold_GB/s", "threshold_at_peak_GB/s"}};
  for (const ThresholdRow& x : r.rows) {
    rows.push_back({std::to_string(x.prefix_tokens), fixed(static_cast<double>(x.prefix_bytes) * 1e-9, 3),
                    fixed(x.saved_s, 4), fixed(x.threshold_bytes_per_s * 1e-9, 2),
                    fixed(x.threshold_at_peak_bytes_per_s * 1e-9, 2)});
  }
  mc::report::print_table(out, rows);
  out << "\nlinear term only (kv_bytes_per_token x prefill rate): " << fixed(r.linear_threshold_bytes_per_s * 1e-9, 2)
      << " GB/s at the preset's efficiency, " << fixed(r.linear_threshold_at_peak_bytes_per_s * 1e-9, 2)
      << " GB/s at peak";
  if (r.paper_bytes_per_s) out << "; paper: ~" << fixed(*r.paper_bytes_per_s * 1e-9, 0) << " GB/s";
  out << "\nfetching a cached prefix beats recomputing it when the fetch bandwidth exceeds the threshold\n";
}

// ---------------------------------------------------------------------------------------------
// Capacity

namespace {

struct Evaluation {
  double attainment = 0;
  double ttft_attainment = 0;
  SimResult result;
};

}  // namespace

Result<CapacityPlan> plan_capacity(const std::vector<trace::Request>& rows, const CapacityOptions& o) {
  if (!(o.accept > 0 && o.accept <= 1)) return error(Code::kInvalidArgument, "--accept must be in (0, 1]");
  if (o.max_instances < 1 || o.max_instances > 4096) {
    return error(Code::kInvalidArgument, "--max-instances must be in [1, 4096]");
  }
  if (o.cache_total_tokens.empty() || o.nic_bytes_per_s.empty()) {
    return error(Code::kInvalidArgument, "the cache and NIC candidate lists must not be empty");
  }
  if (rows.empty()) return error(Code::kInvalidArgument, "the trace window holds no request");
  MC_RETURN_IF_ERROR(o.base.validate());
  CapacityPlan plan;

  // 1. Cache: global LRU hit ratio of the window per candidate total capacity.
  std::vector<int64_t> caps = o.cache_total_tokens;
  std::sort(caps.begin(), caps.end());
  {
    replay::PrefixCacheModel infinite(0, o.base.block_size);
    for (const auto& r : rows) infinite.add(r);
    plan.cache_hit_ratio_infinite = infinite.ratios().tokens_full_blocks;
  }
  plan.cache_total_tokens = caps.back();
  bool chosen = false;
  for (int64_t cap : caps) {  // every candidate, for the capacity curve; the first reaching the fraction is chosen
    replay::PrefixCacheModel lru(cap / o.base.block_size, o.base.block_size);
    for (const auto& r : rows) lru.add(r);
    const double hit = lru.ratios().tokens_full_blocks;
    plan.cache_curve.emplace_back(cap, hit);
    if (chosen) continue;
    plan.cache_hit_ratio = hit;
    if (hit >= o.cache_fraction * plan.cache_hit_ratio_infinite) {
      plan.cache_total_tokens = cap;
      chosen = true;
    }
  }

  std::vector<double> nics = o.nic_bytes_per_s;
  std::sort(nics.begin(), nics.end());
  ClusterConfig c = o.base;
  c.early_rejection = false;
  const SimOptions base_opt = [&] {
    SimOptions s;
    s.cluster = c;
    s.window = o.window;
    return s;
  }();

  auto evaluate = [&](const std::string& step, int64_t p, int64_t d, double nic) -> Result<Evaluation> {
    SimOptions s = base_opt;
    s.cluster.prefill_instances = p;
    s.cluster.decode_instances = d;
    s.cluster.cache_capacity_tokens = plan.cache_total_tokens / p;
    s.cluster.nic_bandwidth_bytes_per_s = nic;
    s.cluster.instance_nic_bandwidth_bytes_per_s.clear();  // the plan sizes one NIC for every instance
    replay::SummaryOptions so;
    so.slo_ttft_ms = {c.slo_ttft_ms};
    so.slo_tbt_ms = {c.slo_tbt_ms};
    auto src = vector_source(rows);
    MC_ASSIGN_OR_RETURN(SimResult res, simulate(s, *src, so));
    Evaluation e;
    e.attainment = res.summary.slo.front().attainment;
    int64_t ttft_met = 0;
    for (const auto& r : res.records) {
      if (r.ttft_ms && *r.ttft_ms <= c.slo_ttft_ms) ++ttft_met;
    }
    e.ttft_attainment = static_cast<double>(ttft_met) / static_cast<double>(res.records.size());
    CapacityTrial t{
        step, p, d, s.cluster.cache_capacity_tokens, nic, e.attainment, e.ttft_attainment, res.totals.wall_s};
    plan.trials.push_back(t);
    if (o.progress) {
      std::cerr << "mc-plan: " << step << " P=" << p << " D=" << d << " nic=" << fixed(nic * 1e-9, 1)
                << " GB/s -> attainment " << pct(e.attainment) << " % (TTFT " << pct(e.ttft_attainment) << " %)\n";
    }
    e.result = std::move(res);
    return e;
  };
  // Fewest n in [1, max] with ok(n), assuming monotonicity; max+1 when even max fails.
  auto fewest = [&](auto&& ok) -> Result<int64_t> {
    int64_t lo = 1, hi = o.max_instances;
    MC_ASSIGN_OR_RETURN(bool top, ok(hi));
    if (!top) return o.max_instances + 1;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      MC_ASSIGN_OR_RETURN(bool good, ok(mid));
      if (good) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  };

  // 2. Prefill: decode and NIC generous, TTFT attainment.
  MC_ASSIGN_OR_RETURN(int64_t p, fewest([&](int64_t n) -> Result<bool> {
                        MC_ASSIGN_OR_RETURN(Evaluation e, evaluate("prefill", n, o.max_instances, nics.back()));
                        return e.ttft_attainment >= o.accept;
                      }));
  if (p > o.max_instances) {
    return error(Code::kResourceExhausted, "even " + std::to_string(o.max_instances) +
                                               " prefill instances miss the TTFT SLO for more than " +
                                               pct(1 - o.accept) +
                                               " % of the requests: raise --max-instances or "
                                               "relax --slo-ttft-ms");
  }
  // 3. Decode: both SLOs.
  MC_ASSIGN_OR_RETURN(int64_t d, fewest([&](int64_t n) -> Result<bool> {
                        MC_ASSIGN_OR_RETURN(Evaluation e, evaluate("decode", p, n, nics.back()));
                        return e.attainment >= o.accept;
                      }));
  if (d > o.max_instances) {
    return error(Code::kResourceExhausted, "even " + std::to_string(o.max_instances) +
                                               " decode instances miss the TBT SLO for more than " + pct(1 - o.accept) +
                                               " % of the requests: raise --max-instances or "
                                               "relax --slo-tbt-ms");
  }
  // 4. NIC: the slowest candidate that keeps attainment.
  plan.nic_bandwidth_bytes_per_s = nics.back();
  for (double nic : nics) {
    if (nic == nics.back()) break;
    MC_ASSIGN_OR_RETURN(Evaluation e, evaluate("nic", p, d, nic));
    if (e.attainment >= o.accept) {
      plan.nic_bandwidth_bytes_per_s = nic;
      break;
    }
  }
  // 5. The plan itself.
  MC_ASSIGN_OR_RETURN(Evaluation fin, evaluate("final", p, d, plan.nic_bandwidth_bytes_per_s));
  plan.prefill_instances = p;
  plan.decode_instances = d;
  plan.cache_capacity_tokens = plan.cache_total_tokens / p;
  plan.attainment = fin.attainment;
  plan.feasible = fin.attainment >= o.accept;
  plan.cluster = c;
  plan.cluster.prefill_instances = p;
  plan.cluster.decode_instances = d;
  plan.cluster.cache_capacity_tokens = plan.cache_capacity_tokens;
  plan.cluster.nic_bandwidth_bytes_per_s = plan.nic_bandwidth_bytes_per_s;
  plan.cluster.instance_nic_bandwidth_bytes_per_s.clear();
  plan.cluster.early_rejection = o.base.early_rejection;
  const int64_t kv_bytes = fin.result.cluster.value("kv_bytes_per_token", int64_t{0});
  plan.cache_total_bytes = plan.cache_total_tokens * kv_bytes;
  plan.final_run = std::move(fin.result);
  return plan;
}

nlohmann::json to_json(const CapacityPlan& p, const replay::RunInfo& info) {
  nlohmann::json trials = nlohmann::json::array();
  for (const CapacityTrial& t : p.trials) {
    trials.push_back({{"step", t.step},
                      {"prefill_instances", t.prefill_instances},
                      {"decode_instances", t.decode_instances},
                      {"cache_capacity_tokens", t.cache_capacity_tokens},
                      {"nic_bandwidth_bytes_per_s", t.nic_bandwidth_bytes_per_s},
                      {"attainment", t.attainment},
                      {"ttft_attainment", t.ttft_attainment},
                      {"wall_s", t.wall_s}});
  }
  return {{"config", mc::report::run_info_json(info)},
          {"feasible", p.feasible},
          {"prefill_instances", p.prefill_instances},
          {"decode_instances", p.decode_instances},
          {"cache_total_tokens", p.cache_total_tokens},
          {"cache_capacity_tokens", p.cache_capacity_tokens},
          {"cache_total_bytes", p.cache_total_bytes},
          {"cache_hit_ratio", p.cache_hit_ratio},
          {"cache_hit_ratio_infinite", p.cache_hit_ratio_infinite},
          {"nic_bandwidth_bytes_per_s", p.nic_bandwidth_bytes_per_s},
          {"attainment", p.attainment},
          {"cluster", p.cluster.to_json()},
          {"trials", std::move(trials)},
          {"summary", replay::to_json(p.final_run.summary)}};
}

void print_plan(std::ostream& out, const CapacityPlan& p, const replay::RunInfo& info) {
  mc::report::print_run_header(out, info);
  mc::report::print_table(
      out, {{"plan", "prefill", "decode", "cache_total_tokens", "cache_per_prefill_tokens", "cache_total_GB",
             "nic_GB/s", "attainment_%", "feasible"},
            {"", std::to_string(p.prefill_instances), std::to_string(p.decode_instances),
             std::to_string(p.cache_total_tokens), std::to_string(p.cache_capacity_tokens),
             fixed(static_cast<double>(p.cache_total_bytes) * 1e-9, 0), fixed(p.nic_bandwidth_bytes_per_s * 1e-9, 1),
             pct(p.attainment), p.feasible ? "yes" : "no"}});
  out << "cache: LRU hit ratio " << pct(p.cache_hit_ratio) << " % of prompt tokens at the chosen capacity, "
      << pct(p.cache_hit_ratio_infinite) << " % with an infinite cache\n\n";
  std::vector<std::vector<std::string>> rows = {{"trial", "prefill", "decode", "cache_per_prefill_tokens", "nic_GB/s",
                                                 "attainment_%", "ttft_attainment_%", "wall_s"}};
  for (const CapacityTrial& t : p.trials) {
    rows.push_back({t.step, std::to_string(t.prefill_instances), std::to_string(t.decode_instances),
                    std::to_string(t.cache_capacity_tokens), fixed(t.nic_bandwidth_bytes_per_s * 1e-9, 1),
                    pct(t.attainment), pct(t.ttft_attainment), fixed(t.wall_s, 2)});
  }
  mc::report::print_table(out, rows);
  out << "\nCLUSTER.json of the plan:\n" << p.cluster.to_json().dump(2) << "\n";
}

report::Page plan_page(const CapacityPlan& p, double accept, double cache_fraction, const replay::RunInfo& info) {
  using report::Series;
  using report::SeriesStyle;
  report::Chart curve;
  curve.id = "capacity_curve";
  curve.title = "Cache capacity: LRU hit ratio of the window";
  curve.x_label = "cache capacity, all instances (tokens, log scale)";
  curve.y_label = "prompt tokens found cached (%)";
  curve.log_x = true;
  curve.y_max = 100;
  curve.key = "top left";
  Series lru;
  lru.title = "LRU (complete blocks)";
  for (const auto& [cap, hit] : p.cache_curve) {
    if (cap > 0) lru.points.emplace_back(static_cast<double>(cap), 100 * hit);
  }
  if (!lru.points.empty()) {
    const double lo = lru.points.front().first, hi = lru.points.back().first;
    Series inf, target;
    inf.title = "infinite cache";
    inf.point_type = 4;
    inf.color = "#7f7f7f";
    inf.points = {{lo, 100 * p.cache_hit_ratio_infinite}, {hi, 100 * p.cache_hit_ratio_infinite}};
    target.title = "target: " + report::pct(cache_fraction) + " % of infinite";
    target.point_type = 2;
    target.color = "#d55e00";
    const double t = 100 * cache_fraction * p.cache_hit_ratio_infinite;
    target.points = {{lo, t}, {hi, t}};
    Series chosen;
    chosen.title = "chosen: " + std::to_string(p.cache_total_tokens) + " tokens";
    chosen.style = SeriesStyle::kPoints;
    chosen.point_type = 6;
    chosen.point_size = 1.6;
    chosen.color = "#009e73";
    chosen.points = {{static_cast<double>(p.cache_total_tokens), 100 * p.cache_hit_ratio}};
    curve.series = {std::move(lru), std::move(inf), std::move(target)};
    if (p.cache_total_tokens > 0) curve.series.push_back(std::move(chosen));
  }
  curve.caption =
      "The global LRU hit ratio of the trace window at each candidate capacity (--cache-candidates); "
      "the plan takes the smallest reaching the target share of the infinite cache's.";

  report::Chart trials;
  trials.id = "trials";
  trials.title = "Search: SLO attainment of every simulation";
  trials.x_label = "trial (in order)";
  trials.y_label = "requests within both SLOs (% of offered)";
  trials.y_max = 100;
  trials.key = "bottom right";
  std::vector<Series> steps;
  for (size_t i = 0; i < p.trials.size(); ++i) {
    const CapacityTrial& t = p.trials[i];
    auto it = std::find_if(steps.begin(), steps.end(), [&](const Series& s) { return s.title == t.step; });
    if (it == steps.end()) {
      Series s;
      s.title = t.step;
      s.style = SeriesStyle::kPoints;
      s.point_size = 1.0;
      s.point_type = 7 + 2 * static_cast<int>(steps.size() % 4);
      steps.push_back(std::move(s));
      it = std::prev(steps.end());
    }
    it->points.emplace_back(static_cast<double>(i + 1), 100 * t.attainment);
  }
  if (!p.trials.empty()) {
    Series goal;
    goal.title = "accept: " + report::pct(accept) + " %";
    goal.color = "#d55e00";
    goal.point_type = 2;
    goal.points = {{1, 100 * accept}, {static_cast<double>(p.trials.size()), 100 * accept}};
    steps.push_back(std::move(goal));
  }
  trials.series = std::move(steps);
  trials.caption =
      "Each simulation of the search (prefill count, then decode count, then NIC bandwidth, then the "
      "final check), by its attainment of both SLOs against --accept.";

  const std::string label =
      "plan " + std::to_string(p.prefill_instances) + "P+" + std::to_string(p.decode_instances) + "D";
  replay::GpuSeconds g;
  g.spent = p.final_run.totals.prefill_gpu_s;
  g.saved = p.final_run.totals.prefill_gpu_s_saved;
  g.saved_estimated = false;
  report::Page page =
      replay::run_page("mc-plan capacity", info, {{label, p.final_run.records, p.final_run.summary, g}}, {});
  page.subtitle = std::string(p.feasible ? "Feasible" : "Not feasible") + ": " + std::to_string(p.prefill_instances) +
                  " prefill + " + std::to_string(p.decode_instances) + " decode instances, " +
                  std::to_string(p.cache_total_tokens) + " cache tokens, NIC " +
                  report::fixed(p.nic_bandwidth_bytes_per_s / 1e9, 1) + " GB/s per instance; final attainment " +
                  report::pct(p.attainment) + " %. The final run's charts follow the search's.";
  std::vector<report::Chart> charts;
  if (!curve.series.empty()) charts.push_back(std::move(curve));
  if (!trials.series.empty()) charts.push_back(std::move(trials));
  charts.insert(charts.end(), std::make_move_iterator(page.charts.begin()), std::make_move_iterator(page.charts.end()));
  page.charts = std::move(charts);
  return page;
}

}  // namespace mc::sim
