// The text helpers of mc_report's tables, shared by every report of the replay, the simulator and the
// capacity planner (so that their tables look alike): fixed-point text, the aligned table printer with
// units in the column headers, the run-configuration header, and the JSON of a Distribution.
// Thread-safety: pure functions; the printers write only to the stream they are given.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/report/report.hpp"

namespace mc::replay::format {

// `v` with `digits` decimals ("12.50").
std::string fixed(double v, int digits);
// A fraction as a percentage with one decimal ("37.4").
std::string pct(double fraction);
// Rows of cells: the first column left-aligned, the others right-aligned, each as wide as its widest cell.
void print_rows(std::ostream& out, const std::vector<std::vector<std::string>>& rows);
// "k=v  k=v" of the run's configuration followed by a blank line; nothing when `info` is empty.
void print_header(std::ostream& out, const RunInfo& info);
// {"count", "mean", "p50", "p90", "p99", "max"}; {"count": 0} when there were no values.
nlohmann::json distribution_json(const std::optional<Distribution>& d);
nlohmann::json info_json(const RunInfo& info);

}  // namespace mc::replay::format
