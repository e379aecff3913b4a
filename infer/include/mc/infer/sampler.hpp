// Choosing an output token from the model's logits (DESIGN.md §15 "Sampling"): OpenAI's sampling parameters
// (proto::SamplingParams: penalties, temperature, top_k, top_p, min_p, seed) and logprobs, shared by the prefill
// instance (the first token) and the decode instance (the rest), so a request's tokens follow one rule wherever they
// are produced.
//
// Determinism: the draw for output token `index` uses the uniform number sampling_uniform(seed, index), a function
// of those two alone; equal logits, parameters and counts give the same token on any instance and in any batch.
// Cost: O(vocab) for greedy and for the draw; top_p without top_k sorts the tokens that min_p and the draw's
// candidates leave (at worst the vocabulary, ~10 ms for 150k tokens at -O2 — only when top_p < 1 is asked).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "mc/proto/sampling.hpp"

namespace mc::infer {

// How often each token was generated so far in a request (presence and frequency penalties).
using TokenCounts = std::unordered_map<uint32_t, int32_t>;

struct TokenChoice {
  uint32_t token = 0;
  // With params.logprobs >= 0: {token, logprob}, then the params.logprobs most likely tokens, most likely first
  // (proto::TokenEvent::logprobs). Empty otherwise.
  std::vector<proto::TokenLogprob> logprobs;
};

// The uniform number in [0, 1) of output token `index` of a request seeded `seed`: SplitMix64 of the pair.
double sampling_uniform(uint64_t seed, int64_t index);

// Chooses output token `index` from `logits` (the vocabulary's, finite: the backends check). `counts` may be null
// when the parameters have no penalties. params must be within proto::sampling_error's bounds.
TokenChoice sample_token(std::span<const float> logits, const proto::SamplingParams& params, int64_t index,
                         const TokenCounts* counts);

// The first output token of a prefill: the backend's greedy token when the parameters need no logits or the backend
// has none (sim: last_logits empty), else sample_token(last_logits, params, 0, no counts).
TokenChoice choose_first_token(uint32_t greedy_token, std::span<const float> last_logits,
                               const proto::SamplingParams& params);

}  // namespace mc::infer
