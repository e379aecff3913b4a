// What a worker's death does to the requests it holds (DESIGN.md §10 "Worker faults"), and the bounds on what
// workers report, as pure code: the daemon (mc-conductor) detects a death (missed heartbeats, or a worker RPC
// that failed on transport) and applies these decisions; nothing here does I/O or reads a clock (times come in
// as arguments).
//
// A request the Conductor accepted is in one of three phases:
//   kDispatching  reservation and prefill job under way; nothing has reached the client yet (decode sends the
//                 first token only after the prefill's kv_commit);
//   kReleasing    its prefill failed or its prefill instance died and the Conductor is asking the decode
//                 instance whether the reservation is still unconsumed: the client may already have heard
//                 (a request_error of an abort, or tokens after a commit);
//   kDecoding     the KV was committed: the decode instance is streaming tokens to the client.
// An instance's death touches a request when the instance is its decode instance (any phase), or its prefill
// instance while it is kDispatching (a finished prefill no longer matters). A touched kDispatching request is
// re-dispatched when attempts are left and some of its TTFT SLO remains (the new decision gets the remaining
// budget), else failed; any other touched request is failed (the client counts the tokens it already got).
// A reservation held on a live decode instance is released at once.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/sched/cluster_state.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

enum class RequestPhase : uint8_t { kDispatching = 0, kReleasing = 1, kDecoding = 2 };

// An accepted request as the Conductor tracks it.
struct TrackedRequest {
  std::string request_id;
  std::string prefill_id, decode_id;  // the instances of its current attempt
  RequestPhase phase = RequestPhase::kDispatching;
  int64_t submit_ns = 0;          // when it was submitted (the Conductor's monotonic clock)
  double slo_ttft_ms = 0;         // the TTFT SLO applied to it (> 0)
  int attempts = 1;               // dispatch attempts so far, the first included
  bool reservation_held = false;  // its decode reservation exists (reserve answered, not consumed)
};

enum class FaultAction : uint8_t { kRedispatch = 0, kFail = 1 };
std::string_view fault_action_name(FaultAction a);  // "redispatch" | "fail"

struct FaultPolicyConfig {
  int max_attempts = 3;  // dispatch attempts per request, the first included (>= 1)
};

// What becomes of one touched request.
struct FaultDecision {
  std::string request_id;
  FaultAction action = FaultAction::kFail;
  // Release the request's reservation on its (live) decode instance now.
  bool release_reservation = false;
  double remaining_ttft_ms = 0;  // kRedispatch: the SLO budget left for the new decision (> 0)
  std::string reason;            // names the instance and the cause; kFail: what the client is told
  std::string instance_cause;    // "<role> instance '<id>' <cause>": the start of reason
};

// The decisions for every request of `requests` that the death of `instance_id` (for `cause`, e.g. "missed its
// heartbeats for 3000 ms") touches, in the order of `requests`. `now_ns` is on the clock of submit_ns.
std::vector<FaultDecision> decide_instance_death(std::span<const TrackedRequest> requests,
                                                 const std::string& instance_id, const std::string& cause,
                                                 int64_t now_ns, const FaultPolicyConfig& config);

// ---- a client's cancel (conductor.cancel, DESIGN.md §10 "Cancel") ----
// The stage a cancelled request was found in, as conductor.cancel's reply names it (protocol.hpp
// ConductorCancelReply::stage).
enum class CancelStage : uint8_t { kUnknown = 0, kDispatching = 1, kPrefilling = 2, kDecoding = 3 };
std::string_view cancel_stage_name(CancelStage s);  // "unknown" | "dispatching" | "prefilling" | "decoding"

// What the Conductor does for the cancel of one request. Whatever the stage, the request's books close at once
// (Scheduler::on_request_done: its prefill queue and decode reservation leave the ledger) and it is never
// dispatched, re-dispatched or failed again; the cancel is its terminal outcome.
struct CancelPlan {
  CancelStage stage = CancelStage::kUnknown;
  bool reject_submit = false;        // its submit is still unanswered: answered as a rejection "cancelled"
  bool release_reservation = false;  // decode_release of its held reservation (no prefill job was sent for it)
  bool cancel_prefill = false;       // prefill_cancel: its job was sent and may still be queued there
  bool cancel_decode = false;        // decode_cancel: decode holds its reservation or streams it
  // Its record stays (marked cancelled) until the outstanding prefill_job or decode_release answer comes, which
  // then only closes it: no fault, no re-dispatch, no request_error from the Conductor.
  bool wait_for_reply = false;
};

// The plan for `r` (null: the Conductor tracks no such request: stage unknown, nothing to do). `prefill_job_sent`:
// its current attempt's prefill_job was sent (phase kDispatching only); `submit_answered`: its submit was answered.
// A kDispatching request whose job was not sent yet is "dispatching"; one whose job was sent, or kReleasing, is
// "prefilling" (the daemon reports "dispatching" instead when the prefill instance says it dropped the job from its
// queue); kDecoding is "decoding".
CancelPlan plan_cancel(const TrackedRequest* r, bool prefill_job_sent, bool submit_answered);

// ---- bounds on what workers and clients report (issue 17 item 5) ----
// A load figure, a token count or a batch above this is absurd (2^40).
inline constexpr int64_t kMaxReportedCount = int64_t{1} << 40;
// A reported duration (decode step, ledger phase) above this is absurd (1 h).
inline constexpr double kMaxReportedMs = 3'600'000;
// A client's SLO above this is refused (24 h): it would keep requests and reservations forever.
inline constexpr double kMaxSloMs = 86'400'000;

// The most tokens one request can have (16 M: beyond every context window), to check that a report's token
// counts agree with its counts of jobs and requests.
inline constexpr int64_t kMaxTokensPerRequest = int64_t{1} << 24;

// kInvalidArgument naming the instance and the field when a figure of `load` is negative or above
// kMaxReportedCount, or when the figures disagree with each other: queued tokens without (or beyond
// kMaxTokensPerRequest per) queued job, context tokens likewise per running request, or running requests,
// context tokens or KV reserved beyond the KV capacity the instance registered (kv_capacity_tokens > 0).
Status validate_load_report(const LoadReport& load, std::string_view instance_id, int64_t kv_capacity_tokens = 0);
// kInvalidArgument when a decode step's batch or context is negative or absurd, or its time is negative,
// not finite or above kMaxReportedMs.
Status validate_decode_step(int64_t batch_requests, int64_t context_tokens, double step_ms,
                            std::string_view instance_id);
// A worker's event time for a request (wall clock, unix ns): kInvalidArgument unless it lies within
// [not_before_unix_ns - skew, now_unix_ns + skew] (not before the submit or the request's previous event,
// not in the future beyond the allowed clock skew).
Status validate_event_time(int64_t event_unix_ns, int64_t not_before_unix_ns, int64_t now_unix_ns,
                           int64_t max_clock_skew_ms, std::string_view what);
// kInvalidArgument for an SLO that is negative, not finite or above kMaxSloMs (0: the default).
Status validate_slo_ms(double slo_ms, std::string_view field, std::string_view what);

}  // namespace mc::sched
