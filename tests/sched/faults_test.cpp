// The pure fault decisions of the Conductor (sched/policy faults.hpp): which requests a worker's death touches,
// re-dispatch or fail, which reservations are released, and the bounds on reported values.
#include "mc/sched/faults.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "mc/testkit/units.hpp"

namespace mc::sched {
namespace {

using testkit::kNsPerMs;

TrackedRequest req(const std::string& id, const std::string& prefill, const std::string& decode, RequestPhase phase,
                   bool held = true) {
  TrackedRequest r;
  r.request_id = id;
  r.prefill_id = prefill;
  r.decode_id = decode;
  r.phase = phase;
  r.submit_ns = 1'000 * kNsPerMs;
  r.slo_ttft_ms = 10'000;
  r.reservation_held = held;
  return r;
}

TEST(Faults, PrefillDeathRedispatchesItsDispatchingRequestsAndReleasesTheirReservations) {
  const std::vector<TrackedRequest> rs = {
      req("a", "p0", "d0", RequestPhase::kDispatching),
      req("b", "p1", "d0", RequestPhase::kDispatching),  // another prefill: untouched
      req("c", "p0", "d1", RequestPhase::kDecoding),     // its prefill is over: untouched
      req("d", "p0", "d1", RequestPhase::kDispatching, /*held=*/false),
  };
  auto ds = decide_instance_death(rs, "p0", "missed its heartbeats for 3000 ms", 3'000 * kNsPerMs, {});
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].request_id, "a");
  EXPECT_EQ(ds[0].action, FaultAction::kRedispatch);
  EXPECT_TRUE(ds[0].release_reservation);
  EXPECT_DOUBLE_EQ(ds[0].remaining_ttft_ms, 8'000);  // 2 s of the 10 s SLO are gone
  EXPECT_NE(ds[0].reason.find("prefill instance 'p0' missed its heartbeats"), std::string::npos) << ds[0].reason;
  EXPECT_NE(ds[0].reason.find("attempt 2 of 3"), std::string::npos) << ds[0].reason;
  EXPECT_EQ(ds[0].instance_cause, "prefill instance 'p0' missed its heartbeats for 3000 ms");
  EXPECT_EQ(ds[1].request_id, "d");
  EXPECT_FALSE(ds[1].release_reservation);  // no reservation held yet
}

TEST(Faults, DecodeDeathFailsStreamingRequestsAndRedispatchesTheRest) {
  const std::vector<TrackedRequest> rs = {
      req("a", "p0", "d0", RequestPhase::kDecoding),
      req("b", "p1", "d0", RequestPhase::kDispatching),
      req("c", "p1", "d0", RequestPhase::kReleasing),
      req("e", "p1", "d1", RequestPhase::kDecoding),
  };
  auto ds = decide_instance_death(rs, "d0", "did not answer decode_release", 2'000 * kNsPerMs, {});
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds[0].action, FaultAction::kFail);
  EXPECT_NE(ds[0].reason.find("decode instance 'd0'"), std::string::npos);
  EXPECT_NE(ds[0].reason.find("tokens received so far are counted"), std::string::npos) << ds[0].reason;
  EXPECT_EQ(ds[1].action, FaultAction::kRedispatch);
  EXPECT_FALSE(ds[1].release_reservation);      // the reservation died with d0
  EXPECT_EQ(ds[2].action, FaultAction::kFail);  // the client may already have heard
  for (const auto& d : ds) EXPECT_FALSE(d.release_reservation);
}

TEST(Faults, NoRedispatchPastTheSloOrTheAttempts) {
  TrackedRequest late = req("late", "p0", "d0", RequestPhase::kDispatching);
  TrackedRequest tired = req("tired", "p0", "d0", RequestPhase::kDispatching);
  tired.attempts = 3;
  const std::vector<TrackedRequest> rs = {late, tired};
  // 10.5 s after the submit of a 10 s SLO.
  auto ds = decide_instance_death(rs, "p0", "died", 11'500 * kNsPerMs, FaultPolicyConfig{.max_attempts = 3});
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].action, FaultAction::kFail);
  EXPECT_NE(ds[0].reason.find("past the TTFT SLO of 10000 ms"), std::string::npos) << ds[0].reason;
  EXPECT_TRUE(ds[0].release_reservation);  // failed or not, its reservation goes
  EXPECT_EQ(ds[1].action, FaultAction::kFail);
  EXPECT_NE(ds[1].reason.find("3 of 3 dispatch attempts used"), std::string::npos) << ds[1].reason;
  // One attempt allowed: never re-dispatched.
  auto once = decide_instance_death(std::vector<TrackedRequest>{req("x", "p0", "d0", RequestPhase::kDispatching)}, "p0",
                                    "died", 1'001 * kNsPerMs, FaultPolicyConfig{.max_attempts = 1});
  ASSERT_EQ(once.size(), 1u);
  EXPECT_EQ(once[0].action, FaultAction::kFail);
  EXPECT_EQ(fault_action_name(FaultAction::kRedispatch), "redispatch");
}

TEST(Faults, UntouchedInstanceChangesNothing) {
  const std::vector<TrackedRequest> rs = {req("a", "p0", "d0", RequestPhase::kDecoding)};
  EXPECT_TRUE(decide_instance_death(rs, "p9", "died", 0, {}).empty());
  EXPECT_TRUE(decide_instance_death(rs, "p0", "died", 0, {}).empty());  // its prefill is done
}

TEST(Faults, LoadReportsOutsideTheirRangeAreRefused) {
  LoadReport ok;
  ok.queued_prefill_tokens = 5'000;
  ok.queued_prefill_jobs = 1;
  EXPECT_TRUE(validate_load_report(ok, "p0").is_ok());
  LoadReport negative = ok;
  negative.queued_prefill_tokens = -1;
  Status st = validate_load_report(negative, "p0");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("queued_prefill_tokens -1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'p0'"), std::string::npos);
  LoadReport huge = ok;
  huge.kv_reserved_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(validate_load_report(huge, "d0").is_ok());

