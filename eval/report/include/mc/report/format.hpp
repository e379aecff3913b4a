// The JSON of a Distribution, shared by the reports of mc_report, mc_replay and mc_sim. Number formatting,
// the table printer and the run header are libcommon's (mc/common/report.hpp).
// Thread-safety: pure functions.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "mc/report/report.hpp"

namespace mc::replay::format {

// {"count", "mean", "p50", "p90", "p99", "max"}; {"count": 0} when there were no values.
nlohmann::json distribution_json(const std::optional<Distribution>& d);

}  // namespace mc::replay::format
