// examples/cluster.sh (issue 20 item 1) without namespaces: the ssh mode's --dry-run prints every command each host
// would run, bound to the host's own address; a broken description exits 2 with the reason; the same description
// runs on loopback with the hosts as --host labels; examples/fault-matrix.sh's master restart on loopback. The
// namespace runs are in cluster_netns_e2e_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "mc/testkit/local_cluster.hpp"
#include "mc/testkit/process.hpp"

namespace mc::testing {
using namespace mc::testkit;  // NOLINT: run, Scratch, slurp
namespace MC_UNITY_ID {

const std::string kScript = MC_SOURCE_DIR "/examples/cluster.sh";
const std::string kClusters = MC_SOURCE_DIR "/examples/clusters/";
const std::string kBin = MC_BINARY_DIR "/bin";

// The script with `args`, stdout and stderr together.
RunResult script(const std::string& args, int64_t timeout_ms = 60000) {
  return run({"/bin/bash", "-c", "/bin/bash " + kScript + " --bin " + kBin + " " + args + " 2>&1"}, timeout_ms);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ClusterScript, SshDryRunPrintsEveryDaemonOnItsHost) {
  auto r = script(kClusters + "ssh-example.json --mode ssh --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // Keys to every host first, then each daemon over ssh on its host, bound to that host's address.
  EXPECT_EQ(count_of(r.out, "scp -qr "), 2u) << r.out;
  EXPECT_NE(r.out.find("ssh mc@gpu-a.example 'nohup " + kBin + "/mc-store master --listen tcp://192.0.2.10:0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ssh mc@gpu-b.example 'nohup " + kBin + "/mc-decode --listen tcp://192.0.2.11:0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--xfer-listen tcp://192.0.2.11:0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mc-gateway --listen 192.0.2.11:0 --client-bind tcp://192.0.2.11:0"), std::string::npos)
      << r.out;
  // Every daemon that needs the master or the Conductor is given the endpoint the ready line will tell.
  EXPECT_EQ(count_of(r.out, "--master \\<master-endpoint\\>"), 2u) << r.out;
  EXPECT_EQ(count_of(r.out, "--conductor \\<conductor-endpoint\\>"), 3u) << r.out;  // decode, prefill, gateway
  EXPECT_EQ(count_of(r.out, "ssh mc@gpu-"), 7u) << "one line per daemon: " << r.out;
  EXPECT_EQ(count_of(r.out, "mkdir -p -m 700"), 2u) << r.out;
  EXPECT_EQ(r.out.find("127.0.0.1"), std::string::npos) << "nothing may assume loopback: " << r.out;
}

TEST(ClusterScript, NetnsDryRunBuildsRacksRouterAndShaping) {
  auto r = script(kClusters + "two-racks.json --mode netns --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "type bridge"), 2u) << r.out;
  EXPECT_NE(r.out.find("sysctl -qw net.ipv4.ip_forward=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tbf rate 10000mbit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tbf rate 5000mbit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("route add default via 10.88.2.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-host-h3 " + kBin + "/mc-decode --listen tcp://10.88.2.11:0"), std::string::npos) << r.out;
}

// Pipelined prefill groups (docs/DESIGN.md §18 "Live groups"): the description's pipeline_group and
// pipeline_chunk_tokens reach the Conductor for ref instances, and every decode instance gets the store, since it puts
// the blocks of pipelined prompts; sim instances run stages too (their hidden states scaled like their KV).
TEST(ClusterScript, PipelineGroupsReachTheConductorForRefAndSim) {
  auto r = script(kClusters +
                  "ssh-example.json --mode ssh --dry-run --set backend=ref --set pipeline_group=2 "
                  "--set pipeline_chunk_tokens=128");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--pipeline-group 2 --prefill-chunk 128"), 1u) << r.out;
  EXPECT_NE(r.out.find("mc-decode --listen tcp://192.0.2.11:0"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.out, "--store \\<master-endpoint\\>"), 2u) << "decode and prefill: " << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set backend=sim --set pipeline_group=2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--pipeline-group 2 --prefill-chunk 8192 --pipeline-reserve-factor 2"), 1u) << r.out;
  // The reserve (instances about free to form a group, x its size) from the description, as mc-sim --cluster reads it.
  r = script(kClusters + "pipeline.json --mode loopback --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--pipeline-group 2 --prefill-chunk 2048 --pipeline-reserve-factor 1"), 1u) << r.out;
  r = script(kClusters + "pipeline.json --mode loopback --dry-run --set pipeline_reserve_factor=0.5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.pipeline_reserve_factor must be a number in [1, 64]"), std::string::npos) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set backend=ref --set pipeline_group=two");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.pipeline_group must be 1..64"), std::string::npos) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set backend=ref --set pipeline_chunk_tokens=0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.pipeline_chunk_tokens"), std::string::npos) << r.out;
}

// The prefill queue discipline (docs/DESIGN.md §10): defaults.queue reaches the Conductor; absent, the Conductor keeps
// its policy's default; anything else is refused before a daemon starts.
TEST(ClusterScript, QueueDisciplineReachesTheConductor) {
  auto r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set queue=fcfs");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--queue fcfs"), 1u) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--queue "), 0u) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set queue=lifo");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.queue must be fcfs or slo"), std::string::npos) << r.out;
}

