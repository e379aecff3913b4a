#include "mc/sim/plan.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "mc/common/report.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/replay/analyze.hpp"
#include "mc/report/format.hpp"

namespace mc::sim {

using mc::report::fixed;
using mc::report::pct;

// ---------------------------------------------------------------------------------------------
// Threshold

Result<ThresholdReport> fetch_threshold(const std::string& model, const std::string& gpu,
                                        const std::vector<int64_t>& prefix_tokens, int64_t new_tokens) {
  if (new_tokens < 1) return error(Code::kInvalidArgument, "--new-tokens must be >= 1");
  if (prefix_tokens.empty()) return error(Code::kInvalidArgument, "--prefix-tokens needs at least one length");
  MC_ASSIGN_OR_RETURN(infer::ModelConfig m, infer::load_model(model));
  MC_ASSIGN_OR_RETURN(infer::GpuSpec g, infer::gpu_preset(gpu));
  const infer::GpuSpec peak = g.at_peak();
  ThresholdReport r;
  r.model = m.name;
  r.gpu = g.name;
  r.kv_bytes_per_token = m.kv_bytes_per_token();
  r.new_tokens = new_tokens;
  r.compute_efficiency = g.compute_efficiency;
  r.linear_threshold_bytes_per_s = infer::fetch_threshold_bytes_per_s(m, g);
  r.linear_threshold_at_peak_bytes_per_s = infer::fetch_threshold_bytes_per_s(m, peak);
  if (g.name == "a800x8") r.paper_bytes_per_s = 6e9;
  if (g.name == "h800x8") r.paper_bytes_per_s = 19e9;
  for (int64_t p : prefix_tokens) {
    if (p < 1) return error(Code::kInvalidArgument, "--prefix-tokens: lengths must be >= 1, got " + std::to_string(p));
    ThresholdRow row;
    row.prefix_tokens = p;
    row.prefix_bytes = p * r.kv_bytes_per_token;
    row.saved_s = infer::recompute_saved_s(m, g, new_tokens, p);
    row.threshold_bytes_per_s = static_cast<double>(row.prefix_bytes) / row.saved_s;
    row.threshold_at_peak_bytes_per_s =
        static_cast<double>(row.prefix_bytes) / infer::recompute_saved_s(m, peak, new_tokens, p);
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
  for (int64_t cap : caps) {
    replay::PrefixCacheModel lru(cap / o.base.block_size, o.base.block_size);
    for (const auto& r : rows) lru.add(r);
    const double hit = lru.ratios().tokens_full_blocks;
    plan.cache_hit_ratio = hit;
    if (hit >= o.cache_fraction * plan.cache_hit_ratio_infinite) {
      plan.cache_total_tokens = cap;
      break;
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

}  // namespace mc::sim
