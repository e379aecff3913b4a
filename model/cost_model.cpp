#include "mc/model/cost_model.hpp"

#include <algorithm>

namespace mc::model {
namespace {

GpuSpec make_gpu(std::string name, double peak_per_gpu, double hbm_per_gpu) {
  GpuSpec g;
  g.name = std::move(name);
  g.gpu_count = 8;
  g.peak_flops_per_s = 8 * peak_per_gpu;
  g.hbm_bytes_per_s = 8 * hbm_per_gpu;
  g.hbm_bytes = 8LL * 80 * (1LL << 30);
  return g;
}

const std::vector<GpuSpec>& gpus() {
  static const std::vector<GpuSpec> kGpus = {
      make_gpu("a800x8", 312e12, 2039e9),
      make_gpu("h800x8", 989.5e12, 3350e9),
  };
  return kGpus;
}

double nonneg(int64_t v) { return v > 0 ? static_cast<double>(v) : 0.0; }

// 4·H·d per layer per (query, key) pair: QKᵀ and A·V, 2 FLOPs per multiply-add each.
double attention_flops_per_pair(const ModelConfig& m) {
  return static_cast<double>(m.num_layers) * 4.0 * static_cast<double>(m.num_heads) * static_cast<double>(m.head_dim);
}

}  // namespace

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& g : gpus()) names.push_back(g.name);
  return names;
}

Result<GpuSpec> gpu_preset(std::string_view name) {
  for (const auto& g : gpus()) {
    if (g.name == name) return g;
  }
  std::string known;
  for (const auto& n : gpu_preset_names()) known += (known.empty() ? "" : ", ") + n;
  return error(Code::kInvalidArgument, "unknown GPU preset '" + std::string(name) + "' (known: " + known + ")");
}

double prefill_flops(const ModelConfig& model, int64_t new_tokens, int64_t cached_tokens) {
  const double n = nonneg(new_tokens);
  const double c = nonneg(cached_tokens);
  const double linear = 2.0 * static_cast<double>(model.matmul_param_count()) * n;
  const double pairs = n * c + n * (n + 1.0) / 2.0;
  return linear + attention_flops_per_pair(model) * pairs;
}

double prefill_time_s(const ModelConfig& model, const GpuSpec& gpu, int64_t new_tokens, int64_t cached_tokens) {
  return prefill_flops(model, new_tokens, cached_tokens) / (gpu.peak_flops_per_s * gpu.compute_efficiency);
}

double decode_step_time_s(const ModelConfig& model, const GpuSpec& gpu, int64_t batch_size,
                          int64_t total_context_tokens) {
  const double b = nonneg(batch_size);
  const double t = nonneg(total_context_tokens);
  if (b == 0) return 0.0;
  const double bytes = static_cast<double>(model.weight_bytes()) + t * static_cast<double>(model.kv_bytes_per_token());
  const double memory_s = bytes / (gpu.hbm_bytes_per_s * gpu.memory_efficiency);
  const double flops = 2.0 * static_cast<double>(model.matmul_param_count()) * b + attention_flops_per_pair(model) * t;
  const double compute_s = flops / (gpu.peak_flops_per_s * gpu.compute_efficiency);
  return std::max(memory_s, compute_s);
}

double prefill_rate_tokens_per_s(const ModelConfig& model, const GpuSpec& gpu) {
  return gpu.peak_flops_per_s * gpu.compute_efficiency / (2.0 * static_cast<double>(model.matmul_param_count()));
}

double fetch_threshold_bytes_per_s(const ModelConfig& model, const GpuSpec& gpu) {
  return static_cast<double>(model.kv_bytes_per_token()) * prefill_rate_tokens_per_s(model, gpu);
}

double recompute_saved_s(const ModelConfig& model, const GpuSpec& gpu, int64_t new_tokens, int64_t cached_tokens) {
  const int64_t n = std::max<int64_t>(new_tokens, 0);
  const int64_t c = std::max<int64_t>(cached_tokens, 0);
  return prefill_time_s(model, gpu, n + c, 0) - prefill_time_s(model, gpu, n, c);
}

}  // namespace mc::model
