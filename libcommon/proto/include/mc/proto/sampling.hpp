// Sampling parameters on the wire (DESIGN.md §15 "Sampling"): how a request's output tokens are chosen, carried by
// conductor.submit (conductor.hpp), prefill.job and decode.reserve (worker.hpp), and the logprobs token events carry
// back. Wire rules: envelope.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "mc/proto/message.hpp"

namespace mc::proto {

// How a request's output tokens are chosen (OpenAI's sampling parameters; DESIGN.md §15 "Sampling"), carried from
// the submitter through the Conductor to the prefill instance (the first token) and the decode instance (the rest).
// Each token is drawn from the model's logits in this order: presence and frequency penalties (subtracted from the
// logits of tokens already generated: presence_penalty once, frequency_penalty per occurrence), then temperature
// (0: the greedy argmax, no draw), then top_k, top_p (the smallest set of most likely tokens whose probability
// reaches top_p) and min_p (tokens below min_p times the most likely one's probability dropped), then one draw
// with the uniform number splitmix64(seed, index) — a function of the seed and the token's index alone, so a seed
// gives the same text on any instance, batch or placement. logprobs >= 0 asks for each token's log-probability
// under the model's distribution (log_softmax of the raw logits) and that many of the most likely alternatives.
// Bounds (sampling_error): temperature [0, 100], top_p (0, 1], top_k [0, 1<<20] (0: all), min_p [0, 1],
// penalties [-2, 2], logprobs [-1, 20]. The defaults are greedy decoding without logprobs.
// Its own header (not worker.hpp) because conductor.submit carries it too: the Conductor's section does not include
// the workers'.
struct SamplingParams {
  double temperature = 0;
  double top_p = 1;
  int64_t top_k = 0;
  double min_p = 0;
  uint64_t seed = 0;
  double presence_penalty = 0;
  double frequency_penalty = 0;
  int32_t logprobs = -1;  // -1: none; 0..20: the token's own logprob and this many alternatives
  bool greedy() const { return temperature == 0; }
  bool needs_counts() const { return presence_penalty != 0 || frequency_penalty != 0; }
  // Whether a token needs the model's logits beyond the greedy argmax.
  bool needs_logits() const { return !greedy() || needs_counts() || logprobs >= 0; }
  MC_MESSAGE(temperature, top_p, top_k, min_p, seed, presence_penalty, frequency_penalty, logprobs);
};
inline constexpr int32_t kMaxTopLogprobs = 20;
// The first parameter outside the bounds above, and the rule it breaks (field "" when all are inside), so a caller can
// name the field in its own error (mc-gateway's 400 param).
struct SamplingError {
  std::string field;
  std::string rule;
  bool ok() const { return field.empty(); }
  std::string message() const { return field + " must be in " + rule; }
};
inline SamplingError check_sampling(const SamplingParams& p) {
  auto in = [](double v, double lo, double hi) { return v >= lo && v <= hi; };  // false for NaN
  if (!in(p.temperature, 0, 100)) return {"temperature", "[0, 100]"};
  if (!(p.top_p > 0 && p.top_p <= 1)) return {"top_p", "(0, 1]"};
  if (p.top_k < 0 || p.top_k > (1 << 20)) return {"top_k", "[0, 1048576] (0: no limit)"};
  if (!in(p.min_p, 0, 1)) return {"min_p", "[0, 1]"};
  if (!in(p.presence_penalty, -2, 2)) return {"presence_penalty", "[-2, 2]"};
  if (!in(p.frequency_penalty, -2, 2)) return {"frequency_penalty", "[-2, 2]"};
  if (p.logprobs < -1 || p.logprobs > kMaxTopLogprobs) return {"logprobs", "[-1, 20]"};
  return {};
}
// "" when the parameters are inside the bounds, else check_sampling's message.
inline std::string sampling_error(const SamplingParams& p) {
  const SamplingError e = check_sampling(p);
  return e.ok() ? "" : e.message();
}
// One token's log-probability (natural log, <= 0) under the model's distribution.
struct TokenLogprob {
  uint32_t token = 0;
  float logprob = 0;
  MC_MESSAGE(token, logprob);
};

}  // namespace mc::proto
