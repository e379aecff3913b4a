// Chunked pipeline parallelism (CPP) for one long prefill across a group of X prefill instances (the paper's
// "chunked pipeline parallelism, which passes activations only at chunk boundaries", Mooncake FAST'25 §3.3 /
// our seed article; docs/DESIGN.md §18 "Chunked pipeline parallelism"), as pure functions of values.
//
// The model's L layers are split into X stages of consecutive layers, one per instance (stage_layers, uneven
// allowed). The prompt's new tokens are cut into chunks of at most chunk_tokens. Chunk j runs through stage 1,
// its hidden states (hidden_bytes_per_token per token) cross to stage 2 over the link, and so on; while chunk j
// is in stage s+1, chunk j+1 runs in stage s. The recursion (a flow shop, every stage FIFO over the chunks):
//
//   t(s, j)      = (layers_s / L) · pass_s(n_j, c + tokens before chunk j)   stage s's share of chunk j's pass
//   b(j)         = n_j · hidden_bytes_per_token / link_bytes_per_s + link_latency_s   (a boundary crossing)
//   finish(s, j) = max(finish(s-1, j) + b(j), finish(s, j-1), ready_s) + t(s, j)
//   TTFT         = finish(X, last chunk)                                     (the last stage makes the first token)
//
// pass_s(n, c) is one whole-model pass over n new tokens after c already in the KV cache (the cost model's
// prefill_time_s, or the Conductor's fitted predictor). A stage's share is its fraction of the layers: the
// attention and MLP cost of a layer is the same in every layer; the lm_head on the last stage and the embedding
// on the first are counted in the per-layer share (llama3-70b: 1.3 % of the matmul parameters).
// ready_s is when stage s can start (its queue); 0 for an idle group. The bubble of stage s is its span from
// its first chunk's start to its last chunk's end minus its busy time. With X = 1 the recursion is the chunked
// prefill on one node; with X = 1 and one chunk, exactly pass_s(n, c).
//
// Units: seconds (double), tokens, bytes. Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"

namespace mc::model {

struct PipelineShape {
  std::vector<int64_t> stage_layers;   // layers of each stage, in pipeline order; they sum to the model's layers
  int64_t chunk_tokens = 8192;         // the most new tokens of one chunk (>= 1)
  double link_bytes_per_s = 25e9;      // between consecutive stages (a 200 Gbit/s NIC: 25e9 B/s)
  double link_latency_s = 20e-6;       // fixed cost of one boundary crossing
  int64_t hidden_bytes_per_token = 0;  // activations crossing a boundary per token; 0: hidden_size · dtype_bytes
};

// layers split into `stages` stages as evenly as possible, the earlier stages taking the remainder.
// kInvalidArgument when stages < 1 or stages > layers.
Result<std::vector<int64_t>> even_stage_layers(int64_t layers, int64_t stages);

// Checks the shape against the model: at least one stage, every stage >= 1 layer, the sum = model.num_layers,
// chunk_tokens >= 1, a positive finite link bandwidth, a non-negative latency. kInvalidArgument names the field.
Status validate_pipeline(const PipelineShape& shape, const ModelConfig& model);

struct PipelineTiming {
  double ttft_s = 0;                  // finish of the last stage's last chunk
  std::vector<double> stage_end_s;    // per stage: its last chunk's end (the stage is free from then on)
  std::vector<double> stage_busy_s;   // per stage: compute seconds
  std::vector<double> stage_start_s;  // per stage: its first chunk's start (it waits from ready_s until then)
  double boundary_s = 0;              // sum over chunks and boundaries of the crossings
  double bubble_s = 0;                // sum over stages of (last end - first start - busy)
  int64_t chunks = 0;
};

// A whole-model pass: seconds to prefill `new_tokens` after `cached_tokens` (pass_s above).
using PassSeconds = std::function<double(int64_t new_tokens, int64_t cached_tokens)>;

// The recursion above for `new_tokens` after `cached_tokens`. stage_ready_s: empty (all 0) or one per stage.
// new_tokens <= 0 gives an all-zero timing. The shape must be valid (validate_pipeline); a stage_ready_s of the
// wrong size counts as all 0.
PipelineTiming pipeline_timing(const PassSeconds& pass_s, const PipelineShape& shape, int64_t model_layers,
                               int64_t hidden_bytes_per_token, int64_t new_tokens, int64_t cached_tokens,
                               std::span<const double> stage_ready_s = {});

// The cost model's pipelined prefill: pipeline_timing with pass_s = prefill_time_s(model, gpu, ·, ·).
PipelineTiming pipelined_prefill(const ModelConfig& model, const GpuSpec& gpu, const PipelineShape& shape,
                                 int64_t new_tokens, int64_t cached_tokens);

}  // namespace mc::model
