// Block ids for rows that have none (the CSV traces), and the id scheme of synthetic session traces
// (`mc-trace-replay gen`): DESIGN.md §4.6.
//
// Ids follow the Mooncake convention: an id names its block and everything before it, so two rows share a block
// exactly when they share the id. Three kinds of ids, all SplitMix64 mixes of the model's seed:
//   system_id(k, j)      block j of shared system prompt k
//   fresh_id(r, j)       block j of row (or turn) r where nothing is shared: its own text
//   history_id(r, j)     block j of the history after row r's answer (prompt and output tokens), which the
//                        session's next turn starts with
// A prompt of L tokens that starts with P shared tokens (a system prompt, or a session's history) has the shared
// prefix's floor(P / block_size) complete blocks' ids, then fresh ids up to ceil(L / block_size) (the block that
// straddles the end of the shared tokens holds new text: fresh). After its answer of O tokens the session's history
// is the prompt's complete blocks, then history ids up to floor((L + O) / block_size) blocks.
//
// The prefix model (--synthesize-prefixes MODEL) assigns ids to rows in arrival order:
//   MODEL = none | chat[:key=value[,key=value...]]
//   system_prompts=16   shared system prompts (0: none); prompt k (0-based) is chosen with weight 1/(k+1)^zipf
//   system_tokens=1024  mean system prompt length: prompt k has system_tokens x (0.5 + u_k) tokens, u_k in [0, 1)
//   zipf=1.0            popularity skew of the system prompts (0: uniform)
//   continue=0.5        probability that a row continues an open session: it does when some open session's
//                       history is shorter than the row's prompt (one of those, chosen uniformly); else the row
//                       opens a session with a system prompt
//   sessions=256        open sessions kept (the least recently used is closed beyond)
//   seed=0              seed of every choice and id
// Equal inputs (rows in the same order, same model) give equal ids on every host.
// Thread-safety: one synthesizer per reader; the free functions are pure.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::trace {

// The id scheme (above), for the synthesizer and the session generator.
class PrefixIds {
 public:
  explicit PrefixIds(uint64_t seed) : seed_(seed) {}
  uint64_t system_id(uint64_t prompt, uint64_t block) const;
  uint64_t fresh_id(uint64_t row, uint64_t block) const;
  uint64_t history_id(uint64_t row, uint64_t block) const;
  // The ids of a prompt of `input_length` tokens whose first `shared_tokens` tokens are those of `shared_ids`
  // (complete blocks of the shared text, at least floor(shared_tokens / block_size) of them; more are ignored),
  // the rest fresh ids of row `row`.
  std::vector<uint64_t> prompt_ids(const std::vector<uint64_t>& shared_ids, int64_t shared_tokens, int64_t input_length,
                                   int64_t block_size, uint64_t row) const;
  // The history after row `row` answered: the prompt's complete blocks, then history ids, floor((input_length +
  // output_length) / block_size) in all.
  std::vector<uint64_t> history_ids(const std::vector<uint64_t>& prompt_ids, int64_t input_length,
                                    int64_t output_length, int64_t block_size, uint64_t row) const;
  // The first `blocks` ids of system prompt `prompt`.
  std::vector<uint64_t> system_ids(uint64_t prompt, int64_t blocks) const;

 private:
  uint64_t seed_;
};

struct PrefixModel {
  int64_t system_prompts = 16;
  int64_t system_tokens = 1024;
  double zipf = 1.0;
  double continue_probability = 0.5;
  int64_t sessions = 256;
  uint64_t seed = 0;
  // The length of system prompt k, tokens.
  int64_t system_prompt_tokens(int64_t k) const;
};

// Parses MODEL (above; not "none": see is_none_model()); a bad key or value is kInvalidArgument naming it.
Result<PrefixModel> parse_prefix_model(std::string_view spec);
bool is_none_model(std::string_view spec);
// The spec in canonical form, every key with its value ("chat:system_prompts=16,...").
std::string to_string(const PrefixModel& model);

// A choice among n items, item k (0-based) with weight 1/(k+1)^s.
class ZipfChoice {
 public:
  ZipfChoice(int64_t n, double s);
  // The item of a uniform u in [0, 1); 0 when n is 0.
  int64_t pick(double u) const;
  bool empty() const { return cumulative_.empty(); }

 private:
  std::vector<double> cumulative_;
};

// Assigns ids to rows without ids, in arrival order (the model above).
class PrefixSynthesizer {
 public:
  explicit PrefixSynthesizer(const PrefixModel& model);
  // The ids of the next row (ceil(input_length / block_size) of them), and its answer kept as its session's history.
  std::vector<uint64_t> next(int64_t input_length, int64_t output_length, int64_t block_size);
  const PrefixModel& model() const { return model_; }
  int64_t rows() const { return rows_; }
  int64_t continued() const { return continued_; }  // rows that continued a session

 private:
  struct Session {
    int64_t history_tokens = 0;
    std::vector<uint64_t> history;  // floor(history_tokens / block_size) ids
  };

  PrefixModel model_;
  PrefixIds ids_;
  ZipfChoice system_prompts_;
  std::list<Session> open_;  // front: most recently used
  int64_t rows_ = 0;
  int64_t continued_ = 0;
};

// A uniform double in [0, 1) from a SplitMix64 stream.
double uniform01(uint64_t& state);

}  // namespace mc::trace
