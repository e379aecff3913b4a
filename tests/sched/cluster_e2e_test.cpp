// The Conductor end to end with the real daemons: examples/local-cluster.sh starts a store master, 2 storage
// nodes, mc-conductor, 2 prefill and 2 decode instances (sim backend) spread over two host labels (--hosts 2:
// node0, prefill0, decode0 on host0; node1, prefill1, decode1 on host1). The test then replays small traces
// it writes itself through mc-trace-replay, phase by phase on the same cluster, and checks what the Conductor
// decided against what the daemons did (their stat counters, the store's replicas):
//   (a) independent requests are spread over both prefill instances;
//   (b) a request repeating a long prefix stored by an earlier one runs on the prefill instance whose host
//       holds that prefix (the master put the blocks on the writer's host) and reuses it;
//   (r) while that holder is busy with a long job, a request with the same prefix goes to the idle instance
//       and the Conductor has the store copy the prefix to the idle instance's host (replicate_prefix);
//   (c) a request longer than any decode instance's KV capacity is rejected with its reason before any
//       prefill instance receives a job.
// TieredClusterE2E (issue 16) runs storage nodes with little DRAM and an SSD tier, and a Conductor logging its
// decisions: SSD hits reach the ledger and refit the SSD bandwidth; the decode predictor learns from every
// step; `mc-conductor replay-decisions` re-runs the log through every policy.
// HotReadsClusterE2E (issue 16 item 5) turns hot-object replication on through local-cluster.sh --hot-reads.
// Only loopback. The cluster script runs in its own process group; a guard ends it (and so every daemon,
// its state directory and /dev/shm files) on the way out, also when an assertion fails.
// ClusterE2E (phases a, b, r and c above) is in cluster_placement_e2e_test.cpp, run alone (SERIAL); the fixture is
// cluster_fixture.hpp.
#include <gtest/gtest.h>

#include "cluster_fixture.hpp"

namespace mc::sched {
namespace MC_UNITY_ID {
using namespace mc::sched::cluster_e2e;  // NOLINT: the shared cluster fixture

// Issue 24 item 1 through the real daemons: mc-conductor --queue slo decides the order of the prefill instance's
// queue and mc-prefill follows it (prefill_job.queue_key_ns). One prefill instance: a long request A runs, a long B
// and then a short C wait behind it; the slo order keys C before B, so C reaches its first token first and waits
// less in the prefill's queue (its ledger's queue_ms), where first come, first served would run B first.
class QueueOrderClusterE2E : public ClusterFixture {
 protected:
  void SetUp() override {
    time_scale_ = kTimeScale;
    testkit::LocalClusterFixture::start_cluster(
        {"--hosts", "1", "--store-nodes", "1", "--prefill", "1", "--decode", "1", "--backend", "sim",
         "--kv-buffer-size", "128MiB", "--policy", "kvcache", "--conductor-args", "--queue slo", "--time-scale",
         kTimeScale},
        {"master", "conductor", "prefill0", "decode0"});
  }
};

TEST_F(QueueOrderClusterE2E, TheConductorsSloOrderReachesThePrefillQueue) {
  auto r = replay(
      "q", {trace_row(0, ids_range(1000, 60)), trace_row(10, ids_range(2000, 40)), trace_row(20, ids_range(3000, 2))});
  for (int64_t line = 1; line <= 3; ++line) {
    ASSERT_EQ(r[line].value("outcome", ""), "completed") << r[line].dump() << why("q");
    ASSERT_EQ(r[line].value("prefill_instance", ""), "prefill0") << r[line].dump();
  }
  auto first_token_ms = [](const json& rec) { return rec.value("submit_ms", 0.0) + rec.value("ttft_ms", 0.0); };
  const json& b = r[2];
  const json& c = r[3];
  EXPECT_LT(first_token_ms(c), first_token_ms(b)) << b.dump() << "\n" << c.dump() << why("q");
  EXPECT_LT(c["ledger"].value("queue_ms", int64_t{0}), b["ledger"].value("queue_ms", int64_t{0})) << b.dump() << "\n"
                                                                                                  << c.dump();
}

// A cluster whose storage nodes have little DRAM (8 blocks each) and an SSD tier, at the modelled speed (time
// scale 1: the Conductor takes bandwidth samples only then), the Conductor pricing transfers at the bytes the
// sim workers really move (1 KiB per token) and logging every decision.
class TieredClusterE2E : public ClusterFixture {
 protected:
  void SetUp() override {
    start_cluster({"--store-nodes", "2", "--prefill", "2", "--decode", "2", "--backend", "sim", "--kv-buffer-size",
                   "64MiB", "--dram-bytes", "4MiB", "--ssd-bytes", "64MiB", "--policy", "kvcache", "--conductor-args",
                   "--kv-bytes-per-token 1024 --decisions " + s_.path("decisions.jsonl")},
                  "1");
  }
  json json_of(const ToolRun& r) {
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
    return j;
  }
  json store_stat() {
    return json_of(run_tool("store_stat", {kBin + "/mc-store", "stat", "--master", endpoints_.at("master"), "--json"}));
  }
  json replay_summary(const std::string& tag) {
    ToolRun r = run_tool(tag + "_report", {kBin + "/mc-trace-replay", "report", s_.path(tag + ".jsonl"), "--json"});
    EXPECT_EQ(r.rc, 0) << r.err;
    return json_of(r);
  }
};

// Issue 16 item 1: hits served from a storage node's SSD tier reach the ledger as SSD hits (not remote ones),
// in the amount the store counted, and the Conductor refits its SSD bandwidth from those reads.
TEST_F(TieredClusterE2E, SsdHitsReachTheLedgerAndRefitTheSsdBandwidth) {
  // Phase 1: a 4-block prompt A, then 5 other 4-block prompts: 24 blocks on 16 blocks of DRAM, so the oldest
  // (A's) are demoted to SSD.
  std::vector<std::string> rows = {trace_row(0, ids_range(100, 4), 4)};
  for (uint64_t i = 1; i <= 5; ++i)
    rows.push_back(trace_row(static_cast<int64_t>(i) * 10, ids_range(100 + 100 * i, 4), 4));
  auto fill = replay("fill", rows);
  for (const auto& [line, r] : fill) ASSERT_EQ(r.value("outcome", ""), "completed") << r.dump() << why("fill");
  json st;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        st = store_stat();
        int64_t on_ssd = 0;
        for (const json& seg : st["segments"]) {
          if (seg.value("medium", "") == "disk") on_ssd += seg.value("objects", int64_t{0});
        }
        return on_ssd >= 8;
      },
      60'000, 200))
      << st.dump();
  const double ssd_prior = conductor_status()["predictors"]["bandwidth_bytes_per_s"].value("ssd", 0.0);
  json idx;
  ASSERT_TRUE(wait_idle(&idx)) << idx.dump();

