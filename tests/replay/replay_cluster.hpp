// The replay e2e tests' shared part (replay_e2e_test.cpp, replay_ref_e2e_test.cpp): examples/local-cluster.sh with
// mc-trace-replay inside, run in its own process group (RAII: no daemon outlives a failed test), and its records.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/replay/analyze.hpp"
#include "mc/report/report.hpp"
#include "mc/testkit/process.hpp"

namespace mc::replay::e2e {

using json = nlohmann::json;
using namespace std::chrono_literals;

inline const std::string kBin = MC_BINARY_DIR "/bin";
inline const std::string kScript = MC_SOURCE_DIR "/examples/local-cluster.sh";
inline const std::string kTrace = MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl";

// Why the cluster cannot be composed from this build, or "" when it can.
inline std::string cluster_unavailable() {
  for (const char* tool : {"mc-store", "mc-conductor", "mc-prefill", "mc-decode", "mc-trace-replay"}) {
    if (::access((kBin + "/" + tool).c_str(), X_OK) != 0) return kBin + "/" + tool + " is not built";
  }
  for (const char* tool : {"mc-prefill", "mc-decode"}) {
    std::string cmd = kBin + "/" + tool + " --help 2>/dev/null | grep -q -- --conductor";
    if (std::system(cmd.c_str()) != 0)
      return std::string(tool) +
             " has no --conductor flag: the workers cannot register with mc-conductor in this build";
  }
  return "";
}

inline std::string slurp(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

struct Scratch {
  std::string dir;
  Scratch() {
    dir = ::testing::TempDir() + "replay_e2e_" + std::to_string(::getpid()) + "_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir);
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

struct ClusterRun {
  int rc = -1;
  json summary;
  std::vector<json> records;
  std::string err;
};

// local-cluster.sh CLUSTER_ARGS -- CMD: the cluster's stdout/stderr go to TAG.out/TAG.err.
inline int run_cluster_command(const Scratch& s, const std::string& tag, const std::vector<std::string>& cluster_args,
                               const std::vector<std::string>& cmd) {
  std::vector<std::string> argv = {"/bin/bash", kScript, "--bin", kBin, "--ready-timeout-s", "60"};
  argv.insert(argv.end(), cluster_args.begin(), cluster_args.end());
  argv.push_back("--");
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  // Its own process group: on the way out the group gets SIGTERM (the script's trap stops and reaps its
  // daemons), then SIGKILL after 10 s.
  testkit::ChildOptions o;
  o.own_process_group = true;
  o.stdin_path = "/dev/null";
  o.stdout_path = s.path(tag + ".out");
  o.stderr_path = s.path(tag + ".err");
  o.stop_grace_ms = 10000;
  testkit::Child child(argv, o);
  return child.wait_exit(150'000);
}

inline ClusterRun read_run(const Scratch& s, const std::string& tag, int rc, const std::string& summary_path) {
  ClusterRun r;
  r.rc = rc;
  r.err = slurp(s.path(tag + ".err"));
  try {
    r.summary = json::parse(slurp(summary_path));
  } catch (const std::exception&) {
  }
  std::ifstream in(s.path(tag + ".jsonl"));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) r.records.push_back(json::parse(line));
  return r;
}

inline std::vector<std::string> replay_command(const Scratch& s, const std::string& tag,
                                               const std::vector<std::string>& replay_args) {
  std::vector<std::string> cmd = {kBin + "/mc-trace-replay", kTrace,         "--json", "--out",
                                  s.path(tag + ".jsonl"),    "--no-progress"};
  cmd.insert(cmd.end(), replay_args.begin(), replay_args.end());
  return cmd;
}

// local-cluster.sh CLUSTER_ARGS -- mc-trace-replay TRACE REPLAY_ARGS --json --out TAG.jsonl
inline ClusterRun run_on_cluster(const Scratch& s, const std::string& tag, const std::vector<std::string>& cluster_args,
                                 const std::vector<std::string>& replay_args) {
  int rc = run_cluster_command(s, tag, cluster_args, replay_command(s, tag, replay_args));
  return read_run(s, tag, rc, s.path(tag + ".out"));
}

inline int count_shm_files(const std::string& marker) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().find(marker) != std::string::npos) ++n;
  return n;
}

}  // namespace mc::replay::e2e
