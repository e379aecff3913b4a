// End-to-end: the real mc-xfer binaries on loopback. serve + read/write --verify over tcp and shm,
// multi-path over 127.0.0.1 and 127.0.0.2, bad requests (the server keeps serving), the serving process
// killed mid-transfer, bench and topo JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mc/common/location.hpp"
#include "mc/testkit/json.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::transfer::testing {
using namespace mc::testkit;  // NOLINT: Child, run, ready_field, parse_json, wait_until
namespace {

const std::string kXfer = MC_BINARY_DIR "/bin/mc-xfer";

struct Server {
  explicit Server(std::vector<std::string> extra, const std::string& size = "64MiB") {
    std::vector<std::string> argv = {kXfer, "serve", "--size", size};
    argv.insert(argv.end(), extra.begin(), extra.end());
    child = std::make_unique<Child>(argv);
    line = child->wait_line("ready ", 30000);
    segment = ready_field(line, "segment");
  }
  std::unique_ptr<Child> child;
  std::string line;
  std::string segment;
};

// Bytes process `pid` has passed to read()/readv() so far (rchar of /proc/PID/io; 0 when unreadable).
uint64_t read_chars(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/io");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

class XferE2E : public ::testing::TestWithParam<std::string> {};

TEST_P(XferE2E, ServeReadWriteVerify) {
  Server s({"--listen", "tcp://127.0.0.1:0"});
  ASSERT_FALSE(s.segment.empty()) << "no ready line: " << s.line;
  EXPECT_NE(s.line.find("shm=yes"), std::string::npos) << s.line;
  auto rd = run({kXfer, "read", "--target", s.segment, "--offset", "12345", "--length", "5MiB", "--verify",
                 "--transport", GetParam(), "--json"},
                30000);
  ASSERT_EQ(rd.exit_code, 0) << rd.out;
  auto j = parse_json(rd);
  EXPECT_EQ(j["transport"], GetParam());
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["steps"][0]["transferred_bytes"], 5u << 20);
  EXPECT_EQ(j["steps"][0]["state"], "completed");
  auto wr = run({kXfer, "write", "--target", s.segment, "--offset", "1MiB", "--length", "3MiB", "--verify",
                 "--transport", GetParam(), "--json"},
                30000);
  ASSERT_EQ(wr.exit_code, 0) << wr.out;
  auto w = parse_json(wr);
  EXPECT_EQ(w["verified"], true);
  ASSERT_EQ(w["steps"].size(), 3u);  // write ~pattern, read back, restore
  // The served pattern is intact after the write's restore step.
  auto again =
      run({kXfer, "read", "--target", s.segment, "--length", "8MiB", "--verify", "--transport", GetParam()}, 30000);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("verify: ok"), std::string::npos) << again.out;
}

