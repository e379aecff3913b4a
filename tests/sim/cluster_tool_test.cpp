// `mc-sim --cluster FILE`: the real binary on a cluster description (e2e: it starts the binary).
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace mc::sim {
namespace MC_UNITY_ID {

// Runs `cmd` (stderr merged when the command says 2>&1), returns its stdout; `rc` the exit status.
std::string run_tool(const std::string& cmd, int& rc) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  rc = pclose(p.release());
  return out;
}

const std::string kSim = MC_BINARY_DIR "/bin/mc-sim";
const std::string kTrace = MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl";

// "first,first+1,...": n hash ids for a trace line.
std::string ids(int first, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ',';
    s += std::to_string(first + i);
  }
  return s;
}

TEST(McSimCluster, SimulatesTheDescribedCluster) {
  const std::string file = MC_SOURCE_DIR "/examples/clusters/two-racks.json";
  int rc = 0;
  std::string out =
      run_tool(kSim + " --cluster " + file + " --trace " + kTrace + " --max-requests 50 --json 2>/dev/null", rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  // two-racks.json: prefill on h0 and h2, decode on h1 and h3, storage on all four (256 MiB / 1280 B each).
  EXPECT_EQ(j["cluster"]["prefill_instances"], 2);
  EXPECT_EQ(j["cluster"]["decode_instances"], 2);
  EXPECT_EQ(j["instances"].size(), 4u);
  EXPECT_EQ(j["cluster"]["cache_capacity_tokens"], 4 * (256 * 1024 * 1024 / 1280) / 2);
  EXPECT_EQ(j["cluster"]["block_size"], 512);
  EXPECT_EQ(j["cluster"]["policy"], "kvcache");
  EXPECT_EQ(j["cluster"]["instance_nic_bandwidth_bytes_per_s"].size(), 4u);
  EXPECT_EQ(j["summary"]["requests"]["offered"], 50);
  const std::string description = j["summary"]["config"].value("description", "");
  EXPECT_NE(description.find("two-racks: 4 hosts in 2 racks (rack0: h0 h1; rack1: h2 h3)"), std::string::npos)
      << description;

  // Explicit flags still override the description.
  out = run_tool(kSim + " --cluster " + file + " --trace " + kTrace +
                     " --max-requests 10 --decode-instances 3 --policy round_robin --json 2>/dev/null",
                 rc);
  ASSERT_EQ(rc, 0) << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["cluster"]["decode_instances"], 3);
  EXPECT_EQ(j["cluster"]["policy"], "round_robin");

  // The environment variable names it too.
  out = run_tool("MC_CLUSTER=" + file + " " + kSim + " --trace " + kTrace + " --max-requests 5 --json 2>/dev/null", rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["cluster"]["prefill_instances"], 2);
}

// pipeline.json: two prefill hosts form a group for a long prompt (defaults.pipeline_group 2, chunks of 2,048,
// pipeline_reserve_factor 1: both about free suffice), as the live cluster of the same file does
// (docs/BENCHMARKS.md); with the default reserve of 2 x 2 instances about free, two instances never form one.
TEST(McSimCluster, PipelineDescriptionFormsAGroupForTheLongPrompt) {
  const std::string file = MC_SOURCE_DIR "/examples/clusters/pipeline.json";
  const std::string trace = "/tmp/mc-sim-cluster-pipeline-" + std::to_string(getpid()) + ".jsonl";
  {
    std::ofstream t(trace);
    t << R"({"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [)" << ids(0, 2) << "]}\n"
      << R"({"timestamp": 3000, "input_length": 1024, "output_length": 4, "hash_ids": [)" << ids(100, 2) << "]}\n"
      << R"({"timestamp": 6000, "input_length": 16384, "output_length": 4, "hash_ids": [)" << ids(200, 32) << "]}\n";
  }
  int rc = 0;
  std::string out = run_tool(kSim + " --cluster " + file + " --trace " + trace + " --json 2>/dev/null", rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["cluster"]["pipeline_group"], 2);
  EXPECT_EQ(j["cluster"]["pipeline_reserve_factor"], 1.0);
  EXPECT_EQ(j["totals"]["pipelined_prefills"], 1) << out;
  out = run_tool(kSim + " --cluster " + file + " --trace " + trace + " --pipeline-reserve-factor 2 --json 2>/dev/null",
                 rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["totals"]["pipelined_prefills"], 0) << out;
  // A group must save --pipeline-min-gain of one instance's TTFT (the Conductor's flag): 2 stages save at most half.
  out = run_tool(kSim + " --cluster " + file + " --trace " + trace + " --pipeline-min-gain 0.6 --json 2>/dev/null", rc);
  ASSERT_EQ(rc, 0) << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["cluster"]["pipeline_min_gain"], 0.6);
  EXPECT_EQ(j["totals"]["pipelined_prefills"], 0) << out;
  std::filesystem::remove(trace);
}

