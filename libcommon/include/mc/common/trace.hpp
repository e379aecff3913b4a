// Streaming reader of Mooncake FAST'25 JSONL request traces (DESIGN.md §4).
//
// One JSON object per line: {"timestamp": ms since start, "input_length": tokens,
// "output_length": tokens, "hash_ids": [one u64 per block_size-token block; the last may be partial]},
// and optionally the request's key scope (block_key.hpp, DESIGN.md §4.1): "lora_name" and "lora_version"
// (the LoRA adapter it runs with) and "salt" (its tenant salt), strings; absent = the base model, no salt.
// Validation (DESIGN.md §13.17–13.19): every field present and an integer of the right range
// (timestamp >= 0, input_length >= 1, output_length >= 0, ids in [0, 2^64-1] kept as exact u64 —
// no double rounding, no 32-bit truncation); len(hash_ids) == ceil(input_length / block_size);
// timestamps non-decreasing; the scope fields strings as validate_key_scope() accepts. Blank lines are ignored; CRLF
// line ends and a UTF-8 BOM are accepted.
//
// Modes: kStrict — the first bad line is an error (kInvalidArgument "trace.jsonl:2: ..."), the
// caller exits 2. kLenient — a bad line is skipped, warned about on stderr and counted (stats()).
// Memory: one line at a time (constant in the trace length). Thread-safety: one reader per thread.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"

namespace mc::trace {

struct Request {
  int64_t line_no = 0;        // 1-based line in the input
  int64_t timestamp_ms = 0;   // arrival, ms since the start of the trace
  int64_t input_length = 0;   // prompt tokens
  int64_t output_length = 0;  // tokens to generate (requested)
  std::vector<uint64_t> hash_ids;
  RequestKeyScope scope;  // adapter and salt; empty = base model, no salt
};

enum class Mode { kStrict, kLenient };

struct ReaderOptions {
  Mode mode = Mode::kStrict;
  int64_t block_size = 512;
  std::string source_name = "-";  // named in messages ("conversation_trace.jsonl:13: ...")
  bool warn_on_stderr = true;     // lenient mode: one warning line per skipped row
};

struct ReaderStats {
  int64_t lines = 0;    // lines read, blank ones included
  int64_t rows = 0;     // valid rows returned
  int64_t skipped = 0;  // invalid rows skipped (lenient)
  int64_t blank = 0;
  std::vector<std::string> first_errors;  // up to 10 messages of skipped rows
};

class Reader {
 public:
  // Reads from `in` (not owned; must outlive the reader).
  Reader(std::istream& in, ReaderOptions options);
  // Opens a file, or stdin for "-".
  static Result<std::unique_ptr<Reader>> open(const std::string& path, ReaderOptions options);
  ~Reader();

  // The next valid row; nullopt at end of input; an error in strict mode at the first bad row.
  Result<std::optional<Request>> next();
  const ReaderStats& stats() const { return stats_; }

 private:
  // Validates one line; kInvalidArgument naming the line on failure.
  Result<Request> parse_line(const std::string& line, int64_t line_no);

  std::unique_ptr<std::istream> owned_;
  std::istream* in_;
  ReaderOptions options_;
  ReaderStats stats_;
  int64_t last_timestamp_ms_ = -1;
};

// Parses one line on its own (no monotonicity check): used by tools and tests.
Result<Request> parse_row(const std::string& line, int64_t block_size, const std::string& where);

}  // namespace mc::trace
