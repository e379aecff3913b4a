// What the simulator needs to know about the GPUs: how long a prefill and a decode step take, and
// how many KV bytes a token occupies. The production numbers come from the compute backends' cost
// model (infer/, `sim` backend) through make_infer_cost_model(); tests inject hand-computable ones.
//
// Units: seconds, tokens, bytes. Implementations must be pure (same inputs -> same outputs) and
// monotonic non-decreasing in every argument. Thread-safety: const methods, safe from any thread.
#pragma once

#include <cstdint>

namespace mc::sim {

class CostModel {
 public:
  virtual ~CostModel() = default;
  // One prefill pass computing `new_tokens` tokens whose attention also reads `cached_tokens` of
  // prefix KV already in HBM. new_tokens >= 1.
  virtual double prefill_time_s(int64_t new_tokens, int64_t cached_tokens) const = 0;
  // One decode step of a continuous batch of `batch_size` requests holding `context_tokens` tokens
  // of KV in total (each request produces one token).
  virtual double decode_step_time_s(int64_t batch_size, int64_t context_tokens) const = 0;
  virtual int64_t kv_bytes_per_token() const = 0;
  // For chunked pipeline parallelism (mc/model/pipeline.hpp): the layers split into stages, and the activation
  // bytes of one token that cross a stage boundary. The defaults are LLaMA3-70B's (80 layers, 8192 x BF16).
  virtual int64_t num_layers() const { return 80; }
  virtual int64_t hidden_bytes_per_token() const { return 16384; }
};

// Prefill time of `new_tokens` after `cached_tokens`, cut into chunks of `chunk_tokens` (<= 0: one
// pass): the sum of the chunks' pass times, each chunk attending to the cache and to the chunks
// before it (chunked prefill, paper §5: chunked pipeline parallelism runs chunk after chunk).
double chunked_prefill_time_s(const CostModel& model, int64_t new_tokens, int64_t cached_tokens, int64_t chunk_tokens);

}  // namespace mc::sim
