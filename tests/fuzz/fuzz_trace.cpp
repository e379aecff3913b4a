// Fuzz harness: the trace readers. Input: one control byte, then the file's bytes. Bits 0-1 of the control
// byte pick the reader: the Mooncake JSONL trace reader (trace::Reader, what mc-trace-replay and mc-sim read
// traces with) in strict mode, the same in lenient mode, or the run-records reader
// (replay::read_records_jsonl, what re-summarising a finished run reads); bits 2-3 pick the block size.
// The input may be any format the reader detects (Mooncake JSONL, Azure or BurstGPT CSV).
// Invariants: no crash or throw; every row the trace reader returns obeys the documented rules (ranges,
// one hash id per block, timestamps non-decreasing), and in lenient mode every line is counted once as a
// row, a skipped row or a blank line.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "mc/report/report.hpp"
#include "mc/trace/trace.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_trace: invariant broken: %s\n", what);
  std::abort();
}

void read_trace(const std::string& text, mc::trace::Mode mode, int64_t block_size) {
  std::istringstream in(text);
  mc::trace::ReaderOptions options;
  options.mode = mode;
  options.block_size = block_size;
  options.source_name = "fuzz.jsonl";
  options.warn_on_stderr = false;
  mc::trace::Reader reader(in, options);
  int64_t last_ts = 0;
  while (true) {
    mc::Result<std::optional<mc::trace::Request>> row = reader.next();
    if (!row.is_ok()) {
      // Lenient mode fails only on a first line of no known format (JSONL, Azure or BurstGPT CSV) or a CSV header
      // that lacks a needed column or names it twice, before any row.
      const std::string& why = row.status().message();
      if (mode == mc::trace::Mode::kLenient &&
          (reader.stats().rows > 0 || (why.find("the first line is neither") == std::string::npos &&
                                       why.find(" CSV header ") == std::string::npos)))
        broken("the lenient reader failed");
      if (row.status().code() != mc::Code::kInvalidArgument) broken("a bad row is not kInvalidArgument");
      return;
    }
    if (!row->has_value()) break;
    const mc::trace::Request& r = **row;
    if (r.timestamp_ms < last_ts || r.input_length < 1 || r.output_length < 0) broken("a row out of range");
    const auto blocks = static_cast<size_t>((r.input_length + block_size - 1) / block_size);
    if (r.hash_ids.size() != blocks) broken("hash_ids is not one id per block");
    last_ts = r.timestamp_ms;
  }
  const mc::trace::ReaderStats& s = reader.stats();
  // A CSV record may span lines (quoted line breaks), so a CSV file's rows and skips may be fewer than its lines.
  if (mode == mc::trace::Mode::kLenient && s.format == mc::trace::Format::kMooncake &&
      s.lines != s.rows + s.skipped + s.blank + s.header) {
    broken("lines are not rows + skipped + blank");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  static constexpr int64_t kBlockSizes[] = {512, 16, 1, 3};
  const int64_t block_size = kBlockSizes[(data[0] >> 2) % 4];
  switch (data[0] % 4) {
    case 0:
      read_trace(text, mc::trace::Mode::kStrict, block_size);
      break;
    case 1:
      read_trace(text, mc::trace::Mode::kLenient, block_size);
      break;
    default: {
      std::istringstream in(text);
      (void)mc::replay::read_records_jsonl(in, "fuzz-records.jsonl");
      break;
    }
  }
  return 0;
}
