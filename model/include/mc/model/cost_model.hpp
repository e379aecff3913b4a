// mc::infer cost model (library mc_model): predicted prefill and decode-step times of a model on a GPU server,
// as pure functions.
//
// One model serves three users: the `sim` backend sleeps these times, the Conductor (mc_conductor) sets its
// predictors' priors with them, and the cluster simulator replays traces with them. Keep them pure: no clocks, no
// state.
//
// GPU presets (whole 8-GPU server, tensor-parallel over 8; figures are NVIDIA datasheet numbers, dense
// i.e. without 2:4 sparsity):
//   a800x8  8 × A800 80GB SXM: BF16 Tensor Core 312 TFLOP/s, HBM2e 2,039 GB/s per GPU
//           (NVIDIA A800 40GB/80GB datasheet, same compute and memory as the A100 80GB SXM datasheet; the A800
//           differs only in NVLink, 400 GB/s). Server: 2.496e15 FLOP/s, 16.31e12 B/s.
//   h800x8  8 × H800 80GB SXM5: BF16 Tensor Core 989.5 TFLOP/s, HBM3 3.35 TB/s per GPU
//           (NVIDIA H800 datasheet / H100 SXM5 datasheet, "1,979 TFLOPS with sparsity" halved; NVLink 400 GB/s).
//           Server: 7.916e15 FLOP/s, 26.8e12 B/s.
//   Efficiencies (our assumption, not a datasheet figure): compute_efficiency 0.6 (model FLOPs utilisation of a
//   large prefill batch), memory_efficiency 0.8 (achieved / peak HBM bandwidth in decode).
//
// Formulas (FLOPs count a multiply-add as 2; L layers, H attention heads, d head_dim, P = matmul_param_count):
//   prefill_flops(n new, c cached) = 2·P·n                                   (linear: every weight once per token)
//                                  + L · 4·H·d · (n·c + n·(n+1)/2)           (attention: QKᵀ and A·V, causal: the
//                                                                             i-th new token sees c + i + 1 keys)
//   prefill_time_s   = prefill_flops / (peak_flops_per_s · compute_efficiency)
//   decode_step_time_s(b batch, T total context tokens of the batch)
//                    = max( (weight_bytes + T·kv_bytes_per_token) / (hbm_bytes_per_s · memory_efficiency),
//                           (2·P·b + L·4·H·d·T) / (peak_flops_per_s · compute_efficiency) )
//                      (decode reads every weight once per step and every KV byte of the batch once; it is
//                      memory-bound unless the batch is very large)
//   prefill_rate_tokens_per_s = peak_flops_per_s · compute_efficiency / (2·P)   (short-context rate, linear term)
//   fetch_threshold_bytes_per_s = kv_bytes_per_token · prefill_rate_tokens_per_s   (DESIGN.md §1: fetching a cached
//                      prefix beats recomputing it when the fetch bandwidth exceeds this)
//   With the GPU at peak (gpu.at_peak(), efficiency 1) and llama3-70b this gives 5.9 GB/s on a800x8 and 18.7 GB/s on
//   h800x8 — the paper's "≈ 6 GB/s" and "≈ 19 GB/s" (Mooncake FAST'25 §2 / our seed article). With the presets'
//   0.6 efficiency the threshold is 0.6× that: a slower prefill makes fetching pay off sooner.
//
// Units: seconds (double), bytes, FLOPs, tokens. Inputs are clamped at 0 (negative token counts count as 0).
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/model/model_config.hpp"

namespace mc::model {

struct GpuSpec {
  std::string name = "a800x8";
  int64_t gpu_count = 8;
  double peak_flops_per_s = 8 * 312e12;        // dense BF16, whole server
  double hbm_bytes_per_s = 8 * 2039e9;         // whole server
  int64_t hbm_bytes = 8LL * 80 * (1LL << 30);  // HBM capacity, whole server
  double compute_efficiency = 0.6;             // achieved / peak FLOP/s in prefill
  double memory_efficiency = 0.8;              // achieved / peak HBM bandwidth in decode

  // The same server at 100 % efficiency (the paper's threshold arithmetic).
  GpuSpec at_peak() const {
    GpuSpec g = *this;
    g.compute_efficiency = 1.0;
    g.memory_efficiency = 1.0;
    return g;
  }
};

// Names accepted by gpu_preset: "a800x8", "h800x8".
std::vector<std::string> gpu_preset_names();
// kInvalidArgument lists the known names.
Result<GpuSpec> gpu_preset(std::string_view name);

// FLOPs of prefilling `new_tokens` after `cached_tokens` already in the KV cache (formula above).
double prefill_flops(const ModelConfig& model, int64_t new_tokens, int64_t cached_tokens);

// Seconds to prefill `new_tokens` on top of `cached_tokens` cached ones (formula above).
double prefill_time_s(const ModelConfig& model, const GpuSpec& gpu, int64_t new_tokens, int64_t cached_tokens);

// Seconds of one decode step for `batch_size` sequences holding `total_context_tokens` tokens of KV in all.
double decode_step_time_s(const ModelConfig& model, const GpuSpec& gpu, int64_t batch_size,
                          int64_t total_context_tokens);

// Prefill tokens per second on a short context (linear term only).
double prefill_rate_tokens_per_s(const ModelConfig& model, const GpuSpec& gpu);

// Fetch bandwidth (bytes/s) above which loading cached KV is faster than recomputing it (DESIGN.md §1).
double fetch_threshold_bytes_per_s(const ModelConfig& model, const GpuSpec& gpu);

// Seconds of prefill that reusing `cached_tokens` saves for a prompt of cached_tokens + new_tokens:
// prefill_time_s(new+cached, 0) − prefill_time_s(new, cached). Compare with the fetch time
// cached_tokens · kv_bytes_per_token / bandwidth to decide fetch vs recompute for a concrete prefix.
double recompute_saved_s(const ModelConfig& model, const GpuSpec& gpu, int64_t new_tokens, int64_t cached_tokens);

}  // namespace mc::model
