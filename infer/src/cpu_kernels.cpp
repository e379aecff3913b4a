// The CPU engine's thread pool and linear kernels (cpu_kernels.hpp).
#include "mc/infer/cpu_kernels.hpp"

#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "mc/model/safetensors.hpp"

namespace mc::infer::cpu {

// ---- ThreadPool ----

ThreadPool::ThreadPool(int threads) {
  const int n = std::max(1, threads);
  scratch_.resize(static_cast<size_t>(n) * kScratchSlots);
  for (int w = 1; w < n; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

float* ThreadPool::scratch(int worker, int slot, size_t floats) {
  std::vector<float>& v = scratch_[static_cast<size_t>(worker) * kScratchSlots + static_cast<size_t>(slot)];
  if (v.size() < floats) v.resize(floats);
  return v.data();
}

void ThreadPool::work(int worker) {
  for (;;) {
    const int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= tasks_) return;
    (*fn_)(t, worker);
  }
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work(worker);
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ == 0) done_.notify_one();
  }
}

void ThreadPool::run(int64_t tasks, const std::function<void(int64_t, int)>& fn) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    running_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  work(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return running_ == 0; });
  fn_ = nullptr;
}

// ---- element types ----

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kF32:
      return "fp32";
    case WeightType::kBF16:
      return "bf16";
    case WeightType::kF16:
      return "fp16";
  }
  return "?";
}

int64_t weight_type_bytes(WeightType t) { return t == WeightType::kF32 ? 4 : 2; }

namespace {

bool detect_simd() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const bool kSimd = detect_simd();

inline float scalar_at(const void* p, WeightType t, int64_t i) {
  const auto* b = static_cast<const std::byte*>(p);
  if (t == WeightType::kF32) {
    float v;
    std::memcpy(&v, b + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, b + i * 2, 2);
  return t == WeightType::kBF16 ? model::bf16_to_float(h) : model::fp16_to_float(h);
}

// ---- AVX2 + FMA + F16C ----

#define MC_SIMD __attribute__((target("avx2,fma,f16c")))

template <WeightType T>
MC_SIMD inline __m256 load8(const std::byte* p) {
  if constexpr (T == WeightType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == WeightType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

MC_SIMD inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <WeightType T>
MC_SIMD void to_fp32_simd(const std::byte* src, int64_t n, float* dst) {
  constexpr int64_t kBytes = T == WeightType::kF32 ? 4 : 2;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<T>(src + i * kBytes));
  for (; i < n; ++i) dst[i] = scalar_at(src, T, i);
}

// out[m] = dot(row, x + m * ldx) for m < M (M <= kDotRows): the weight row is loaded once for all M rows. The rows
// are unrolled at compile time (a fold over I...) so the accumulators live in registers: two a row hide the FMA latency
// for few rows; more rows hide it themselves, and AVX2's 16 registers hold one a row plus the weights.
template <WeightType T, int... I>
MC_SIMD void dot_rows_unrolled(std::integer_sequence<int, I...>, const std::byte* row, const float* x, int64_t ldx,
                               int64_t n, float* out) {
  constexpr int64_t kBytes = T == WeightType::kF32 ? 4 : 2;
  constexpr int M = sizeof...(I);
  __m256 acc[M], acc2[M];
  ((acc[I] = _mm256_setzero_ps(), acc2[I] = _mm256_setzero_ps()), ...);
  int64_t i = 0;
  if constexpr (M > 4) {
    for (; i + 8 <= n; i += 8) {
      const __m256 w0 = load8<T>(row + i * kBytes);
      ((acc[I] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + I * ldx + i), acc[I])), ...);
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m256 w0 = load8<T>(row + i * kBytes);
      const __m256 w1 = load8<T>(row + (i + 8) * kBytes);
      ((acc[I] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + I * ldx + i), acc[I])), ...);
      ((acc2[I] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + I * ldx + i + 8), acc2[I])), ...);
    }
    for (; i + 8 <= n; i += 8) {
      const __m256 w0 = load8<T>(row + i * kBytes);
      ((acc[I] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + I * ldx + i), acc[I])), ...);
    }
  }
  for (int m = 0; m < M; ++m) {
    float s = hsum(_mm256_add_ps(acc[m], acc2[m]));
    for (int64_t j = i; j < n; ++j) s += scalar_at(row, T, j) * x[m * ldx + j];
    out[m] = s;
  }
}

template <WeightType T, int M>
MC_SIMD void dot_rows_simd(const std::byte* row, const float* x, int64_t ldx, int64_t n, float* out) {
  dot_rows_unrolled<T>(std::make_integer_sequence<int, M>{}, row, x, ldx, n, out);
}

template <WeightType T>
void dot_rows_portable(const std::byte* row, const float* x, int64_t ldx, int64_t n, int64_t rows, float* out) {
  for (int64_t m = 0; m < rows; ++m) {
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += scalar_at(row, T, j) * x[m * ldx + j];
    out[m] = s;
  }
}

template <WeightType T>
void dot_rows(const std::byte* row, const float* x, int64_t ldx, int64_t n, int64_t rows, float* out) {
  if (!kSimd) return dot_rows_portable<T>(row, x, ldx, n, rows, out);
  switch (rows) {
    case 1:
      return dot_rows_simd<T, 1>(row, x, ldx, n, out);
    case 2:
      return dot_rows_simd<T, 2>(row, x, ldx, n, out);
    case 3:
      return dot_rows_simd<T, 3>(row, x, ldx, n, out);
    case 4:
      return dot_rows_simd<T, 4>(row, x, ldx, n, out);
    case 5:
      return dot_rows_simd<T, 5>(row, x, ldx, n, out);
    case 6:
      return dot_rows_simd<T, 6>(row, x, ldx, n, out);
    case 7:
      return dot_rows_simd<T, 7>(row, x, ldx, n, out);
    default:
      return dot_rows_simd<T, 8>(row, x, ldx, n, out);
  }
}