  // Phase 2: A's prefix again with a new block: its blocks come back from SSD.
  auto again = replay("again", {trace_row(0, concat(ids_range(100, 4), {999}), 4)});
  ASSERT_EQ(again[1].value("outcome", ""), "completed") << again[1].dump() << why("again");
  const int64_t ssd_tokens = again[1]["ledger"].value("hit_tokens_ssd", int64_t{0});
  EXPECT_GT(ssd_tokens, 0) << again[1].dump() << why("again");

  // The store's count of reads served by SSD segments matches the ledger's SSD tokens (every read of this
  // test is a prefill's prefix fetch; phase 1 reused nothing).
  st = store_stat();
  int64_t ssd_hits = 0;
  for (const json& seg : st["segments"]) {
    if (seg.value("medium", "") == "disk") ssd_hits += seg.value("hits", int64_t{0});
  }
  EXPECT_GT(ssd_hits, 0) << st.dump();
  EXPECT_EQ(ssd_tokens, ssd_hits * kBlockTokens) << again[1].dump() << "\n" << st.dump();

  // The report shows the SSD share: ssd_% > 0 in the table, hit_tokens_ssd in the JSON.
  json sum = replay_summary("again");
  EXPECT_EQ(sum["cache"].value("hit_tokens_ssd", int64_t{0}), ssd_tokens) << sum.dump();
  EXPECT_GT(sum["cache"].value("hit_ratio_ssd", 0.0), 0.0) << sum.dump();

