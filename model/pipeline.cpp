#include "mc/model/pipeline.hpp"

#include <algorithm>
#include <cmath>

namespace mc::model {

Result<std::vector<int64_t>> even_stage_layers(int64_t layers, int64_t stages) {
  if (stages < 1 || stages > layers) {
    return error(Code::kInvalidArgument,
                 "a pipeline of " + std::to_string(stages) + " stages over " + std::to_string(layers) +
                     " layers: give 1 to the number of layers stages (one layer at least each)");
  }
  std::vector<int64_t> out(static_cast<size_t>(stages), layers / stages);
  for (int64_t s = 0; s < layers % stages; ++s) ++out[static_cast<size_t>(s)];
  return out;
}

Status validate_pipeline(const PipelineShape& shape, const ModelConfig& model) {
  if (shape.stage_layers.empty()) return error(Code::kInvalidArgument, "pipeline: stage_layers is empty");
  int64_t sum = 0;
  for (size_t s = 0; s < shape.stage_layers.size(); ++s) {
    if (shape.stage_layers[s] < 1) {
      return error(Code::kInvalidArgument, "pipeline: stage " + std::to_string(s) + " has " +
                                               std::to_string(shape.stage_layers[s]) + " layers (at least 1)");
    }
    sum += shape.stage_layers[s];
  }
  if (sum != model.num_layers) {
    return error(Code::kInvalidArgument, "pipeline: the stages hold " + std::to_string(sum) + " layers, model " +
                                             model.name + " has " + std::to_string(model.num_layers));
  }
  if (shape.chunk_tokens < 1) {
    return error(Code::kInvalidArgument,
                 "pipeline: chunk_tokens " + std::to_string(shape.chunk_tokens) + " (at least 1 token)");
  }
  if (!std::isfinite(shape.link_bytes_per_s) || shape.link_bytes_per_s <= 0) {
    return error(Code::kInvalidArgument, "pipeline: link_bytes_per_s must be positive and finite");
  }
  if (!std::isfinite(shape.link_latency_s) || shape.link_latency_s < 0) {
    return error(Code::kInvalidArgument, "pipeline: link_latency_s must be >= 0 and finite");
  }
  if (shape.hidden_bytes_per_token < 0) {
    return error(Code::kInvalidArgument,
                 "pipeline: hidden_bytes_per_token must be >= 0 (0: hidden_size x dtype_bytes)");
  }
  return Status::ok();
}

PipelineTiming pipeline_timing(const PassSeconds& pass_s, const PipelineShape& shape, int64_t model_layers,
                               int64_t hidden_bytes_per_token, int64_t new_tokens, int64_t cached_tokens,
                               std::span<const double> stage_ready_s) {
  const size_t stages = shape.stage_layers.size();
  PipelineTiming t;
  t.stage_end_s.assign(stages, 0.0);
  t.stage_busy_s.assign(stages, 0.0);
  t.stage_start_s.assign(stages, 0.0);
  if (new_tokens <= 0 || stages == 0 || model_layers <= 0) return t;
  const bool ready_given = stage_ready_s.size() == stages;
  std::vector<double> fraction(stages), first_start(stages, -1.0), prev_end(stages);
  for (size_t s = 0; s < stages; ++s) {
    fraction[s] = static_cast<double>(shape.stage_layers[s]) / static_cast<double>(model_layers);
    prev_end[s] = ready_given ? std::max(0.0, stage_ready_s[s]) : 0.0;  // finish(s, -1) = ready_s
  }
  const int64_t chunk = std::max<int64_t>(1, shape.chunk_tokens);
  const double hidden = static_cast<double>(hidden_bytes_per_token);
  for (int64_t done = 0; done < new_tokens; done += chunk) {
    const int64_t n = std::min(chunk, new_tokens - done);
    const double pass = pass_s(n, cached_tokens + done);
    const double crossing = static_cast<double>(n) * hidden / shape.link_bytes_per_s + shape.link_latency_s;
    double arrive = 0;  // when chunk j's input is at stage s: finish(s-1, j) + b(j); the prompt is at stage 0
    for (size_t s = 0; s < stages; ++s) {
      if (s > 0) {
        arrive += crossing;
        t.boundary_s += crossing;
      }
      const double start = std::max(arrive, prev_end[s]);
      const double work = fraction[s] * pass;
      if (first_start[s] < 0) first_start[s] = start;
      prev_end[s] = start + work;
      t.stage_busy_s[s] += work;
      arrive = prev_end[s];
    }
    ++t.chunks;
  }
  for (size_t s = 0; s < stages; ++s) {
    t.stage_end_s[s] = prev_end[s];
    t.stage_start_s[s] = first_start[s];
    t.bubble_s += std::max(0.0, prev_end[s] - first_start[s] - t.stage_busy_s[s]);
  }
  t.ttft_s = t.stage_end_s.back();
  return t;
}

PipelineTiming pipelined_prefill(const ModelConfig& model, const GpuSpec& gpu, const PipelineShape& shape,
                                 int64_t new_tokens, int64_t cached_tokens) {
  const int64_t hidden =
      shape.hidden_bytes_per_token > 0 ? shape.hidden_bytes_per_token : model.hidden_size * model.dtype_bytes;
  return pipeline_timing([&](int64_t n, int64_t c) { return prefill_time_s(model, gpu, n, c); }, shape,
                         model.num_layers, hidden, new_tokens, cached_tokens);
}

}  // namespace mc::model
