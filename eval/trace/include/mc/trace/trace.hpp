// The one reader of request traces (DESIGN.md §4.2, §4.6): every tool that reads a trace (mc-trace-replay replay,
// analyze and convert, mc-sim, mc-plan capacity) gets its rows here, whatever the file's format.
//
// Formats (Format; detected from the first non-blank line unless named):
//   mooncake  Mooncake FAST'25 JSONL, one JSON object per line: {"timestamp", "input_length": tokens,
//             "output_length": tokens, "hash_ids": [one u64 per block_size-token block; the last may be partial]},
//             and optionally the request's key scope (block_key.hpp, DESIGN.md §4.1): "lora_name" and
//             "lora_version" (the LoRA adapter it runs with) and "salt" (its tenant salt), strings; absent = the
//             base model, no salt. Detected by a first line starting with '{'.
//   azure     Azure LLM inference CSV (2023/2024): a header naming TIMESTAMP (a UTC date and time,
//             "2023-11-16 18:15:46.6805900", or with an offset, "2024-05-10 00:00:00.009930+00:00"), ContextTokens and
//             GeneratedTokens, in any order among other columns.
//   burstgpt  BurstGPT CSV: a header naming Timestamp (seconds since the trace's start), Request tokens and
//             Response tokens (Model, Total tokens, Log Type and other columns are ignored).
// CSV files are RFC 4180 (csv.hpp): quoted fields, commas and line breaks inside quotes, CRLF; header names are
// matched without regard to case or surrounding blanks; a needed column named twice is an error.
//
// Timestamps: JSON numbers or strings (a decimal number, or a date and time as Azure's), converted exactly (no
// double rounding) to ns. Numbers are in TimeUnit: named, the format's own (BurstGPT: s), or for Mooncake JSONL
// detected from the first row's value by magnitude: >= 1e17 ns, >= 1e14 µs, >= 1e11 ms, >= 1e9 s, else ms (a
// relative trace, the Mooncake convention). A first timestamp at or after 1e9 s since 1970 (2001-09-09) is an epoch
// time (so is every date): every timestamp is then shifted so that the first row's is 0. Rows keep whole ms (sub-ms
// parts are cut). One file's timestamps are all numbers or all dates (a mix is an error at the first odd row).
//
// Blocks: a row's hash_ids must number ceil(input_length / block_size) (BlockAccounting::kStrict, the default).
// With kLenient a row with another (non-zero) count is accepted: id i then covers tokens [round(i·L/n),
// round((i+1)·L/n)) of its L tokens (L/n each, rounded to whole tokens), and the row is re-cut into block_size
// blocks whose ids derive from (the id covering the block's last token, the block's end): rows that share leading
// ids share the re-cut blocks those ids cover; the count of such rows is in stats().reblocked_rows.
// Rows without ids (the CSV formats) get ids of their own: unique (no reuse between rows) or, with a prefix model
// (trace_prefix.hpp, DESIGN.md §4.6), shared system prompts and multi-turn sessions with growing history.
//
// Validation (DESIGN.md §13.17–13.19): every field present and of the right range (timestamp >= 0 and < 2^63 ns,
// input_length >= 1, output_length >= 0, both <= 2^31-1, ids in [0, 2^64-1] kept as exact u64 — no double
// rounding, no 32-bit truncation); timestamps non-decreasing; the scope fields strings as validate_key_scope()
// accepts; at most kMaxSynthesizedBlocks ids made for one row; JSON nested at most 32 levels (checked before
// parsing). Messages show at most the first 64 bytes of a value, control bytes as \xNN. Blank lines are ignored; CRLF
// line ends and a UTF-8 BOM are accepted.
//
// Modes: kStrict — the first bad line is an error (kInvalidArgument "trace.jsonl:2: ..." naming the field), the
// caller exits 2. kLenient — a bad line is skipped, warned about on stderr and counted (stats()). A file whose first
// line is no known format, or whose CSV header lacks a needed column or names one twice, is an error in both
// modes.
// Memory: one line at a time (constant in the trace length; a prefix model keeps its open sessions).
// Thread-safety: one reader per thread.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"

