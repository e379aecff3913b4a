// The CPU engine's kernels (cpu_kernels.hpp) against plain loops: linear() for every weight type, both layouts, few
// rows (the dot-product path) and many (the converted-sgemm path), with a bias; the pool runs every task once.
#include "mc/infer/cpu_kernels.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include "mc/model/safetensors.hpp"

namespace mc::infer {
namespace MC_UNITY_ID {

using cpu::WeightMatrix;
using cpu::WeightType;

TEST(CpuPool, RunsEveryTaskOnceOnEveryPoolSize) {
  for (int threads : {1, 2, 3, 8}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t tasks : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(tasks));
      std::atomic<int> bad_worker{0};
      pool.run(tasks, [&](int64_t t, int w) {
        hits[static_cast<size_t>(t)].fetch_add(1);
        if (w < 0 || w >= threads) bad_worker.fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << threads << " threads, " << tasks << " tasks";
      EXPECT_EQ(bad_worker.load(), 0);
    }
  }
}

// A random matrix stored as `type` in the out × in layout, and the exact fp32 values it holds.
struct Stored {
  std::vector<uint16_t> half;
  std::vector<float> f32;  // the values (exact widening of `half` for 2-byte types)
};
Stored make(WeightType type, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Stored s;
  s.f32.resize(static_cast<size_t>(n));
  if (type != WeightType::kF32) s.half.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = u(rng);
    if (type == WeightType::kBF16) {
      s.half[i] = model::float_to_bf16(v);
      s.f32[i] = model::bf16_to_float(s.half[i]);
    } else if (type == WeightType::kF16) {
      s.half[i] = model::float_to_fp16(v);
      s.f32[i] = model::fp16_to_float(s.half[i]);
    } else {
      s.f32[i] = v;
    }
  }
  return s;
}

TEST(CpuLinear, MatchesPlainLoopsForEveryTypeLayoutAndRowCount) {
  cpu::ThreadPool pool(3);
  const int64_t in = 83, out = 301;  // not multiples of the SIMD width or the block sizes
  std::vector<float> bias(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) bias[o] = 0.01f * static_cast<float>(o % 7);
  for (WeightType type : {WeightType::kF32, WeightType::kBF16, WeightType::kF16}) {
    const Stored w = make(type, in * out, 3 + static_cast<uint64_t>(type));
    const void* data = type == WeightType::kF32 ? static_cast<const void*>(w.f32.data()) : w.half.data();
    for (int64_t m : {1, 3, 8, 9, 40}) {
      const Stored x = make(WeightType::kF32, m * in, 99);
      WeightMatrix wm{data, type, in, out, true, bias.data()};
      std::vector<float> y(static_cast<size_t>(m * out));
      cpu::linear(pool, x.f32.data(), m, wm, y.data());
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t o = 0; o < out; ++o) {
          double want = bias[o];
          for (int64_t i = 0; i < in; ++i) want += static_cast<double>(x.f32[r * in + i]) * w.f32[o * in + i];
          ASSERT_NEAR(y[r * out + o], want, 1e-4)
              << cpu::weight_type_name(type) << " m=" << m << " (" << r << ", " << o << ")";
        }
      }
    }
  }
  // The in × out layout (seeded fp32 weights): y = x · W.
  const Stored w = make(WeightType::kF32, in * out, 5);
  for (int64_t m : {1, 20}) {
    const Stored x = make(WeightType::kF32, m * in, 7);
    std::vector<float> y(static_cast<size_t>(m * out));
    cpu::linear(pool, x.f32.data(), m, WeightMatrix{w.f32.data(), WeightType::kF32, in, out, false, nullptr}, y.data());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double want = 0;
        for (int64_t i = 0; i < in; ++i) want += static_cast<double>(x.f32[r * in + i]) * w.f32[i * out + o];
        ASSERT_NEAR(y[r * out + o], want, 1e-4) << "in-major m=" << m;
      }
    }
  }
}

TEST(CpuLinear, ConversionsAreExactAndRoundToNearestEven) {
  for (WeightType type : {WeightType::kBF16, WeightType::kF16}) {
    const Stored s = make(type, 1001, 17);
    std::vector<float> out(s.f32.size());
    cpu::to_fp32(s.half.data(), type, static_cast<int64_t>(s.half.size()), out.data());
    EXPECT_EQ(out, s.f32) << cpu::weight_type_name(type);
    std::vector<uint16_t> back(s.half.size());
    cpu::from_fp32(out.data(), static_cast<int64_t>(out.size()), type, back.data());
    EXPECT_EQ(back, s.half) << cpu::weight_type_name(type);
  }
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0); 1 + 3·2^-8 rounds up to 1 + 2^-6.
  const float v[2] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f};
  uint16_t h[2];
  cpu::from_fp32(v, 2, WeightType::kBF16, h);
  EXPECT_EQ(model::bf16_to_float(h[0]), 1.0f);
  EXPECT_EQ(model::bf16_to_float(h[1]), 1.0f + 0x1p-6f);
}

}  // namespace MC_UNITY_ID
}  // namespace mc::infer
