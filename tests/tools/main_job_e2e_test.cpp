// examples/replay-conversation.sh, the main job (issue 20 item 5), on a 10 s window: the cluster of
// examples/clusters/main-job.json sized as the modelled 8xA800 node (mc-plan node), the window replayed with the
// prefix cache on and again with it off, and the side-by-side table with a number in both columns. Built twice:
// main_job_e2e_test (label e2e) runs it on loopback, main_job_netns_e2e_test (label netns, MC_MAIN_JOB_NETNS) with
// every host a network namespace and --json (skips with the reason when not root or `ip netns` is unavailable).
// Afterwards no daemon of the run (found by a tag in its environment), no namespace and no /dev/shm file is left.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "mc/testkit/local_cluster.hpp"
#include "mc/testkit/netns.hpp"
#include "mc/testkit/process.hpp"

namespace mc::testing {
using namespace mc::testkit;  // NOLINT: run, Scratch, slurp, NetnsHosts
namespace {

namespace fs = std::filesystem;
const std::string kBin = MC_BINARY_DIR "/bin";

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::set<std::string> netns_list() {
  std::set<std::string> out;
  std::istringstream in(run({"/bin/bash", "-c", "ip netns list 2>/dev/null | awk '{print $1}'"}, 10000).out);
  for (std::string n; in >> n;) out.insert(n);
  return out;
}

// Processes whose environment holds `tag` (every daemon the script started inherits it).
std::vector<std::string> tagged_processes(const std::string& tag) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (all.find(tag) != std::string::npos) {
      std::ifstream comm(e.path() / "comm");
      std::string name;
      std::getline(comm, name);
      out.push_back(pid + " " + name);
    }
  }
  return out;
}

// The two numbers after a row's label in the side-by-side table ("TTFT mean (ms)   123   456").
bool two_numbers(const std::string& out, const std::string& label, double& on, double& off) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(label, 0) != 0) continue;
    std::istringstream rest(line.substr(label.size()));
    return static_cast<bool>(rest >> on >> off);
  }
  return false;
}

// Two suite names, one per program: ctest knows a test by its name, and the properties of one (labels, the netns
// lock) would otherwise land on both.
#ifdef MC_MAIN_JOB_NETNS
#define MC_MAIN_JOB_SUITE MainJobNetns
#else
#define MC_MAIN_JOB_SUITE MainJob
#endif

