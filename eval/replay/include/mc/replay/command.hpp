// The commands of mc-trace-replay as library calls (the tool's main only parses flags into these):
//   replay   TRACE --conductor tcp://...  the live open-loop replay: JSONL records (--out), summary
//   analyze  TRACE                        offline trace statistics and prefix-cache hit ratios
//   report   RECORDS.jsonl...             the summary of a finished run's records, re-computed; with
//                                         several files, one comparison row per run (label: file stem)
//   convert  TRACE                        any trace the reader accepts, written as Mooncake JSONL
//   gen                                   a synthetic session-structured trace (gen.hpp) as Mooncake JSONL
// Output: the table (default) or one JSON document (--json) on `out`; diagnostics on stderr. In JSON
// mode a failure is reported as {"error": {"code", "message"}} on `out` as well as returned.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/replay/analyze.hpp"
#include "mc/replay/conductor_link.hpp"
#include "mc/replay/gen.hpp"
#include "mc/replay/replay.hpp"
#include "mc/report/report.hpp"
#include "mc/trace/trace.hpp"

namespace mc::replay {

// Options every trace-reading command shares.
struct TraceInput {
  std::string path = "-";          // file, or "-" for stdin
  bool lenient = false;            // skip bad rows with a warning (default: strict, first bad row fails)
  int64_t trace_block_size = 512;  // tokens per hash_id in the trace
  trace::FormatOptions formats;    // format, timestamp unit, block accounting, prefix model (trace.hpp)
  Window window;
  trace::ReaderOptions reader_options() const;
};

struct ReplayCommand {
  TraceInput input;
  ReplayOptions replay;
  ConductorLinkOptions conductor;
  std::string client_bind = "tcp://127.0.0.1:0";  // where mc-decode sends token events (a connectable address)
  // Non-empty (http://HOST:PORT): replay through mc-gateway's HTTP API instead of the Conductor (http_target.hpp).
  std::string target;
  std::string target_model;       // the model named in each request ("": the gateway's first)
  std::string target_api_key;     // --api-key: the gateway's API key ("": none)
  int64_t max_output_tokens = 0;  // 0: as in the trace; else each row's output_length is capped
  int64_t max_input_tokens = 0;   // 0: as in the trace; else each prompt is cut to its first max_input_tokens tokens
  SummaryOptions summary;
  std::string out_path;  // JSONL records; empty: none
  bool json = false;
  // Exit status 0 even when accepted requests failed or were lost (default: such a run is an error, kUnavailable
  // after the summary is printed).
  bool allow_failures = false;
};

// The pictures of a command (--html, --svg): the page and/or every chart as SVG (mc/report/page.hpp).
struct PictureOutput {
  std::string html_path;  // "": no page
  std::string svg_dir;    // "": no SVG files
  bool wanted() const { return !html_path.empty() || !svg_dir.empty(); }
};

struct AnalyzeCommand {
  TraceInput input;
  std::vector<int64_t> capacity_tokens = {1'000'000, 3'000'000, 10'000'000, 50'000'000};
  bool json = false;
  PictureOutput pictures;  // the capacity curve, the length distributions and the arrivals
};

struct ReportCommand {
  std::vector<std::string> records_paths;  // one: the full summary; several: one comparison row each
  SummaryOptions summary;
  bool json = false;
  PictureOutput pictures;
  double gpus_per_instance = 1;  // GPU-seconds of the page's prefill ledger = instance-seconds x this
};

// `convert`: the window's rows as Mooncake JSONL (trace::to_jsonl), to out_path ("-": `out`); what was read (format,
// unit, epoch shift, re-cut rows) goes to stderr.
struct ConvertCommand {
  TraceInput input;
  std::string out_path = "-";
};

// `gen`: a synthetic trace (gen.hpp) to out_path ("-": `out`); a one-line summary on stderr.
struct GenCommand {
  GenOptions options;
  std::string out_path = "-";
};

// The summary is printed whatever the outcome; then, unless allow_failures, kUnavailable (exit 1) when an
// accepted request failed or was lost, naming the counts and the most frequent reason.
Status run_replay_command(const ReplayCommand& command, std::ostream& out);
Status run_analyze_command(const AnalyzeCommand& command, std::ostream& out);
Status run_report_command(const ReportCommand& command, std::ostream& out);
Status run_convert_command(const ConvertCommand& command, std::ostream& out);
Status run_gen_command(const GenCommand& command, std::ostream& out);

}  // namespace mc::replay
