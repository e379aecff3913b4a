// The CPU engine's building blocks (the `ref` backend, backend.hpp; DESIGN.md §7 "Real models"): a thread pool that
// runs every parallel part of a forward pass, and the weight-times-activation product ("linear") over weights kept
// as the checkpoint stores them (fp32, bf16 or fp16, memory-mapped, in place) with fp32 arithmetic and accumulation.
//
// Where the time goes and how it is split (all cores, one pool; OpenBLAS itself runs single-threaded inside tasks):
//   - few rows (m <= kDotRows: a decode step of a small batch, the last prompt token's logits): memory-bound; each
//     weight row is read once and multiplied with all m activation rows (SIMD dot products, the weight converted to
//     fp32 in registers), tasks over blocks of output rows. The limit is the weight bytes over memory bandwidth.
//   - many rows (prefill): compute-bound; each task converts a block of kBlockRows weight rows to fp32 in its worker's
//     scratch (nothing when already fp32) and multiplies it with OpenBLAS sgemm. The limit is sgemm's FLOP rate.
// Shapes are row-major. Thread-safety: a ThreadPool runs one run() at a time (its owner's thread calls it; a worker
// must not call run()); the free functions are pure apart from the pool's scratch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mc::infer::cpu {

// A fixed set of threads that run the tasks of one parallel loop at a time. Workers sleep on a condition variable
// between loops (they never spin, so they take no CPU from OpenBLAS or other processes while idle).
class ThreadPool {
 public:
  // `threads` >= 1 counts the caller: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(task, worker) for every task in [0, tasks), spread over the threads (worker in [0, size()); the
  // caller is worker 0), and returns when all are done. fn must not throw.
  void run(int64_t tasks, const std::function<void(int64_t task, int worker)>& fn);
  // A scratch buffer of at least `floats` floats owned by `worker` (slot 0..kScratchSlots-1); valid until the next
  // call for the same (worker, slot). Only that worker's task may use it.
  static constexpr int kScratchSlots = 4;
  float* scratch(int worker, int slot, size_t floats);

 private:
  void work(int worker);
  void worker_loop(int worker);

  std::vector<std::thread> workers_;
  std::vector<std::vector<float>> scratch_;  // [worker * kScratchSlots + slot]
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int running_ = 0;  // workers still in the current loop
  bool stop_ = false;
};

enum class WeightType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };
const char* weight_type_name(WeightType t);
int64_t weight_type_bytes(WeightType t);

// A weight matrix in place. out_major: rows are output features, `out` rows of `in` elements (PyTorch's nn.Linear,
// the Hugging Face layout): y = x · Wᵀ. Otherwise `in` rows of `out` elements (y = x · W), fp32 only (the seeded
// weights of the ref model). `data` may be unaligned for 2-byte types; fp32 data must be 4-byte aligned.
struct WeightMatrix {
  const void* data = nullptr;
  WeightType type = WeightType::kF32;
  int64_t in = 0, out = 0;
  bool out_major = true;
  const float* bias = nullptr;  // `out` floats added to every row, or null
  int64_t bytes() const { return in * out * weight_type_bytes(type); }
};

inline constexpr int64_t kDotRows = 8;      // at most this many activation rows take the dot-product path
inline constexpr int64_t kBlockRows = 128;  // weight rows a sgemm task converts and multiplies at once

// y (m × w.out) = x (m × w.in) · W (+ bias). m >= 1. Uses the pool's scratch slot 0.
void linear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, float* y);

// Converts n elements of type `t` at `src` (any alignment) to fp32 (exact).
void to_fp32(const void* src, WeightType t, int64_t n, float* dst);
// Rounds n fp32 values to type `t` (round to nearest even; fp16 beyond its range becomes ±Inf) into dst.
void from_fp32(const float* src, int64_t n, WeightType t, void* dst);

// In place over n > 0 values: x_i = e^(x_i − max) / Σ e^(x_j − max). The SIMD path's e^x is a polynomial with a
// relative error of about 1e-7 (Cephes' expf); the sum is kept in double across lanes.
void softmax(float* x, int64_t n);

// Whether the SIMD (AVX2 + FMA + F16C) kernels run on this CPU; otherwise portable loops compute the same values
// (the sums in another order).
bool simd_available();

}  // namespace mc::infer::cpu
