// JSON forms of the scheduler's values, for the decision log (mc-conductor --decisions FILE, one
// object per line) and for reports. Keys carry units (_ms, _tokens, _bytes); times are relative ms
// except decided_at_ns (the scheduler clock). A logged line holds the decision's inputs (the request,
// the candidates' queue and prefix figures) so that a bad decision can be examined offline.
// Thread-safety: pure functions.
#pragma once

#include <span>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {
class Scheduler;
}

namespace mc::sched {

nlohmann::json to_json(const PrefillEstimate& e);
nlohmann::json to_json(const DecodeEstimate& e);
// Inverse of to_json(PrefillEstimate); kInvalidArgument naming the missing or mistyped key.
Result<PrefillEstimate> estimate_from_json(const nlohmann::json& j);
// {"request": {...}, "decision": {...}}; block hashes as 16-hex-digit strings ("0x..."). The decision holds
// the applied TTFT SLO ("slo_ttft_ms_applied"), the target scheduled to ("ttft_target_ms": the SLO less the SLO
// headroom) and "early_reject", and, when `estimates` (the policy's input:
// Scheduler::last_estimates()) is not empty, "estimates": every priced prefill instance in registration
// order, so that `mc-conductor replay-decisions` can re-run any policy on it (decision_replay.hpp).
nlohmann::json decision_record(const Request& request, const Decision& decision,
                               std::span<const PrefillEstimate> estimates = {});
// The scheduler's state for `mc-conductor stat`: config, instances (role, host, liveness "live" or
// "unknown" (no load report yet), last_seen_ms_ago, queue_ms, ledger and reported load), index size
// and counters, decisions by kind, predictor coefficients, bandwidths (with their sample counts), the TTFT
// prediction error and the decode step prediction error ("decode_step_error").
nlohmann::json scheduler_status(const Scheduler& scheduler, bool with_instances = true);

}  // namespace mc::sched
