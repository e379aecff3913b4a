// `mc-model run`: one prompt through the CPU engine alone (the ref backend, backend.hpp) — greedy tokens and the top
// logits of the last prompt token, for checking an engine against a reference (issue 49). Thread-safety: one call at
// a time per process (the engine's pool and OpenBLAS settings are process-wide).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "mc/common/status.hpp"

namespace mc::infer {

struct RunCommand {
  std::string model;       // preset, Hugging Face directory or JSON file (model::load_model)
  std::string prompt_ids;  // comma-separated token ids, at least one
  int64_t steps = 8;       // greedy tokens to generate (0: only the prompt's logits)
  int64_t top = 5;         // logits of the last prompt token to print, largest first
  std::string kv_dtype = "auto";
  int threads = 1;
  uint64_t seed = 0;          // seeded weights (a preset or JSON shape)
  int64_t cached_tokens = 0;  // prefill the first N prompt tokens first, then the rest over their KV (a prefix hit)
  bool json = false;
};
// Prints the generated tokens and the top logits (a table, or one JSON object: model, revision, kv_dtype,
// prompt_tokens, cached_tokens, tokens, top [[id, logit]...], top_gap (top-1 minus top-2), prefill_s,
// decode_tokens_per_s). kInvalidArgument for a malformed id list, an id outside the vocabulary, a prompt plus
// steps beyond the model's context; the model's and the engine's errors as they are.
Status run_model_command(const RunCommand& cmd, std::ostream& out);

}  // namespace mc::infer