// Pending prefixes, load-priced placement and SLO headroom (docs/DESIGN.md §10) reach the Conductor; absent, its
// defaults; bad values are refused before a daemon starts.
TEST(ClusterScript, PlacementSettingsReachTheConductor) {
  auto r = script(kClusters +
                  "ssh-example.json --mode ssh --dry-run --set pending_prefix=off --set "
                  "placement_load_weight=0.5 --set slo_headroom=0.1 --set shed_limit=3");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--pending-prefix off --placement-load-weight 0.5 --slo-headroom 0.1 --shed-limit 3"), 1u)
      << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "--pending-prefix"), 0u) << r.out;
  EXPECT_EQ(count_of(r.out, "--placement-load-weight"), 0u) << r.out;
  EXPECT_EQ(count_of(r.out, "--slo-headroom"), 0u) << r.out;
  EXPECT_EQ(count_of(r.out, "--shed-limit"), 0u) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set pending_prefix=sometimes");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.pending_prefix must be on or off"), std::string::npos) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set placement_load_weight=-1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.placement_load_weight must be a number in [0, 1000]"), std::string::npos) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set slo_headroom=0.95");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.slo_headroom must be a number in [0, 0.9]"), std::string::npos) << r.out;
  r = script(kClusters + "ssh-example.json --mode ssh --dry-run --set shed_limit=-2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("defaults.shed_limit must be a number in [0, 1000]"), std::string::npos) << r.out;
}

TEST(ClusterScript, BrokenDescriptionsExit2WithTheReason) {
  Scratch s("cluster_script");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(s.path(name)) << text;
    return s.path(name);
  };
  const std::string two_masters = write("two-masters.json", R"({"hosts":[
    {"name":"a","daemons":{"master":1,"conductor":1,"store":1,"prefill":1,"decode":1}},
    {"name":"b","daemons":{"master":1}}]})");
  const std::string bad_rack = write("bad-rack.json", R"({"racks":[{"name":"r0"}],"hosts":[
    {"name":"a","rack":"r9","daemons":{"master":1,"conductor":1,"store":1,"prefill":1,"decode":1}}]})");
  const std::string no_decode = write("no-decode.json", R"({"hosts":[
    {"name":"a","daemons":{"master":1,"conductor":1,"store":1,"prefill":1}}]})");
  const std::string bad_name = write("bad-name.json", R"({"hosts":[
    {"name":"a b","daemons":{"master":1,"conductor":1,"store":1,"prefill":1,"decode":1}}]})");
  const std::string not_json = write("not.json", "{hosts: [");
  const std::pair<std::string, std::string> cases[] = {
      {two_masters, "exactly one store master"},
      {bad_rack, "rack 'r9', which .racks does not name"},
      {no_decode, "at least one prefill and one decode"},
      {bad_name, "host name 'a b'"},
      {not_json, "is not JSON"},
      {s.path("absent.json"), "cannot read"},
  };
  for (const auto& [file, why] : cases) {
    auto r = script(file + " --mode loopback --dry-run");
    EXPECT_EQ(r.exit_code, 2) << file << ": " << r.out;
    EXPECT_NE(r.out.find(why), std::string::npos) << file << ": " << r.out;
  }
  auto r = script(kClusters + "pair.json --mode sideways");
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

