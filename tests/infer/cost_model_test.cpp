#include "mc/model/cost_model.hpp"

#include <gtest/gtest.h>

namespace mc::infer {
namespace {

model::ModelConfig llama70b() { return model::model_preset("llama3-70b").value(); }
model::GpuSpec gpu(const char* name) { return model::gpu_preset(name).value(); }

TEST(CostModel, PresetsCarryDatasheetNumbers) {
  EXPECT_DOUBLE_EQ(gpu("a800x8").peak_flops_per_s, 8 * 312e12);
  EXPECT_DOUBLE_EQ(gpu("a800x8").hbm_bytes_per_s, 8 * 2039e9);
  EXPECT_DOUBLE_EQ(gpu("h800x8").peak_flops_per_s, 8 * 989.5e12);
  EXPECT_DOUBLE_EQ(gpu("h800x8").hbm_bytes_per_s, 8 * 3350e9);
  EXPECT_FALSE(model::gpu_preset("b200x8"));
}

TEST(CostModel, FetchThresholdMatchesPaperAtPeak) {
  // Paper: ≈ 6 GB/s on 8×A800, ≈ 19 GB/s on 8×H800 for LLaMA3-70B.
  const double a800 = model::fetch_threshold_bytes_per_s(llama70b(), gpu("a800x8").at_peak());
  const double h800 = model::fetch_threshold_bytes_per_s(llama70b(), gpu("h800x8").at_peak());
  EXPECT_NEAR(a800 / 1e9, 6.0, 0.3);
  EXPECT_NEAR(h800 / 1e9, 19.0, 0.6);
  // Scales linearly with the efficiency factor.
  EXPECT_NEAR(model::fetch_threshold_bytes_per_s(llama70b(), gpu("a800x8")), 0.6 * a800, 1.0);
}

TEST(CostModel, PrefillFlopsFollowTheDocumentedFormula) {
  const model::ModelConfig m = llama70b();
  const double P = static_cast<double>(m.matmul_param_count());
  const double per_pair = 80.0 * 4 * 64 * 128;
  // one token, nothing cached: sees itself only.
  EXPECT_DOUBLE_EQ(model::prefill_flops(m, 1, 0), 2 * P + per_pair * 1);
  // 100 new tokens on 1000 cached: 100·1000 + 100·101/2 pairs.
  EXPECT_DOUBLE_EQ(model::prefill_flops(m, 100, 1000), 2 * P * 100 + per_pair * (100.0 * 1000 + 5050));
  // Cached + new split adds up: prefilling a..b then b..c costs the same as a..c.
  EXPECT_NEAR(model::prefill_flops(m, 300, 0) + model::prefill_flops(m, 700, 300), model::prefill_flops(m, 1000, 0),
              1e3);
  EXPECT_DOUBLE_EQ(model::prefill_flops(m, 0, 5000), 0.0);
  EXPECT_DOUBLE_EQ(model::prefill_flops(m, -5, 10), 0.0);
  const model::GpuSpec g = gpu("a800x8");
  EXPECT_DOUBLE_EQ(model::prefill_time_s(m, g, 4096, 0), model::prefill_flops(m, 4096, 0) / (g.peak_flops_per_s * 0.6));
}

TEST(CostModel, PrefillMonotonic) {
  const model::ModelConfig m = llama70b();
  const model::GpuSpec g = gpu("a800x8");
  double prev = 0;
  for (int64_t n = 512; n <= 131072; n *= 2) {
    const double t = model::prefill_time_s(m, g, n, 0);
    EXPECT_GT(t, prev) << n;
    EXPECT_GT(model::prefill_time_s(m, g, n, 4096), t) << "more context costs more attention";
    prev = t;
  }
  // Faster GPU, faster prefill.
  EXPECT_LT(model::prefill_time_s(m, gpu("h800x8"), 8192, 0), model::prefill_time_s(m, g, 8192, 0));
}

TEST(CostModel, PrefixHitSavesMostOfALongPrefill) {
  // Paper (DESIGN.md §6): a 95 % hit on a 128 K input removes 92 % of prefill time. The formula must land in
  // that regime: more than 90 % saved, and less than 95 %, because the last 5 % of tokens attend over the
  // longest context and so cost more than 5 % of the FLOPs.
  const model::ModelConfig m = llama70b();
  const model::GpuSpec g = gpu("a800x8");
  const int64_t total = 128 * 1024;
  const int64_t cached = total * 95 / 100;
  const double saved = model::recompute_saved_s(m, g, total - cached, cached) / model::prefill_time_s(m, g, total, 0);
  EXPECT_GT(saved, 0.90);
  EXPECT_LT(saved, 0.95);
}

TEST(CostModel, DecodeStepIsMemoryBoundAndGrowsWithContext) {
  const model::ModelConfig m = llama70b();
  const model::GpuSpec g = gpu("a800x8");
  const double weights_only = static_cast<double>(m.weight_bytes()) / (g.hbm_bytes_per_s * g.memory_efficiency);
  EXPECT_DOUBLE_EQ(model::decode_step_time_s(m, g, 1, 0), weights_only);
  const double t1 = model::decode_step_time_s(m, g, 8, 8 * 4096);
  EXPECT_DOUBLE_EQ(t1, (m.weight_bytes() + 8.0 * 4096 * m.kv_bytes_per_token()) / (g.hbm_bytes_per_s * 0.8));
  EXPECT_GT(model::decode_step_time_s(m, g, 8, 8 * 8192), t1);
  EXPECT_DOUBLE_EQ(model::decode_step_time_s(m, g, 0, 0), 0.0);
  // LLaMA3-70B on 8×A800: ~141 GB of weights over ~13 TB/s ≈ 11 ms per step (TBT SLOs are 100-300 ms).
  EXPECT_GT(weights_only, 0.005);
  EXPECT_LT(weights_only, 0.02);
  // A huge batch becomes compute-bound: the compute term takes over.
  const double huge = model::decode_step_time_s(m, g, 100000, 0);
  EXPECT_DOUBLE_EQ(huge, 2.0 * m.matmul_param_count() * 100000 / (g.peak_flops_per_s * 0.6));
}

}  // namespace
}  // namespace mc::infer
