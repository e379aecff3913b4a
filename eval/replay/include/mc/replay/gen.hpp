// `mc-trace-replay gen`: a session-structured synthetic trace in Mooncake JSONL (DESIGN.md §4.6), for workloads the
// public traces do not cover.
//
// Sessions start by a Poisson process (exponential gaps) or a bursty one (gamma gaps with a coefficient of variation
// burst_cv > 1), session_rate per second on average. A session has a geometric number of turns (mean turns_mean) and
// one of system_prompts shared system prompts (Zipf popularity, the prefix model's prompts and lengths:
// trace_prefix.hpp). Turn 1's prompt is the system prompt and a user message; turn t's is turn t-1's prompt and
// answer (the history) and a new user message, so its blocks start with the history's ids. User messages and answers
// are lognormal with the given means and sigma (at least 1 token). Turns are think_s apart on average (exponential);
// a session's first prompt is cut to max_input_tokens, and a session ends after its turns or before a later prompt
// longer than max_input_tokens. Rows are written in arrival order
// (ms timestamps; ties by session), ids one per block_size tokens.
// Deterministic: one seed gives the same file on every host (SplitMix64 streams, one per session, and one for the
// session starts). Memory: the open sessions only.
// Thread-safety: pure function of its options.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "mc/common/status.hpp"

namespace mc::replay {

struct GenOptions {
  int64_t sessions = 100;
  double session_rate = 1.0;          // sessions started per second, mean
  std::string arrival = "poisson";    // poisson | bursty
  double burst_cv = 4.0;              // bursty: coefficient of variation of the gaps between session starts
  double turns_mean = 4.0;            // turns per session, geometric, >= 1
  double think_s = 30.0;              // mean gap between a session's turns, seconds (exponential)
  int64_t system_prompts = 16;        // shared system prompts (0: none)
  int64_t system_tokens = 1024;       // mean system prompt length, tokens
  double zipf = 1.0;                  // popularity skew of the system prompts
  double user_tokens = 400;           // mean user message, tokens
  double output_tokens = 300;         // mean answer, tokens
  double length_sigma = 1.0;          // lognormal sigma of user messages and answers
  int64_t max_input_tokens = 131072;  // first prompt cut to it; a session ends before a longer later prompt
  int64_t block_size = 512;           // tokens per hash_id
  uint64_t seed = 0;
  Status validate() const;  // kInvalidArgument naming the flag
};

struct GenStats {
  int64_t rows = 0;
  int64_t sessions = 0;
  int64_t max_input_tokens = 0;  // the longest prompt written
  double last_timestamp_s = 0;
};

// Writes the trace to `out`, one JSON object per line.
Result<GenStats> generate_trace(const GenOptions& options, std::ostream& out);

}  // namespace mc::replay
