// What every mc tool's printed output shares: fixed-point numbers, the aligned text table, the run header
// (tool, build, host, time and the run's configuration), the one JSON error document, and this host's name.
//
// All functions are stateless and thread-safe; they write only to the stream they are given.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"

namespace mc::report {

// This host's name from gethostname(2); "localhost" when the call fails.
std::string host_name();

// `v` with `digits` decimals ("12.50"); digits >= 0.
std::string fixed(double v, int digits);
// A fraction as a percentage with one decimal ("37.4" for 0.374).
std::string pct(double fraction);

// Rows of cells printed as a table: the first column left-aligned, the others right-aligned, each as wide as
// its widest cell, two spaces between columns, trailing blanks trimmed. Rows may differ in length; units
// belong in the header row's cells ("ttft_ms").
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

// The run header: ordered key/value pairs describing a run (tool, build, host, time, then the
// command's configuration such as trace=..., start_s=...).
using RunInfo = std::vector<std::pair<std::string, std::string>>;
// {tool, build id} for the tool named `tool` ("mc-sim"): the header of a run that is the same on every host
// and at every time (simulation, planning).
RunInfo run_info(const std::string& tool);
// run_info(tool) followed by {host name, UTC start time "YYYY-MM-DDTHH:MM:SSZ"}: the header of a run that
// measured or read something here ("mc-trace-replay analyze").
RunInfo host_run_info(const std::string& tool);
// "k=v  k=v" on one line followed by a blank line; nothing when `info` is empty.
void print_run_header(std::ostream& out, const RunInfo& info);
// The header as one JSON object {"k": "v", ...} (a document's "config").
nlohmann::json run_info_json(const RunInfo& info);

// The JSON error document of every tool in --json mode: {"error": {"code": "<code name>", "message": "..."}}.
nlohmann::json error_json(const Status& status);
// Prints error_json(status) on `out` as one line when `json` and status is an error; returns
// `status` unchanged, so a command can `return print_error(json, out, st);`.
Status print_error(bool json, std::ostream& out, const Status& status);

}  // namespace mc::report
