// JSON forms of the scheduler's values, for the decision log (mc-conductor --decisions FILE, one
// object per line) and for reports. Keys carry units (_ms, _tokens, _bytes); times are relative ms
// except decided_at_ns (the scheduler clock). A logged line holds the decision's inputs (the request,
// the candidates' queue and prefix figures) so that a bad decision can be examined offline.
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "mc/sched/types.hpp"

namespace mc::sched {

nlohmann::json to_json(const PrefillEstimate& e);
nlohmann::json to_json(const DecodeEstimate& e);
// {"request": {...}, "decision": {...}}; block hashes as 16-hex-digit strings ("0x...").
nlohmann::json decision_record(const Request& request, const Decision& decision);

}  // namespace mc::sched