// The description on loopback: every daemon up with its host's name as its label, the command gets the endpoints,
// and nothing is left after.
TEST(ClusterScript, LoopbackRunsTheDescriptionWithHostLabels) {
  for (const char* tool : {"mc-store", "mc-conductor", "mc-prefill", "mc-decode", "mc-auth"}) {
    if (::access((kBin + "/" + tool).c_str(), X_OK) != 0) GTEST_SKIP() << kBin << "/" << tool << " is not built";
  }
  Scratch s("cluster_loopback");
  const std::string cmd = "cp \"$MC_CLUSTER_STATE/cluster.txt\" " + s.path("cluster.txt") +
                          " && echo \"$MC_CONDUCTOR " + "$MC_CLIENT_BIND\" > " + s.path("env.txt") +
                          " && echo \"$MC_CLUSTER_STATE\" > " + s.path("state.txt");
  auto r = script(kClusters + "pair.json --mode loopback --ready-timeout-s 90 -- /bin/bash -c '" + cmd + "'", 180000);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string cluster = slurp(s.path("cluster.txt"));
  for (const char* line : {"master ", "node0 ", "node1 ", "conductor ", "decode0 ", "prefill0 "}) {
    EXPECT_NE(cluster.find(line), std::string::npos) << cluster;
  }
  EXPECT_NE(cluster.find("tcp://127.0.0.1:"), std::string::npos) << cluster;
  EXPECT_NE(cluster.find(" h1\n"), std::string::npos) << "decode0 and node1 run on host h1: " << cluster;
  EXPECT_EQ(slurp(s.path("env.txt")).rfind("tcp://127.0.0.1:", 0), 0u);
  std::string state = slurp(s.path("state.txt"));
  state.erase(state.find_last_not_of('\n') + 1);
  EXPECT_FALSE(std::filesystem::exists(state)) << "the state directory " << state << " outlived the cluster";
  // Every daemon went with the script (cluster.txt: name pid endpoint host).
  std::istringstream lines(cluster);
  std::string name, pid, rest;
  while (lines >> name >> pid && std::getline(lines, rest)) {
    EXPECT_NE(::kill(static_cast<pid_t>(std::stol(pid)), 0), 0) << name << " (pid " << pid << ") outlived the cluster";
  }
}

// examples/fault-matrix.sh --faults master-restart on loopback (issue 48 item 6): the store master SIGKILLed 2 s into
// a short replay and started again at once on the same ports. The restart looked up the master's network namespace
// in hosts.txt, which only --cluster writes: under `set -e` the lookup ended the script mid-replay and tore the
// cluster down. Every accepted request ends completed or failed (lost = 0).
TEST(FaultMatrix, MasterRestartOnLoopbackLosesNoRequest) {
  for (const char* tool : {"mc-store", "mc-conductor", "mc-prefill", "mc-decode", "mc-trace-replay"}) {
    if (::access((kBin + "/" + tool).c_str(), X_OK) != 0) GTEST_SKIP() << kBin << "/" << tool << " is not built";
  }
  if (std::system("command -v jq >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs jq: tools/install-deps.sh installs it";
  Scratch s("fault_master_restart");
  auto r = run(
      {"/bin/bash", MC_SOURCE_DIR "/examples/fault-matrix.sh", "--bin", kBin, "--faults", "master-restart",
       "--duration-s", "6", "--speed", "8", "--at-s", "2", "--drain-timeout-s", "60", "--json", "--out", s.path("out")},
      240000);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::istringstream rows(r.out);
  std::string line;
  int measured = 0;
  while (std::getline(rows, line)) {
    auto row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object() || !row.contains("fault")) continue;
    ++measured;
    EXPECT_EQ(row["fault"], "master-restart") << line;
    EXPECT_EQ(row["lost"], 0) << line;
    EXPECT_GT(row["accepted"].get<int>(), 0) << line;
    EXPECT_EQ(row["accepted"].get<int>(), row["completed"].get<int>() + row["failed"].get<int>()) << line;
  }
  EXPECT_EQ(measured, 1) << r.out;
}

}  // namespace MC_UNITY_ID
}  // namespace mc::testing
