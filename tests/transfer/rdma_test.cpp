// The rdma transport's device-free parts: the handshake messages and the descriptor's rdma fields (round
// trip, and a descriptor written before rdma_lids existed), device selection from a fake sysfs tree, GID and
// MTU helpers, GID index choice, validation of a peer's QP values, READ-depth and MTU negotiation, the
// memory-region split, the RLIMIT_MEMLOCK remedy, the queue-pair transition attributes (builds with
// ibverbs), the error when no device exists (or rdma is not built), and an engine asked for rdma on such
// a host. The parts that need a device are in rdma_e2e_test.cpp (label rdma).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/shared_buffer.hpp"
#include "rdma/rdma.hpp"
#include "tcp/net.hpp"

#ifdef MC_TRANSFER_HAVE_RDMA
#include <infiniband/verbs.h>

#include "rdma/qp_attr.hpp"
#endif
#include <cerrno>
#include <cstring>

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
  MC_MESSAGE(format_version, name, host_id, pid, endpoints, rdma_devices, rdma_gids, regions, topology_json);
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

GidEntry gid(uint32_t index, GidType type, const std::string& hex) {
  GidEntry e;
  e.index = index;
  e.type = type;
  EXPECT_TRUE(gid_from_hex(hex, e.raw).is_ok()) << hex;
  return e;
}

// A RoCE port as mlx5 fills it: v1 and v2 of the link-local address, then v1 and v2 of the IPv4 address.
std::vector<GidEntry> roce_table() {
  return {gid(0, GidType::kRoceV1, "fe800000000000000a5f9afffe123456"),
          gid(1, GidType::kRoceV2, "fe800000000000000a5f9afffe123456"),
          gid(2, GidType::kRoceV1, "00000000000000000000ffffc0a80a02"),
          gid(3, GidType::kRoceV2, "00000000000000000000ffffc0a80a02")};
}

TEST(RdmaGid, RoceChoosesTheIpv4MappedV2Entry) {
  auto i = choose_gid_index(roce_table(), true, "", "mlx5_0 port 1");
  ASSERT_TRUE(i.is_ok()) << i.status().to_string();
  EXPECT_EQ(i.value(), 3u) << "not the link-local v2 entry at 1, not a v1 entry";
}

TEST(RdmaGid, RoceFallsBackToGlobalThenLinkLocalV2AndSkipsZeroSlots) {
  std::vector<GidEntry> t = {gid(0, GidType::kRoceV2, std::string(32, '0')),
                             gid(1, GidType::kRoceV2, "fe800000000000000a5f9afffe123456"),
                             gid(5, GidType::kRoceV2, "20010db8000000000000000000000007")};
  EXPECT_EQ(choose_gid_index(t, true, "", "d").value(), 5u) << "global IPv6 before link-local";
  t.pop_back();
  EXPECT_EQ(choose_gid_index(t, true, "", "d").value(), 1u) << "link-local v2 as the last resort; zero skipped";
  t.pop_back();
  auto none = choose_gid_index(t, true, "", "mlx5_0 port 1");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), Code::kNoPath);
  EXPECT_NE(none.status().message().find("no RoCE v2 GID"), std::string::npos) << none.status().message();
  EXPECT_NE(none.status().message().find("MC_RDMA_GID_INDEX"), std::string::npos);
  // Only v1 entries: refused (a v1 end cannot talk to a v2 end), naming what the table holds.
  std::vector<GidEntry> v1 = {gid(0, GidType::kRoceV1, "fe800000000000000a5f9afffe123456")};
  auto r = choose_gid_index(v1, true, "", "d");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("0:RoCE v1:fe80"), std::string::npos) << r.status().message();
}

TEST(RdmaGid, InfinibandUsesItsPortGid) {
  std::vector<GidEntry> t = {gid(0, GidType::kIb, "fe800000000000000202c9fffe000001"),
                             gid(1, GidType::kIb, std::string(32, '0'))};
  EXPECT_EQ(choose_gid_index(t, false, "", "d").value(), 0u);
  EXPECT_FALSE(choose_gid_index({}, false, "", "d").is_ok());
}

TEST(RdmaGid, OverrideMustNameAPresentNonZeroEntry) {
  EXPECT_EQ(choose_gid_index(roce_table(), true, "1", "d").value(), 1u);
  for (const char* bad : {"abc", "3x", "-1", " 3", "99"}) {
    auto r = choose_gid_index(roce_table(), true, bad, "mlx5_0 port 1");
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("MC_RDMA_GID_INDEX"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("mlx5_0 port 1"), std::string::npos) << r.status().message();
  }
  std::vector<GidEntry> t = roce_table();
  std::memset(t[3].raw, 0, 16);
  EXPECT_FALSE(choose_gid_index(t, true, "3", "d").is_ok()) << "a zero slot cannot be forced";
}