  // The Conductor refit its SSD bandwidth from the timed SSD reads: samples, and a value off the prior.
  json after;
  ASSERT_TRUE(wait_idle(&after)) << after.dump();
  after = conductor_status();
  EXPECT_GE(after["predictors"]["bandwidth_samples"].value("ssd", 0), 1) << after.dump();
  EXPECT_NE(after["predictors"]["bandwidth_bytes_per_s"].value("ssd", 0.0), ssd_prior) << after.dump();
  ToolRun table =
      run_tool("conductor_stat", {kBin + "/mc-conductor", "stat", "--endpoint", endpoints_.at("conductor")});
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_EQ(table.out.find("ssd 3.00 (0 samples)"), std::string::npos) << table.out;
}

// Issue 16 item 6: the decode predictor learns from every decode step, each with its own batch and context,
// and its error shows in the Conductor's stat and in the replay's report.
TEST_F(TieredClusterE2E, DecodePredictorLearnsFromEachStepAndShowsItsError) {
  std::vector<std::string> rows;
  for (uint64_t i = 0; i < 6; ++i)
    rows.push_back(trace_row(static_cast<int64_t>(i) * 20, ids_range(3000 + 10 * i, 2), 24));
  auto r = replay("decode", rows);
  for (const auto& [line, rec] : r) ASSERT_EQ(rec.value("outcome", ""), "completed") << rec.dump() << why("decode");
  // Heartbeats carry the steps: wait for them to arrive (every 500 ms).
  json st;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        st = conductor_status();
        return st["predictors"]["decode"].value("samples", 0) >= 20;
      },
      30'000, 100))
      << st.dump();
  const json& err = st["decode_step_error"];
  EXPECT_GE(err.value("samples", 0), 20) << st.dump();
  EXPECT_TRUE(std::isfinite(err.value("mean_abs_ms", -1.0)) && err.value("mean_abs_ms", -1.0) >= 0) << st.dump();
  ToolRun table =
      run_tool("conductor_stat", {kBin + "/mc-conductor", "stat", "--endpoint", endpoints_.at("conductor")});
  EXPECT_NE(table.out.find("decode step prediction error: "), std::string::npos) << table.out;
  // The report: the TBT prediction of every completed request against its measured mean gap.
  json sum = replay_summary("decode");
  EXPECT_EQ(sum["tbt_prediction"].value("count", 0), 6) << sum.dump();
  EXPECT_TRUE(std::isfinite(sum["tbt_prediction"].value("mean_abs_error_ms", -1.0))) << sum.dump();
  ToolRun report = run_tool("decode_report", {kBin + "/mc-trace-replay", "report", s_.path("decode.jsonl")});
  EXPECT_NE(report.out.find("TBT (mean gap)"), std::string::npos) << report.out;
}

// Issue 16 item 7: a --decisions log replays through the policy library: the logged policy reproduces each of
// its choices, and another policy chooses differently somewhere.
TEST_F(TieredClusterE2E, DecisionLogReplaysThroughEveryPolicy) {
  // Two shared prefixes, each repeated: kvcache sends a repeat where its prefix is; other policies need not.
  std::vector<std::string> rows;
  for (uint64_t i = 0; i < 10; ++i) {
    rows.push_back(trace_row(static_cast<int64_t>(i) * 30, concat(ids_range(7000 + 100 * (i % 2), 3), {7500 + i}), 2));
  }
  auto r = replay("dec", rows);
  for (const auto& [line, rec] : r) ASSERT_EQ(rec.value("outcome", ""), "completed") << rec.dump() << why("dec");
  ToolRun rep =
      run_tool("replay_decisions", {kBin + "/mc-conductor", "replay-decisions", s_.path("decisions.jsonl"), "--policy",
                                    "kvcache,least_loaded,cache_aware,random,round_robin", "--json"});
  ASSERT_EQ(rep.rc, 0) << rep.err;
  json j = json_of(rep);
  EXPECT_EQ(j.value("logged", 0), 10) << j.dump();
  EXPECT_EQ(j.value("replayable", 0), 10) << j.dump();
  EXPECT_EQ(j["logged_policies"], json::array({"kvcache"})) << j.dump();
  int64_t others_differing = 0;
  for (const json& p : j["policies"]) {
    EXPECT_EQ(p.value("decisions", 0), 10) << p.dump();
    if (p.value("policy", "") == "kvcache") {
      EXPECT_EQ(p.value("same_choice", 0), 10) << p.dump();
      EXPECT_EQ(p.value("different_choice", -1), 0) << p.dump();
      EXPECT_EQ(p.value("max_abs_ttft_diff_ms", -1.0), 0.0) << p.dump();
    } else {
      others_differing += p.value("different_choice", 0);
    }
  }
  EXPECT_GT(others_differing, 0) << j.dump();
  // The table, and a clear error for a log that is not one.
  ToolRun table = run_tool("replay_table", {kBin + "/mc-conductor", "replay-decisions", s_.path("decisions.jsonl")});
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("p99_abs_ttft_diff_ms"), std::string::npos) << table.out;
  std::ofstream(s_.path("bad.jsonl")) << "{\"not\": \"a decision\"}\n";
  ToolRun bad = run_tool("replay_bad", {kBin + "/mc-conductor", "replay-decisions", s_.path("bad.jsonl")});
  EXPECT_EQ(bad.rc, 2) << bad.err;
  EXPECT_NE(bad.err.find("bad.jsonl:1"), std::string::npos) << bad.err;
}

