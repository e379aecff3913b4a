// Failover of the replicated store master (issue 21, docs/RELIABILITY.md "Master failover"): a benchmark, not a test
// (never run by ctest; tests/bench/ha_bench.sh runs it). A real etcd on loopback, two `mc-store master --etcd`, one
// storage node and a client that puts 4 KiB objects without pause; the leader is killed with SIGKILL MC_HA_KILLS
// times (default 20), each time restarted as a standby once the other took over. Per kill: the takeover (kill -> etcd
// names the new leader) and the reattach (takeover -> the client's first put acknowledged by the new leader), the puts
// that failed and those delayed past 1 s. At the end every acknowledged put is read back: lost and wrong must be 0 (the
// node holds 512 MiB, more than the puts of the run: nothing is evicted). The next kill waits until the client has put
// through the new leader.
// Output: one line per kill and a summary (median and max), on stdout; MC_HA_JSON=1 adds a JSON line.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/clock.hpp"
#include "mc/coord/leader.hpp"
#include "mc/store/client.hpp"
#include "mc/testkit/etcd.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace {

using namespace mc;

const std::string kBin = MC_BINARY_DIR "/bin/mc-store";

int64_t now_ms() { return mc::steady_ms(); }

std::vector<std::byte> bytes_of(size_t n, uint64_t seed) { return testkit::seeded_bytes(n, seed); }

