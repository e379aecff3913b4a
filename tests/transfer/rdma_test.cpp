// The rdma transport's device-free parts: the handshake messages and the descriptor's rdma fields (round
// trip, and a descriptor written before rdma_lids existed), device selection from a fake sysfs tree, GID and
// MTU helpers, the error when no device exists (or rdma is not built), and an engine asked for rdma on such
// a host. The parts that need a device are in rdma_e2e_test.cpp (label rdma).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mc/common/codec.hpp"
#include "mc/common/protocol.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/shared_buffer.hpp"
#include "rdma/rdma.hpp"
#include "tcp/net.hpp"

#ifdef MC_TRANSFER_HAVE_RDMA
#include <infiniband/verbs.h>
#endif

namespace mc::transfer::rdma {
namespace {

namespace fs = std::filesystem;

// Devices ibverbs sees on this host (0 when rdma is not built).
int device_count() {
#ifdef MC_TRANSFER_HAVE_RDMA
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l != nullptr) ibv_free_device_list(l);
  return l == nullptr ? 0 : n;
#else
  return 0;
#endif
}

TEST(RdmaProtocol, HandshakeMessagesRoundTrip) {
  proto::RdmaConnectRequest rq;
  rq.segment = "10.0.0.2:4000";
  rq.target_device = "mlx5_1";
  rq.initiator = proto::RdmaQpInfo{"mlx5_0", 1, 0x1234, 0xabcdef, 7, "fe800000000000000202c9fffe000001", 3, 4096};
  rq.max_rd_atomic = 16;
  auto rq2 = codec::unpack<proto::RdmaConnectRequest>(codec::pack(rq), "t").value();
  EXPECT_EQ(rq2.segment, rq.segment);
  EXPECT_EQ(rq2.target_device, "mlx5_1");
  EXPECT_EQ(rq2.initiator.device, "mlx5_0");
  EXPECT_EQ(rq2.initiator.qp_num, 0x1234u);
  EXPECT_EQ(rq2.initiator.psn, 0xabcdefu);
  EXPECT_EQ(rq2.initiator.lid, 7u);
  EXPECT_EQ(rq2.initiator.gid, rq.initiator.gid);
  EXPECT_EQ(rq2.initiator.gid_index, 3u);
  EXPECT_EQ(rq2.initiator.mtu_bytes, 4096u);
  EXPECT_EQ(rq2.max_rd_atomic, 16u);

  proto::RdmaConnectReply rp;
  rp.target = proto::RdmaQpInfo{"mlx5_1", 2, 99, 5, 0, std::string(32, '0'), 0, 1024};
  rp.max_rd_atomic = 8;
  auto rp2 = codec::unpack<proto::RdmaConnectReply>(codec::pack(rp), "t").value();
  EXPECT_EQ(rp2.target.device, "mlx5_1");
  EXPECT_EQ(rp2.target.port, 2u);
  EXPECT_EQ(rp2.target.qp_num, 99u);
  EXPECT_EQ(rp2.target.mtu_bytes, 1024u);
  EXPECT_EQ(rp2.max_rd_atomic, 8u);

  // Truncated input is an error, not a crash.
  std::string packed = codec::pack(rq);
  EXPECT_FALSE(codec::unpack<proto::RdmaConnectRequest>(packed.substr(0, packed.size() / 2), "t").is_ok());
}

TEST(RdmaProtocol, DescriptorCarriesRkeysPerDevice) {
  proto::SegmentDescriptor d;
  d.format_version = proto::kSegmentDescriptorVersion;
  d.name = "10.0.0.2:4000";
  d.rdma_devices = {"mlx5_0", "mlx5_1"};
  d.rdma_gids = {"fe800000000000000202c9fffe000001", "fe800000000000000202c9fffe000002"};
  d.rdma_lids = {3, 4};
  proto::RegionDescriptor a{0, 1ull << 30, "cpu:0", "", 0, 0x7f0000000000ull, {0x11, 0x21}};
  proto::RegionDescriptor b{1ull << 30, (3ull << 30) + 5, "cpu:1", "", 0, 0x7f0040000000ull, {0x12, 0x22}};
  d.regions = {a, b};
  auto d2 = codec::unpack<proto::SegmentDescriptor>(codec::pack(d), "t").value();
  EXPECT_EQ(d2.rdma_devices, d.rdma_devices);
  EXPECT_EQ(d2.rdma_gids, d.rdma_gids);
  EXPECT_EQ(d2.rdma_lids, (std::vector<uint32_t>{3, 4}));
  ASSERT_EQ(d2.regions.size(), 2u);
  EXPECT_EQ(d2.regions[1].length_bytes, (3ull << 30) + 5) << "64-bit lengths";
  EXPECT_EQ(d2.regions[1].rdma_addr, 0x7f0040000000ull);
  EXPECT_EQ(d2.regions[1].rdma_rkeys, (std::vector<uint32_t>{0x12, 0x22}));
}

// The descriptor as format version 1 wrote it before rdma_lids: the same map without that key.
struct DescriptorBeforeLids {
  uint32_t format_version = 0;
  std::string name;
  std::string host_id;
  int32_t pid = 0;
  std::vector<std::string> endpoints;
  std::vector<std::string> rdma_devices;
  std::vector<std::string> rdma_gids;
  std::vector<proto::RegionDescriptor> regions;
  std::string topology_json;
  MSGPACK_DEFINE_MAP(format_version, name, host_id, pid, endpoints, rdma_devices, rdma_gids, regions, topology_json);
};

TEST(RdmaProtocol, DescriptorExtensionIsCompatibleBothWays) {
  DescriptorBeforeLids old;
  old.format_version = proto::kSegmentDescriptorVersion;
  old.name = "h:1";
  old.endpoints = {"tcp://127.0.0.1:1"};
  old.rdma_devices = {"mlx5_0"};
  old.rdma_gids = {std::string(32, '0')};
  old.regions = {proto::RegionDescriptor{0, 4096, "cpu:0", "", 0, 0x1000, {5}}};
  auto now = codec::unpack<proto::SegmentDescriptor>(codec::pack(old), "old descriptor");
  ASSERT_TRUE(now.is_ok()) << now.status().to_string();
  EXPECT_EQ(now->name, "h:1");
  EXPECT_TRUE(now->rdma_lids.empty());
  EXPECT_EQ(now->regions[0].rdma_rkeys, (std::vector<uint32_t>{5}));

  proto::SegmentDescriptor fresh;
  fresh.format_version = proto::kSegmentDescriptorVersion;
  fresh.name = "h:2";
  fresh.rdma_lids = {9};
  auto back = codec::unpack<DescriptorBeforeLids>(codec::pack(fresh), "new descriptor, old reader");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->name, "h:2");
}