// --preempt-chunk-tokens (DESIGN.md §10 "Preemption"): one prefill instance computes a 16 K-token prompt when a
// 512-token one arrives; with preemption the short one runs after the long one's current 2,048-token chunk, without
// it waits for the whole long prefill. The report counts the yields and echoes the setting.
TEST(McSimCluster, PreemptionLetsAShortPromptPassALongOneAtAChunkBoundary) {
  const std::string trace = "/tmp/mc-sim-preempt-" + std::to_string(getpid()) + ".jsonl";
  {
    std::ofstream t(trace);
    t << R"({"timestamp": 0, "input_length": 16384, "output_length": 4, "hash_ids": [)" << ids(0, 32) << "]}\n"
      << R"({"timestamp": 100, "input_length": 512, "output_length": 4, "hash_ids": [)" << ids(100, 1) << "]}\n";
  }
  std::map<int64_t, nlohmann::json> runs;
  for (const int64_t chunk : {int64_t{0}, int64_t{2048}}) {
    int rc = 0;
    const std::string out =
        run_tool(kSim + " --trace " + trace + " --prefill-instances 1 --decode-instances 1 --preempt-chunk-tokens " +
                     std::to_string(chunk) + " --json 2>/dev/null",
                 rc);
    ASSERT_EQ(rc, 0) << out;
    runs[chunk] = nlohmann::json::parse(out);
    EXPECT_EQ(runs[chunk]["cluster"]["preempt_chunk_tokens"], chunk);
    EXPECT_EQ(runs[chunk]["summary"]["requests"]["completed"], 2) << out;
  }
  EXPECT_EQ(runs[0]["totals"]["prefill_preemptions"], 0);
  EXPECT_EQ(runs[2048]["totals"]["prefill_preemptions"], 1);
  // The long prompt's TTFT is the max in both runs; the short one's makes the mean: far lower with preemption.
  const double mean_off = runs[0]["summary"]["ttft_ms"]["mean"].get<double>();
  const double mean_on = runs[2048]["summary"]["ttft_ms"]["mean"].get<double>();
  const double max_off = runs[0]["summary"]["ttft_ms"]["max"].get<double>();
  EXPECT_LT(mean_on, mean_off - 0.25 * max_off) << mean_on << " vs " << mean_off;
  int rc = 0;
  const std::string bad = run_tool(kSim + " --trace " + trace + " --preempt-chunk-tokens -1 2>&1", rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << bad;
  EXPECT_NE(bad.find("--preempt-chunk-tokens"), std::string::npos) << bad;
  std::filesystem::remove(trace);
}

// Load shedding (DESIGN.md §10 "Load shedding"): the first 2,000 requests of the conversation trace at 3x its rate
// are a burst in which kvcache's default turns away some of the largest prompts (reason load_shed) and the mean TTFT
// falls; --shed-limit 0 (the paper's rule) sheds none.
TEST(McSimCluster, LoadSheddingTurnsAwayTheLargestPromptsOfABurst) {
  std::map<std::string, nlohmann::json> runs;
  for (const std::string limit : {"", "0"}) {
    int rc = 0;
    const std::string out = run_tool(kSim + " --trace " + kTrace + " --rate-scale 3 --max-requests 2000" +
                                         (limit.empty() ? "" : " --shed-limit " + limit) + " --json 2>/dev/null",
                                     rc);
    ASSERT_EQ(rc, 0) << out;
    runs[limit] = nlohmann::json::parse(out);
  }
  EXPECT_EQ(runs[""]["cluster"]["shed_limit"], 5.0);
  EXPECT_EQ(runs["0"]["cluster"]["shed_limit"], 0.0);
  const int64_t shed = runs[""]["summary"]["reasons"].value("load_shed", 0);
  EXPECT_GT(shed, 0) << runs[""]["summary"]["reasons"].dump();
  EXPECT_EQ(runs["0"]["summary"]["reasons"].value("load_shed", 0), 0);
  EXPECT_LT(runs[""]["summary"]["ttft_ms"]["mean"].get<double>(),
            runs["0"]["summary"]["ttft_ms"]["mean"].get<double>());
  int rc = 0;
  for (const std::string flag :
       {"--shed-limit -1", "--shed-limit abc", "--shed-limit nan", "--balancing-threshold 0.5"}) {
    const std::string bad = run_tool(kSim + " --trace " + kTrace + " " + flag + " 2>&1", rc);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << bad;
    EXPECT_NE(bad.find(flag.substr(0, flag.find(' '))), std::string::npos) << bad;
    EXPECT_NE(bad.find("is not a finite number in ["), std::string::npos) << bad;
  }
}

TEST(McSimCluster, RefusalsExitTwoWithTheReason) {
  int rc = 0;
  std::string out = run_tool(kSim + " --cluster missing.json --trace " + kTrace + " 2>&1", rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  EXPECT_NE(out.find("missing.json"), std::string::npos) << out;

  const std::string broken = ::testing::TempDir() + "mc_sim_broken_cluster.json";
  {
    std::ofstream f(broken);
    f << R"({"hosts": [{"name": "a", "daemons": {"master": 1, "conductor": 1, "prefill": 1, "decode": 1}}]})";
  }
  out = run_tool(kSim + " --cluster " + broken + " --trace " + kTrace + " 2>&1", rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  EXPECT_NE(out.find("daemons.store: the cluster needs at least one storage node"), std::string::npos) << out;

  // --cluster and the older CLUSTER.json positional exclude each other.
  out = run_tool(
      kSim + " --cluster " MC_SOURCE_DIR "/examples/clusters/two-racks.json other.json --trace " + kTrace + " 2>&1",
      rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  std::remove(broken.c_str());
}

}  // namespace MC_UNITY_ID
}  // namespace mc::sim