TEST(MC_MAIN_JOB_SUITE, CacheOnAndOffSideBySideAndNothingLeft) {
#ifdef MC_MAIN_JOB_NETNS
  const bool netns = true;
  {
    NetnsHosts probe;
    if (!probe.why_not().empty()) GTEST_SKIP() << probe.why_not();
  }
#else
  const bool netns = false;
#endif
  for (const char* tool :
       {"mc-store", "mc-conductor", "mc-prefill", "mc-decode", "mc-auth", "mc-trace-replay", "mc-plan"}) {
    if (::access((kBin + "/" + tool).c_str(), X_OK) != 0) GTEST_SKIP() << kBin << "/" << tool << " is not built";
  }
  if (std::system("command -v jq >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs jq (tools/install-deps.sh)";
  Scratch s(netns ? "main_job_netns" : "main_job");
  const std::string tag = "MC_MAIN_JOB_TEST_TAG=" + std::to_string(::getpid()) + (netns ? "n" : "l");
  const auto shm_before = entries("/dev/shm");
  const auto ns_before = netns_list();
  auto r = run({"/bin/bash", "-c",
                "env " + tag + " MC_KEEP_LOGS=" + s.path("logs") +
                    " /bin/bash " MC_SOURCE_DIR "/examples/replay-conversation.sh --duration-s 10 --mode " +
                    (netns ? "netns --json" : "loopback") + " --build-dir " MC_BINARY_DIR " --out " +
                    s.path("records.jsonl") + " --html " + s.path("report.html") + " 2> " + s.path("stderr.txt")},
               280000);
  const std::string err = slurp(s.path("stderr.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.out << err;
  // The header states the mode, the scale and the modelled capacities in tokens.
  EXPECT_NE(err.find(netns ? "mode netns" : "mode loopback"), std::string::npos) << err;
  EXPECT_NE(err.find("scale: 256 (live 1280 B per token)"), std::string::npos) << err;
  EXPECT_NE(err.find("tokens per instance"), std::string::npos) << err;

  if (netns) {
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["mode"], "netns");
    EXPECT_GT(j["node"]["decode_kv_tokens"].get<int64_t>(), 1'400'000) << j["node"].dump();
    EXPECT_GT(j["analyze"]["hit_ratio_bound"].get<double>(), 0.0);
    for (const char* run : {"cache_on", "cache_off"}) {
      ASSERT_TRUE(j[run].is_object()) << run;
      EXPECT_GT(j[run]["requests"]["offered"].get<int64_t>(), 0) << run;
      EXPECT_GT(j[run]["requests"]["completed"].get<int64_t>(), 0) << run;
      EXPECT_TRUE(j[run]["ttft_ms"]["mean"].is_number()) << run;
      EXPECT_GT(j[run]["prefill_gpu_s"].get<double>(), 0.0) << run;
    }
    EXPECT_EQ(j["cache_off"]["cache"]["hit_ratio"].get<double>(), 0.0);
  } else {
    // Both columns carry numbers.
    EXPECT_NE(r.out.find("what the cache bought"), std::string::npos) << r.out;
    for (const char* label : {"requests offered", "completed", "prefill GPU-s (ledger prefill_ms x GPUs)",
                              "TTFT mean (ms)", "TTFT p90 (ms)", "hit ratio (% of prompt tokens)"}) {
      double on = -1, off = -1;
      EXPECT_TRUE(two_numbers(r.out, label, on, off)) << label << " in\n" << r.out;
      EXPECT_GE(on, 0) << label;
      EXPECT_GE(off, 0) << label;
    }
    double on = 0, off = 0;
    ASSERT_TRUE(two_numbers(r.out, "hit ratio (% of prompt tokens)", on, off)) << r.out;
    EXPECT_EQ(off, 0.0) << "the cache-off run hit the cache:\n" << r.out;
    ASSERT_TRUE(two_numbers(r.out, "prefill GPU-s (ledger prefill_ms x GPUs)", on, off)) << r.out;
    EXPECT_GT(on, 0.0) << r.out;
    EXPECT_GT(off, 0.0) << r.out;
  }
  // The HTML report of both runs, where stderr says (drawn by gnuplot; without it, stderr says why there is none).
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_NE(err.find("HTML report: " + s.path("report.html")), std::string::npos) << err;
    const std::string html = slurp(s.path("report.html"));
    EXPECT_NE(html.find("data-chart=\"ttft_cdf\" data-series=\"2\""), std::string::npos)
        << "no TTFT CDF with a curve per run";
  } else {
    EXPECT_NE(err.find("no HTML report: gnuplot is missing"), std::string::npos) << err;
  }
  // --out kept both runs' records.
  EXPECT_TRUE(fs::exists(s.path("records.jsonl")));
  EXPECT_TRUE(fs::exists(s.path("records.cache-off.jsonl")));

  // Nothing is left: no process of the run, no namespace, no /dev/shm file.
  const auto left = tagged_processes(tag);
  EXPECT_TRUE(left.empty()) << "outlived the script: " << left.front();
  // (netns mode only: the loopback run makes none, and other tests may make theirs meanwhile; the namespace tests
  // share the ctest lock "netns")
  if (netns) {
    for (const auto& n : netns_list()) {
      // cluster.sh's names: mc<its pid>-host-NAME, mc<its pid>-switch-RACK, mc<its pid>-router
      const bool launchers = n.size() > 3 && n.rfind("mc", 0) == 0 && std::isdigit(static_cast<unsigned char>(n[2]));
      EXPECT_TRUE(!launchers || ns_before.count(n)) << "namespace " << n << " outlived the script";
    }
  }
  for (const auto& f : entries("/dev/shm")) EXPECT_TRUE(shm_before.count(f)) << "/dev/shm/" << f << " was left";
}

}  // namespace
}  // namespace mc::testing