struct Op {
  int64_t start_ms = 0, end_ms = 0;
  bool ok = false;
  std::string error;  // a failed put's status
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

TEST(HaFailoverBench, KillTheLeaderRepeatedly) {
  if (!testkit::EtcdCluster::installed()) GTEST_SKIP() << testkit::EtcdCluster::kNotInstalled;
  const int kills = std::max(1, std::atoi(std::getenv("MC_HA_KILLS") ? std::getenv("MC_HA_KILLS") : "20"));
  const std::string lease_s = std::getenv("MC_HA_LEASE_S") ? std::getenv("MC_HA_LEASE_S") : "2";
  testkit::EtcdCluster etcd(1, "ha_bench");
  ASSERT_TRUE(etcd.start()) << etcd.error();
  const std::string cluster = "bench" + std::to_string(::getpid());
  std::map<std::string, std::unique_ptr<testkit::Child>> masters;
  std::map<std::string, std::string> endpoint_of;  // name -> RPC endpoint
  const auto start_master = [&](const std::string& name) {
    testkit::ChildOptions o;
    o.stdout_path = "";  // piped: the ready line
    masters[name] = std::make_unique<testkit::Child>(
        std::vector<std::string>{kBin, "--log-level", "error", "master", "--listen", "tcp://127.0.0.1:0", "--events",
                                 "tcp://127.0.0.1:0", "--etcd", etcd.endpoints(), "--cluster-id", cluster,
                                 "--leader-lease-s", lease_s},
        o);
    std::istringstream w(masters[name]->wait_line("ready ", 30000));
    std::string word;
    for (int i = 0; w >> word; ++i) {
      if (i == 2) endpoint_of[name] = word;
    }
  };
  auto locator = LeaderLocator::create(LeaderAddress{"", etcd.endpoints(), cluster});
  ASSERT_TRUE(locator.is_ok());
  const auto leader_name = [&]() -> std::string {
    auto l = (*locator)->leader(10000);
    if (!l.is_ok()) return "";
    for (const auto& [name, ep] : endpoint_of) {
      if (ep == l->endpoint) return name;
    }
    return "";
  };
  start_master("a");
  ASSERT_TRUE(testkit::wait_until([&] { return leader_name() == "a"; }, 20000, 20));
  start_master("b");
  testkit::ChildOptions no;
  no.stdout_path = "";
  testkit::Child node({kBin, "--log-level", "error", "serve", "--etcd", etcd.endpoints(), "--cluster-id", cluster,
                       "--node-id", cluster + "-n1", "--dram-bytes", "512MiB", "--heartbeat-ms", "200"},
                      no);
  ASSERT_FALSE(node.wait_line("ready ", 30000).empty());

  store::ClientOptions co;
  co.etcd = etcd.endpoints();
  co.cluster_id = cluster;
  auto client = store::Client::connect(co);
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  constexpr size_t kSize = 4096;
  std::mutex mu;
  std::vector<Op> ops;
  std::map<std::string, uint64_t> acked;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t i = 0; !stop.load() && i < 10'000'000; ++i) {
      const std::string key = "bench/" + std::to_string(i);
      Op op;
      op.start_ms = now_ms();
      Status st = (*client)->put(key, bytes_of(kSize, i));
      op.ok = st.is_ok();
      if (!op.ok) op.error = st.to_string();
      op.end_ms = now_ms();
      std::lock_guard<std::mutex> lock(mu);
      ops.push_back(op);
      if (op.ok) acked[key] = i;
    }
  });

  struct Kill {
    int64_t kill_ms = 0, takeover_ms = 0;
  };
  std::vector<Kill> done;
  for (int k = 0; k < kills; ++k) {
    // Steady state between kills (pacing, not synchronisation: the next kill waits for the standby below).
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const std::string victim = leader_name();
    ASSERT_FALSE(victim.empty()) << "no leader before kill " << k;
    const uint64_t gen = (*locator)->generation();
    Kill kill;
    kill.kill_ms = now_ms();
    masters[victim]->signal(SIGKILL);
    ASSERT_TRUE((*locator)->wait_change(gen, 30000)) << "no takeover after kill " << k;
    kill.takeover_ms = now_ms();
    done.push_back(kill);
    // The next kill only once the client has put through the new leader (bounded): a kill during a reattach
    // would measure two faults at once.
    testkit::wait_until(
        [&] {
          std::lock_guard<std::mutex> lock(mu);
          return !ops.empty() && ops.back().ok && ops.back().end_ms >= kill.takeover_ms;
        },
        15000, 5);
    masters[victim].reset();
    endpoint_of.erase(victim);
    start_master(victim);  // back as a standby
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  writer.join();

  // Per kill: reattach = takeover -> the first put acknowledged after it; failed and delayed puts around it.
  std::vector<double> takeovers, reattaches;
  uint64_t failed = 0, delayed = 0;
  for (size_t k = 0; k < done.size(); ++k) {
    const Kill& kill = done[k];
    const int64_t next_kill = k + 1 < done.size() ? done[k + 1].kill_ms : INT64_MAX;
    int64_t first_ok = 0;
    uint64_t f = 0, d = 0;
    std::string why;
    for (const Op& op : ops) {
      if (op.end_ms < kill.kill_ms || op.end_ms >= next_kill) continue;  // each put in the window it ended in
      if (!op.ok) ++f;
      if (!op.ok && why.empty()) why = op.error;
      if (op.ok && op.end_ms - op.start_ms > 1000) ++d;
      if (op.ok && op.end_ms >= kill.takeover_ms && first_ok == 0) first_ok = op.end_ms;
    }
    takeovers.push_back(static_cast<double>(kill.takeover_ms - kill.kill_ms));
    reattaches.push_back(first_ok ? static_cast<double>(first_ok - kill.takeover_ms) : 1e9);
    failed += f;
    delayed += d;
    std::printf("kill %2zu: takeover %5lld ms, reattach %5lld ms after it, %llu puts failed, %llu delayed > 1 s\n",
                k + 1, static_cast<long long>(kill.takeover_ms - kill.kill_ms),
                static_cast<long long>(first_ok ? first_ok - kill.takeover_ms : -1), static_cast<unsigned long long>(f),
                static_cast<unsigned long long>(d));
    if (!why.empty()) std::printf("         first failure: %s\n", why.substr(0, 300).c_str());
  }
  // Every acknowledged put reads back exactly.
  uint64_t lost = 0, wrong = 0;
  for (const auto& [key, seed] : acked) {
    auto got = (*client)->get(key);
    if (!got.is_ok()) {
      ++lost;
    } else if (*got != bytes_of(kSize, seed)) {
      ++wrong;
    }
  }
  std::printf(
      "%d kills (lease %s s): takeover median %.0f ms, max %.0f ms; reattach median %.0f ms, max %.0f ms after "
      "the takeover; puts %zu (%zu acknowledged), failed %llu, delayed > 1 s %llu; acknowledged puts lost "
      "%llu, wrong %llu\n",
      kills, lease_s.c_str(), percentile(takeovers, 0.5), percentile(takeovers, 1.0), percentile(reattaches, 0.5),
      percentile(reattaches, 1.0), ops.size(), acked.size(), static_cast<unsigned long long>(failed),
      static_cast<unsigned long long>(delayed), static_cast<unsigned long long>(lost),
      static_cast<unsigned long long>(wrong));
  if (std::getenv("MC_HA_JSON") != nullptr) {
    nlohmann::json j = {{"kills", kills},
                        {"lease_s", std::stod(lease_s)},
                        {"takeover_ms_median", percentile(takeovers, 0.5)},
                        {"takeover_ms_max", percentile(takeovers, 1.0)},
                        {"reattach_ms_median", percentile(reattaches, 0.5)},
                        {"reattach_ms_max", percentile(reattaches, 1.0)},
                        {"puts", ops.size()},
                        {"acknowledged", acked.size()},
                        {"failed", failed},
                        {"delayed_1s", delayed},
                        {"lost", lost},
                        {"wrong", wrong}};
    std::printf("%s\n", j.dump().c_str());
  }
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
