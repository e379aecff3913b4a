// The paper's experiments (docs/REPRODUCTION.md) on a reduced window of the shipped conversation trace, with
// the predictors refitted as the daemons do and the orderings asserted; the refit does not drift under
// overload; and determinism of whole runs.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "mc/sim/simulator.hpp"

namespace mc::sim {
namespace {

const char* kTrace = MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl";

std::vector<trace::Request> window(double duration_s) {
  trace::ReaderOptions ro;
  auto src = open_trace(kTrace, ro);
  EXPECT_TRUE(src.is_ok()) << src.status().to_string();
  TraceWindow w;
  w.duration_s = duration_s;
  auto rows = load_window(**src, w);
  EXPECT_TRUE(rows.is_ok()) << rows.status().to_string();
  return std::move(rows).value();
}

SimResult run(const std::vector<trace::Request>& rows, SimOptions opt, std::ostream* records = nullptr) {
  opt.records_jsonl = records;
  auto src = vector_source(rows);
  replay::SummaryOptions so;
  so.slo_ttft_ms = {opt.cluster.slo_ttft_ms};
  so.slo_tbt_ms = {opt.cluster.slo_tbt_ms};
  auto r = simulate(opt, *src, so);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

// Reproduction 1 (paper: random 19.65 s > load balancing 5.27 s > KVCache-centric 3.07 s mean TTFT).
// The baselines have only their own instance's cache (as in the paper); kvcache has the global pool.
TEST(Reproduction, SchedulingPoliciesOrderAsInThePaper) {
  const auto rows = window(600);
  ASSERT_GT(rows.size(), 1500u);
  std::map<std::string, double> mean_ttft_ms;
  for (const char* policy : {"random", "least_loaded", "cache_aware", "kvcache"}) {
    SimOptions o;
    o.cluster.policy = policy;
    o.cluster.cache_mode = std::string(policy) == "kvcache" ? CacheMode::kGlobal : CacheMode::kLocal;
    o.window.rate_scale = 1.5;
    SimResult r = run(rows, o);
    ASSERT_TRUE(r.summary.ttft_ms.has_value());
    mean_ttft_ms[policy] = r.summary.ttft_ms->mean;
  }
  // Measured on this window: random 8.6 s > least_loaded 3.6 s > cache_aware 2.3 s > kvcache 1.7 s.
  EXPECT_GT(mean_ttft_ms["random"], mean_ttft_ms["least_loaded"]);
  EXPECT_GT(mean_ttft_ms["least_loaded"], mean_ttft_ms["cache_aware"]);
  EXPECT_GT(mean_ttft_ms["cache_aware"], mean_ttft_ms["kvcache"]);
}

// Reproduction 2: a global pool beats equal-capacity local caches in hit ratio and prefill compute.
TEST(Reproduction, GlobalPoolHitsMoreThanLocalCachesOfEqualCapacity) {
  auto rows = window(600);
  for (auto& r : rows) r.output_length = 1;  // as in the paper's cache experiment
  SimOptions o;
  o.cluster.prefill_instances = 10;
  o.cluster.cache_capacity_tokens = 1'000'000;  // scaled with the window (paper: 3 M each, whole trace)
  SimResult global = run(rows, o);
  o.cluster.cache_mode = CacheMode::kLocal;
  SimResult local = run(rows, o);
  // Measured on this window: 26.7 % vs 23.8 % (docs/REPRODUCTION.md: far from the paper's 2.36x).
  EXPECT_GT(global.totals.hit_ratio(), 1.05 * local.totals.hit_ratio());
  EXPECT_LT(global.totals.prefill_gpu_s, local.totals.prefill_gpu_s);
  EXPECT_EQ(local.totals.hit_tokens_remote, 0);
}

// Reproduction 3: more cache, more hits, up to the infinite-cache ratio.
TEST(Reproduction, HitRatioGrowsWithCacheCapacity) {
  const auto rows = window(600);
  double last = -1;
  for (int64_t total : {100'000, 1'000'000, 10'000'000}) {
    SimOptions o;
    o.cluster.cache_capacity_tokens = total / o.cluster.prefill_instances;
    const double hit = run(rows, o).totals.hit_ratio();
    EXPECT_GT(hit, last) << total;
    last = hit;
  }
  EXPECT_LT(last, 0.45);  // the window's infinite-cache ratio bounds it
}

// Reproduction 5: under overload, early rejection keeps goodput up.
TEST(Reproduction, EarlyRejectionProtectsGoodputUnderOverload) {
  const auto rows = window(300);
  SimOptions o;
  o.window.rate_scale = 4;
  o.cluster.slo_ttft_ms = 10'000;
  SimResult on = run(rows, o);
  o.cluster.early_rejection = false;
  SimResult off = run(rows, o);
  ASSERT_FALSE(on.summary.slo.empty());
  EXPECT_GT(on.summary.rejected, 0);
  EXPECT_EQ(off.summary.rejected, 0);
  EXPECT_GE(on.summary.slo.front().goodput_rps, off.summary.slo.front().goodput_rps);
  EXPECT_GT(on.summary.slo.front().attainment_accepted, off.summary.slo.front().attainment_accepted);
}

// docs/REPRODUCTION.md runs every table with the refit on, as the daemons do. It once drifted under overload
// (after ~9,000 prefill jobs the predictions fell to 0 ms for 4 s prefills, mean TTFT 8.4 s -> 21.8 s, TTFT
// prediction error 11.8 s): the whole trace at 2.5x load, refit on against off, keeps the mean TTFT within
// 10 % and the prediction error under a second (measured: 8.2 s on vs 8.4 s off; error 13 ms). The mean-TTFT
// comparison runs the paper's kvcache (FCFS, the pool as it is, the smallest TTFT), where it was found: with issue
// 24's defaults a 97 %-busy cluster's mean TTFT moves by up to 20 % either way between any two runs that differ in
// small predictions (measured 2026-12-06: 5.09 s on against 4.23 s off, while the SLO order alone gives 5.45 against
// 5.60 s and FCFS with pending prefixes and load pricing 6.78 against 7.16 s); the defaults keep the error bounds.
TEST(Reproduction, RefitOnDoesNotDriftUnderOverload) {
  const auto rows = window(0);
  ASSERT_GT(rows.size(), 12'000u);
  SimOptions o;
  o.window.rate_scale = 2.5;
  {
    SimResult defaults = run(rows, o);
    EXPECT_GT(defaults.summary.prediction.count, 11'000);
    EXPECT_LT(defaults.summary.prediction.mean_abs_error_ms, 1'000.0);
    EXPECT_LT(defaults.summary.prediction.p90_abs_error_ms, 5'000.0);
  }
  o.cluster.queue = "fcfs";
  o.cluster.pending_prefix = "off";
  o.cluster.placement_load_weight = 0;
  o.cluster.slo_headroom = 0;
  o.cluster.shed_limit = 0;
  o.refit_predictors = false;
  SimResult off = run(rows, o);
  o.refit_predictors = true;
  SimResult on = run(rows, o);
  ASSERT_TRUE(on.summary.ttft_ms && off.summary.ttft_ms);
  EXPECT_LT(on.summary.ttft_ms->mean, 1.1 * off.summary.ttft_ms->mean)
      << "refit on " << on.summary.ttft_ms->mean << " ms vs off " << off.summary.ttft_ms->mean << " ms";
  EXPECT_GT(on.summary.prediction.count, 11'000);
  EXPECT_LT(on.summary.prediction.mean_abs_error_ms, 1'000.0);
  EXPECT_LT(on.summary.prediction.p90_abs_error_ms, 5'000.0);
  EXPECT_LT(on.summary.rejected, 2 * off.summary.rejected + 20);
}

TEST(Determinism, SameInputsGiveIdenticalRecordsAndSeedsMatter) {
  const auto rows = window(120);
  SimOptions o;
  o.cluster.policy = "random";
  o.window.rate_scale = 2;
  std::ostringstream a, b, c;
  run(rows, o, &a);
  run(rows, o, &b);
  EXPECT_FALSE(a.str().empty());
  EXPECT_EQ(a.str(), b.str());
  o.cluster.seed = 2;
  run(rows, o, &c);
  EXPECT_NE(a.str(), c.str());
}

}  // namespace
}  // namespace mc::sim