INSTANTIATE_TEST_SUITE_P(Transports, XferE2E, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

TEST(XferE2EMultipath, TwoLoopbackAddressesBothCarrySlices) {
  Server s({"--listen", "tcp://127.0.0.1:0", "--listen", "tcp://127.0.0.2:0"});
  ASSERT_FALSE(s.segment.empty()) << s.line;
  auto rd = run({kXfer, "read", "--target", s.segment, "--length", "32MiB", "--verify", "--transport", "tcp", "--json"},
                30000);
  ASSERT_EQ(rd.exit_code, 0) << rd.out;
  auto j = parse_json(rd);
  uint64_t on1 = 0, on2 = 0;
  for (const auto& sl : j["steps"][0]["slices"]) {
    const std::string path = sl["path"];
    if (path.find("127.0.0.1:") != std::string::npos) on1 += sl["length_bytes"].get<uint64_t>();
    if (path.find("127.0.0.2:") != std::string::npos) on2 += sl["length_bytes"].get<uint64_t>();
  }
  EXPECT_GT(on1, 0u);
  EXPECT_GT(on2, 0u);
  EXPECT_EQ(on1 + on2, 32u << 20);
}

TEST(XferE2EBadRequests, ErrorsAndTheServerKeepsServing) {
  Server s({"--listen", "tcp://127.0.0.1:0"}, "8MiB");
  ASSERT_FALSE(s.segment.empty()) << s.line;
  // Unknown segment: nobody serves on port 1.
  auto unk = run({kXfer, "read", "--target", "127.0.0.1:1", "--length", "4KiB", "--json"}, 20000);
  EXPECT_EQ(unk.exit_code, 1) << unk.out;
  EXPECT_NE(parse_json(unk)["error"]["message"].get<std::string>().find("127.0.0.1:1"), std::string::npos) << unk.out;
  // Offset past the end, over both transports.
  for (const char* t : {"tcp", "shm"}) {
    auto past = run(
        {kXfer, "read", "--target", s.segment, "--offset", "8MiB", "--length", "1", "--transport", t, "--json"}, 20000);
    EXPECT_EQ(past.exit_code, 2) << past.out;
    EXPECT_NE(parse_json(past)["error"]["message"].get<std::string>().find("outside"), std::string::npos) << past.out;
  }
  // Length overflow: offset + length wraps 64 bits.
  auto wrap = run({kXfer, "write", "--target", s.segment, "--offset", "9223372036854775807", "--length", "1MiB",
                   "--transport", "tcp"},
                  20000);
  EXPECT_EQ(wrap.exit_code, 2) << wrap.out;
  // Bad usage.
  EXPECT_EQ(run({kXfer, "read", "--target", s.segment, "--length", "lots"}, 10000).exit_code, 2);
  EXPECT_EQ(run({kXfer, "bench"}, 10000).exit_code, 2);
  // Still serving.
  auto ok = run({kXfer, "read", "--target", s.segment, "--length", "8MiB", "--verify", "--transport", "tcp"}, 20000);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

TEST(XferE2EKill, ServerKilledMidTransferClientFailsCleanly) {
  Server s({"--listen", "tcp://127.0.0.1:0"}, "256MiB");
  ASSERT_FALSE(s.segment.empty()) << s.line;
  Child bench({kXfer, "bench", "--target", s.segment, "--transport", "tcp", "--block", "4MiB", "--duration", "30",
               "--timeout-ms", "20000", "--json"});
  // Mid-transfer: once the client has read 16 MiB from its sockets (the tcp transport reads data with readv,
  // which /proc/PID/io counts in rchar; the warm-up alone reads the whole 256 MiB).
  ASSERT_TRUE(wait_until([&] { return read_chars(bench.pid()) >= (16u << 20); }, 20000))
      << "the bench did not start transferring";
  s.child->kill_now(SIGKILL, 1000);
  const int64_t t0 = mono_ms();
  std::string out;
  int status = bench.finish(25000, &out);
  ASSERT_GE(status, 0) << "client hung after the server died";
  EXPECT_LT(mono_ms() - t0, 20000);
  ASSERT_TRUE(WIFEXITED(status)) << "client crashed (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_TRUE(j.contains("error")) << out;
}

TEST(XferE2EBench, JsonHasOneResultPerBlock) {
  Server s({"--listen", "tcp://127.0.0.1:0"});
  ASSERT_FALSE(s.segment.empty()) << s.line;
  auto b = run(
      {kXfer, "bench", "--target", s.segment, "--block", "64KiB,1MiB", "--duration", "0.3", "--batch", "8", "--json"},
      60000);
  ASSERT_EQ(b.exit_code, 0) << b.out;
  auto j = parse_json(b);
  EXPECT_EQ(j["transport"], "shm");
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["block_bytes"], 65536u);
  EXPECT_GT(j["results"][0]["bytes_per_second"].get<double>(), 0);
  EXPECT_GT(j["results"][1]["requests"].get<uint64_t>(), 0u);
  EXPECT_GT(j["results"][1]["latency_p99_ns"].get<int64_t>(), 0);
  EXPECT_TRUE(j.contains("build") && j.contains("host"));
  auto table =
      run({kXfer, "bench", "--target", s.segment, "--block", "1MiB", "--duration", "0.2", "--transport", "tcp"}, 60000);
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("GB/s"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("transport tcp"), std::string::npos) << table.out;
}

// Here (no RDMA NIC, no soft-RoCE) asking for rdma is a clear runtime error, exit 1, not a hang or a crash.
TEST(XferE2EBench, RdmaWithoutDeviceFailsClearly) {
  std::error_code ec;
  if (std::filesystem::exists("/sys/class/infiniband", ec) && !std::filesystem::is_empty("/sys/class/infiniband", ec)) {
    GTEST_SKIP() << "this host has an RDMA device (/sys/class/infiniband): the no-device error cannot be seen";
  }
  auto b =
      run({kXfer, "bench", "--target", "127.0.0.1:9", "--transport", "rdma", "--duration", "0.1", "--json"}, 20000);
  EXPECT_EQ(b.exit_code, 1) << b.out;
  auto j = parse_json(b);
  const std::string err = j["error"].value("message", "");
  // "returned 0" (an empty list) or "failed: <strerror>" (NULL: no RDMA in this kernel).
  EXPECT_TRUE(err.find("no RDMA device: ibv_get_device_list ") != std::string::npos ||
              err.find("rdma transport not built") != std::string::npos)
      << b.out;
}

// Issue 16 item 8: mc-xfer serve answers `stat` (mc-xfer stat --endpoint, the stat= of its ready line) with
// the bytes and transfers it served over tcp.
TEST(XferE2EStat, ServeCountsWhatItServed) {
  Server s({"--listen", "tcp://127.0.0.1:0"}, "8MiB");
  ASSERT_FALSE(s.segment.empty()) << s.line;
  const std::string stat = ready_field(s.line, "stat");
  ASSERT_FALSE(stat.empty()) << "no stat= in the ready line: " << s.line;
  auto counters = [&] {  // counters, as Prometheus types a *_total
    auto r = run({kXfer, "stat", "--endpoint", stat, "--json"}, 20000);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    auto j = parse_json(r);
    return j.contains("metrics") ? j["metrics"]["counters"] : nlohmann::json::object();
  };
  EXPECT_EQ(counters().value("mc_xfer_served_reads_total", -1.0), 0.0);
  ASSERT_EQ(run({kXfer, "read", "--target", s.segment, "--length", "1MiB", "--transport", "tcp"}, 30000).exit_code, 0);
  ASSERT_EQ(
      run({kXfer, "write", "--target", s.segment, "--offset", "1MiB", "--length", "64KiB", "--transport", "tcp"}, 30000)
          .exit_code,
      0);
  auto g = counters();
  EXPECT_GE(g.value("mc_xfer_served_reads_total", 0.0), 1.0) << g.dump();
  EXPECT_EQ(g.value("mc_xfer_served_read_bytes_total", 0.0), 1048576.0) << g.dump();
  EXPECT_GE(g.value("mc_xfer_served_writes_total", 0.0), 1.0) << g.dump();
  EXPECT_EQ(g.value("mc_xfer_served_written_bytes_total", 0.0), 65536.0) << g.dump();
  EXPECT_GE(g.value("mc_xfer_connections_accepted_total", 0.0), 1.0) << g.dump();
  EXPECT_TRUE(g.contains("mc_xfer_served_errors_total")) << g.dump();
  auto table = run({kXfer, "stat", "--endpoint", stat}, 20000);
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("mc_xfer_served_read_bytes_total"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("1048576"), std::string::npos) << table.out;
  auto gone = run({kXfer, "stat", "--endpoint", "tcp://127.0.0.1:1", "--timeout-ms", "500", "--json"}, 20000);
  EXPECT_EQ(gone.exit_code, 1) << gone.out;
  EXPECT_NE(parse_json(gone)["error"]["message"].get<std::string>().find("127.0.0.1:1"), std::string::npos) << gone.out;
}

// A GPU location is a usage error naming the flag, the value and the remedy, never host memory served under
// a GPU name (issue 16 item 3): mc has no GPU memory backend, whatever toolkit the build machine has.
TEST(XferE2ELocation, GpuLocationIsRefused) {
  auto gpu =
      run({"/bin/sh", "-c", kXfer + " serve --size 1MiB --listen tcp://127.0.0.1:0 --location cuda:0 2>&1"}, 20000);
  EXPECT_EQ(gpu.exit_code, 2) << gpu.out;
  EXPECT_EQ(gpu.out.find("ready "), std::string::npos) << "served host memory as cuda:0: " << gpu.out;
  for (const char* part : {"--location", "cuda:0", "GPU memory", "host location"}) {
    EXPECT_NE(gpu.out.find(part), std::string::npos) << "missing '" << part << "': " << gpu.out;
  }
  auto bad = run({"/bin/sh", "-c", kXfer + " serve --size 1MiB --location gpu0 2>&1"}, 20000);
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  // A host location still serves.
  Server host({"--listen", "tcp://127.0.0.1:0", "--location", "cpu:0"}, "1MiB");
  EXPECT_FALSE(host.segment.empty()) << host.line;
}

TEST(XferE2ETopo, JsonMatrix) {
  auto t = run({kXfer, "topo", "--json"}, 10000);
  ASSERT_EQ(t.exit_code, 0) << t.out;
  auto j = parse_json(t);
  EXPECT_EQ(j["version"], 1);
  EXPECT_TRUE(j["matrix"].contains("cpu:0")) << t.out;
  auto table = run({kXfer, "topo"}, 10000);
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("lo"), std::string::npos);
  auto bad = run({kXfer, "topo", "--topology", "/nonexistent.json"}, 10000);
  EXPECT_EQ(bad.exit_code, 2);  // a missing input file is a usage error in every tool (issue 17 item 6)
}

}  // namespace
}  // namespace mc::transfer::testing