namespace mc::trace {

struct Request {
  int64_t line_no = 0;        // 1-based line in the input (a CSV record's first line)
  int64_t timestamp_ms = 0;   // arrival, ms since the start of the trace
  int64_t input_length = 0;   // prompt tokens
  int64_t output_length = 0;  // tokens to generate (requested)
  std::vector<uint64_t> hash_ids;
  RequestKeyScope scope;  // adapter and salt; empty = base model, no salt
};

enum class Mode { kStrict, kLenient };
enum class Format { kAuto, kMooncake, kAzure, kBurstGpt };
enum class TimeUnit { kAuto, kSeconds, kMillis, kMicros, kNanos };
enum class BlockAccounting { kStrict, kLenient };

// The most ids the reader makes for one row (re-cut or synthesized): 65,536 (a 33.5 M-token prompt at 512 tokens
// per block), so that a short CSV row cannot make the reader hold gigabytes.
inline constexpr int64_t kMaxSynthesizedBlocks = int64_t{1} << 16;

// Names as the flags spell them ("auto", "mooncake", "azure", "burstgpt"; "auto", "s", "ms", "us", "ns";
// "strict", "lenient").
std::string_view format_name(Format format);
std::string_view unit_name(TimeUnit unit);
Result<Format> parse_format(std::string_view name);
Result<TimeUnit> parse_unit(std::string_view name);

// How a file's rows are read: its format, the unit of its timestamps, how ids map to blocks, and how rows without
// ids get theirs. The tools' --format, --timestamp-unit, --block-accounting and --synthesize-prefixes.
struct FormatOptions {
  Format format = Format::kAuto;
  TimeUnit timestamp_unit = TimeUnit::kAuto;
  BlockAccounting block_accounting = BlockAccounting::kStrict;
  // Rows without ids: "" or "none" — unique ids, no reuse; else a prefix model (trace_prefix.hpp), e.g. "chat" or
  // "chat:system_prompts=8,continue=0.6".
  std::string synthesize_prefixes;
};

struct ReaderOptions {
  Mode mode = Mode::kStrict;
  int64_t block_size = 512;
  std::string source_name = "-";  // named in messages ("conversation_trace.jsonl:13: ...")
  bool warn_on_stderr = true;     // lenient mode: one warning line per skipped row
  FormatOptions formats;
};

struct ReaderStats {
  int64_t lines = 0;    // lines read, blank ones and a CSV header included
  int64_t rows = 0;     // valid rows returned
  int64_t skipped = 0;  // invalid rows skipped (lenient)
  int64_t blank = 0;
  int64_t header = 0;                     // lines of a CSV header (0 or 1)
  std::vector<std::string> first_errors;  // up to 10 messages of skipped rows
  // What was read, once the first row was (kAuto until then).
  Format format = Format::kAuto;
  bool format_detected = false;
  TimeUnit timestamp_unit = TimeUnit::kAuto;  // of numeric timestamps; kAuto when they were dates
  bool unit_detected = false;                 // by magnitude (no unit named, none fixed by the format)
  bool dates = false;                         // timestamps were dates and times
  int64_t epoch_shift_ns = 0;                 // subtracted from every timestamp (0: none)
  int64_t reblocked_rows = 0;                 // rows re-cut by lenient block accounting
  int64_t synthesized_rows = 0;               // rows without ids that were given ids
};

// The stats as (key, value) lines of a run's header: format, timestamp unit (and whether detected), the epoch
// shift, re-cut and synthesized rows — only the ones that say something.
std::vector<std::pair<std::string, std::string>> describe(const ReaderStats& stats, const FormatOptions& options);

// True when the file was not read as a plain Mooncake trace in ms (another format, unit or dates, an epoch shift,
// re-cut or synthesized ids): the tools then say so on stderr as well as in the header.
bool read_differently(const ReaderStats& stats);

class PrefixSynthesizer;
struct PendingRow;  // a row parsed from its format, before its timestamp is resolved and its ids fixed (trace.cpp)

class Reader {
 public:
  // Reads from `in` (not owned; must outlive the reader).
  Reader(std::istream& in, ReaderOptions options);
  // Opens a file, or stdin for "-". Checks the options (block size, a prefix model's spec): kInvalidArgument.
  static Result<std::unique_ptr<Reader>> open(const std::string& path, ReaderOptions options);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The next valid row; nullopt at end of input; an error in strict mode at the first bad row.
  Result<std::optional<Request>> next();
  const ReaderStats& stats() const { return stats_; }

 private:
  Result<PendingRow> parse_csv_row(const std::vector<std::string>& fields, const std::string& where);
  Status read_header(const std::string& line, const std::string& where, bool named);
  Result<Request> finish(PendingRow pending, const std::string& where);

  std::unique_ptr<std::istream> owned_;
  std::istream* in_;
  ReaderOptions options_;
  ReaderStats stats_;
  int64_t last_timestamp_ms_ = -1;
  Format format_ = Format::kAuto;  // fixed at the first non-blank line
  std::vector<int> columns_;       // CSV: the field index of each needed column
  bool shift_fixed_ = false;       // the first row's timestamp fixed the epoch shift and the unit
  std::unique_ptr<PrefixSynthesizer> prefixes_;
  Status setup_;  // a bad option, reported by next()
};

// One row as a Mooncake JSONL line (no line break): timestamp (ms), input_length, output_length, hash_ids, and the
// scope fields that are set. What `mc-trace-replay convert` and `gen` write; the reader reads it back as it was.
std::string to_jsonl(const Request& row);

// Parses one Mooncake JSONL line on its own (ms timestamps, strict block accounting, no monotonicity check): used by
// tools and tests.
Result<Request> parse_row(const std::string& line, int64_t block_size, const std::string& where);

// ---- Building blocks, exposed for the tests ----

// A timestamp as written: an exact decimal (digits, an optional fraction and exponent) or a date and time.
struct TimeValue {
  bool is_date = false;
  int64_t date_ns = 0;   // is_date: ns since 1970-01-01T00:00:00 UTC
  std::string digits;    // !is_date: the significant digits, no sign, no point
  int32_t exponent = 0;  // value = digits x 10^exponent
  double approx = 0;     // for detection by magnitude
};
// "1700000000123", "1.5", "1.7e18", "2023-11-16 18:15:46.6805900" (also with 'T', and a trailing 'Z' or UTC offset
// +HH:MM, +HHMM or +HH, either sign, taken off). Negative,
// NaN, infinite, empty or garbled text is kInvalidArgument naming `field`.
Result<TimeValue> parse_time_text(std::string_view text, std::string_view field, const std::string& where);
// The unit a numeric first timestamp is taken in when none is named (see above).
TimeUnit detect_unit(double first_value);
// value in `unit` as ns, truncated to whole ns; kInvalidArgument when it is 2^63 ns or more.
Result<int64_t> to_ns(const TimeValue& value, TimeUnit unit, std::string_view field, const std::string& where);
// Re-cuts a row whose ids are not one per block (lenient block accounting, above): ceil(input_length / block_size)
// ids. ids must not be empty.
std::vector<uint64_t> recut_ids(const std::vector<uint64_t>& ids, int64_t input_length, int64_t block_size);

}  // namespace mc::trace
