// The main job end to end on loopback: examples/local-cluster.sh starts the real daemons (store
// master, storage nodes, mc-conductor, mc-prefill, mc-decode), mc-trace-replay replays a window of
// the shipped conversation trace through them, and the test checks the JSON summary and the JSONL
// records. Every test runs the cluster script in its own process group and kills that group on the
// way out (RAII), so no daemon outlives a failed test; the script itself removes its /dev/shm files.
// This file: the sim cluster (SERIAL, tests/replay/CMakeLists.txt); replay_ref_e2e_test.cpp: the ref backend.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "replay_cluster.hpp"

namespace mc::replay {
namespace MC_UNITY_ID {
using namespace mc::replay::e2e;  // NOLINT: the shared cluster helpers

// 50 requests of the conversation trace (lines 4174..4223, 1353 s..1365 s: every request shares the
// first block, and one reuses a 54-block conversation prefix) through 1 master / 2 nodes / 1 conductor /
// 2 prefill / 2 decode with the sim backend. The cluster runs 20x faster than the hardware it models and
// the replay sends at half the trace's pace, with a TTFT SLO no request misses, so the test checks the
// cache path rather than overload and admission (which the main job and the conductor's tests show).
// How fast this machine runs the window decides which blocks are stored when each request is sent, and
// the conductor prices each fetch against recomputing with times it measures, so the test asserts
// bounds computed from the run's own records rather than one expected hit ratio (see below). The policy
// is cache_aware: the test is about the cache path, not about which instance the kvcache policy picks.
TEST(ReplayE2E, SimClusterFiftyRequests) {
  if (auto why = cluster_unavailable(); !why.empty()) GTEST_SKIP() << why;
  Scratch s;
  const std::vector<std::string> window = {"--start-s", "1352.9", "--max-requests", "50"};
  std::vector<std::string> replay = {
      "--speed",           "0.5", "--time-scale", "20",   "--max-output-tokens", "16",
      "--drain-timeout-s", "90",  "--id-prefix",  "e2e-", "--slo-ttft-ms",       "600000"};
  replay.insert(replay.end(), window.begin(), window.end());
  ClusterRun r =
      run_on_cluster(s, "sim",
                     {"--backend", "sim", "--time-scale", "20", "--store-nodes", "2", "--prefill", "2", "--decode", "2",
                      "--policy", "cache_aware", "--kv-buffer-size", "512MiB", "--kv-bytes-per-token", "256"},
                     replay);
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(r.records.size(), 50u) << r.err;
  int completed = 0, rejected = 0;
  int64_t prompt = 0, hits = 0;
  for (const json& j : r.records) {
    ASSERT_TRUE(record_from_json(j).is_ok()) << j.dump();
    const std::string outcome = j["outcome"];
    if (outcome == "completed") {
      ++completed;
      EXPECT_TRUE(j.contains("ttft_ms")) << j.dump();
      EXPECT_GE(j["output_tokens"].get<int64_t>(), 1);
      EXPECT_FALSE(j["prefill_instance"].get<std::string>().empty());
      EXPECT_FALSE(j["decode_instance"].get<std::string>().empty());
      prompt += j["ledger"].value("prompt_tokens", int64_t{0});
      hits += j["ledger"].value("hit_tokens_local", int64_t{0}) + j["ledger"].value("hit_tokens_remote", int64_t{0}) +
              j["ledger"].value("hit_tokens_ssd", int64_t{0});
    } else {
      ASSERT_EQ(outcome, "rejected") << j.dump();  // never "failed": no request is lost
      ++rejected;
      EXPECT_FALSE(j.value("reason", std::string()).empty()) << j.dump();
    }
  }
  EXPECT_EQ(r.summary["requests"]["offered"], 50);
  EXPECT_EQ(r.summary["requests"]["completed"], completed);
  EXPECT_EQ(r.summary["requests"]["rejected"], rejected);
  EXPECT_EQ(r.summary["requests"]["failed"], 0);
  EXPECT_EQ(r.summary["cache"]["prompt_tokens"], prompt);
  EXPECT_EQ(r.summary["ttft_ms"]["count"], completed);
  EXPECT_EQ(completed, 50) << r.err;  // no SLO can be missed, and the KV buffers hold the whole window
  EXPECT_EQ(count_shm_files("mc-store-lc"), 0);

  // The hit ratio the cluster achieved, between two bounds that do not depend on how fast this
  // machine ran the window:
  //  - at most what analyze predicts for the same window with an infinite cache of complete blocks,
  //    counting only blocks of requests that arrived strictly earlier (the 12 requests of the first
  //    timestamp run concurrently and cannot reuse each other's blocks);
  //  - per request, the pool (the conductor's index of the store) held at least what the records show
  //    was stored before the request was sent: the complete blocks of every request whose last token
  //    had arrived by then (prefill puts its new blocks before it replies, long before the last
  //    token; at 256 bytes per token the window's ~145 MiB of blocks fit the two 256 MiB nodes, so
  //    nothing is evicted);
  //  - per request, the prefill reused exactly the prefix the conductor planned. How much of the
  //    pool's prefix to plan (fetch vs recompute, priced from measured times) is the policy's
  //    business and tested in tests/sched; here it only has to be honoured.
  AnalyzeOptions ao;
  ao.window.start_s = 1352.9;
  ao.window.max_requests = 50;
  auto a = analyze_file(kTrace, ao);
  ASSERT_TRUE(a.is_ok());
  const double predicted = a->infinite_earlier.tokens_full_blocks;
  const double live = r.summary["cache"]["hit_ratio"].get<double>();
  EXPECT_GT(predicted, 0.05);
  EXPECT_GT(hits, 0);
  EXPECT_LE(live, predicted + 1e-9) << "live " << live << " vs analyze (earlier arrivals) " << predicted;

  constexpr int64_t kBlockTokens = 512;
  std::map<int64_t, json> rows;  // trace line -> row, for the lines of this window
  for (const json& j : r.records) rows[j["trace_line"].get<int64_t>()] = json();
  {
    std::ifstream in(kTrace);
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n)
      if (rows.count(n)) rows[n] = json::parse(line);
  }
  int64_t lower_hits = 0;
  std::ostringstream detail;
  for (const json& req : r.records) {
    if (req["outcome"] != "completed") continue;
    const double sent = req["submit_ms"].get<double>();
    std::set<uint64_t> stored;
    for (const json& q : r.records) {
      if (q["outcome"] != "completed" || &q == &req) continue;
      if (q["submit_ms"].get<double>() + q["e2e_ms"].get<double>() >= sent) continue;
      const json& row = rows[q["trace_line"].get<int64_t>()];
      const auto ids = row["hash_ids"].get<std::vector<uint64_t>>();
      const auto full = static_cast<size_t>(row["input_length"].get<int64_t>() / kBlockTokens);
      stored.insert(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(full, ids.size())));
    }
    const json& row = rows[req["trace_line"].get<int64_t>()];
    const auto ids = row["hash_ids"].get<std::vector<uint64_t>>();
    int64_t k = 0;
    while (k < static_cast<int64_t>(ids.size()) && stored.count(ids[static_cast<size_t>(k)])) ++k;
    const int64_t input = row["input_length"].get<int64_t>();
    const int64_t bound = std::min(k * kBlockTokens, (input / kBlockTokens) * kBlockTokens);
    lower_hits += bound;
    const json& l = req["ledger"];
    const int64_t got = l.value("hit_tokens_local", int64_t{0}) + l.value("hit_tokens_remote", int64_t{0}) +
                        l.value("hit_tokens_ssd", int64_t{0});
    const int64_t pool = l.value("pool_prefix_tokens", int64_t{-1});
    const int64_t planned = l.value("planned_hit_tokens", int64_t{-1});
    std::ostringstream one;
    one << "line " << req["trace_line"] << " sent_ms " << sent << " ttft_ms " << req["ttft_ms"] << " e2e_ms "
        << req["e2e_ms"] << " prefill " << req["prefill_instance"] << " stored_before_tokens " << bound
        << " pool_prefix_tokens " << pool << " planned_hit_tokens " << planned << " hit_tokens " << got << " decision "
        << l.value("decision", std::string("-"));
    detail << one.str() << "\n";
    EXPECT_GE(pool, bound) << "the conductor did not know blocks stored before the request was sent: " << one.str();
    EXPECT_LE(planned, pool) << one.str();
    EXPECT_EQ(got, planned) << "the prefill did not reuse the prefix it was told to: " << one.str();
  }
  EXPECT_GT(lower_hits, 0) << "no request of the window was sent after an earlier one had finished:\n" << detail.str();
  if (HasFailure()) ADD_FAILURE() << detail.str() << r.err;
}

}  // namespace MC_UNITY_ID
}  // namespace mc::replay