// Issue 16 item 5: `local-cluster.sh --hot-reads N` turns the store's hot-object replication on. A prefix read
// a second time within the window gets a second replica on the other storage node, made by the reading
// prefill; the master counts the copies.
class HotReadsClusterE2E : public ClusterFixture {
 protected:
  void SetUp() override {
    start_cluster({"--store-nodes", "2", "--prefill", "2", "--decode", "2", "--backend", "sim", "--kv-buffer-size",
                   "64MiB", "--policy", "kvcache", "--hot-reads", "1"},
                  kTimeScale);
  }
};

TEST_F(HotReadsClusterE2E, PrefixReadTwiceGetsASecondReplica) {
  const std::vector<uint64_t> prefix = ids_range(8000, 4);
  json idx;
  auto p = replay("hot_p", {trace_row(0, prefix)});
  ASSERT_EQ(p[1].value("outcome", ""), "completed") << p[1].dump() << why("hot_p");
  ASSERT_TRUE(wait_index(4, &idx)) << idx.dump();
  ASSERT_TRUE(wait_idle(&idx)) << idx.dump();
  for (const auto& [key, segs] : store_objects()) ASSERT_EQ(segs.size(), 1u) << key;
  // Two more requests on the prefix, one after the other: each reads its 4 blocks; the second read of each
  // block is over the threshold (1).
  for (const std::string tag : {"hot_r1", "hot_r2"}) {
    ASSERT_TRUE(wait_idle(&idx)) << idx.dump();
    auto r = replay(tag, {trace_row(0, concat(prefix, {static_cast<uint64_t>(8100 + tag.back() - '0')}))});
    ASSERT_EQ(r[1].value("outcome", ""), "completed") << r[1].dump() << why(tag);
    EXPECT_EQ(hit_tokens(r[1]), 4 * kBlockTokens) << r[1].dump();
  }
  // The reader makes the copies after its read: wait for them.
  std::map<std::string, std::vector<std::string>> objects;
  int doubled = 0;
  testkit::wait_until(
      [&] {
        objects = store_objects();
        doubled = 0;
        for (const auto& [key, segs] : objects) doubled += segs.size() == 2 ? 1 : 0;
        return doubled >= 4;
      },
      20'000, 100);
  EXPECT_EQ(doubled, 4) << why("hot_r2");
  proto::StoreStatRequest stat;
  EXPECT_GE(call("master", stat).hot_replications, 4u);
}

// The script's promise: a SIGTERM to local-cluster.sh while its command runs stops the command and every
// daemon at once (its command used to run in the foreground, so bash ran the trap only after it ended).
TEST(LocalClusterScript, SigtermStopsTheCommandAndEveryDaemon) {
  for (const char* tool : {"mc-store", "mc-conductor", "mc-prefill", "mc-decode"}) {
    if (::access((kBin + "/" + tool).c_str(), X_OK) != 0) GTEST_SKIP() << kBin << "/" << tool << " is not built";
  }
  testkit::Scratch s("lc_sigterm");
  const std::string cmd = "cp \"$MC_CLUSTER_STATE/cluster.txt\" " + s.path("pids.tmp") + " && mv " +
                          s.path("pids.tmp") + " " + s.path("pids") + " && exec sleep 600";
  testkit::ChildOptions o;
  o.stdin_path = "/dev/null";
  o.stdout_path = s.path("out");
  o.stderr_path = s.path("err");
  o.stop_grace_ms = 10000;
  testkit::Child script({"/bin/bash", MC_SOURCE_DIR "/examples/local-cluster.sh", "--bin", kBin, "--store-nodes", "1",
                         "--prefill", "1", "--decode", "1", "--", "/bin/bash", "-c", cmd},
                        o);
  ASSERT_TRUE(
      testkit::wait_until([&] { return std::filesystem::exists(s.path("pids")) || !script.running(); }, 120'000, 100))
      << slurp(s.path("err"));
  ASSERT_TRUE(std::filesystem::exists(s.path("pids"))) << slurp(s.path("err"));
  std::vector<pid_t> daemons;
  std::istringstream lines(slurp(s.path("pids")));
  std::string name, endpoint;
  pid_t pid = 0;
  while (lines >> name >> pid >> endpoint) daemons.push_back(pid);
  ASSERT_EQ(daemons.size(), 5u) << slurp(s.path("pids"));
  ASSERT_EQ(::kill(script.pid(), SIGTERM), 0);
  // The trap gives each daemon 5 s to stop before SIGKILL.
  EXPECT_EQ(script.wait_exit(30'000), 143) << slurp(s.path("err"));
  for (pid_t d : daemons) EXPECT_NE(::kill(d, 0), 0) << "daemon pid " << d << " still runs";
}

}  // namespace MC_UNITY_ID
}  // namespace mc::sched
