// Internal helper of mc_replay's reports (not a public header): the JSON of a Distribution. The number
// formatting, table and run header are libcommon's (mc/common/report.hpp).
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "mc/replay/report.hpp"

namespace mc::replay::format {

// {"count", "mean", "p50", "p90", "p99", "max"}; {"count": 0} when there were no values.
nlohmann::json distribution_json(const std::optional<Distribution>& d);

}  // namespace mc::replay::format
