// The modelled resources one by one: NICs with fair sharing, the LRU block cache, the prefill FIFO
// server and the continuous-batching decoder, each against times derived by hand.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "linear_cost_model.hpp"
#include "mc/sim/block_cache.hpp"
#include "mc/sim/instances.hpp"
#include "mc/sim/network.hpp"

namespace mc::sim {
namespace {

constexpr double kGB = 1e9;
constexpr int64_t kMs = 1'000'000;

struct Env {
  ManualClock clock;
  EventQueue q{clock};
};

TEST(Network, OneFlowRunsAtLineRate) {
  Env e;
  Network net(e.q, {10 * kGB, 10 * kGB});
  int64_t done_at = -1;
  net.start_flow(0, 1, 1'000'000'000, [&](int64_t t) { done_at = t; });
  e.q.run();
  EXPECT_EQ(done_at, 100 * kMs);  // 1 GB / 10 GB/s
  EXPECT_EQ(net.stats(0).tx_bytes, 1'000'000'000);
  EXPECT_EQ(net.stats(1).rx_bytes, 1'000'000'000);
  EXPECT_EQ(net.stats(1).busy_ns, 100 * kMs);
  EXPECT_EQ(net.active_flows(0), 0);
}

TEST(Network, TwoFlowsIntoOneNicShareItAndTheSecondSpeedsUpWhenTheFirstEnds) {
  Env e;
  Network net(e.q, {10 * kGB, 10 * kGB, 10 * kGB});
  int64_t a_done = -1, b_done = -1;
  net.start_flow(0, 2, 1'000'000'000, [&](int64_t t) { a_done = t; });
  // B joins at 50 ms: A has 0.5 GB left; both then get 5 GB/s on NIC 2's receive side, A ends at
  // 50 + 100 = 150 ms having let B move 0.5 GB; B's last 0.5 GB runs alone at 10 GB/s: 200 ms.
  e.q.schedule_at(50 * kMs, [&] { net.start_flow(1, 2, 1'000'000'000, [&](int64_t t) { b_done = t; }); });
  e.q.run();
  EXPECT_NEAR(static_cast<double>(a_done), 150.0 * kMs, 2);
  EXPECT_NEAR(static_cast<double>(b_done), 200.0 * kMs, 2);
}

TEST(Network, MaxMinFairnessGivesTheSlowReceiversLeftoverToTheOther) {
  Env e;
  Network net(e.q, {10 * kGB, 10 * kGB, 2 * kGB});
  uint64_t x = net.start_flow(0, 2, 1'000'000'000, [](int64_t) {});
  uint64_t y = net.start_flow(0, 1, 1'000'000'000, [](int64_t) {});
  // NIC 2 caps x at 2 GB/s; y takes the rest of NIC 0's 10 GB/s, not an equal split of 5.
  EXPECT_DOUBLE_EQ(net.flow_rate_bytes_per_s(x), 2 * kGB);
  EXPECT_DOUBLE_EQ(net.flow_rate_bytes_per_s(y), 8 * kGB);
  e.q.run();
}

TEST(Network, EmptyAndLocalFlowsCompleteAtOnceFromTheQueue) {
  Env e;
  Network net(e.q, {10 * kGB, 10 * kGB});
  int calls = 0;
  net.start_flow(0, 1, 0, [&](int64_t t) { calls += (t == 0); });
  net.start_flow(1, 1, 1'000'000, [&](int64_t t) { calls += (t == 0); });
  EXPECT_EQ(calls, 0);  // never from inside start_flow
  e.q.run();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(net.stats(1).busy_ns, 0);
}

TEST(BlockCache, MatchesPrefixesAndEvictsTailsBeforeHeads) {
  BlockCache cache(4);
  std::vector<uint64_t> a = {1, 2, 3};
  std::vector<uint64_t> b = {1, 7};
  std::vector<uint64_t> evicted;
  EXPECT_EQ(cache.insert(a), 3);
  EXPECT_EQ(cache.match_prefix(a), 3);
  EXPECT_EQ(cache.match_prefix(b), 1);  // shares the head only
  EXPECT_EQ(cache.insert(b, {}, [&](uint64_t k) { evicted.push_back(k); }), 1);
  EXPECT_TRUE(evicted.empty());
  std::vector<uint64_t> c = {9, 10};
  cache.insert(c, {}, [&](uint64_t k) { evicted.push_back(k); });
  // LRU order before: 1,7 (b, head most recent), 1... then 2,3 from a (3 least recent).
  EXPECT_EQ(evicted, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(cache.match_prefix(a), 1);
  EXPECT_EQ(cache.size_blocks(), 4);
  EXPECT_EQ(cache.evictions(), 2);
}

TEST(BlockCache, TouchProtectsAChainAndZeroCapacityHoldsNothing) {
  BlockCache cache(3);
  std::vector<uint64_t> a = {1, 2}, b = {5};
  cache.insert(a);
  cache.insert(b);
  cache.touch(a, 2);  // a is now most recent; b the victim
  std::vector<uint64_t> c = {8};
  std::vector<uint64_t> evicted;
  cache.insert(c, {}, [&](uint64_t k) { evicted.push_back(k); });
  EXPECT_EQ(evicted, (std::vector<uint64_t>{5}));
  BlockCache none(0);
  EXPECT_EQ(none.insert(a), 0);
  EXPECT_EQ(none.match_prefix(a), 0);
}

TEST(PrefillInstance, FifoWithFetchThenCompute) {
  Env e;
  testing::LinearCostModel m;  // 1 ms per token
  Network net(e.q, {10 * kGB, 10 * kGB});
  PrefillInstance p(0, e.q, net, m, 0);
  std::vector<PrefillJob> done;
  PrefillJob j1;
  j1.request = 1;
  j1.input_tokens = 1000;  // 1.0 s
  PrefillJob j2;
  j2.request = 2;
  j2.input_tokens = 3000;
  j2.cached_tokens = 2000;                 // 1000 to compute: 1.0 s
  j2.fetches = {Fetch{1, 1'000'000'000}};  // from NIC 1 at 10 GB/s: 0.1 s
  PrefillInstance::Hooks hooks;
  hooks.on_done = [&](const PrefillJob& j) { done.push_back(j); };
  p.submit(j1, hooks);
  p.submit(j2, hooks);
  EXPECT_NEAR(p.predicted_queue_s(), 1.0 + 0.1 + 1.0, 1e-9);
  EXPECT_EQ(p.queued_tokens(), 2000);
  e.q.run();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].request, 1u);
  EXPECT_EQ(done[0].finish_ns, 1000 * kMs);
  EXPECT_EQ(done[1].start_ns, 1000 * kMs);
  EXPECT_EQ(done[1].compute_start_ns, 1100 * kMs);
  EXPECT_EQ(done[1].finish_ns, 2100 * kMs);
  EXPECT_EQ(p.busy_compute_ns(), 2000 * kMs);
  EXPECT_EQ(p.queued_tokens(), 0);
  EXPECT_EQ(p.jobs_done(), 2);
}

TEST(PrefillInstance, StartHookRevisesThePlanAndParallelFetchesEndWithTheSlowest) {
  Env e;
  testing::LinearCostModel m;
  Network net(e.q, {10 * kGB, 10 * kGB, 10 * kGB});
  PrefillInstance p(0, e.q, net, m, 0);
  PrefillJob job;
  job.input_tokens = 2000;
  job.cached_tokens = 1500;  // planned at decision time
  PrefillJob seen;
  PrefillInstance::Hooks hooks;
  hooks.on_start = [](PrefillJob& j) {
    // Part of the prefix was evicted meanwhile: 1000 reused, fetched from two holders at once, and
    // 0.05 s of local load.
    j.cached_tokens = 1000;
    j.fetches = {Fetch{1, 500'000'000}, Fetch{2, 1'000'000'000}};
    j.local_load_s = 0.05;
  };
  hooks.on_done = [&](const PrefillJob& j) { seen = j; };
  p.submit(job, hooks);
  EXPECT_EQ(p.queued_tokens(), 500);
  e.q.run();
  // Fetches share NIC 0's receive side: 5 GB/s each until the 0.5 GB one ends at 0.1 s, then the
  // other's last 0.5 GB at 10 GB/s: 0.15 s. Local load 0.05 s, compute 1000 tokens: 1.0 s.
  EXPECT_NEAR(static_cast<double>(seen.compute_start_ns), 200.0 * kMs, 2);
  EXPECT_NEAR(static_cast<double>(seen.finish_ns), 1200.0 * kMs, 2);
  EXPECT_EQ(p.queued_tokens(), 0);
}

TEST(PrefillInstance, ChunkingAddsTheAttentionOfEarlierChunks) {
  Env e;
  testing::LinearCostModel m;
  m.attention_s = 1e-6;
  Network net(e.q, {10 * kGB});
  PrefillInstance whole(0, e.q, net, m, 0), chunked(0, e.q, net, m, 500);
  // 1000 new after 0 cached: 1.0 + 1000*0*1e-6 = 1.0 s in one pass.
  EXPECT_NEAR(whole.compute_time_s(1000, 0), 1.0, 1e-12);
  // Two chunks: 0.5 + (0.5 + 500*500*1e-6) = 1.25 s.
  EXPECT_NEAR(chunked.compute_time_s(1000, 0), 1.25, 1e-12);
  // With a cached prefix of 1000: 1000 new -> 1.0 + 1000*1000e-6 = 2.0 s.
  EXPECT_NEAR(whole.compute_time_s(2000, 1000), 2.0, 1e-12);
}

// Preemption at chunk boundaries (DESIGN.md §10 "Preemption", mc-sim --preempt-chunk-tokens): a job of a smaller
// queue key that arrives while a long one computes runs after the long job's current chunk, the long job resumes
// where it stopped (its start hooks once), and the time it spent yielded is counted apart from its compute.
TEST(PrefillInstance, AJobOfASmallerKeyRunsAfterTheCurrentChunkAndTheLongJobResumes) {
  for (const int64_t chunk : {int64_t{0}, int64_t{1000}}) {
    SCOPED_TRACE("preempt chunk " + std::to_string(chunk));
    Env e;
    testing::LinearCostModel m;  // 1 ms per token
    Network net(e.q, {10 * kGB});
    PrefillInstance p(0, e.q, net, m, 0);
    p.set_preempt_chunk_tokens(chunk);
    std::map<uint64_t, PrefillJob> done;
    int starts = 0, compute_starts = 0;
    PrefillInstance::Hooks hooks;
    hooks.on_start = [&](PrefillJob&) { ++starts; };
    hooks.on_compute_start = [&](const PrefillJob&) { ++compute_starts; };
    hooks.on_done = [&](const PrefillJob& j) { done[j.request] = j; };
    // (request, tokens at 1 ms each, queue key in s) submitted at `at_ms`.
    auto submit_at = [&](int64_t at_ms, uint64_t request, int64_t tokens, int64_t key_s) {
      e.q.schedule_at(at_ms * kMs, [&p, &hooks, request, tokens, key_s] {
        PrefillJob j;
        j.request = request;
        j.input_tokens = tokens;
        j.queue_key_ns = key_s * 1000 * kMs;
        p.submit(j, hooks);
      });
    };
    submit_at(0, 1, 4000, 100);  // 4 s, four chunks of 1 s
    // At 1.5 s, a 0.5 s job of a smaller key; at 1.6 s one of a larger key (it never preempts).
    submit_at(1500, 2, 500, 50);
    submit_at(1600, 3, 100, 200);
    e.q.run();
    ASSERT_EQ(done.size(), 3u);
    EXPECT_EQ(starts, 3);  // once per job, a resumed job's included
    EXPECT_EQ(compute_starts, 3);
    EXPECT_EQ(p.busy_compute_ns(), 4600 * kMs);  // the same work either way
    EXPECT_EQ(p.queued_tokens(), 0);
    if (chunk == 0) {  // no preemption: FIFO among the waiting by key, the running job to its end
      EXPECT_EQ(done[1].finish_ns, 4000 * kMs);
      EXPECT_EQ(done[2].finish_ns, 4500 * kMs);
      EXPECT_EQ(done[1].preempted_ns, 0);
      EXPECT_EQ(p.preemptions(), 0);
    } else {  // the small job waits for the chunk ending at 2 s, runs 2.0-2.5 s; the big one ends 0.5 s later
      EXPECT_EQ(done[2].start_ns, 2000 * kMs);
      EXPECT_EQ(done[2].finish_ns, 2500 * kMs);
      EXPECT_EQ(done[1].compute_start_ns, 0);
      EXPECT_EQ(done[1].finish_ns, 4500 * kMs);
      EXPECT_EQ(done[1].preempted_ns, 500 * kMs);
      EXPECT_EQ(p.preemptions(), 1);
    }
    EXPECT_EQ(done[3].finish_ns, 4600 * kMs);  // a larger key waits for both, preemption or not
  }
}

TEST(DecodeInstance, ContinuousBatchingJoinsAtStepBoundaries) {
  Env e;
  testing::LinearCostModel m;  // 10 ms per step
  DecodeInstance d(e.q, m, 1'000'000, 0);
  std::vector<DecodeResult> res;
  ASSERT_TRUE(d.try_reserve(110));
  d.join(DecodeJob{1, 100, 3, 0}, [&](const DecodeResult& r) { res.push_back(r); });
  // Joins at 15 ms, mid-step: waits for the step boundary at 20 ms.
  e.q.schedule_at(15 * kMs, [&] {
    ASSERT_TRUE(d.try_reserve(52));
    d.join(DecodeJob{2, 50, 2, 15 * kMs}, [&](const DecodeResult& r) { res.push_back(r); });
  });
  e.q.run();
  ASSERT_EQ(res.size(), 2u);
  // Request 1: steps end at 10, 20, 30 ms; gaps 10, 10, 10.
  EXPECT_EQ(res[0].request, 1u);
  EXPECT_EQ(res[0].tokens, 3);
  EXPECT_EQ(res[0].last_token_ns, 30 * kMs);
  EXPECT_EQ(res[0].gaps_ms, (std::vector<double>{10, 10, 10}));
  // Request 2 joins the step starting at 20 ms: tokens at 30 and 40 ms; gaps 15 and 10 ms.
  EXPECT_EQ(res[1].request, 2u);
  EXPECT_EQ(res[1].join_ns, 20 * kMs);
  EXPECT_EQ(res[1].last_token_ns, 40 * kMs);
  ASSERT_EQ(res[1].gaps_ms.size(), 2u);
  EXPECT_NEAR(res[1].gaps_ms[0], 15, 1e-9);
  EXPECT_NEAR(res[1].gaps_ms[1], 10, 1e-9);
  EXPECT_EQ(d.steps(), 4);
  EXPECT_EQ(d.tokens_produced(), 5);
  EXPECT_EQ(d.context_tokens(), 0);
}

TEST(DecodeInstance, ReservationCountsFutureGrowthAndWaitersRunFifo) {
  Env e;
  testing::LinearCostModel m;
  DecodeInstance d(e.q, m, 1000, 0);
  EXPECT_TRUE(d.try_reserve(600));
  EXPECT_FALSE(d.try_reserve(500));  // fits now at prompt size, not at full length
  std::vector<int> order;
  d.reserve_or_wait(500, [&] { order.push_back(1); });
  d.reserve_or_wait(100, [&] { order.push_back(2); });  // would fit, but must not overtake
  EXPECT_FALSE(d.try_reserve(1));
  e.q.run();
  EXPECT_TRUE(order.empty());
  d.release(600);
  e.q.run();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(d.reserved_tokens(), 600);
  // A request larger than the whole capacity is held once the instance is empty, never starved.
  d.release(600);
  EXPECT_TRUE(d.try_reserve(5000));
}

}  // namespace
}  // namespace mc::sim