proto::RdmaQpInfo good_peer() {
  return proto::RdmaQpInfo{"mlx5_1", 1, 0x1234, 0xabcdef, 0, "00000000000000000000ffffc0a80a02", 3, 4096};
}

proto::RdmaQpInfo good_peer_with_lid(uint32_t lid) {
  auto q = good_peer();
  q.lid = lid;
  return q;
}

TEST(RdmaHandshake, PeerValidation) {
  EXPECT_TRUE(validate_peer_qp(good_peer(), true, "w").is_ok());
  auto expect_bad = [](proto::RdmaQpInfo q, bool eth, const std::string& field) {
    Status st = validate_peer_qp(q, eth, "rdma connect from x");
    ASSERT_FALSE(st.is_ok()) << field;
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rdma connect from x"), std::string::npos) << st.message();
  };
  auto q = good_peer();
  q.qp_num = 0;
  expect_bad(q, true, "qp_num 0");
  q.qp_num = 1;
  expect_bad(q, true, "qp_num 1");
  q.qp_num = 1u << 24;
  expect_bad(q, true, "qp_num");
  q = good_peer();
  q.psn = 1u << 24;
  expect_bad(q, true, "psn");
  q = good_peer();
  q.mtu_bytes = 1500;
  expect_bad(q, true, "MTU 1500");
  q = good_peer();
  q.gid = "zz";
  expect_bad(q, true, "GID");
  q = good_peer();
  q.gid = std::string(32, '0');
  expect_bad(q, true, "zero GID");
  q.lid = 7;
  EXPECT_TRUE(validate_peer_qp(q, false, "w").is_ok()) << "InfiniBand: a LID is enough";
  expect_bad(good_peer_with_lid(7), true, "link layers must match");
  q.lid = 0;
  expect_bad(q, false, "neither a LID nor a GID");
  q.lid = 0x10000;
  expect_bad(q, false, "LID");
}

TEST(RdmaHandshake, NegotiatedLimits) {
  EXPECT_EQ(negotiate_rd_atomic(16, 8), 8);
  EXPECT_EQ(negotiate_rd_atomic(4, 16), 4);
  EXPECT_EQ(negotiate_rd_atomic(0, 16), 1) << "at least one READ in flight";
  EXPECT_EQ(negotiate_rd_atomic(300, 1000), 255) << "8-bit field: clamped, not wrapped";
  EXPECT_EQ(negotiate_rd_atomic(-1, 5), 1);
  EXPECT_EQ(negotiate_mtu(5, 1024), 3);
  EXPECT_EQ(negotiate_mtu(3, 4096), 3);
  EXPECT_EQ(negotiate_mtu(5, 4096), 5);
  EXPECT_EQ(negotiate_mtu(5, 1500), 0);
  EXPECT_EQ(negotiate_mtu(0, 4096), 0);
  EXPECT_EQ(negotiate_mtu(6, 4096), 0);
}

TEST(RdmaRegistration, SplitAtTheDeviceLimit) {
  auto sum = [](const std::vector<std::pair<uint64_t, uint64_t>>& v) {
    uint64_t s = 0, next = 0;
    for (auto [off, len] : v) {
      EXPECT_EQ(off, next);
      EXPECT_GT(len, 0u);
      s += len;
      next = off + len;
    }
    return s;
  };
  const uint64_t big = (4ull << 30) + (16 << 10) + 7;
  auto v = split_registration(big, 1ull << 30, 1ull << 31);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v.back().second, (16u << 10) + 7);
  EXPECT_EQ(sum(v), big);
  // The device limit wins over a larger chunk request.
  auto w = split_registration(big, UINT64_MAX, 1ull << 31);
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].second, 1ull << 31);
  EXPECT_EQ(sum(w), big);
  EXPECT_EQ(split_registration(4096, 4096, UINT64_MAX).size(), 1u);
  EXPECT_TRUE(split_registration(0, 4096, UINT64_MAX).empty());
  EXPECT_EQ(split_registration(3, 0, UINT64_MAX).size(), 3u) << "chunk 0 means 1, never a zero step";
}