// A sysfs tree with two NUMA nodes, one NIC and one RDMA device per node.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mc-rdma-sysfs-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    node("devices/system/node/node0");
    node("devices/system/node/node1");
    device("class/infiniband/mlx5_0", 0);
    device("class/infiniband/mlx5_1", 1);
    device("class/net/eth0", 0);
  }
  void TearDown() override { fs::remove_all(root_); }
  void node(const std::string& rel) { fs::create_directories(root_ / rel); }
  void device(const std::string& rel, int numa) {
    fs::create_directories(root_ / rel / "device");
    std::ofstream(root_ / rel / "device/numa_node") << numa << "\n";
  }
  fs::path root_;
};

TEST_F(FakeSysfs, DeviceSelectionFollowsNuma) {
  auto t = Topology::discover(root_.string());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const std::vector<std::string> devs = {"mlx5_0", "mlx5_1"};
  // Memory on node 0 at both ends: mlx5_0 <-> mlx5_0 first; pairs crossing a socket on one side keep half
  // the weight and stay as spare paths; the pair crossing on both sides is dropped.
  auto p = plan_paths(t.value(), devs, "cpu:0", t.value(), devs, "cpu:0");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].local_device, "mlx5_0");
  EXPECT_EQ(p[0].remote_index, 0u);
  EXPECT_DOUBLE_EQ(p[0].weight, Topology::kPreferredWeight * Topology::kPreferredWeight);
  EXPECT_DOUBLE_EQ(p[1].weight, Topology::kPreferredWeight * Topology::kFallbackWeight);
  for (const auto& x : p) EXPECT_FALSE(x.local_device == "mlx5_1" && x.remote_index == 1) << "both sides cross";
  // Memory on node 1 here, node 0 there: mlx5_1 -> mlx5_0.
  auto q = plan_paths(t.value(), devs, "cpu:1", t.value(), devs, "cpu:0");
  ASSERT_FALSE(q.empty());
  EXPECT_EQ(q[0].local_device, "mlx5_1");
  EXPECT_EQ(q[0].remote_index, 0u);
  // The NIC is not an RDMA device: only the devices passed in are paired.
  for (const auto& x : q) EXPECT_NE(x.local_device, "eth0");
  // No device on either side: no path.
  EXPECT_TRUE(plan_paths(t.value(), {}, "cpu:0", t.value(), devs, "cpu:0").empty());
  EXPECT_TRUE(plan_paths(t.value(), devs, "cpu:0", t.value(), {}, "cpu:0").empty());
}

TEST_F(FakeSysfs, UnknownRemoteTopologyStillPairs) {
  auto t = Topology::discover(root_.string());
  ASSERT_TRUE(t.is_ok());
  Topology unknown;  // a peer that published no topology
  auto p = plan_paths(t.value(), {"mlx5_0", "mlx5_1"}, "cpu:0", unknown, {"ib0"}, "cpu:0");
  ASSERT_EQ(p.size(), 2u) << "mlx5_0 (preferred) and mlx5_1 (fallback) both reach the peer's only device";
  EXPECT_EQ(p[0].local_device, "mlx5_0");
  EXPECT_GT(p[0].weight, p[1].weight);
}

