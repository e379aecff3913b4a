// Re-running logged decisions through other policies (`mc-conductor replay-decisions`, DESIGN.md §10): "what
// would another policy have done on yesterday's traffic". Each line of a decision log (`mc-conductor serve
// --decisions FILE`, decision_json.hpp) holds the policy's input, every live prefill instance as priced then
// (queue, cheapest prefix plan, transfer, prefill, predicted TTFT; in registration order), with the TTFT SLO
// applied and whether early rejection was on. A replay hands those estimates to each named policy in log
// order (make_policy with the given seed: random and round_robin replay their own sequence) and compares its
// choice and its predicted TTFT with the logged ones.
//
// What a replay can and cannot say: the prefill choice and its TTFT are exact re-runs; a replayed choice is
// rejected when early rejection was on and its TTFT is not admissible (ttft_admissible: kvcache at the logged
// target, the other policies at the SLO itself, as the Conductor would), and a decision
// the Conductor rejected on the decode side (tbt_slo, kv_capacity, no_decode_instance) stays rejected (the
// decode side is not re-priced). Later queues are those the logged policy caused, not the replayed one's:
// the replay answers "which instance, at what predicted TTFT, given that state", not a full re-simulation
// (mc-sim does that).
//
// Pure; thread-safety: none (plain values and functions).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

// One logged decision, as a replay needs it.
struct LoggedDecision {
  Request request;     // id, lengths and SLOs (block hashes are not needed)
  std::string policy;  // the policy that decided
  bool accepted = false;
  std::string reject_reason;     // "" when accepted; else reject_reason_name()
  std::string chosen_prefill;    // the logged policy's choice ("" when rejected before choosing)
  double predicted_ttft_ms = 0;  // of that choice
  double slo_ttft_ms = 0;        // the TTFT SLO applied
  double ttft_target_ms = 0;     // the target scheduled to (SLO headroom); the SLO in a log from before it
  bool early_reject = true;
  double service_weight = 0;               // the load-priced placement's weight (0 in a log from before it)
  double load_ratio = 0;                   // load shedding's ratio (Decision::load_ratio; 0 in an older log)
  double shed_limit = 0;                   // the shed limit the logging Conductor applied (0: none, or an older log)
  double shed_slo_ms = 0;                  // the TTFT SLO that limit multiplies (the Conductor's; 0: slo_ttft_ms)
  std::vector<PrefillEstimate> estimates;  // the policy's input; empty: nothing to re-run
};

// One line of a decision log. kInvalidArgument naming the key for a line that is not a decision record;
// a record of an older log without "estimates" parses with empty estimates (it is skipped and counted).
Result<LoggedDecision> logged_decision_from_json(const nlohmann::json& line);

struct PolicyReplay {
  std::string policy;
  int64_t decisions = 0;         // re-run (logged decisions with estimates)
  int64_t same_choice = 0;       // chose the logged prefill instance
  int64_t different_choice = 0;  // chose another one
  int64_t accepted = 0;          // of the re-run ones, not rejected by the replay
  int64_t rejected = 0;          // rejected: predicted TTFT over the SLO (early rejection on), or decode side as logged
  int64_t rejected_ttft = 0;     // of those, by the TTFT SLO
  int64_t rejected_shed = 0;     // of those, by load shedding (kvcache at the log's shed_limit)
  // Predicted TTFT of the replayed choice minus the logged one, ms, over the re-run decisions.
  double mean_ttft_diff_ms = 0;
  double p99_abs_ttft_diff_ms = 0;  // nearest rank
  double max_abs_ttft_diff_ms = 0;
};

struct DecisionReplay {
  int64_t logged = 0;                        // decisions read
  int64_t replayable = 0;                    // with estimates
  int64_t logged_accepted = 0;               // of the replayable ones, accepted by the logged policy
  int64_t logged_rejected = 0;               // of the replayable ones, rejected by the logged policy
  std::vector<std::string> logged_policies;  // distinct, in order of appearance
  std::vector<PolicyReplay> policies;        // in the order asked
};

// Re-runs every logged decision that has estimates through each policy of `policies` (names of
// policy_names(); kInvalidArgument for another, or for none). `seed`: the random policy's seed.
Result<DecisionReplay> replay_decisions(std::span<const LoggedDecision> log, const std::vector<std::string>& policies,
                                        uint64_t seed);

}  // namespace mc::sched
