#include "mc/sched/faults.hpp"

#include <cmath>
#include <string>

namespace mc::sched {

namespace {

std::string ms_text(double ms) { return std::to_string(static_cast<int64_t>(std::llround(ms))); }

}  // namespace

std::string_view fault_action_name(FaultAction a) { return a == FaultAction::kRedispatch ? "redispatch" : "fail"; }

std::vector<FaultDecision> decide_instance_death(std::span<const TrackedRequest> requests,
                                                 const std::string& instance_id, const std::string& cause,
                                                 int64_t now_ns, const FaultPolicyConfig& config) {
  std::vector<FaultDecision> out;
  for (const TrackedRequest& r : requests) {
    const bool decode_died = r.decode_id == instance_id;
    const bool prefill_died = r.prefill_id == instance_id && r.phase == RequestPhase::kDispatching;
    if (!decode_died && !prefill_died) continue;
    FaultDecision d;
    d.request_id = r.request_id;
    const std::string& who = d.instance_cause;
    d.instance_cause = std::string(decode_died ? "decode" : "prefill") + " instance '" + instance_id + "' " + cause;
    // A reservation on a decode instance that is still alive is freed now; one on the dead instance went with it.
    d.release_reservation = !decode_died && r.reservation_held;
    if (r.phase != RequestPhase::kDispatching) {
      d.action = FaultAction::kFail;
      d.reason = who + (r.phase == RequestPhase::kDecoding
                            ? " while the request was decoding (the tokens received so far are counted)"
                            : " while its failed prefill was being cleaned up");
      out.push_back(std::move(d));
      continue;
    }
    const double elapsed_ms = static_cast<double>(now_ns - r.submit_ns) * 1e-6;
    d.remaining_ttft_ms = r.slo_ttft_ms - elapsed_ms;
    if (r.attempts >= config.max_attempts) {
      d.action = FaultAction::kFail;
      d.reason = who + " before the first token, not re-dispatched: " + std::to_string(r.attempts) + " of " +
                 std::to_string(config.max_attempts) + " dispatch attempts used";
    } else if (!(d.remaining_ttft_ms > 0)) {
      d.action = FaultAction::kFail;
      d.reason = who + " before the first token, not re-dispatched: " + ms_text(elapsed_ms) +
                 " ms since submit, past the TTFT SLO of " + ms_text(r.slo_ttft_ms) + " ms";
    } else {
      d.action = FaultAction::kRedispatch;
      d.reason = who + " before the first token: re-dispatched (attempt " + std::to_string(r.attempts + 1) + " of " +
                 std::to_string(config.max_attempts) + ", " + ms_text(d.remaining_ttft_ms) +
                 " ms of the TTFT SLO left)";
    }
    if (d.action == FaultAction::kFail) d.remaining_ttft_ms = 0;
    out.push_back(std::move(d));
  }
  return out;
}

std::string_view cancel_stage_name(CancelStage s) {
  switch (s) {
    case CancelStage::kDispatching:
      return "dispatching";
    case CancelStage::kPrefilling:
      return "prefilling";
    case CancelStage::kDecoding:
      return "decoding";
    case CancelStage::kUnknown:
      break;
  }
  return "unknown";
}

CancelPlan plan_cancel(const TrackedRequest* r, bool prefill_job_sent, bool submit_answered) {
  CancelPlan p;
  if (r == nullptr) return p;
  p.reject_submit = !submit_answered;
  switch (r->phase) {
    case RequestPhase::kDispatching:
      if (!prefill_job_sent) {
        // Reserving (a late reservation is released when it comes: the request is gone) or replicating.
        p.stage = CancelStage::kDispatching;
        p.release_reservation = r->reservation_held;
      } else {
        // The decode instance refuses its kv_commit; a queued job is dropped by the prefill instance.
        p.stage = CancelStage::kPrefilling;
        p.cancel_prefill = true;
        p.cancel_decode = true;
        p.wait_for_reply = true;
      }
      break;
    case RequestPhase::kReleasing:
      // Its prefill failed or its instance died; decode_release's answer is outstanding and decode may already
      // stream it (a commit just before): decode_cancel stops that.
      p.stage = CancelStage::kPrefilling;
      p.cancel_decode = true;
      p.wait_for_reply = true;
      break;
    case RequestPhase::kDecoding:
      p.stage = CancelStage::kDecoding;
      p.cancel_decode = true;
      p.reject_submit = false;
      break;
  }
  return p;
}

Status validate_load_report(const LoadReport& load, std::string_view instance_id, int64_t kv_capacity_tokens) {
  const std::pair<const char*, int64_t> fields[] = {{"queued_prefill_tokens", load.queued_prefill_tokens},
                                                    {"queued_prefill_jobs", load.queued_prefill_jobs},
                                                    {"running_requests", load.running_requests},
                                                    {"kv_reserved_tokens", load.kv_reserved_tokens},
                                                    {"context_tokens", load.context_tokens}};
  for (const auto& [name, value] : fields) {
    if (value < 0 || value > kMaxReportedCount) {
      return error(Code::kInvalidArgument, "heartbeat of '" + std::string(instance_id) + "': " + name + " " +
                                               std::to_string(value) +
                                               " is outside [0, 2^40] (refused; fix the "
                                               "worker's load report)");
    }
  }
  const std::string what = "heartbeat of '" + std::string(instance_id) + "': ";
  if (load.queued_prefill_tokens > load.queued_prefill_jobs * kMaxTokensPerRequest) {
    return error(Code::kInvalidArgument, what + std::to_string(load.queued_prefill_tokens) +
                                             " queued prefill tokens in " + std::to_string(load.queued_prefill_jobs) +
                                             " queued jobs (at most 2^24 tokens a job; refused)");
  }
  if (load.context_tokens > load.running_requests * kMaxTokensPerRequest) {
    return error(Code::kInvalidArgument, what + std::to_string(load.context_tokens) + " context tokens in " +
                                             std::to_string(load.running_requests) +
                                             " running requests (at most 2^24 tokens a request; refused)");
  }
  if (kv_capacity_tokens > 0 &&
      (load.running_requests > kv_capacity_tokens || load.context_tokens > kv_capacity_tokens)) {
    return error(Code::kInvalidArgument, what + std::to_string(load.running_requests) + " running requests with " +
                                             std::to_string(load.context_tokens) +
                                             " context tokens: more than the registered KV capacity of " +
                                             std::to_string(kv_capacity_tokens) + " tokens holds (refused)");
  }
  if (kv_capacity_tokens > 0 && load.kv_reserved_tokens > kv_capacity_tokens) {
    return error(Code::kInvalidArgument, what + std::to_string(load.kv_reserved_tokens) +
                                             " KV tokens reserved, above the registered capacity of " +
                                             std::to_string(kv_capacity_tokens) + " (refused)");
  }
  return Status::ok();
}

Status validate_decode_step(int64_t batch_requests, int64_t context_tokens, double step_ms,
                            std::string_view instance_id) {
  const std::string what = "heartbeat of '" + std::string(instance_id) + "': decode step sample ";
  if (batch_requests < 0 || batch_requests > kMaxReportedCount || context_tokens < 0 ||
      context_tokens > kMaxReportedCount) {
    return error(Code::kInvalidArgument, what + "with batch " + std::to_string(batch_requests) + " and context " +
                                             std::to_string(context_tokens) + " tokens (each must be in [0, 2^40])");
  }
  if (!std::isfinite(step_ms) || step_ms < 0 || step_ms > kMaxReportedMs) {
    return error(Code::kInvalidArgument,
                 what + "of " + std::to_string(step_ms) + " ms (must be finite, in [0, 3600000] ms)");
  }
  return Status::ok();
}

Status validate_event_time(int64_t event_unix_ns, int64_t not_before_unix_ns, int64_t now_unix_ns,
                           int64_t max_clock_skew_ms, std::string_view what) {
  // The bounds come from the Conductor's own clock and configuration (near the present, no overflow); the
  // event time may be any int64, so it is only compared, and differences are taken in double.
  const int64_t skew_ns = max_clock_skew_ms * 1'000'000;
  auto ms_apart = [](int64_t a, int64_t b) {
    return std::to_string(static_cast<int64_t>((static_cast<double>(a) - static_cast<double>(b)) * 1e-6));
  };
  if (event_unix_ns < not_before_unix_ns - skew_ns) {
    return error(Code::kInvalidArgument, std::string(what) + ": event_unix_ns " + std::to_string(event_unix_ns) +
                                             " is " + ms_apart(not_before_unix_ns, event_unix_ns) +
                                             " ms before the submit or the request's previous event (at most " +
                                             std::to_string(max_clock_skew_ms) + " ms of clock skew allowed; refused)");
  }
  if (event_unix_ns > now_unix_ns + skew_ns) {
    return error(Code::kInvalidArgument, std::string(what) + ": event_unix_ns " + std::to_string(event_unix_ns) +
                                             " lies " + ms_apart(event_unix_ns, now_unix_ns) +
                                             " ms in the Conductor's future (at most " +
                                             std::to_string(max_clock_skew_ms) +
                                             " ms of clock skew allowed; refused: synchronise the workers' clocks)");
  }
  return Status::ok();
}

Status validate_slo_ms(double slo_ms, std::string_view field, std::string_view what) {
  if (!std::isfinite(slo_ms) || slo_ms < 0 || slo_ms > kMaxSloMs) {
    return error(Code::kInvalidArgument, std::string(what) + ": " + std::string(field) + " " + std::to_string(slo_ms) +
                                             " ms is outside [0, 86400000] ms (0: the "
                                             "Conductor's default)");
  }
  return Status::ok();
}

}  // namespace mc::sched
