// Trace rows for tests that build a Mooncake trace in memory instead of reading a JSONL file.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mc/trace/trace.hpp"

namespace mc::testkit {

// One request of a trace: its 1-based line number, arrival time (ms from the trace's start), prompt and
// output lengths (tokens) and the prompt's block hash ids (one per block, prefix-chained as in the trace).
inline trace::Request trace_row(int64_t line_no, int64_t timestamp_ms, int64_t input_length, int64_t output_length,
                                std::vector<uint64_t> hash_ids) {
  trace::Request r;
  r.line_no = line_no;
  r.timestamp_ms = timestamp_ms;
  r.input_length = input_length;
  r.output_length = output_length;
  r.hash_ids = std::move(hash_ids);
  return r;
}

// Every row of a trace text read with `options`: the rows before the first error, that error (ok at the end of the
// text) and the reader's counters.
struct TraceRead {
  std::vector<trace::Request> rows;
  Status status;
  trace::ReaderStats stats;
};
inline TraceRead read_trace(const std::string& text, const trace::ReaderOptions& options) {
  std::istringstream in(text);
  trace::Reader r(in, options);
  TraceRead out;
  while (true) {
    auto row = r.next();
    if (!row.is_ok()) {
      out.status = row.status();
      break;
    }
    if (!row->has_value()) break;
    out.rows.push_back(**row);
  }
  out.stats = r.stats();
  return out;
}

}  // namespace mc::testkit
