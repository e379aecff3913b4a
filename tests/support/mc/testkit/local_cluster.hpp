// A test fixture around examples/local-cluster.sh: starts a whole cluster of the real daemons on loopback
// (store master and nodes, the Conductor, prefill and decode instances), reads their endpoints from the
// script's cluster.txt, calls them over RPC, and stops everything on the way out (also when an assertion
// fails): the script runs in its own process group, which gets SIGTERM (its trap stops and reaps the
// daemons, their state directory and /dev/shm files), then SIGKILL after 10 s.
// Used by the e2e tests that need more than one daemon (tests/sched/*_e2e_test.cpp). Only loopback.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/scratch.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::testkit {

inline std::string slurp(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

// A child in its own process group, stdin from /dev/null, stdout and stderr to files; on the way out the
// group gets SIGTERM, then SIGKILL after 10 s.
inline std::unique_ptr<Child> start_group_child(const std::vector<std::string>& argv, const std::string& out_path,
                                                const std::string& err_path) {
  ChildOptions o;
  o.own_process_group = true;
  o.stdin_path = "/dev/null";
  o.stdout_path = out_path;
  o.stderr_path = err_path;
  o.stop_grace_ms = 10000;
  return std::make_unique<Child>(argv, o);
}

// A daemon killed (SIGKILL, a crash) and started again just as it was: waits until `pid` is gone, starts `argv`
// (restart_argv's command line) as a group child, and waits up to timeout_ms for a "ready" line in out_path. Null when
// the old process outlived the kill or the new one printed no ready line (the caller's ASSERT then says so, with
// err_path's text).
inline std::unique_ptr<Child> kill_and_restart(pid_t pid, const std::vector<std::string>& argv,
                                               const std::string& out_path, const std::string& err_path,
                                               int64_t timeout_ms = 30'000) {
  if (pid <= 0 || ::kill(pid, SIGKILL) != 0) return nullptr;  // never kill(0): the test's own process group
  if (!wait_until([&] { return ::kill(pid, 0) != 0; }, 10'000, 10)) return nullptr;
  std::unique_ptr<Child> c = start_group_child(argv, out_path, err_path);
  if (!wait_until([&] { return slurp(out_path).find("ready") != std::string::npos; }, timeout_ms, 50)) return nullptr;
  return c;
}

class LocalClusterFixture : public ::testing::Test {
 protected:
  explicit LocalClusterFixture(const std::string& tag) : s_(tag), client_name_(tag) {}

  static std::string bin() { return MC_BINARY_DIR "/bin"; }

  // Starts local-cluster.sh with `flags` (after --bin and --ready-timeout-s) and waits (180 s at most) until it
  // is up; every name of `required` must then be in its cluster.txt. Skips when a binary is not built.
  void start_cluster(const std::vector<std::string>& flags, const std::vector<std::string>& required) {
    for (const char* tool : {"mc-store", "mc-conductor", "mc-prefill", "mc-decode", "mc-trace-replay"}) {
      if (::access((bin() + "/" + tool).c_str(), X_OK) != 0) GTEST_SKIP() << bin() << "/" << tool << " is not built";
    }
    // The cluster runs until the test creates `done`; CMD prints where its state directory is.
    const std::string cmd = "echo \"$MC_CLUSTER_STATE\" > " + s_.path("state.tmp") + " && mv " + s_.path("state.tmp") +
                            " " + s_.path("state") + "; while [ ! -e " + s_.path("done") + " ]; do sleep 0.1; done";
    std::vector<std::string> argv = {
        "/bin/bash", MC_SOURCE_DIR "/examples/local-cluster.sh", "--bin", bin(), "--ready-timeout-s", "90"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", "/bin/bash", "-c", cmd});
    cluster_ = start_group_child(argv, s_.path("cluster.out"), s_.path("cluster.err"));
    bool exited = false;
    const bool up =
        wait_until([&] { return std::filesystem::exists(s_.path("state")) || (exited = cluster_->wait_exit(0) != -1); },
                   180'000, 100);
    ASSERT_FALSE(exited) << "local-cluster.sh exited before the cluster was up:\n" << slurp(s_.path("cluster.err"));
    ASSERT_TRUE(up) << "cluster not up in 180 s:\n" << slurp(s_.path("cluster.err"));
    std::string state = slurp(s_.path("state"));
    state.erase(state.find_last_not_of("\n ") + 1);
    std::istringstream lines(slurp(state + "/cluster.txt"));
    std::string name, pid, endpoint;
    while (lines >> name >> pid >> endpoint) {
      endpoints_[name] = endpoint;
      pids_[name] = static_cast<pid_t>(std::stol(pid));
    }
    for (const std::string& n : required) {
      ASSERT_TRUE(endpoints_.count(n)) << n << " missing from " << state << "/cluster.txt";
    }
  }

  void TearDown() override {
    if (!cluster_) return;
    std::ofstream(s_.path("done")).put('\n');
    const int rc = cluster_->wait_exit(60'000);
    EXPECT_EQ(rc, 0) << slurp(s_.path("cluster.err"));
    cluster_.reset();
  }

  // One call to the daemon `name` of cluster.txt (10 s to connect and to answer); a default reply, with a
  // failed expectation, when it fails.
  template <typename Req>
  typename Req::Reply call(const std::string& name, const Req& req) {
    rpc::ClientOptions o;
    o.client_name = client_name_;
    o.connect_timeout_ms = 10000;
    auto client = rpc::RpcClient::connect(endpoints_.at(name), o);
    EXPECT_TRUE(client.is_ok()) << name << ": " << client.status().to_string();
    if (!client.is_ok()) return {};
    auto reply = (*client)->call(req, 10000);
    EXPECT_TRUE(reply.is_ok()) << name << ": " << reply.status().to_string();
    return reply.is_ok() ? reply.value() : typename Req::Reply{};
  }
  nlohmann::json conductor_status() {
    return nlohmann::json::parse(call("conductor", proto::ConductorStatusRequest{true}).status_json, nullptr, false);
  }
  // The prompt tokens a record's ledger says came from the cache (local, remote and SSD).
  static int64_t hit_tokens(const nlohmann::json& record) {
    const nlohmann::json& l = record.value("ledger", nlohmann::json::object());
    return l.value("hit_tokens_local", int64_t{0}) + l.value("hit_tokens_remote", int64_t{0}) +
           l.value("hit_tokens_ssd", int64_t{0});
  }

  Scratch s_;
  std::string client_name_;
  std::unique_ptr<Child> cluster_;
  std::map<std::string, std::string> endpoints_;
  std::map<std::string, pid_t> pids_;  // name -> pid, from cluster.txt (e.g. to kill one in a fault test)
};

}  // namespace mc::testkit
