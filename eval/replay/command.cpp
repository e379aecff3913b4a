#include "mc/replay/command.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "mc/cli/cli.hpp"
#include "mc/common/input_file.hpp"
#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/replay/http_target.hpp"
#include "mc/report/format.hpp"
#include "mc/report/page.hpp"
#include "mc/report/run_charts.hpp"

namespace mc::replay {

using json = nlohmann::json;

trace::ReaderOptions TraceInput::reader_options() const {
  trace::ReaderOptions o;
  o.mode = lenient ? trace::Mode::kLenient : trace::Mode::kStrict;
  o.block_size = trace_block_size;
  o.source_name = path == "-" ? "<stdin>" : path;
  o.warn_on_stderr = true;
  o.formats = formats;
  return o;
}

namespace {

std::string num(double v) {
  std::string s = mc::report::fixed(v, 3);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void add_window_info(RunInfo& info, const TraceInput& in, const trace::ReaderStats& stats) {
  info.emplace_back("trace", in.path);
  info.emplace_back("mode", in.lenient ? "lenient" : "strict");
  if (in.window.start_s > 0) info.emplace_back("start_s", num(in.window.start_s));
  if (in.window.duration_s > 0) info.emplace_back("duration_s", num(in.window.duration_s));
  if (in.window.max_requests > 0) info.emplace_back("max_requests", std::to_string(in.window.max_requests));
  if (stats.skipped > 0) info.emplace_back("skipped_rows", std::to_string(stats.skipped));
  for (auto& kv : trace::describe(stats, in.formats)) info.push_back(std::move(kv));
}

// What the reader found out by itself (format, timestamp unit, an epoch shift), on stderr as well: it changes how
// every row is read, so it is said where a script's operator sees it even when stdout is data.
void log_trace_read(const trace::Reader& reader, const TraceInput& in) {
  const trace::ReaderStats& st = reader.stats();
  if (!trace::read_differently(st)) return;
  std::string line;
  for (const auto& [k, v] : trace::describe(st, in.formats)) line += (line.empty() ? "" : ", ") + k + " " + v;
  MC_LOG_INFO << in.reader_options().source_name << ": " << line;
}

// Lenient mode: the final count of skipped rows (each was already warned about on its line).
void warn_skipped(const trace::Reader& reader) {
  const auto& st = reader.stats();
  if (st.skipped > 0)
    MC_LOG_WARN << st.skipped << " rows skipped (lenient mode) of " << st.lines << " lines; " << st.rows
                << " valid rows read";
}

Result<std::unique_ptr<trace::Reader>> open_trace(const TraceInput& in) {
  if (in.trace_block_size < 1)
    return Status(Code::kInvalidArgument,
                  "--trace-block-size must be >= 1, got " + std::to_string(in.trace_block_size));
  return trace::Reader::open(in.path, in.reader_options());
}

}  // namespace

Status run_analyze_command(const AnalyzeCommand& c, std::ostream& out) {
  auto reader = open_trace(c.input);
  if (!reader.is_ok()) return mc::report::print_error(c.json, out, reader.status());
  AnalyzeOptions opt;
  opt.reader = c.input.reader_options();
  opt.window = c.input.window;
  opt.capacity_tokens = c.capacity_tokens;
  opt.keep_samples = c.pictures.wanted();
  auto a = analyze(**reader, opt);
  if (!a.is_ok()) return mc::report::print_error(c.json, out, a.status());
  if (a->requests == 0)
    return mc::report::print_error(c.json, out, empty_window_error("analyze", opt.reader.source_name));
  warn_skipped(**reader);
  log_trace_read(**reader, c.input);
  RunInfo info = mc::report::host_run_info("mc-trace-replay analyze");
  add_window_info(info, c.input, (*reader)->stats());
  info.emplace_back("block_size", std::to_string(c.input.trace_block_size));
  if (c.pictures.wanted()) {
    Status st = mc::report::write_page(analyze_page(*a, info, c.input.trace_block_size),
                                       {c.pictures.html_path, c.pictures.svg_dir, {}});
    if (!st.is_ok()) return mc::report::print_error(c.json, out, st);
  }
  if (c.json) {
    out << to_json(*a, info).dump(2) << "\n";
  } else {
    print_table(out, *a, info);
  }
  return Status::ok();
}

Status run_report_command(const ReportCommand& c, std::ostream& out) {
  if (c.records_paths.empty())
    return mc::report::print_error(c.json, out, Status(Code::kInvalidArgument, "no records file given"));
  if (c.pictures.wanted() && !(c.gpus_per_instance > 0 && c.gpus_per_instance <= 1024)) {
    return mc::report::print_error(c.json, out,
                                   Status(Code::kInvalidArgument, "--gpus-per-instance must be in (0, 1024], got " +
                                                                      mc::report::fixed(c.gpus_per_instance, 3)));
  }
  std::vector<std::pair<std::string, Summary>> runs;
  std::vector<RunRecords> pictured;
  for (const std::string& path : c.records_paths) {
    Result<std::ifstream> in = open_input_file(path, "records file", "write one with mc-trace-replay --out FILE");
    if (!in.is_ok()) return mc::report::print_error(c.json, out, in.status());
    auto records = read_records_jsonl(*in, path);
    if (!records.is_ok()) return mc::report::print_error(c.json, out, records.status());
    if (records->empty()) {
      return mc::report::print_error(
          c.json, out,
          Status(Code::kInvalidArgument,
                 "no record in records file '" + path +
                     "': empty (write records with mc-trace-replay --out FILE or mc-sim --out)"));
    }
    std::string label = std::filesystem::path(path).stem().string();
    runs.emplace_back(label, summarize(*records, c.summary));
    if (c.pictures.wanted()) pictured.push_back({label, std::move(records).value(), runs.back().second, std::nullopt});
  }
  RunInfo info = mc::report::host_run_info("mc-trace-replay report");
  if (c.pictures.wanted()) {
    RunInfo page_info = info;
    for (const std::string& path : c.records_paths) page_info.emplace_back("records", path);
    RunChartOptions options;
    options.gpus_per_instance = c.gpus_per_instance;
    const mc::report::Page page = run_page("Run report", page_info, pictured, options);
    Status st = mc::report::write_page(page, {c.pictures.html_path, c.pictures.svg_dir, {}});
    if (!st.is_ok()) return mc::report::print_error(c.json, out, st);
  }
  if (runs.size() == 1) {
    info.emplace_back("records", c.records_paths.front());
    if (c.json) {
      out << to_json(runs.front().second, info).dump(2) << "\n";
    } else {
      print_table(out, runs.front().second, info);
    }
    return Status::ok();
  }
  if (c.json) {
    json all = json::array();
    for (const auto& [label, s] : runs) {
      json j = to_json(s, info);
      j["run"] = label;
      all.push_back(std::move(j));
    }
    out << all.dump(2) << "\n";
  } else {
    mc::report::print_run_header(out, info);
    print_comparison(out, runs);
  }
  return Status::ok();
}

namespace {

// Where convert and gen write their trace: `out` for "-", else `path` opened (truncated) into `file`.
Result<std::ostream*> trace_output(const std::string& path, std::ostream& out, std::ofstream& file) {
  if (path == "-") return &out;
  file.open(path, std::ios::trunc);
  if (!file) return Status(Code::kIo, "cannot write the trace to " + path + ": " + std::strerror(errno));
  return &file;
}

}  // namespace

Status run_convert_command(const ConvertCommand& c, std::ostream& out) {
  if (c.out_path != "-" && c.input.path != "-") {
    std::error_code ec;
    if (std::filesystem::equivalent(c.input.path, c.out_path, ec)) {
      return Status(Code::kInvalidArgument, "convert: --out " + c.out_path + " is the input trace " + c.input.path +
                                                "; writing it would truncate what is being read (give another file)");
    }
  }
  MC_ASSIGN_OR_RETURN(std::unique_ptr<trace::Reader> reader, open_trace(c.input));
  std::ofstream file;
  MC_ASSIGN_OR_RETURN(std::ostream * dst, trace_output(c.out_path, out, file));
  // Row by row, so a large trace converts in constant memory; the window as read_window() selects it.
  int64_t written = 0;
  const Window& w = c.input.window;
  while (true) {
    MC_ASSIGN_OR_RETURN(std::optional<trace::Request> row, reader->next());
    if (!row) break;
    if (!w.contains(*row)) {
      if (w.duration_s > 0 && static_cast<double>(row->timestamp_ms) / 1000.0 >= w.start_s + w.duration_s) break;
      continue;
    }
    if (w.max_requests > 0 && written >= w.max_requests) break;
    *dst << trace::to_jsonl(*row) << '\n';
    ++written;
  }
  dst->flush();
  if (!*dst)
    return Status(Code::kIo, "writing the trace to " + (c.out_path == "-" ? std::string("stdout") : c.out_path) +
                                 " failed: " + std::strerror(errno));
  if (written == 0) return empty_window_error("convert", c.input.reader_options().source_name);
  warn_skipped(*reader);
  std::string line;
  for (const auto& [k, v] : trace::describe(reader->stats(), c.input.formats)) line += ", " + k + " " + v;
  MC_LOG_INFO << "converted " << written << " rows of " << c.input.reader_options().source_name << " to "
              << (c.out_path == "-" ? std::string("stdout") : c.out_path) << " (Mooncake JSONL, "
              << c.input.trace_block_size << " tokens per hash_id" << line << ")";
  return Status::ok();
}

Status run_gen_command(const GenCommand& c, std::ostream& out) {
  MC_RETURN_IF_ERROR(c.options.validate());
  std::ofstream file;
  MC_ASSIGN_OR_RETURN(std::ostream * dst, trace_output(c.out_path, out, file));
  MC_ASSIGN_OR_RETURN(GenStats st, generate_trace(c.options, *dst));
  dst->flush();
  if (!*dst) return Status(Code::kIo, "writing the trace to " + c.out_path + " failed: " + std::strerror(errno));
  MC_LOG_INFO << "gen: " << st.rows << " requests of " << st.sessions << " sessions over " << num(st.last_timestamp_s)
              << " s (longest prompt " << st.max_input_tokens << " tokens, seed " << c.options.seed << ") to "
              << (c.out_path == "-" ? std::string("stdout") : c.out_path);
  return Status::ok();
}

Status run_replay_command(const ReplayCommand& c, std::ostream& out) {
  auto reader = open_trace(c.input);
  if (!reader.is_ok()) return mc::report::print_error(c.json, out, reader.status());
  auto rows = read_window(**reader, c.input.window);
  if (!rows.is_ok()) return mc::report::print_error(c.json, out, rows.status());
  warn_skipped(**reader);
  log_trace_read(**reader, c.input);
  if (rows->empty())
    return mc::report::print_error(c.json, out, empty_window_error("replay", c.input.reader_options().source_name));
  if (c.max_output_tokens < 0)
    return mc::report::print_error(c.json, out, Status(Code::kInvalidArgument, "--max-output-tokens must be >= 0"));
  if (c.max_output_tokens > 0)
    for (auto& r : *rows) r.output_length = std::min(r.output_length, c.max_output_tokens);
  if (c.max_input_tokens < 0)
    return mc::report::print_error(c.json, out, Status(Code::kInvalidArgument, "--max-input-tokens must be >= 0"));
  if (c.max_input_tokens > 0) {
    // The prompt's first max_input_tokens tokens: its leading blocks keep their hash_ids, so prefixes stay shared.
    const int64_t bs = std::max<int64_t>(1, c.replay.synth.trace_block_size);
    for (auto& r : *rows) {
      if (r.input_length <= c.max_input_tokens) continue;
      r.input_length = c.max_input_tokens;
      r.hash_ids.resize(std::min(r.hash_ids.size(), static_cast<size_t>((r.input_length + bs - 1) / bs)));
    }
  }
  if (c.summary.slo_ttft_ms.empty() || c.summary.slo_tbt_ms.empty())
    return mc::report::print_error(
        c.json, out, Status(Code::kInvalidArgument, "--slo-ttft-ms and --slo-tbt-ms need at least one value"));

  std::ofstream records_out;
  if (!c.out_path.empty()) {
    records_out.open(c.out_path, std::ios::trunc);
    if (!records_out)
      return mc::report::print_error(
          c.json, out, Status(Code::kIo, "cannot write records to " + c.out_path + ": " + std::strerror(errno)));
  }
  ReplayOptions ro = c.replay;
  ro.window = c.input.window;
  ro.synth.trace_block_size = c.input.trace_block_size;
  ro.slo_ttft_ms = c.summary.slo_ttft_ms.front();
  ro.slo_tbt_ms = c.summary.slo_tbt_ms.front();
  ConductorLinkOptions lo = c.conductor;
  lo.block_size_tokens = ro.synth.block_tokens;
  auto replay = [&]() -> Result<ReplayResult> {
    if (c.target.empty()) {
      MC_LOG_INFO << "replaying " << rows->size() << " requests against " << lo.endpoint;
      auto events = make_client_event_source(c.client_bind);
      return run_replay(*rows, ro, conductor_link_factory(lo), events.get());
    }
    HttpTargetOptions ho;
    ho.url = c.target;
    ho.model = c.target_model;
    ho.api_key = c.target_api_key;
    ho.connect_timeout_ms = lo.connect_timeout_ms;
    ho.submit_timeout_ms = lo.submit_timeout_ms;
    MC_ASSIGN_OR_RETURN(HttpTarget target, make_http_target(ho));
    MC_LOG_INFO << "replaying " << rows->size() << " requests through " << c.target;
    return run_replay(*rows, ro, target.links, target.events.get());
  };
  Result<ReplayResult> result = replay();
  if (!result.is_ok()) return mc::report::print_error(c.json, out, result.status());

  if (records_out.is_open()) {
    for (const RequestRecord& r : result->records) records_out << to_json(r).dump() << "\n";
    records_out.flush();
    if (!records_out)
      return mc::report::print_error(
          c.json, out, Status(Code::kIo, "writing records to " + c.out_path + " failed: " + std::strerror(errno)));
  }
  Summary s = summarize(result->records, c.summary);
  RunInfo info = mc::report::host_run_info("mc-trace-replay replay");
  add_window_info(info, c.input, (*reader)->stats());
  if (c.target.empty()) {
    info.emplace_back("conductor", lo.endpoint);
  } else {
    info.emplace_back("target", c.target);
  }
  info.emplace_back("speed", num(ro.speed));
  info.emplace_back("rate_scale", num(ro.rate_scale));
  info.emplace_back("time_scale", num(ro.time_scale));
  info.emplace_back("block_tokens", std::to_string(ro.synth.block_tokens));
  if (c.max_output_tokens > 0) info.emplace_back("max_output_tokens", std::to_string(c.max_output_tokens));
  if (c.max_input_tokens > 0) info.emplace_back("max_input_tokens", std::to_string(c.max_input_tokens));
  info.emplace_back("wall_s", num(result->wall_s));
  if (result->unknown_events > 0) info.emplace_back("unknown_events", std::to_string(result->unknown_events));
  info.emplace_back("lost", std::to_string(result->lost));
  if (c.json) {
    out << to_json(s, info).dump(2) << "\n";
  } else {
    print_table(out, s, info);
  }
  if (s.failed == 0 || c.allow_failures) return Status::ok();
  // The records say why; the message names the most frequent reason (issue 17 item 6: scripts can trust it).
  // Counted by kind, as the table's reason lines (the text before the first ": "; a message names its request).
  std::map<std::string, std::pair<int64_t, std::string>> kinds;
  for (const RequestRecord& r : result->records) {
    if (r.outcome != Outcome::kFailed) continue;
    auto& [count, example] = kinds[r.reason.substr(0, r.reason.find(": "))];
    if (count++ == 0) example = r.reason;
  }
  auto top = std::max_element(kinds.begin(), kinds.end(),
                              [](const auto& a, const auto& b) { return a.second.first < b.second.first; });
  const std::string most =
      top == kinds.end()
          ? std::string("no reason given)")
          : std::to_string(top->second.first) + "x): " + top->first +
                (top->second.second != top->first ? " (e.g. " + top->second.second + ")" : std::string());
  const std::string submits =
      s.submit_failed > 0 ? ", and " + std::to_string(s.submit_failed) + " submits failed before any answer" : "";
  return Status(Code::kUnavailable, std::to_string(s.failed - s.submit_failed) + " of " + std::to_string(s.accepted) +
                                        " accepted requests failed (" + std::to_string(result->lost) +
                                        " lost: no terminal event within the drain timeout)" + submits +
                                        "; most often (" + most + " (--allow-failures exits 0 all the same)");
}

}  // namespace mc::replay
