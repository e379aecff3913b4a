#include "mc/trace/trace_flags.hpp"

#include "mc/cli/cli.hpp"

namespace mc::cli {

void add_trace_window_flags(CLI::App& cmd, double& start_s, double& duration_s, int64_t& max_requests) {
  cmd.add_option("--start-s", start_s, "Skip rows that arrive before this trace time (seconds)")
      ->capture_default_str()
      ->check(kNonNegativeFinite);
  cmd.add_option("--duration-s", duration_s,
                 "Only rows arriving within this many trace seconds after --start-s (0: to the end)")
      ->capture_default_str()
      ->check(kNonNegativeFinite);
  cmd.add_option("--max-requests", max_requests, "At most this many rows (0: no limit)")
      ->capture_default_str()
      ->check(kNonNegativeFinite);
}

CLI::Option* add_rate_scale_option(CLI::App& cmd, double& rate_scale) {
  return cmd
      .add_option("--rate-scale", rate_scale,
                  "Multiply the arrival rate (divide the gaps between arrivals; 2: twice as many requests/s)")
      ->envname("MC_RATE_SCALE")
      ->capture_default_str()
      ->check(kPositiveFinite);
}

CLI::Option* add_trace_file_option(CLI::App& cmd, std::string& path) {
  return cmd.add_option("--trace", path, "Trace file (Mooncake JSONL, Azure or BurstGPT CSV), or - for stdin")
      ->envname("MC_TRACE")
      ->capture_default_str();
}

void add_trace_format_flags(CLI::App& cmd, trace::FormatOptions& formats) {
  cmd.add_option_function<std::string>(
         "--format", [&formats](const std::string& v) { formats.format = trace::parse_format(v).value(); },
         "Trace format: auto (a JSON object on the first line, or a CSV header naming the columns), mooncake "
         "(JSONL), azure (CSV: TIMESTAMP,ContextTokens,GeneratedTokens), burstgpt (CSV: Timestamp,Request "
         "tokens,Response tokens,...)")
      ->default_str("auto")
      ->check(CLI::IsMember({"auto", "mooncake", "azure", "burstgpt"}));
  cmd.add_option_function<std::string>(
         "--timestamp-unit",
         [&formats](const std::string& v) { formats.timestamp_unit = trace::parse_unit(v).value(); },
         "Unit of numeric timestamps: s, ms, us, ns, or auto (BurstGPT: s; else by the first one's magnitude: "
         ">= 1e17 ns, >= 1e14 us, >= 1e11 ms, >= 1e9 s, smaller ms). Epoch times (>= 1e9 s) are shifted to "
         "start at 0")
      ->default_str("auto")
      ->check(CLI::IsMember({"auto", "s", "ms", "us", "ns"}));
  cmd.add_option_function<std::string>(
         "--block-accounting",
         [&formats](const std::string& v) {
           formats.block_accounting =
               v == "lenient" ? trace::BlockAccounting::kLenient : trace::BlockAccounting::kStrict;
         },
         "strict: a row needs ceil(input_length / block size) hash_ids; lenient: another count is accepted, each "
         "id covering input_length / len(hash_ids) tokens (rounded), the row re-cut into blocks and counted")
      ->default_str("strict")
      ->check(CLI::IsMember({"strict", "lenient"}));
  cmd.add_option("--synthesize-prefixes", formats.synthesize_prefixes,
                 "Ids of rows without hash_ids (CSV): none (unique ids, no reuse) or a prefix model, chat[:key=value,"
                 "...] with keys system_prompts, system_tokens, zipf, continue, sessions, seed (shared system "
                 "prompts, multi-turn sessions with growing history; DESIGN.md 4.6)")
      ->default_str("none");
}

}  // namespace mc::cli