// Few rows: tasks over blocks of output features; y[m][o] = dot(W[o], x[m]).
template <WeightType T>
void linear_dot(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, float* y) {
  const auto* base = static_cast<const std::byte*>(w.data);
  const int64_t row_bytes = w.in * weight_type_bytes(T);
  // Blocks of about 64 KiB of weights, at least 8 rows: enough tasks to balance, few enough to be cheap.
  const int64_t block = std::max<int64_t>(8, (64 << 10) / std::max<int64_t>(1, row_bytes));
  const int64_t tasks = (w.out + block - 1) / block;
  pool.run(tasks, [&](int64_t t, int) {
    const int64_t o1 = std::min(w.out, (t + 1) * block);
    float r[kDotRows];
    for (int64_t o = t * block; o < o1; ++o) {
      dot_rows<T>(base + o * row_bytes, x, w.in, w.in, m, r);
      for (int64_t i = 0; i < m; ++i) y[i * w.out + o] = r[i];
    }
  });
}

// e^x for 8 lanes: x = n·ln2 + r (Cody–Waite split of ln2), e^r by the degree-6 minimax polynomial of Cephes' expf
// (relative error about 1e-7), times 2^n built in the exponent bits. Inputs are clamped to ±88.38 (below, 0).
MC_SIMD inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

MC_SIMD void softmax_simd(float* x, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float mx = -std::numeric_limits<float>::infinity();
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float l : lanes) mx = std::max(mx, l);
  for (int64_t j = i; j < n; ++j) mx = std::max(mx, x[j]);
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 vsum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  double sum = hsum(vsum);
  for (int64_t j = i; j < n; ++j) {
    x[j] = std::exp(x[j] - mx);
    sum += x[j];
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (int64_t j = i; j < n; ++j) x[j] *= static_cast<float>(1.0 / sum);
}

}  // namespace

bool simd_available() { return kSimd; }

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  if (kSimd) return softmax_simd(x, n);
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void to_fp32(const void* src, WeightType t, int64_t n, float* dst) {
  const auto* p = static_cast<const std::byte*>(src);
  if (kSimd) {
    switch (t) {
      case WeightType::kF32:
        return to_fp32_simd<WeightType::kF32>(p, n, dst);
      case WeightType::kBF16:
        return to_fp32_simd<WeightType::kBF16>(p, n, dst);
      case WeightType::kF16:
        return to_fp32_simd<WeightType::kF16>(p, n, dst);
    }
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = scalar_at(p, t, i);
}

void from_fp32(const float* src, int64_t n, WeightType t, void* dst) {
  if (t == WeightType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* out = static_cast<std::byte*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = t == WeightType::kBF16 ? model::float_to_bf16(src[i]) : model::float_to_fp16(src[i]);
    std::memcpy(out + i * 2, &h, 2);
  }
}

void linear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, float* y) {
  if (m <= 0 || w.out <= 0) return;
  if (!w.out_major) {
    // x · W with W in × out, fp32: tasks over column blocks, sgemm each (OpenBLAS single-threaded in a task).
    const auto* wf = static_cast<const float*>(w.data);
    const int64_t block = std::max<int64_t>(64, (w.out + 4 * pool.size() - 1) / (4 * pool.size()));
    pool.run((w.out + block - 1) / block, [&](int64_t t, int) {
      const int64_t c0 = t * block, nb = std::min(block, w.out - c0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(nb),
                  static_cast<int>(w.in), 1.0f, x, static_cast<int>(w.in), wf + c0, static_cast<int>(w.out), 0.0f,
                  y + c0, static_cast<int>(w.out));
    });
  } else if (m <= kDotRows) {
    switch (w.type) {
      case WeightType::kF32:
        linear_dot<WeightType::kF32>(pool, x, m, w, y);
        break;
      case WeightType::kBF16:
        linear_dot<WeightType::kBF16>(pool, x, m, w, y);
        break;
      case WeightType::kF16:
        linear_dot<WeightType::kF16>(pool, x, m, w, y);
        break;
    }
  } else {
    // Many rows: blocks of kBlockRows weight rows, converted to fp32 in the worker's scratch (fp32: in place), then
    // y[:, block] = x · blockᵀ.
    const auto* base = static_cast<const std::byte*>(w.data);
    const int64_t row_bytes = w.in * weight_type_bytes(w.type);
    pool.run((w.out + kBlockRows - 1) / kBlockRows, [&](int64_t t, int worker) {
      const int64_t o0 = t * kBlockRows, nb = std::min(kBlockRows, w.out - o0);
      const float* wb;
      if (w.type == WeightType::kF32) {
        wb = reinterpret_cast<const float*>(base + o0 * row_bytes);
      } else {
        float* s = pool.scratch(worker, 0, static_cast<size_t>(nb * w.in));
        to_fp32(base + o0 * row_bytes, w.type, nb * w.in, s);
        wb = s;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(nb),
                  static_cast<int>(w.in), 1.0f, x, static_cast<int>(w.in), wb, static_cast<int>(w.in), 0.0f, y + o0,
                  static_cast<int>(w.out));
    });
  }
  if (w.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      float* row = y + i * w.out;
      for (int64_t o = 0; o < w.out; ++o) row[o] += w.bias[o];
    }
  }
}

}  // namespace mc::infer::cpu
