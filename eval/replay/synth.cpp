#include "mc/replay/synth.hpp"

#include <algorithm>
#include <string>

#include "mc/common/splitmix.hpp"

namespace mc::replay {

Status SynthOptions::validate() const {
  if (trace_block_size < 1)
    return Status(Code::kInvalidArgument, "trace block size must be >= 1, got " + std::to_string(trace_block_size));
  if (block_tokens < 1 || block_tokens > trace_block_size)
    return Status(Code::kInvalidArgument, "tokens per trace block must be in [1, " + std::to_string(trace_block_size) +
                                              "], got " + std::to_string(block_tokens));
  if (vocab_size < 2)
    return Status(Code::kInvalidArgument, "vocabulary size must be >= 2, got " + std::to_string(vocab_size));
  return Status::ok();
}

void synthesize_block(uint64_t id, std::span<uint32_t> out, const SynthOptions& options) {
  // The state starts from the mixed (id, seed) pair; a second mixing round separates seeds that
  // differ by the golden-ratio increment.
  uint64_t state = id;
  uint64_t mixed = splitmix64(state) ^ options.seed;
  state = mixed;
  splitmix64(state);
  for (uint32_t& t : out) {
    // Multiply-shift maps 64 random bits onto [0, vocab) without modulo bias worth measuring.
    t = static_cast<uint32_t>((static_cast<unsigned __int128>(splitmix64(state)) * options.vocab_size) >> 64);
  }
}

int64_t synthesized_length(const trace::Request& row, const SynthOptions& options) {
  if (options.block_tokens == options.trace_block_size) return row.input_length;
  const int64_t full = row.input_length / options.trace_block_size;
  const int64_t partial = row.input_length % options.trace_block_size;
  int64_t len = full * options.block_tokens;
  if (partial > 0)
    len += std::max<int64_t>(
        1, (partial * options.block_tokens + options.trace_block_size - 1) / options.trace_block_size);
  return len;
}

std::vector<uint32_t> synthesize_prompt(const trace::Request& row, const SynthOptions& options) {
  const int64_t len = synthesized_length(row, options);
  std::vector<uint32_t> tokens(static_cast<size_t>(len));
  int64_t pos = 0;
  for (uint64_t id : row.hash_ids) {
    if (pos >= len) break;
    const int64_t n = std::min(options.block_tokens, len - pos);
    synthesize_block(id, std::span<uint32_t>(tokens).subspan(static_cast<size_t>(pos), static_cast<size_t>(n)),
                     options);
    pos += n;
  }
  // A row with fewer ids than blocks (only possible with a lenient reader's caller bypassing checks)
  // keeps zeros in the tail rather than reading past the ids.
  return tokens;
}

}  // namespace mc::replay
