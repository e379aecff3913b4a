// Predictors: online least squares converges to the true cost terms; bandwidth moving averages;
// prediction error statistics.
#include "mc/sched/predictors.hpp"

#include <cmath>

#include <gtest/gtest.h>

namespace mc::sched {
namespace {

TEST(Predictors, PrefillRefitRecoversTheCostModelTerms) {
  PrefillPredictor p(PrefillCostPrior{5.0, 0.112, 2.1e-6});
  EXPECT_NEAR(p.predict_ms(1000, 0), 5.0 + 112.0 + 2.1e-6 * 1000 * 500.5, 1e-9);
  EXPECT_EQ(p.predict_ms(0, 5000), 0.0);
  // The real hardware: 12 ms fixed, 0.05 ms/token, 4e-6 ms per query-key pair.
  auto truth = [](int64_t n, int64_t c) {
    double nd = static_cast<double>(n), cd = static_cast<double>(c);
    return 12.0 + 0.05 * nd + 4e-6 * nd * (cd + (nd + 1) / 2);
  };
  for (int i = 0; i < 400; ++i) {
    int64_t n = 256 + (i * 977) % 16000;
    int64_t c = (i * 7919) % 30000;
    p.observe(n, c, truth(n, c));
  }
  PrefillCostPrior fit = p.current();
  EXPECT_NEAR(fit.fixed_ms, 12.0, 0.5);
  EXPECT_NEAR(fit.ms_per_token, 0.05, 0.002);
  EXPECT_NEAR(fit.ms_per_token_pair, 4e-6, 1e-7);
  EXPECT_NEAR(p.predict_ms(8192, 4096), truth(8192, 4096), 0.01 * truth(8192, 4096));
  EXPECT_EQ(p.samples(), 400u);
  // Garbage reports are ignored.
  p.observe(1000, 0, -1);
  p.observe(1000, 0, std::nan(""));
  EXPECT_EQ(p.samples(), 400u);
}

TEST(Predictors, FromHardwareUsesFlopsPerTokenAndPerPair) {
  // LLaMA3-70B on 8 x 312 TFLOP/s at 50 % MFU.
  PrefillCostPrior p = PrefillCostPrior::from_hardware(70e9, 80, 8192, 8 * 312e12 * 0.5);
  EXPECT_NEAR(p.ms_per_token, 2 * 70e9 / 1.248e15 * 1e3, 1e-9);
  EXPECT_NEAR(p.ms_per_token_pair, 4.0 * 80 * 8192 / 1.248e15 * 1e3, 1e-15);
}

TEST(Predictors, PriorsFromACostModelRecoverItsCoefficients) {
  // A cost model of exactly the predictors' form: the priors are its coefficients.
  auto prefill_ms = [](int64_t n, int64_t c) {
    const double nd = static_cast<double>(n), cd = static_cast<double>(c);
    return 3.0 + 0.1 * nd + 2e-6 * nd * (cd + (nd + 1) / 2);
  };
  PrefillCostPrior p = prefill_prior_from_cost_model(prefill_ms);
  EXPECT_NEAR(p.fixed_ms, 3.0, 1e-9);
  EXPECT_NEAR(p.ms_per_token, 0.1, 1e-9);
  EXPECT_NEAR(p.ms_per_token_pair, 2e-6, 1e-12);
  auto step_ms = [](int64_t b, int64_t t) {
    return 10.0 + 0.05 * static_cast<double>(b) + 3e-5 * static_cast<double>(t);
  };
  DecodeCostPrior d = decode_prior_from_cost_model(step_ms);
  EXPECT_NEAR(d.fixed_ms, 10.0, 1e-9);
  EXPECT_NEAR(d.ms_per_request, 0.05, 1e-9);
  EXPECT_NEAR(d.ms_per_context_token, 3e-5, 1e-12);
  // Never negative, whatever the model.
  PrefillCostPrior z = prefill_prior_from_cost_model([](int64_t, int64_t) { return 0.0; });
  EXPECT_EQ(z.fixed_ms, 0.0);
  EXPECT_EQ(z.ms_per_token, 0.0);
}

TEST(Predictors, DecodeStepRefit) {
  DecodePredictor d;
  for (int i = 0; i < 300; ++i) {
    int64_t b = 1 + i % 64, t = 1000 + (i * 7331) % 500000;
    d.observe(b, t, 8.0 + 0.2 * static_cast<double>(b) + 5e-5 * static_cast<double>(t));
  }
  EXPECT_NEAR(d.step_ms(32, 200000), 8.0 + 6.4 + 10.0, 0.2);
}

TEST(Predictors, BandwidthMovingAverage) {
  BandwidthEstimator bw;
  EXPECT_NEAR(bw.transfer_ms(PathClass::kRemote, 11'000'000'000), 0.2 + 1000.0, 1e-9);
  EXPECT_EQ(bw.transfer_ms(PathClass::kRecompute, 1 << 30), 0.0);
  EXPECT_EQ(bw.transfer_ms(PathClass::kSsd, 0), 0.0);
  bw.observe(PathClass::kRemote, 1'000'000'000, 1'000'000'000);  // 1 GB/s replaces the prior
  EXPECT_NEAR(bw.bytes_per_s(PathClass::kRemote), 1e9, 1e-3);
  bw.observe(PathClass::kRemote, 2'000'000'000, 1'000'000'000);  // then alpha = 0.2
  EXPECT_NEAR(bw.bytes_per_s(PathClass::kRemote), 1.2e9, 1e-3);
  bw.observe(PathClass::kRemote, 0, 5);
  bw.observe(PathClass::kRemote, 5, 0);
  EXPECT_EQ(bw.samples(PathClass::kRemote), 2u);
  EXPECT_NEAR(bw.bytes_per_s(PathClass::kSameHost), 25e9, 1e-3);
}

TEST(Predictors, PredictionErrorStats) {
  PredictionErrorStats s(10);
  EXPECT_EQ(s.mean_abs_error_ms(), 0.0);
  for (int i = 1; i <= 10; ++i) s.add(100.0 + i, 100.0);  // errors 1..10
  EXPECT_NEAR(s.mean_abs_error_ms(), 5.5, 1e-9);
  EXPECT_NEAR(s.p90_abs_error_ms(), 9.0, 1e-9);
  EXPECT_NEAR(s.mean_signed_error_ms(), 5.5, 1e-9);
  for (int i = 0; i < 10; ++i) s.add(0, 2);  // window slides: errors all 2, signed -2
  EXPECT_NEAR(s.mean_abs_error_ms(), 2.0, 1e-9);
  EXPECT_NEAR(s.mean_signed_error_ms(), -2.0, 1e-9);
  EXPECT_EQ(s.count(), 20u);
}

}  // namespace
}  // namespace mc::sched
