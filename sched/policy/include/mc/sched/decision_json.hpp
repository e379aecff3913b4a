// JSON forms of the scheduler's values, for the decision log (mc-conductor --decisions FILE, one
// object per line) and for reports. Keys carry units (_ms, _tokens, _bytes); times are relative ms
// except decided_at_ns (the scheduler clock). A logged line holds the decision's inputs (the request,
// the candidates' queue and prefix figures) so that a bad decision can be examined offline.
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "mc/sched/types.hpp"

namespace mc::sched {
class Scheduler;
}

namespace mc::sched {

nlohmann::json to_json(const PrefillEstimate& e);
nlohmann::json to_json(const DecodeEstimate& e);
// {"request": {...}, "decision": {...}}; block hashes as 16-hex-digit strings ("0x...").
nlohmann::json decision_record(const Request& request, const Decision& decision);
// The scheduler's state for `mc-conductor stat`: config, instances (role, host, liveness "live" or
// "unknown" (no load report yet), last_seen_ms_ago, queue_ms, ledger and reported load), index size
// and counters, decisions by kind, predictor coefficients, bandwidths and the TTFT prediction error.
nlohmann::json scheduler_status(const Scheduler& scheduler, bool with_instances = true);

}  // namespace mc::sched
