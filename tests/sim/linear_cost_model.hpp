// A hand-computable cost model for the simulator's tests:
//   prefill(new, cached) = per_token_s * new + attention_s * new * cached
//   decode_step(batch, ctx) = step_base_s + step_per_token_s * ctx
#pragma once

#include "mc/sim/cost_model.hpp"

namespace mc::sim::testing {

struct LinearCostModel final : CostModel {
  double per_token_s = 1e-3;
  double attention_s = 0;
  double step_base_s = 0.010;
  double step_per_token_s = 0;
  int64_t kv_bytes = 1000;

  double prefill_time_s(int64_t new_tokens, int64_t cached_tokens) const override {
    return per_token_s * static_cast<double>(new_tokens) +
           attention_s * static_cast<double>(new_tokens) * static_cast<double>(cached_tokens);
  }
  double decode_step_time_s(int64_t, int64_t context_tokens) const override {
    return step_base_s + step_per_token_s * static_cast<double>(context_tokens);
  }
  int64_t kv_bytes_per_token() const override { return kv_bytes; }
};

}  // namespace mc::sim::testing
