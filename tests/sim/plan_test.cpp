// mc-plan's arithmetic and search (the binaries' output: plan_tool_test.cpp).
#include "mc/sim/plan.hpp"

#include <gtest/gtest.h>

namespace mc::sim {
namespace {

TEST(Threshold, MatchesThePapersFiguresAtPeakAndFallsWithPrefixLength) {
  auto a = fetch_threshold("llama3-70b", "a800x8", {1000, 8000, 128000}, 1);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->kv_bytes_per_token, 327'680);
  // kv_bytes_per_token x linear prefill rate at peak: the paper's ~6 GB/s (8xA800).
  EXPECT_NEAR(a->linear_threshold_at_peak_bytes_per_s, 6e9, 0.3e9);
  EXPECT_NEAR(a->rows[0].threshold_at_peak_bytes_per_s, a->linear_threshold_at_peak_bytes_per_s, 0.1e9);
  // Attention makes long prefixes costlier to recompute: the break-even bandwidth falls.
  EXPECT_GT(a->rows[0].threshold_bytes_per_s, a->rows[1].threshold_bytes_per_s);
  EXPECT_GT(a->rows[1].threshold_bytes_per_s, a->rows[2].threshold_bytes_per_s);
  // At the preset's efficiency the prefill is slower, so the threshold is lower by that factor.
  EXPECT_NEAR(a->linear_threshold_bytes_per_s / a->linear_threshold_at_peak_bytes_per_s, a->compute_efficiency, 1e-9);
  auto h = fetch_threshold("llama3-70b", "h800x8", {1000}, 1);
  ASSERT_TRUE(h.is_ok());
  EXPECT_NEAR(h->linear_threshold_at_peak_bytes_per_s, 19e9, 1e9);
  // An unknown preset is bad input (mc/model/cost_model.hpp): the tools exit 2.
  EXPECT_EQ(fetch_threshold("llama3-70b", "b200x8", {1000}, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(fetch_threshold("llama3-70b", "a800x8", {0}, 1).status().code(), Code::kInvalidArgument);
}

std::vector<trace::Request> small_trace() {
  std::vector<trace::Request> rows;
  for (int i = 0; i < 60; ++i) {
    trace::Request r;
    r.line_no = i + 1;
    r.timestamp_ms = i * 500;
    r.input_length = 8192;
    r.output_length = 50;
    for (int b = 0; b < 16; ++b)
      r.hash_ids.push_back(b < 8 ? static_cast<uint64_t>(b) : static_cast<uint64_t>(1000 + i * 16 + b));
    rows.push_back(r);
  }
  return rows;
}

TEST(Capacity, FindsTheFewestInstancesAndEveryTrialIsListed) {
  CapacityOptions o;
  o.base.slo_ttft_ms = 5'000;
  o.max_instances = 8;
  o.accept = 0.95;
  auto plan = plan_capacity(small_trace(), o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->feasible);
  EXPECT_GE(plan->attainment, 0.95);
  EXPECT_GE(plan->prefill_instances, 1);
  EXPECT_LE(plan->prefill_instances, 8);
  ASSERT_FALSE(plan->trials.empty());
  EXPECT_EQ(plan->trials.back().step, "final");
  // Minimality: one prefill instance fewer misses the target (when the plan has more than one).
  if (plan->prefill_instances > 1) {
    bool saw_fewer_failing = false;
    for (const auto& t : plan->trials) {
      if (t.step == "prefill" && t.prefill_instances == plan->prefill_instances - 1) {
        saw_fewer_failing = t.ttft_attainment < 0.95;
      }
    }
    EXPECT_TRUE(saw_fewer_failing);
  }
  // 8 shared blocks out of 16 per request: the cache search finds the reuse.
  EXPECT_GT(plan->cache_hit_ratio_infinite, 0.4);
  o.accept = 1.5;
  EXPECT_EQ(plan_capacity(small_trace(), o).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(plan_capacity({}, CapacityOptions{}).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace mc::sim
