// Transfers across hosts (issue 20): two network namespaces made by the test, joined by one unshaped veth,
// `mc-xfer serve` in one and the client in the other. The bytes arrive intact over tcp, the client never
// picks shm across namespaces (two namespaces are two hosts), inside the server's own namespace it still does,
// and `bench --baseline` measures its raw tcp against the target's address. Skips with the reason when not
// root or `ip netns` is unavailable; the namespaces and processes go away even when an assertion fails.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mc/testkit/json.hpp"
#include "mc/testkit/netns.hpp"
#include "mc/testkit/process.hpp"

namespace mc::transfer::testing {
using namespace mc::testkit;  // NOLINT: Child, run, ready_field, parse_json, NetnsHosts
namespace {

const std::string kXfer = MC_BINARY_DIR "/bin/mc-xfer";

// Hosts "srv" (10.78.0.1) and "cli" (10.78.0.2) on one veth (veth1a in srv, veth1b in cli).
struct TwoHosts {
  TwoHosts() {
    if (!net.why_not().empty()) return;
    ok = net.add("srv") && net.add("cli") && net.link("srv", "10.78.0.1/24", "cli", "10.78.0.2/24") > 0;
  }
  NetnsHosts net;  // destroyed last: after the Child guards of a test have stopped their processes
  bool ok = false;
};

#define MC_NETNS_OR_SKIP(h)                                                                     \
  do {                                                                                          \
    if (!(h).net.why_not().empty()) GTEST_SKIP() << (h).net.why_not();                          \
    if (!(h).ok) GTEST_SKIP() << "cannot build the two-namespace network: " << (h).net.error(); \
  } while (0)

TEST(XferNetns, ReadWriteVerifyAcrossNamespacesUseTcpNotShm) {
  TwoHosts h;
  MC_NETNS_OR_SKIP(h);
  Child server(
      h.net.in("srv", {kXfer, "serve", "--size", "64MiB", "--listen", "tcp://10.78.0.1:0", "--allow-unauthenticated"}));
  const std::string ready = server.wait_line("ready ", 30000);
  const std::string seg = ready_field(ready, "segment");
  ASSERT_EQ(seg.rfind("10.78.0.1:", 0), 0u) << "the segment must be named by the address it was given: " << ready;
  EXPECT_NE(ready_field(ready, "paths").find("tcp://10.78.0.1:"), std::string::npos) << ready;
  EXPECT_EQ(ready_field(ready, "shm"), "yes") << ready;  // shm-shareable memory: only the host identity keeps it off

  // From the other namespace, transport auto: tcp (another host), and the bytes crossed the veth.
  const uint64_t rx0 = h.net.counter("cli", "veth1b", "rx_bytes");
  auto rd = run(h.net.in("cli", {kXfer, "read", "--target", seg, "--offset", "12345", "--length", "8MiB", "--verify",
                                 "--json", "--timeout-ms", "30000"}),
                60000);
  ASSERT_EQ(rd.exit_code, 0) << rd.out;
  auto j = parse_json(rd);
  EXPECT_EQ(j["transport"], "tcp") << "shm must not be used across network namespaces: " << rd.out;
  EXPECT_EQ(j["verified"], true) << rd.out;
  EXPECT_EQ(j["steps"][0]["transferred_bytes"], 8u << 20) << rd.out;
  EXPECT_GE(h.net.counter("cli", "veth1b", "rx_bytes") - rx0, 8u << 20) << "the 8 MiB did not cross the veth";

  // A write (inverted pattern, read back, restored) from the other namespace, also over tcp.
  auto wr = run(h.net.in("cli", {kXfer, "write", "--target", seg, "--offset", "1MiB", "--length", "3MiB", "--verify",
                                 "--json", "--timeout-ms", "30000"}),
                60000);
  ASSERT_EQ(wr.exit_code, 0) << wr.out;
  auto w = parse_json(wr);
  EXPECT_EQ(w["transport"], "tcp") << wr.out;
  EXPECT_EQ(w["verified"], true) << wr.out;

  // Inside the server's own namespace the same segment is on the same host: shm.
  auto local = run(h.net.in("srv", {kXfer, "read", "--target", seg, "--length", "1MiB", "--verify", "--json"}), 60000);
  ASSERT_EQ(local.exit_code, 0) << local.out;
  EXPECT_EQ(parse_json(local)["transport"], "shm") << local.out;
}

TEST(XferNetns, BenchBaselineRunsRawTcpToTheTargetsHost) {
  TwoHosts h;
  MC_NETNS_OR_SKIP(h);
  Child server(
      h.net.in("srv", {kXfer, "serve", "--size", "32MiB", "--listen", "tcp://10.78.0.1:0", "--allow-unauthenticated"}));
  const std::string seg = ready_field(server.wait_line("ready ", 30000), "segment");
  ASSERT_FALSE(seg.empty());
  const uint64_t rx0 = h.net.counter("cli", "veth1b", "rx_bytes");
  auto b = run(h.net.in("cli", {kXfer, "bench", "--target", seg, "--transport", "tcp", "--block", "64KiB,1MiB",
                                "--duration", "0.3", "--baseline", "--json"}),
               90000);
  ASSERT_EQ(b.exit_code, 0) << b.out;
  auto j = parse_json(b);
  EXPECT_EQ(j["transport"], "tcp");
  EXPECT_EQ(j["baseline_tcp_raw_endpoint"], "tcp://" + seg) << "the raw tcp baseline must run to the target's host";
  EXPECT_FALSE(j.contains("baseline_tcp_raw_note")) << j.dump();
  ASSERT_EQ(j["results"].size(), 2u) << b.out;
  for (const auto& r : j["results"]) {
    EXPECT_GT(r["bytes_per_second"].get<double>(), 0) << r.dump();
    EXPECT_EQ(r["failed_requests"], 0) << r.dump();
    EXPECT_GT(r["ratio_to_limit"].get<double>(), 0) << r.dump();
    EXPECT_GT(r["ratio_to_same_memory"].get<double>(), 0) << r.dump();
  }
  int raw = 0, mem = 0;
  for (const auto& l : j["baseline"]) {
    if (l["kind"] == "tcp_raw_mem") {
      ++mem;
      EXPECT_GT(l["bytes_per_second"].get<double>(), 0) << l.dump();
      // The row's buffers here (batch 32 x block over 4 streams) and the swept 32 MiB segment there.
      EXPECT_EQ(l["span_bytes_per_stream"], 8 * l["block_bytes"].get<uint64_t>()) << l.dump();
      EXPECT_EQ(l["target_span_bytes_per_stream"], 8u << 20) << l.dump();
    }
    if (l["kind"] != "tcp_raw") continue;
    ++raw;
    EXPECT_GT(l["bytes_per_second"].get<double>(), 0) << l.dump();
  }
  EXPECT_EQ(raw, 4) << "raw tcp x1 and x4 for each of the two blocks";
  EXPECT_EQ(mem, 2) << "raw tcp x4 through the row's memory for each of the two blocks";
  // Everything (baseline and rows) crossed the veth: far more than the 32 MiB warm-up.
  EXPECT_GT(h.net.counter("cli", "veth1b", "rx_bytes") - rx0, 64u << 20);
  EXPECT_TRUE(server.running()) << "the server must survive the raw streams' abrupt ends";
}

}  // namespace
}  // namespace mc::transfer::testing
