// The flag groups of every command that reads a trace (mc-trace-replay, mc-sim, mc-plan), beside the trace
// reader they configure; the cli kit's conventions (mc/common/cli.hpp): flag beats MC_* environment beats default,
// every add_* binds references that must outlive parsing, a refused value exits 2 at parse time naming the flag.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "mc/trace/trace.hpp"

namespace mc::cli {

// The trace window of every command that reads a Mooncake trace: --start-s (skip rows before this trace
// time, s), --duration-s (trace seconds after --start-s, 0: to the end), --max-requests (at most this
// many rows, 0: no limit); all >= 0.
void add_trace_window_flags(CLI::App& cmd, double& start_s, double& duration_s, int64_t& max_requests);
// The load: --rate-scale (env MC_RATE_SCALE), multiplier of the trace's arrival rate, > 0.
CLI::Option* add_rate_scale_option(CLI::App& cmd, double& rate_scale);
// --trace FILE (env MC_TRACE): a trace (Mooncake JSONL, Azure or BurstGPT CSV), or - for stdin.
CLI::Option* add_trace_file_option(CLI::App& cmd, std::string& path);
// How the trace reader reads the file (trace.hpp, DESIGN.md §4.2, §4.6), for every command that reads a trace:
// --format auto|mooncake|azure|burstgpt, --timestamp-unit auto|s|ms|us|ns, --block-accounting strict|lenient,
// --synthesize-prefixes MODEL (checked when the trace is opened).
void add_trace_format_flags(CLI::App& cmd, trace::FormatOptions& formats);

}  // namespace mc::cli