  EXPECT_TRUE(validate_decode_step(8, 4'000, 30.5, "d0").is_ok());
  EXPECT_FALSE(validate_decode_step(-1, 4'000, 30.5, "d0").is_ok());
  EXPECT_FALSE(validate_decode_step(8, -4, 30.5, "d0").is_ok());
  EXPECT_FALSE(validate_decode_step(8, 4'000, std::numeric_limits<double>::quiet_NaN(), "d0").is_ok());
  EXPECT_FALSE(validate_decode_step(8, 4'000, 1e12, "d0").is_ok());
  EXPECT_FALSE(validate_decode_step(8, 4'000, -0.5, "d0").is_ok());
}

TEST(Faults, EventTimesMustLieBetweenTheSubmitAndNow) {
  const int64_t submit = 1'700'000'000'000 * kNsPerMs, now = submit + 5'000 * kNsPerMs;
  EXPECT_TRUE(validate_event_time(submit + 1'000 * kNsPerMs, submit, now, 60'000, "r").is_ok());
  EXPECT_TRUE(validate_event_time(submit - 10'000 * kNsPerMs, submit, now, 60'000, "r").is_ok());  // skew allowed
  Status future = validate_event_time(std::numeric_limits<int64_t>::max(), submit, now, 60'000, "job_report 'r'");
  EXPECT_EQ(future.code(), Code::kInvalidArgument);
  EXPECT_NE(future.message().find("future"), std::string::npos) << future.message();
  EXPECT_NE(future.message().find("job_report 'r'"), std::string::npos);
  EXPECT_FALSE(validate_event_time(std::numeric_limits<int64_t>::min(), submit, now, 60'000, "r").is_ok());
  EXPECT_FALSE(validate_event_time(submit - 61'000 * kNsPerMs, submit, now, 60'000, "r").is_ok());
  EXPECT_FALSE(validate_event_time(now + 61'000 * kNsPerMs, submit, now, 60'000, "r").is_ok());
  // Non-monotone: before the request's previous event (passed as the lower bound), beyond the skew.
  EXPECT_FALSE(validate_event_time(submit, submit + 2'000 * kNsPerMs, now, 1'000, "r").is_ok());
}

TEST(Faults, SlosAreBounded) {
  EXPECT_TRUE(validate_slo_ms(0, "slo_ttft_ms", "submit 'r'").is_ok());
  EXPECT_TRUE(validate_slo_ms(30'000, "slo_ttft_ms", "submit 'r'").is_ok());
  EXPECT_FALSE(validate_slo_ms(-1, "slo_ttft_ms", "submit 'r'").is_ok());
  EXPECT_FALSE(validate_slo_ms(std::numeric_limits<double>::infinity(), "slo_tbt_ms", "submit 'r'").is_ok());
  Status st = validate_slo_ms(1e18, "slo_ttft_ms", "submit 'r'");
  EXPECT_NE(st.message().find("slo_ttft_ms"), std::string::npos);
}

// conductor.cancel (DESIGN.md §10 "Cancel"): the stage named and the messages sent, by where the request is.
TEST(Cancel, PlanByStage) {
  EXPECT_EQ(cancel_stage_name(plan_cancel(nullptr, false, false).stage), "unknown");
  const CancelPlan none = plan_cancel(nullptr, true, true);
  EXPECT_FALSE(none.reject_submit || none.release_reservation || none.cancel_prefill || none.cancel_decode ||
               none.wait_for_reply);

  // Reserving: no reservation yet (a late one is released when it comes), the submit is answered "cancelled".
  const TrackedRequest reserving = req("a", "p0", "d0", RequestPhase::kDispatching, /*held=*/false);
  CancelPlan p = plan_cancel(&reserving, /*prefill_job_sent=*/false, /*submit_answered=*/false);
  EXPECT_EQ(cancel_stage_name(p.stage), "dispatching");
  EXPECT_TRUE(p.reject_submit);
  EXPECT_FALSE(p.release_reservation);
  EXPECT_FALSE(p.cancel_prefill || p.cancel_decode || p.wait_for_reply);

  // Replicating: the reservation is held and released.
  const TrackedRequest held = req("a", "p0", "d0", RequestPhase::kDispatching, /*held=*/true);
  p = plan_cancel(&held, false, false);
  EXPECT_EQ(p.stage, CancelStage::kDispatching);
  EXPECT_TRUE(p.release_reservation);
  EXPECT_TRUE(p.reject_submit);

  // Prefilling: both instances are told and the prefill's answer closes the record; the submit was answered.
  p = plan_cancel(&held, /*prefill_job_sent=*/true, /*submit_answered=*/true);
  EXPECT_EQ(cancel_stage_name(p.stage), "prefilling");
  EXPECT_TRUE(p.cancel_prefill && p.cancel_decode && p.wait_for_reply);
  EXPECT_FALSE(p.release_reservation || p.reject_submit);

  // Releasing after a failed prefill: decode may already stream it.
  const TrackedRequest releasing = req("a", "p0", "d0", RequestPhase::kReleasing);
  p = plan_cancel(&releasing, true, true);
  EXPECT_EQ(p.stage, CancelStage::kPrefilling);
  EXPECT_TRUE(p.cancel_decode && p.wait_for_reply);
  EXPECT_FALSE(p.cancel_prefill || p.release_reservation);

  // Decoding: decode stops it and frees its KV; nothing to wait for.
  const TrackedRequest decoding = req("a", "p0", "d0", RequestPhase::kDecoding, /*held=*/false);
  p = plan_cancel(&decoding, false, true);
  EXPECT_EQ(cancel_stage_name(p.stage), "decoding");
  EXPECT_TRUE(p.cancel_decode);
  EXPECT_FALSE(p.cancel_prefill || p.release_reservation || p.reject_submit || p.wait_for_reply);
}

}  // namespace
}  // namespace mc::sched