TEST(RdmaRegistration, MemlockRemedy) {
  const std::string m = reg_mr_remedy(ENOMEM, 8ull << 20);
  EXPECT_NE(m.find("RLIMIT_MEMLOCK"), std::string::npos) << m;
  EXPECT_NE(m.find("8388608 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("ulimit -l"), std::string::npos) << m;
  EXPECT_NE(m.find("LimitMEMLOCK"), std::string::npos) << m;
  EXPECT_NE(reg_mr_remedy(EPERM, UINT64_MAX).find("unlimited"), std::string::npos);
  EXPECT_EQ(reg_mr_remedy(EINVAL, 0), "") << "not a pinning problem: no misleading remedy";
}

TEST(RdmaDomainOpen, NoDeviceMessageIsHonest) {
  EXPECT_EQ(no_device_message(false, 0), "no RDMA device: ibv_get_device_list returned 0");
  const std::string failed = no_device_message(true, EPROTONOSUPPORT);
  EXPECT_EQ(failed.rfind("no RDMA device: ibv_get_device_list failed: ", 0), 0u) << failed;
  EXPECT_EQ(failed.find("returned 0"), std::string::npos) << "it returned NULL, not an empty list";
  EXPECT_NE(failed.find("ib_uverbs"), std::string::npos) << failed;
}

#ifdef MC_TRANSFER_HAVE_RDMA
TEST(RdmaQpAttr, InitGrantsRemoteAccessOnlyOnTheTarget) {
  auto t = init_transition(2, QpRole::kTarget);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(t.attr.port_num, 2);
  EXPECT_EQ(t.attr.pkey_index, 0);
  EXPECT_EQ(t.attr.qp_access_flags, unsigned(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  auto i = init_transition(1, QpRole::kInitiator);
  EXPECT_EQ(i.attr.qp_access_flags, 0u);
  EXPECT_EQ(i.mask, t.mask);
}

TEST(RdmaQpAttr, RtrOnRoceCarriesAGrh) {
  auto peer = good_peer();
  auto r = rtr_transition(LocalPort{1, true, 3}, peer, IBV_MTU_1024, 16);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ibv_qp_attr& a = r.value().attr;
  EXPECT_EQ(a.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(a.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(a.dest_qp_num, 0x1234u);
  EXPECT_EQ(a.rq_psn, 0xabcdefu);
  EXPECT_EQ(a.max_dest_rd_atomic, 16);
  EXPECT_EQ(a.min_rnr_timer, kQpMinRnrTimer);
  EXPECT_EQ(a.ah_attr.port_num, 1);
  EXPECT_EQ(a.ah_attr.is_global, 1) << "link layer Ethernet requires a GRH";
  EXPECT_EQ(a.ah_attr.dlid, 0);
  EXPECT_EQ(a.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(a.ah_attr.grh.hop_limit, kGrhHopLimit);
  EXPECT_EQ(a.ah_attr.grh.dgid.raw[10], 0xff);
  EXPECT_EQ(a.ah_attr.grh.dgid.raw[15], 0x02);
  EXPECT_EQ(r.value().mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

TEST(RdmaQpAttr, RtrOnInfinibandUsesTheLid) {
  auto peer = good_peer();
  peer.lid = 0x2a;
  auto r = rtr_transition(LocalPort{1, false, 0}, peer, IBV_MTU_4096, 0);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().attr.ah_attr.dlid, 0x2a);
  EXPECT_EQ(r.value().attr.ah_attr.is_global, 0) << "same subnet: no GRH needed";
  EXPECT_EQ(r.value().attr.max_dest_rd_atomic, 1) << "never 0";
  peer.lid = 0;  // an IB peer known only by GID (another subnet): routed with a GRH
  EXPECT_EQ(rtr_transition(LocalPort{1, false, 0}, peer, IBV_MTU_4096, 1).value().attr.ah_attr.is_global, 1);
  EXPECT_FALSE(rtr_transition(LocalPort{1, true, 0}, peer, 0, 1).is_ok()) << "MTU enum 0";
  EXPECT_FALSE(rtr_transition(LocalPort{1, true, 0}, peer, 6, 1).is_ok());
  peer.gid = "nothex";
  EXPECT_FALSE(rtr_transition(LocalPort{1, true, 0}, peer, IBV_MTU_1024, 1).is_ok());
}

TEST(RdmaQpAttr, RtsSetsTimersAnd24BitPsn) {
  auto t = rts_transition(0x1abcdef, 8);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(t.attr.sq_psn, 0xabcdefu) << "24 bits";
  EXPECT_EQ(t.attr.max_rd_atomic, 8);
  EXPECT_EQ(t.attr.timeout, kQpTimeout);
  EXPECT_EQ(t.attr.retry_cnt, kQpRetryCount);
  EXPECT_EQ(t.attr.rnr_retry, kQpRnrRetry);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC);
  EXPECT_EQ(rts_transition(1, 0).attr.max_rd_atomic, 1);
}
#endif

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
  auto bad =
      tcp::control_call("tcp://" + server.value()->segment_name(), "", tcp::WireOp::kRdmaConnect, "\xc1\xc1", 5000);
  EXPECT_FALSE(bad.is_ok());
  auto again = client.value()->transfer_sync({Op::kRead, local.data(), seg.value(), 0, local.size(), ""}, 10000);
  EXPECT_EQ(again.state, TransferState::kCompleted) << again.status.to_string();
}

}  // namespace
}  // namespace mc::transfer::rdma
