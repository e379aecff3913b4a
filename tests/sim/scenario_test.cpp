// Whole simulations small enough to derive by hand, determinism, and bad input.
#include <gtest/gtest.h>

#include <sstream>

#include "linear_cost_model.hpp"
#include "mc/sim/simulator.hpp"
#include "mc/testkit/trace_rows.hpp"

namespace mc::sim {
namespace {

using testkit::trace_row;

// One prefill and one decode instance; prefill 1 ms per token, decode 10 ms per step, 1,000 B of KV
// per token, 1 GB/s NICs, local cache loads at 1.024 GB/s.
SimOptions one_instance() {
  SimOptions o;
  o.cluster.prefill_instances = 1;
  o.cluster.decode_instances = 1;
  o.cluster.decode_kv_capacity_tokens = 100'000;
  o.cluster.nic_bandwidth_bytes_per_s = 1e9;
  o.cluster.cache_capacity_tokens = 100'000;
  o.local_load_bytes_per_s = 1.024e9;
  return o;
}

Result<SimResult> run(const SimOptions& o, const std::vector<trace::Request>& rows) {
  testing::LinearCostModel m;
  auto src = vector_source(rows);
  return simulate_with(o, *src, m, 8);
}

TEST(Scenario, TwoRequestsQueueOnOneInstance) {
  // r1 arrives at 0 (1,024 tokens, 3 output); r2 at 0.5 s (1,536 tokens sharing r1's two blocks, 2
  // output). When r2 is placed (0.5 s) r1 has not finished, so nothing is cached yet: with the paper's rule (no
  // pending prefixes; the next test has them) r2 recomputes.
  //   r1: prefill 0 -> 1.024 s (TTFT 1.024 s); its KV (1.024 MB at 1 GB/s) is at decode by 1.025 ms
  //       after the compute starts; decode steps end at 1.034 and 1.044 s (E2E 1.044 s, gaps 10 ms).
  //   r2: waits for r1 (queue 0.524 s), prefill 1.024 -> 2.560 s: TTFT = 2.560 - 0.5 = 2.060 s;
  //       one decode step: last token at 2.570 s, E2E 2.070 s.
  SimOptions paper = one_instance();
  paper.cluster.pending_prefix = "off";
  auto r = run(paper, {trace_row(1, 0, 1024, 3, {1, 2}), trace_row(2, 500, 1536, 2, {1, 2, 3})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->records.size(), 2u);
  const auto& a = r->records[0];
  const auto& b = r->records[1];
  EXPECT_EQ(a.outcome, replay::Outcome::kCompleted);
  EXPECT_NEAR(*a.ttft_ms, 1024.0, 1e-6);
  EXPECT_NEAR(*a.e2e_ms, 1044.0, 1e-6);
  EXPECT_EQ(*a.output_tokens, 3);
  EXPECT_NEAR(a.tbt->max_ms, 10.0, 1e-6);
  EXPECT_NEAR(*a.tpot_ms, 10.0, 1e-6);
  EXPECT_NEAR(*b.ttft_ms, 2060.0, 1e-6);
  EXPECT_NEAR(*b.ledger.queue_ms, 524.0, 1e-6);
  EXPECT_EQ(*b.ledger.hit_tokens_local, 0);
  EXPECT_EQ(*b.ledger.decision, "recompute");
  EXPECT_NEAR(*b.e2e_ms, 2070.0, 1e-6);
  EXPECT_EQ(r->summary.completed, 2);
  // The conductor's prediction for r2: queue 0.524 s + prefill 1.536 s.
  EXPECT_NEAR(*b.ledger.predicted_ttft_ms, 2060.0, 1.0);
  // Prefill busy 2.56 s of a 2.57 s run; GPU-seconds = 8 GPUs x 2.56 s.
  EXPECT_NEAR(r->totals.prefill_gpu_s, 8 * 2.560, 1e-6);
  EXPECT_NEAR(r->totals.prefill_gpu_s_saved, 0.0, 1e-9);
}

// The same two requests with pending prefixes (kvcache's default; DESIGN.md §10): r2 is placed behind r1, which
// computes its two blocks, and reads them when r1 is done: it waits 0.524 s, loads 1.024 MB from local DRAM at
// 1.024 GB/s (1 ms) and prefills 512 tokens (0.512 s): TTFT = 1.537 - 0.5 = 1.037 s, as predicted; E2E 1.047 s;
// prefill GPU-seconds 8 x (1.024 + 0.512).
TEST(Scenario, ASecondRequestReusesThePrefixTheFirstIsComputing) {
  auto r = run(one_instance(), {trace_row(1, 0, 1024, 3, {1, 2}), trace_row(2, 500, 1536, 2, {1, 2, 3})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->records.size(), 2u);
  const auto& b = r->records[1];
  EXPECT_NEAR(*b.ttft_ms, 1037.0, 1e-6);
  EXPECT_NEAR(*b.ledger.queue_ms, 524.0, 1e-6);
  EXPECT_EQ(*b.ledger.hit_tokens_local, 1024);
  EXPECT_EQ(*b.ledger.planned_hit_tokens, 1024);
  EXPECT_EQ(*b.ledger.pool_prefix_tokens, 0);  // nothing was in the pool when it was placed
  EXPECT_EQ(*b.ledger.decision, "fetch");
  EXPECT_NEAR(*b.e2e_ms, 1047.0, 1e-6);
  EXPECT_NEAR(*b.ledger.predicted_ttft_ms, 1037.0, 1.0);
  EXPECT_NEAR(r->totals.prefill_gpu_s, 8 * (1.024 + 0.512), 1e-6);
  EXPECT_EQ(r->totals.hit_tokens_lost, 0);
}

TEST(Scenario, ALaterRequestReusesTheCachedPrefix) {
  // r2 arrives at 2 s, after r1's blocks were cached: it reuses 1,024 tokens (2 blocks), loads
  // 1.024 MB from local DRAM at 1.024 GB/s (1 ms) and prefills 512 tokens (0.512 s): TTFT 0.513 s.
  auto r = run(one_instance(), {trace_row(1, 0, 1024, 3, {1, 2}), trace_row(2, 2000, 1536, 2, {1, 2, 3})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& b = r->records[1];
  EXPECT_NEAR(*b.ttft_ms, 513.0, 1e-6);
  EXPECT_EQ(*b.ledger.hit_tokens_local, 1024);
  EXPECT_EQ(*b.ledger.hit_tokens_remote, 0);
  EXPECT_EQ(*b.ledger.decision, "fetch");
  EXPECT_EQ(r->totals.hit_tokens_local, 1024);
  EXPECT_NEAR(r->totals.prefill_gpu_s_saved, 8 * 1.024, 1e-6);
  // The last, partial block of a prompt is never cached: a 1,100-token prompt keys 2 blocks, and
  // the next request with the same 3 ids can reuse only those 2.
  auto p = run(one_instance(), {trace_row(1, 0, 1100, 1, {7, 8, 9}), trace_row(2, 5000, 1100, 1, {7, 8, 9})});
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(*p->records[1].ledger.hit_tokens_local, 1024);
}

TEST(Scenario, TheGlobalPoolFetchesFromAnotherInstanceOverTheNic) {
  SimOptions o = one_instance();
  o.cluster.prefill_instances = 2;
  o.cluster.policy = "round_robin";  // r2 lands on the instance that does not hold the prefix
  auto r = run(o, {trace_row(1, 0, 1024, 1, {1, 2}), trace_row(2, 2000, 1536, 1, {1, 2, 3})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& b = r->records[1];
  EXPECT_EQ(b.prefill_instance, "prefill-1");
  EXPECT_EQ(*b.ledger.hit_tokens_remote, 1024);
  // 1.024 MB over 1 GB/s NICs (1.024 ms) then 512 tokens (512 ms).
  EXPECT_NEAR(*b.ttft_ms, 513.024, 1e-3);
  o.cluster.cache_mode = CacheMode::kLocal;
  auto l = run(o, {trace_row(1, 0, 1024, 1, {1, 2}), trace_row(2, 2000, 1536, 1, {1, 2, 3})});
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l->records[1].ledger.hit_tokens(), 0);
  EXPECT_NEAR(*l->records[1].ttft_ms, 1536.0, 1e-6);
}

TEST(Scenario, OversizedPromptsAreRejectedBeforeAnyWork) {
  SimOptions o = one_instance();
  o.cluster.max_context_tokens = 32'768;
  auto r = run(o, {trace_row(1, 0, 32'777, 100, std::vector<uint64_t>(65, 0)), trace_row(2, 0, 512, 1, {5})});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->records[0].outcome, replay::Outcome::kRejected);
  EXPECT_EQ(r->records[0].reason, "input_too_long");
  EXPECT_FALSE(r->records[0].ttft_ms.has_value());
  EXPECT_EQ(r->records[1].outcome, replay::Outcome::kCompleted);
  EXPECT_EQ(r->instances[0].prompt_tokens, 512);  // no prefill work for the rejected one
  EXPECT_EQ(r->summary.rejected, 1);
}

TEST(Scenario, BadOptionsAreErrorsNotCrashes) {
  SimOptions o = one_instance();
  o.window.rate_scale = 0;
  EXPECT_EQ(run(o, {}).status().code(), Code::kInvalidArgument);
  o = one_instance();
  o.cluster.decode_kv_capacity_tokens = 0;
  EXPECT_EQ(run(o, {}).status().code(), Code::kInvalidArgument);
  o = one_instance();
  o.cluster.policy = "fastest";
  EXPECT_EQ(run(o, {}).status().code(), Code::kInvalidArgument);
  auto empty = run(one_instance(), {});
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->summary.offered, 0);
}

TEST(Scenario, WindowSkipsStopsAndScalesArrivals) {
  std::vector<trace::Request> rows;
  for (int i = 0; i < 10; ++i) rows.push_back(trace_row(i + 1, i * 1000, 512, 1, {static_cast<uint64_t>(100 + i)}));
  SimOptions o = one_instance();
  o.window.start_s = 2;
  o.window.duration_s = 5;    // rows at 2..6 s
  o.window.max_requests = 4;  // of which the first 4
  o.window.rate_scale = 2;    // arrive at 0, 0.5, 1.0, 1.5 s
  auto r = run(o, rows);
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->records.size(), 4u);
  EXPECT_EQ(r->records[0].trace_line, 3);
  EXPECT_EQ(r->records[3].trace_line, 6);
  EXPECT_NEAR(*r->records[3].submit_ms, 1500.0, 1e-9);
}

}  // namespace
}  // namespace mc::sim
