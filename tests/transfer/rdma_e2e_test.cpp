// The rdma transport on a host with an RDMA device (label rdma): mc-xfer serve + read/write --verify over
// rdma, and failover rdma -> tcp inside one process. Every test skips, saying why, where ibverbs finds no
// device (the development machines: no RDMA NIC, no soft-RoCE) or where this build has no rdma transport.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "mc/proto/transfer.hpp"
#include "mc/testkit/json.hpp"
#include "mc/testkit/process.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/shared_buffer.hpp"
#include "mc/transfer/xfer_tool.hpp"

#ifdef MC_TRANSFER_HAVE_RDMA
#include <infiniband/verbs.h>
#endif

namespace mc::transfer::testing {
using namespace mc::testkit;  // NOLINT: Child, run, ready_field, parse_json
namespace {

const std::string kXfer = MC_BINARY_DIR "/bin/mc-xfer";

// "" when the tests can run; otherwise the reason to skip. Only "there is no device" skips: once
// ibv_get_device_list lists one, every later failure (no ACTIVE port, no usable GID, a refused handshake,
// ibv_reg_mr over RLIMIT_MEMLOCK) fails the test with the engine's message.
std::string skip_reason() {
#ifdef MC_TRANSFER_HAVE_RDMA
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l == nullptr) {
    // NULL, not an empty list: the kernel has no RDMA support (no ib_uverbs: EPROTONOSUPPORT or ENOSYS).
    return std::string("no RDMA device: ibv_get_device_list failed: ") + std::strerror(errno);
  }
  ibv_free_device_list(l);
  if (n == 0) return "no RDMA device: ibv_get_device_list returned 0";
  return "";
#else
  return "rdma transport not built (libibverbs not found at configure time)";
#endif
}

#define MC_REQUIRE_RDMA()                  \
  do {                                     \
    const std::string why = skip_reason(); \
    if (!why.empty()) GTEST_SKIP() << why; \
  } while (0)

TEST(RdmaE2E, ServeReadWriteVerify) {
  MC_REQUIRE_RDMA();
  Child server({kXfer, "serve", "--size", "64MiB", "--listen", "tcp://127.0.0.1:0"});
  const std::string line = server.wait_line("ready ", 30000);
  const std::string segment = ready_field(line, "segment");
  ASSERT_FALSE(segment.empty()) << "no ready line: " << line;
  auto rd = run({kXfer, "read", "--target", segment, "--offset", "12345", "--length", "5MiB", "--verify", "--transport",
                 "rdma", "--json"},
                30000);
  ASSERT_EQ(rd.exit_code, 0) << rd.out;
  auto j = parse_json(rd);
  EXPECT_EQ(j["transport"], "rdma");
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["steps"][0]["transferred_bytes"], 5u << 20);
  auto wr = run({kXfer, "write", "--target", segment, "--offset", "1MiB", "--length", "3MiB", "--verify", "--transport",
                 "rdma", "--json"},
                30000);
  ASSERT_EQ(wr.exit_code, 0) << wr.out;
  EXPECT_EQ(parse_json(wr)["verified"], true);
  // Bad requests fail with an error and the server keeps serving.
  auto past =
      run({kXfer, "read", "--target", segment, "--offset", "64MiB", "--length", "1", "--transport", "rdma"}, 30000);
  EXPECT_NE(past.exit_code, 0);
  auto again = run({kXfer, "read", "--target", segment, "--length", "8MiB", "--verify", "--transport", "rdma"}, 30000);
  EXPECT_EQ(again.exit_code, 0) << again.out;
}

// Every RDMA operation fails (the published rkeys are wrong, so the target's NIC answers with a remote
// access error): the slices move to the segment's tcp fallback paths and the read completes, verified.
TEST(RdmaE2E, FailoverRdmaToTcp) {
  MC_REQUIRE_RDMA();
  EngineOptions so;
  so.listen = {"tcp://127.0.0.1:0"};
  auto server = TransferEngine::create(so);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  const uint64_t size = 16 << 20;
  auto sbuf = allocate_shared_buffer(size).value();
  xfer::fill_pattern(static_cast<char*>(sbuf.data()), 0, size);
  ASSERT_TRUE(server.value()->register_memory(sbuf.data(), size).is_ok());
  proto::SegmentDescriptor desc = server.value()->local_descriptor();
  ASSERT_FALSE(desc.rdma_devices.empty()) << "the server published no rdma device";
  for (auto& r : desc.regions) {
    ASSERT_FALSE(r.rdma_rkeys.empty());
    for (auto& k : r.rdma_rkeys) k ^= 0x5a5a5a;
  }
  EngineOptions co;
  co.transports = {"rdma"};
  co.quarantine.initial_backoff_ms = 60000;  // no probe brings a broken rdma path back during the test
  auto client = TransferEngine::create(co);
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto seg = client.value()->open_segment(desc);
  ASSERT_TRUE(seg.is_ok()) << seg.status().to_string();
  ASSERT_EQ(client.value()->segment_transport(seg.value()).value(), "rdma");
  std::vector<char> local(size);
  ASSERT_TRUE(client.value()->register_memory(local.data(), size).is_ok());
  auto st = client.value()->transfer_sync({Op::kRead, local.data(), seg.value(), 0, size, ""}, 30000);
  ASSERT_EQ(st.state, TransferState::kCompleted) << st.status.to_string();
  EXPECT_EQ(xfer::find_pattern_mismatch(local.data(), 0, size), -1);
  EXPECT_GT(st.retried_slices, 0u) << "the first slices went to rdma and failed";
  uint64_t tcp_bytes = 0;
  auto stats = client.value()->path_stats(seg.value());
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  for (const auto& p : stats.value()) {
    if (p.state.label.find("tcp-fallback") != std::string::npos) tcp_bytes += p.state.bytes_done;
  }
  EXPECT_EQ(tcp_bytes, size) << "every byte moved over the tcp fallback";
}

}  // namespace
}  // namespace mc::transfer::testing
