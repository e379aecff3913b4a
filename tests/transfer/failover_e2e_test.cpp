// Failover across real links: two network namespaces joined by two veth pairs (created and removed by
// the test; skipped with the reason when not root). One link down mid-transfer -> the transfer completes
// and verifies over the other; both down -> it fails within its timeout, naming the paths.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::transfer::testing {
using namespace mc::testkit;  // NOLINT: Child, run, ready_field, wait_until
namespace {

const std::string kXferBinary = MC_BINARY_DIR "/bin/mc-xfer";

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Namespaces a (client) and b (server), links 10.201.1.0/24 and 10.201.2.0/24, each shaped to 1 Gbit/s on
// the client side so a 256 MiB transfer lasts about a second. Removed in the destructor.
struct TwoLinkNetns {
  TwoLinkNetns() {
    const std::string id = std::to_string(getpid() % 100000);
    a = "mcxa" + id;
    b = "mcxb" + id;
    for (int i = 0; i < 2; ++i) {
      va[i] = "mxa" + std::to_string(i) + "-" + id;
      vb[i] = "mxb" + std::to_string(i) + "-" + id;
    }
    std::vector<std::string> cmds = {"ip netns add " + a, "ip netns add " + b, "ip -n " + a + " link set lo up",
                                     "ip -n " + b + " link set lo up"};
    for (int i = 0; i < 2; ++i) {
      const std::string net = "10.201." + std::to_string(i + 1);
      cmds.push_back("ip link add " + va[i] + " netns " + a + " type veth peer name " + vb[i] + " netns " + b);
      cmds.push_back("ip -n " + a + " addr add " + net + ".1/24 dev " + va[i]);
      cmds.push_back("ip -n " + b + " addr add " + net + ".2/24 dev " + vb[i]);
      cmds.push_back("ip -n " + a + " link set " + va[i] + " up");
      cmds.push_back("ip -n " + b + " link set " + vb[i] + " up");
      cmds.push_back("ip netns exec " + a + " tc qdisc add dev " + va[i] +
                     " root tbf rate 1gbit burst 256kb latency 100ms");
    }
    for (const auto& c : cmds) {
      if (!sh(c)) {
        error = "setup command failed: " + c;
        return;
      }
    }
    ok = true;
  }
  ~TwoLinkNetns() {
    sh("ip netns del " + a);
    sh("ip netns del " + b);
  }
  bool link(int i, bool up) { return sh("ip -n " + a + " link set " + va[i] + (up ? " up" : " down")); }
  // The first line of /sys/class/net/<client side of link i>/<file>, read inside namespace a ("" when
  // unreadable).
  std::string client_sys(int i, const std::string& file) {
    std::string out;
    FILE* p = popen(("ip netns exec " + a + " cat /sys/class/net/" + va[i] + "/" + file).c_str(), "r");
    if (p == nullptr) return out;
    char buf[64] = {0};
    if (fgets(buf, sizeof buf, p) != nullptr) out = buf;
    pclose(p);
    return out;
  }
  // Bytes received so far on the client side of link i.
  uint64_t rx_bytes(int i) {
    const std::string out = client_sys(i, "statistics/rx_bytes");
    return out.empty() ? 0 : std::stoull(out);
  }
  // Waits (bounded) until link i has carried at least `bytes` more than `base`.
  bool wait_rx(int i, uint64_t base, uint64_t bytes, int64_t timeout_ms) {
    return wait_until([&] { return rx_bytes(i) >= base + bytes; }, timeout_ms, 20);
  }
  // Waits (bounded) until the client side of link i reports operstate "up" (carrier back after link(i, true)).
  bool wait_up(int i, int64_t timeout_ms) {
    return wait_until([&] { return client_sys(i, "operstate").rfind("up", 0) == 0; }, timeout_ms, 20);
  }

  std::string a, b, va[2], vb[2], error;
  bool ok = false;
};

TEST(XferFailover, OneLinkDownCompletesBothDownFails) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces and veth pairs (ip netns add)";
  TwoLinkNetns net;
  if (!net.ok) GTEST_SKIP() << "cannot build the two-link network: " << net.error;
  Child server({"ip", "netns", "exec", net.b, kXferBinary, "serve", "--size", "256MiB", "--listen",
                "tcp://10.201.1.2:0", "--listen", "tcp://10.201.2.2:0",
                "--allow-unauthenticated"});  // addresses of this test's namespaces
  const std::string ready = server.wait_line("ready ", 30000);
  const std::string seg = ready_field(ready, "segment");
  ASSERT_FALSE(seg.empty()) << "server not ready: " << ready;
  ASSERT_NE(ready_field(ready, "paths").find("10.201.2.2"), std::string::npos) << ready;

  // 1. One link down in the middle: completes and verifies over the other path.
  {
    const uint64_t base = net.rx_bytes(1);
    Child client({"ip", "netns", "exec", net.a, kXferBinary, "read", "--target", seg, "--length", "256MiB", "--verify",
                  "--transport", "tcp", "--timeout-ms", "60000", "--json"});
    // Mid-transfer: once the second link has carried 8 MiB of this read.
    ASSERT_TRUE(net.wait_rx(1, base, 8u << 20, 30000)) << "the transfer did not start on link 2";
    ASSERT_TRUE(net.link(1, false));
    std::string out;
    int status = client.finish(90000, &out);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 0) << out;
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_EQ(j["verified"], true) << out;
    EXPECT_EQ(j["steps"][0]["transferred_bytes"], 256u << 20);
    uint64_t on_link1 = 0, on_link2 = 0;
    for (const auto& s : j["steps"][0]["slices"]) {
      const std::string p = s["path"];
      (p.find("10.201.1.2") != std::string::npos ? on_link1 : on_link2) += s["length_bytes"].get<uint64_t>();
    }
    EXPECT_GT(on_link2, 0u) << "the second link carried slices before it went down";
    EXPECT_GT(on_link1, on_link2);
  }
  // 2. Both links down in the middle: fails within its timeout with the reason.
  {
    ASSERT_TRUE(net.link(1, true));
    ASSERT_TRUE(net.wait_up(1, 5000)) << "link 2 did not come back up";
    Child client({"ip", "netns", "exec", net.a, kXferBinary, "read", "--target", seg, "--length", "256MiB",
                  "--transport", "tcp", "--timeout-ms", "20000", "--json"});
    ASSERT_TRUE(net.wait_rx(0, net.rx_bytes(0), 8u << 20, 30000)) << "the transfer did not start";
    ASSERT_TRUE(net.link(0, false));
    ASSERT_TRUE(net.link(1, false));
    const int64_t t0 = mono_ms();
    std::string out;
    int status = client.finish(40000, &out);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "client hung or crashed: " << out;
    EXPECT_EQ(WEXITSTATUS(status), 1) << out;
    EXPECT_LT(mono_ms() - t0, 25000);
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    const std::string err = j["error"].value("message", "");
    EXPECT_TRUE(err.find("no path left") != std::string::npos || err.find("not done within") != std::string::npos)
        << err;
    EXPECT_NE(err.find("10.201.1.2"), std::string::npos) << err;
    EXPECT_NE(err.find("10.201.2.2"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace mc::transfer::testing