TEST(RdmaHelpers, GidHexAndMtu) {
  uint8_t raw[16];
  ASSERT_TRUE(gid_from_hex("fe800000000000000202C9fffe000001", raw).is_ok());
  EXPECT_EQ(raw[0], 0xfe);
  EXPECT_EQ(raw[10], 0xc9);
  EXPECT_EQ(gid_to_hex(raw), "fe800000000000000202c9fffe000001");
  EXPECT_EQ(gid_from_hex("fe80", raw).code(), Code::kInvalidArgument);
  EXPECT_EQ(gid_from_hex(std::string(31, '0') + "g", raw).code(), Code::kInvalidArgument);
  EXPECT_EQ(mtu_enum(256), 1);
  EXPECT_EQ(mtu_enum(4096), 5);
  EXPECT_EQ(mtu_enum(1500), 0);
}

TEST(RdmaDomainOpen, NoDeviceIsAClearError) {
  if (device_count() > 0) GTEST_SKIP() << "this host has an RDMA device; the no-device error cannot be seen";
  auto d = RdmaDomain::open(EngineOptions{}, Topology{});
  ASSERT_FALSE(d.is_ok());
  if (built()) {
    EXPECT_EQ(d.status().code(), Code::kNoPath);
    EXPECT_NE(d.status().message().find("no RDMA device"), std::string::npos) << d.status().message();
  } else {
    EXPECT_EQ(d.status().code(), Code::kUnimplemented);
    EXPECT_NE(d.status().message().find("rdma transport not built"), std::string::npos) << d.status().message();
  }
}

TEST(RdmaEngine, AskingForRdmaAloneFailsWithTheReason) {
  if (device_count() > 0) GTEST_SKIP() << "this host has an RDMA device";
  EngineOptions o;
  o.transports = {"rdma"};
  auto e = TransferEngine::create(o);
  ASSERT_FALSE(e.is_ok());
  const std::string m = e.status().message();
  EXPECT_NE(m.find("rdma"), std::string::npos) << m;
  EXPECT_TRUE(m.find("no RDMA device") != std::string::npos || m.find("not built") != std::string::npos) << m;
}

TEST(RdmaEngine, WithoutDeviceOtherTransportsCarryOnAndThePeerRefusesRdmaConnect) {
  if (device_count() > 0) GTEST_SKIP() << "this host has an RDMA device";
  EngineOptions so;
  so.listen = {"tcp://127.0.0.1:0"};
  so.transports = {"rdma", "tcp"};
  auto server = TransferEngine::create(so);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  auto sbuf = allocate_shared_buffer(1 << 20).value();
  std::memset(sbuf.data(), 0x5a, sbuf.size());
  ASSERT_TRUE(server.value()->register_memory(sbuf.data(), sbuf.size()).is_ok());
  auto desc = server.value()->local_descriptor();
  EXPECT_TRUE(desc.rdma_devices.empty()) << "no device: nothing rdma published";
  EXPECT_EQ(desc.regions.at(0).rdma_addr, 0u);

  EngineOptions co;
  co.transports = {"rdma", "tcp"};
  auto client = TransferEngine::create(co);
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto seg = client.value()->open_segment(server.value()->segment_name());
  ASSERT_TRUE(seg.is_ok()) << seg.status().to_string();
  EXPECT_EQ(client.value()->segment_transport(seg.value()).value(), "tcp");
  std::vector<char> local(64 << 10);
  ASSERT_TRUE(client.value()->register_memory(local.data(), local.size()).is_ok());
  auto st = client.value()->transfer_sync({Op::kRead, local.data(), seg.value(), 4096, local.size(), ""}, 10000);
  ASSERT_EQ(st.state, TransferState::kCompleted) << st.status.to_string();
  EXPECT_EQ(local[0], 0x5a);

  // A peer asking this server for a queue pair gets an error naming the reason; the server keeps serving.
  proto::RdmaConnectRequest rq;
  rq.target_device = "mlx5_0";
  rq.initiator.mtu_bytes = 4096;
  auto rep = tcp::control_call("tcp://" + server.value()->segment_name(), "", tcp::WireOp::kRdmaConnect,
                               codec::pack(rq), 5000);
  ASSERT_FALSE(rep.is_ok());
  EXPECT_EQ(rep.status().code(), Code::kNoPath);
  EXPECT_NE(rep.status().message().find("serves no rdma"), std::string::npos) << rep.status().message();
  // Garbage in the request: still an error reply.
  auto bad = tcp::control_call("tcp://" + server.value()->segment_name(), "", tcp::WireOp::kRdmaConnect, "\xc1\xc1",
                               5000);
  EXPECT_FALSE(bad.is_ok());
  auto again = client.value()->transfer_sync({Op::kRead, local.data(), seg.value(), 0, local.size(), ""}, 10000);
  EXPECT_EQ(again.state, TransferState::kCompleted) << again.status.to_string();
}

}  // namespace
}  // namespace mc::transfer::rdma
