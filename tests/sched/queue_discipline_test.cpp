// The prefill queue discipline (issue 24 item 1; DESIGN.md §10 "Queue discipline") as pure functions and through
// the Scheduler on a ManualClock: overtaking, the aging bound, the deadline guard (no admitted request misses its
// SLO because of the order, in a case where FCFS makes one miss), the predicted queue equal to the queue as it then
// runs, and the overtaking estimate against the arrivals that then overtake.
#include "mc/sched/queue_discipline.hpp"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "mc/common/queue_order.hpp"
#include "mc/sched/scheduler.hpp"
#include "mc/testkit/units.hpp"
#include "test_util.hpp"

namespace mc::sched {
namespace {

using testkit::kNsPerMs;

PrefillJob job(const std::string& id, double ms, int64_t key_ns, int64_t deadline_ns = INT64_MAX) {
  return PrefillJob{id, ms, 0, key_ns, deadline_ns};
}

// Runs a ledger queue to its end with no more arrivals: each job's start (ms from now), in the queue's order.
std::map<std::string, double> run_queue(const std::deque<PrefillJob>& q, int64_t head_started_ns, int64_t now_ns) {
  std::map<std::string, double> start;
  double t = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    start[q[i].request_id] = i == 0 ? 0 : t;
    double ms = q[i].predicted_ms;
    if (i == 0) ms -= static_cast<double>(now_ns - head_started_ns) * 1e-6;
    t += std::max(0.0, ms);
  }
  return start;
}

TEST(QueueDiscipline, NamesParseAndPolicyDefaults) {
  EXPECT_EQ(parse_queue_discipline("fcfs").value(), QueueDiscipline::kFcfs);
  EXPECT_EQ(parse_queue_discipline("slo").value(), QueueDiscipline::kSlo);
  EXPECT_FALSE(parse_queue_discipline("sjf").is_ok());
  EXPECT_EQ(queue_discipline_name(QueueDiscipline::kSlo), "slo");
  EXPECT_EQ(default_queue_discipline("kvcache"), QueueDiscipline::kSlo);
  for (const char* p : {"random", "round_robin", "least_loaded", "cache_aware"}) {
    EXPECT_EQ(default_queue_discipline(p), QueueDiscipline::kFcfs) << p;
  }
}

TEST(QueueDiscipline, ShortJobsOvertakeLongOnesButNeverTheRunningHead) {
  QueueConfig cfg;
  cfg.aging_weight = 4;
  const int64_t now = 10'000 * kNsPerMs;
  // Running head (started at 9 s, 2 s of service: 1 s left), then two long jobs queued at 9 s.
  std::deque<PrefillJob> q = {job("head", 2'000, 9'000 * kNsPerMs),
                              job("L1", 3'000, 9'000 * kNsPerMs + 4 * 3'000 * kNsPerMs),
                              job("L2", 3'000, 9'000 * kNsPerMs + 4 * 3'000 * kNsPerMs)};
  // FCFS: every key is a decision time; the new job goes to the back.
  const std::deque<PrefillJob> q_fcfs = {job("head", 2'000, 9'000 * kNsPerMs), job("L1", 3'000, 9'000 * kNsPerMs),
                                         job("L2", 3'000, 9'000 * kNsPerMs)};
  QueuePlacement fcfs = place_job(q_fcfs, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kFcfs, cfg);
  EXPECT_EQ(fcfs.position, 3u);
  EXPECT_EQ(fcfs.key_ns, now);
  EXPECT_DOUBLE_EQ(fcfs.ahead_ms, 1'000 + 3'000 + 3'000);
  QueuePlacement slo = place_job(q, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, cfg);
  EXPECT_EQ(slo.position, 1u);  // behind the running head only
  EXPECT_EQ(slo.key_ns, now + 4 * 500 * kNsPerMs);
  EXPECT_DOUBLE_EQ(slo.ahead_ms, 1'000);
  EXPECT_EQ(slo.kept_behind, 0u);
  // The same position through every queue that keeps the order (the ledger, the simulator, the daemon).
  auto at =
      queue_insert_position(q.begin(), q.end(), slo.key_ns, 1, [](const PrefillJob& j) { return j.queue_key_ns; });
  EXPECT_EQ(at - q.begin(), 1);
  // Reported work beyond the ledger runs first, whatever the order.
  EXPECT_DOUBLE_EQ(place_job(q, 9'000 * kNsPerMs, now, 500, 250, QueueDiscipline::kSlo, cfg).ahead_ms, 1'250);
  // Into an empty queue: runs at once.
  QueuePlacement empty = place_job({}, 0, now, 500, 0, QueueDiscipline::kSlo, cfg);
  EXPECT_EQ(empty.position, 0u);
  EXPECT_DOUBLE_EQ(empty.ahead_ms, 0);
}

// Preemption at chunk boundaries (QueueConfig::preempt_chunk_tokens > 0): a shorter job goes ahead of the running
// head too (the head keeps the rest of its work, booked as it was), and the deadline guard protects the head as it
// does a waiting job. The ledger books it the same way (ClusterState::assign_prefill).
TEST(QueueDiscipline, WithPreemptionAShortJobGoesAheadOfTheRunningHeadUnlessTheHeadWouldBeLate) {
  QueueConfig cfg;
  cfg.aging_weight = 4;
  cfg.preempt_chunk_tokens = 4096;
  const int64_t now = 10'000 * kNsPerMs;
  // A long head decided at 9 s (key 9 s + 4 x 8 s), 8 s of service of which 1 s has run.
  const int64_t head_key = 9'000 * kNsPerMs + 4 * 8'000 * kNsPerMs;
  std::deque<PrefillJob> q = {job("head", 8'000, head_key, 9'000 * kNsPerMs + 30'000 * kNsPerMs)};
  QueuePlacement p = place_job(q, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, cfg);
  EXPECT_EQ(p.position, 0u);
  EXPECT_DOUBLE_EQ(p.ahead_ms, 0);
  // Without preemption the same job waits for the head's 7 s left.
  QueueConfig plain = cfg;
  plain.preempt_chunk_tokens = 0;
  EXPECT_EQ(place_job(q, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, plain).position, 1u);
  // FCFS keys are decision times: never ahead of the head, preemption or not.
  const std::deque<PrefillJob> q_fcfs = {job("head", 8'000, 9'000 * kNsPerMs)};
  EXPECT_EQ(place_job(q_fcfs, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kFcfs, cfg).position, 1u);
  // The head's deadline 10 s away less the 3 s guard: its 7 s left plus 0.5 s would pass it: the job stays behind.
  std::deque<PrefillJob> tight = {job("head", 8'000, head_key, now + 10'000 * kNsPerMs)};
  QueuePlacement kept = place_job(tight, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, cfg);
  EXPECT_EQ(kept.position, 1u);
  EXPECT_EQ(kept.kept_behind, 1u);
  EXPECT_DOUBLE_EQ(kept.ahead_ms, 7'000);

  // The ledger: the new job becomes the head from now; the old head keeps its 7 s left, behind it.
  ClusterState cs;
  cs.set_prefill_preemption(true);
  ASSERT_TRUE(cs.register_instance(InstanceInfo{"p0", Role::kPrefill, "h0", "ep", "", 0}, 0).is_ok());
  cs.assign_prefill("p0", job("head", 8'000, head_key), 9'000 * kNsPerMs);
  cs.assign_prefill("p0", job("short", 500, p.key_ns), now);
  const Instance* inst = cs.find("p0");
  ASSERT_EQ(inst->prefill_queue.size(), 2u);
  EXPECT_EQ(inst->prefill_queue[0].request_id, "short");
  EXPECT_EQ(inst->head_started_ns, now);
  EXPECT_DOUBLE_EQ(inst->prefill_queue[1].predicted_ms, 7'000);
  EXPECT_DOUBLE_EQ(cs.prefill_queue_ms(*inst, now, 0), 7'500);
  // Without preemption the ledger never puts a job before its running head.
  ClusterState plain_cs;
  ASSERT_TRUE(plain_cs.register_instance(InstanceInfo{"p0", Role::kPrefill, "h0", "ep", "", 0}, 0).is_ok());
  plain_cs.assign_prefill("p0", job("head", 8'000, head_key), 9'000 * kNsPerMs);
  plain_cs.assign_prefill("p0", job("short", 500, p.key_ns), now);
  EXPECT_EQ(plain_cs.find("p0")->prefill_queue[0].request_id, "head");
}

// A job reusing a prefix that a queued job computes (a pending prefix) is placed no earlier than that job's key: behind
// L1 here, under both orders, although the SLO order alone would put it right after the head.
TEST(QueueDiscipline, AJobGoesBehindTheJobWhoseKeyItMustFollow) {
  QueueConfig cfg;
  cfg.aging_weight = 4;
  const int64_t now = 10'000 * kNsPerMs;
  const int64_t l1_key = 9'000 * kNsPerMs + 4 * 3'000 * kNsPerMs;
  std::deque<PrefillJob> q = {job("head", 2'000, 9'000 * kNsPerMs), job("L1", 3'000, l1_key),
                              job("L2", 3'000, l1_key + 1)};
  QueuePlacement slo = place_job(q, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, cfg, l1_key);
  EXPECT_EQ(slo.position, 2u);
  EXPECT_EQ(slo.key_ns, l1_key);
  EXPECT_DOUBLE_EQ(slo.ahead_ms, 1'000 + 3'000);
  // A bound below its own key changes nothing; FCFS keys are decision times, already after the earlier job's.
  EXPECT_EQ(place_job(q, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, cfg, 0).position, 1u);
  EXPECT_EQ(place_job(q, 9'000 * kNsPerMs, now, 500, 0, QueueDiscipline::kSlo, cfg, INT64_MAX).key_ns, kMaxQueueKeyNs);
}

// A job of service s queued at t0 is overtaken only by jobs arriving less than w x (s - their service) after t0.
TEST(QueueDiscipline, AgingBoundsOvertaking) {
  QueueConfig cfg;
  cfg.aging_weight = 4;
  const int64_t t0 = 1'000 * kNsPerMs;
  std::deque<PrefillJob> q = {job("head", 60'000, t0), job("L", 1'000, t0 + 4 * 1'000 * kNsPerMs)};
  // Service 100 ms: window 4 x (1000 - 100) = 3600 ms after t0.
  EXPECT_EQ(place_job(q, t0, t0 + 3'500 * kNsPerMs, 100, 0, QueueDiscipline::kSlo, cfg).position, 1u);  // overtakes
  EXPECT_EQ(place_job(q, t0, t0 + 3'700 * kNsPerMs, 100, 0, QueueDiscipline::kSlo, cfg).position, 2u);  // too late
  // Weight 0: FCFS (every key the decision time).
  cfg.aging_weight = 0;
  const std::deque<PrefillJob> q0 = {job("head", 60'000, t0), job("L", 1'000, t0)};
  EXPECT_EQ(place_job(q0, t0, t0 + 1 * kNsPerMs, 100, 0, QueueDiscipline::kSlo, cfg).position, 2u);
}

// A constructed case where FCFS makes an admitted request miss its TTFT SLO and the slo order does not, and the
// deadline guard keeping a short job behind a queued one it would make late.
TEST(QueueDiscipline, NoAdmittedRequestMissesItsSloBecauseOfTheOrder) {
  ManualClock clock{1'000 * kNsPerMs};
  SchedulerConfig cfg;
  cfg.policy = "kvcache";
  cfg.slo.ttft_ms = 30'000;
  cfg.queue.guard_ms = 500;
  cfg.slo_headroom = 0;  // deadlines at the SLO itself (with headroom they are at the target: DESIGN.md §10)
  for (const char* discipline : {"fcfs", "slo"}) {
    SCOPED_TRACE(discipline);
    cfg.queue.discipline = discipline;
    // Prefill 1 ms per token, nothing else.
    auto s = testing::make_scheduler(&clock, cfg, PrefillCostPrior{0, 1.0, 0}, DecodeCostPrior{1, 0, 0});
    ASSERT_TRUE(s->register_instance(testing::prefill_info("P0", "h0")).is_ok());
    ASSERT_TRUE(s->register_instance(testing::decode_info("D0", "h1", 10'000'000)).is_ok());
    // A running 5 s job, a queued 20 s job, then a 1 s request with a 9 s TTFT SLO.
    Request head = testing::request("head", 5'000, 1, 0);
    Request big = testing::request("big", 20'000, 1, 0);
    Request small = testing::request("small", 1'000, 1, 0);
    small.slo_ttft_ms = 9'000;
    ASSERT_TRUE(s->schedule(head).accepted);
    ASSERT_TRUE(s->schedule(big).accepted);
    Decision d = s->schedule(small);
    if (std::string(discipline) == "fcfs") {
      // Behind both: 5 + 20 + 1 = 26 s > 9 s: rejected early (admitted without early rejection, it misses).
      EXPECT_FALSE(d.accepted);
      EXPECT_EQ(d.reject_reason, RejectReason::kTtftSlo);
      EXPECT_NEAR(d.predicted_ttft_ms, 26'000, 1);
      continue;
    }
    ASSERT_TRUE(d.accepted) << d.reason;
    EXPECT_EQ(d.queue, "slo");
    EXPECT_NEAR(d.prefill.queue_ms, 5'000, 1);  // behind the running head only
    EXPECT_NEAR(d.predicted_ttft_ms, 6'000, 1);
    // The order as it then runs: small at 5 s (done at 6 s, within its 9 s), big at 6 s (done 26 s, within 30 s).
    const Instance* p0 = s->cluster().find("P0");
    auto start = run_queue(p0->prefill_queue, p0->head_started_ns, clock.now_ns());
    EXPECT_DOUBLE_EQ(start["small"], 5'000);
    EXPECT_DOUBLE_EQ(start["big"], 6'000);
  }
  // The guard: big's deadline leaves no room for 1 s more (SLO 25.6 s, guard 0.5 s: 25 s + 1 s > 25.1 s), so the
  // short job stays behind it.
  cfg.queue.discipline = "slo";
  auto s = testing::make_scheduler(&clock, cfg, PrefillCostPrior{0, 1.0, 0}, DecodeCostPrior{1, 0, 0});
  ASSERT_TRUE(s->register_instance(testing::prefill_info("P0", "h0")).is_ok());
  ASSERT_TRUE(s->register_instance(testing::decode_info("D0", "h1", 10'000'000)).is_ok());
  Request head = testing::request("head", 5'000, 1, 0);
  Request big = testing::request("big", 20'000, 1, 0);
  big.slo_ttft_ms = 25'600;  // predicted 25 s: admitted; 26 s (with the small job ahead) would pass 25.1 s
  Request small = testing::request("small", 1'000, 1, 0);
  ASSERT_TRUE(s->schedule(head).accepted);
  ASSERT_TRUE(s->schedule(big).accepted);
  Decision d = s->schedule(small);
  ASSERT_TRUE(d.accepted) << d.reason;
  EXPECT_EQ(d.prefill.kept_behind, 1);
  EXPECT_NEAR(d.prefill.queue_ms, 25'000, 1);
  const Instance* p0 = s->cluster().find("P0");
  auto start = run_queue(p0->prefill_queue, p0->head_started_ns, clock.now_ns());
  EXPECT_DOUBLE_EQ(start["big"], 5'000);  // done at 25 s: within its SLO
  EXPECT_DOUBLE_EQ(start["small"], 25'000);
}

// The Scheduler's predicted queue (the work ahead in the order) is the start the job gets when the ledger's queue
// runs in its order with no later arrivals, for every job of a mixed batch, with and without the guard acting.
TEST(QueueDiscipline, PredictedQueueEqualsTheQueueAsItRuns) {
  for (double guard : {0.0, 500.0}) {
    ManualClock clock{1'000 * kNsPerMs};
    SchedulerConfig cfg;
    cfg.policy = "kvcache";
    cfg.queue.discipline = "slo";
    cfg.queue.guard_ms = guard;
    cfg.slo.ttft_ms = 12'000;
    auto s = testing::make_scheduler(&clock, cfg, PrefillCostPrior{0, 1.0, 0}, DecodeCostPrior{1, 0, 0});
    ASSERT_TRUE(s->register_instance(testing::prefill_info("P0", "h0")).is_ok());
    ASSERT_TRUE(s->register_instance(testing::decode_info("D0", "h1", 100'000'000)).is_ok());
    const std::vector<int64_t> sizes = {3'000, 2'500, 400, 1'800, 100, 2'200, 700, 50, 1'200, 300};
    std::map<std::string, double> ahead;
    for (size_t i = 0; i < sizes.size(); ++i) {
      clock.advance_ns(10 * kNsPerMs);
      Request r = testing::request("r" + std::to_string(i), sizes[i], 1, 0);
      Decision d = s->schedule(r);
      if (!d.accepted) continue;
      ahead[r.request_id] = d.prefill.queue_ms - d.prefill.overtake_ms;
      // Each job's predicted start, once all are queued, is checked below against the later order; right now
      // (nothing after it yet) it is exact.
      const Instance* p0 = s->cluster().find("P0");
      auto start = run_queue(p0->prefill_queue, p0->head_started_ns, clock.now_ns());
      EXPECT_NEAR(start[r.request_id], ahead[r.request_id], 1e-6) << r.request_id;
    }
    EXPECT_GE(ahead.size(), 6u);
    // Every admitted job still finishes within its deadline in the final order (one admitted within the guard of
    // its deadline is overtaken by nothing).
    const Instance* p0 = s->cluster().find("P0");
    auto start = run_queue(p0->prefill_queue, p0->head_started_ns, clock.now_ns());
    for (const PrefillJob& j : p0->prefill_queue) {
      const double finish_ns = static_cast<double>(clock.now_ns()) + (start[j.request_id] + j.predicted_ms) * 1e6;
      EXPECT_LE(finish_ns, static_cast<double>(j.deadline_ns) + 1) << j.request_id;
    }
  }
}

// The overtaking estimate: the recent arrivals shorter than the job, recurring at their rate, each inside its aging
// window; checked against the arrivals that then come at that rate and overtake; bounded by the slack in decide().
TEST(QueueDiscipline, OvertakeEstimateMatchesTheArrivalsThatOvertake) {
  QueueConfig cfg;
  cfg.aging_weight = 4;
  // 100 ms jobs every 900 ms for 10 arrivals: span 8.1 s.
  std::vector<QueueArrival> recent;
  for (int i = 0; i < 10; ++i) recent.push_back({int64_t{i} * 900 * kNsPerMs, 100});
  const int64_t now = 9 * 900 * kNsPerMs;
  const double est = expected_overtake_ms(recent, now, 1'000, QueueDiscipline::kSlo, cfg);
  // The same stream continued (half a gap on: the job comes between two arrivals): arrivals at now + 450 + 900k ms
  // overtake while within 4 x 900 = 3600 ms: 4 of them.
  double actual = 0;
  for (int k = 0; k < 100; ++k) {
    if (450.0 + k * 900.0 < 4 * (1'000 - 100)) actual += 100;
  }
  EXPECT_DOUBLE_EQ(actual, 400);
  EXPECT_NEAR(est, actual, 0.05 * actual);
  EXPECT_DOUBLE_EQ(expected_overtake_ms(recent, now, 1'000, QueueDiscipline::kFcfs, cfg), 0);
  EXPECT_DOUBLE_EQ(expected_overtake_ms(recent, now, 50, QueueDiscipline::kSlo, cfg), 0);  // nothing shorter
}

// The overtaking a job is priced for is bounded by its slack to the target, the SLO less the SLO headroom
// (DESIGN.md §10 "SLO headroom"): T - guard - ahead - service, not SLO - guard - ahead - service.
TEST(QueueDiscipline, OvertakingIsBoundedByTheSlackToTheTarget) {
  double overtake_at[2] = {0, 0};  // with headroom 0.2, then 0 (the same SLO)
  double slo_ms = 0, bound_ms = 0;
  for (int run = 0; run < 2; ++run) {
    ManualClock clock{1'000 * kNsPerMs};
    SchedulerConfig cfg;
    cfg.policy = "kvcache";
    cfg.queue.discipline = "slo";
    cfg.queue.guard_ms = 0;
    cfg.slo_headroom = run == 0 ? 0.2 : 0.0;
    cfg.heartbeat_timeout_ms = 3'600'000;  // the instances never report: the clock moves 9 s
    auto s = testing::make_scheduler(&clock, cfg, PrefillCostPrior{0, 1.0, 0}, DecodeCostPrior{1, 0, 0});
    ASSERT_TRUE(s->register_instance(testing::prefill_info("P0", "h0")).is_ok());
    ASSERT_TRUE(s->register_instance(testing::decode_info("D0", "h1", 10'000'000)).is_ok());
    // 100 ms jobs every 900 ms: shorter ones that will overtake a 1 s job under the SLO order.
    for (int i = 0; i < 10; ++i) {
      Request r = testing::request("short" + std::to_string(i), 100, 1, 0);
      r.slo_ttft_ms = 600'000;
      Decision d = s->schedule(r);
      ASSERT_TRUE(d.accepted) << d.reason;
      clock.advance_ns(900 * kNsPerMs);
    }
    Request big = testing::request("big", 1'000, 1, 0);
    if (run == 0) {
      // Unbounded (a long SLO): its expected overtaking and the work ahead of it.
      big.slo_ttft_ms = 600'000;
      Decision free = s->decide(big);
      ASSERT_TRUE(free.accepted) << free.reason;
      const PrefillEstimate& e = s->last_estimates()[0];
      ASSERT_GT(e.overtake_ms, 100) << "no overtaking expected: the test shows nothing";
      // An SLO whose target leaves a quarter of that overtaking as slack.
      bound_ms = e.overtake_ms / 4;
      slo_ms = (e.queue_ms + 1'000 + bound_ms) / 0.8;
    }
    big.slo_ttft_ms = slo_ms;
    Decision d = s->decide(big);
    overtake_at[run] = s->last_estimates()[0].overtake_ms;
    EXPECT_NEAR(d.ttft_target_ms, slo_ms * (run == 0 ? 0.8 : 1.0), 1e-6);
  }
  EXPECT_NEAR(overtake_at[0], bound_ms, 1e-6);  // headroom 0.2: bounded by the slack to the target
  EXPECT_GT(overtake_at[1], overtake_at[0]);    // headroom 0: by the slack to the SLO, which is larger
}

TEST(QueueDiscipline, SchedulerRefusesBadQueueConfig) {
  ManualClock clock{0};
  SchedulerConfig cfg;
  cfg.queue.discipline = "lifo";
  EXPECT_FALSE(Scheduler::create(cfg, &clock).is_ok());
  cfg.queue.discipline = "slo";
  cfg.queue.aging_weight = -1;
  EXPECT_FALSE(Scheduler::create(cfg, &clock).is_ok());
  cfg.queue.aging_weight = 4;
  EXPECT_TRUE(Scheduler::create(cfg, &clock).is_ok());
  cfg.queue.discipline = "";
  cfg.policy = "least_loaded";
  EXPECT_EQ(Scheduler::create(cfg, &clock).value()->queue_discipline(), QueueDiscipline::kFcfs);
  cfg.policy = "kvcache";
  EXPECT_EQ(Scheduler::create(cfg, &clock).value()->queue_discipline(), QueueDiscipline::kSlo);
  // Preemption: off unless asked (the paper's and mc-prefill's way); a chunk in [0, 2^24] tokens.
  EXPECT_FALSE(Scheduler::create(cfg, &clock).value()->cluster().prefill_preemption());
  cfg.queue.preempt_chunk_tokens = 4096;
  EXPECT_TRUE(Scheduler::create(cfg, &clock).value()->cluster().prefill_preemption());
  cfg.pipeline.group_size = 2;  // a held stage never yields: not modelled together
  auto both = Scheduler::create(cfg, &clock);
  ASSERT_FALSE(both.is_ok());
  EXPECT_NE(both.status().message().find("a held stage never yields"), std::string::npos) << both.status().message();
  cfg.pipeline.group_size = 1;
  for (const int64_t bad : {int64_t{-1}, (int64_t{1} << 24) + 1}) {
    cfg.queue.preempt_chunk_tokens = bad;
    auto s = Scheduler::create(cfg, &clock);
    ASSERT_FALSE(s.is_ok()) << bad;
    EXPECT_NE(s.status().message().find("preemption chunk"), std::string::npos) << s.status().message();
  }
}

}  // namespace
}  // namespace mc::sched
