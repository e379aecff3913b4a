// Slicing and path policy: DESIGN.md §13.8 (zero-length slices, tail merge) and §13.10 (64-bit lengths),
// path selection by weight and bytes in flight, quarantine with backoff and probes, and the transfer
// section of protocol.hpp.
#include "mc/transfer/slicing.hpp"

#include <gtest/gtest.h>

#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/testkit/units.hpp"
#include "mc/transfer/path_policy.hpp"

namespace mc::transfer {
namespace {

using testkit::kKiB;
using testkit::kMiB;

void expect_well_formed(const std::vector<SliceRange>& s, uint64_t length, uint64_t max_slice) {
  uint64_t pos = 0;
  for (const auto& r : s) {
    ASSERT_GT(r.length, 0u) << "zero-length slice at " << r.offset;
    ASSERT_LE(r.length, max_slice);
    ASSERT_EQ(r.offset, pos) << "gap or overlap";
    pos += r.length;
  }
  EXPECT_EQ(pos, length);
}

TEST(Slicing, FieldReport8NoZeroLengthSlicesExactSums) {
  SlicePolicy p{16 * kKiB, 0, 0, 1};
  for (uint64_t len : std::initializer_list<uint64_t>{1, 16383, 16384, 16385, 3 * kMiB, 10 * kMiB, 10 * kMiB + 1}) {
    auto s = plan_slices(len, p);
    expect_well_formed(s, len, 16 * kKiB);
    EXPECT_EQ(s.size(), (len + 16383) / 16384) << len;
    EXPECT_EQ(slice_count(len, p), s.size());
  }
  EXPECT_EQ(plan_slices(10 * kMiB, p).size(), 640u);
  EXPECT_EQ(plan_slices(10 * kMiB + 1, p).size(), 641u);
}

TEST(Slicing, ZeroLengthHasNoSlices) {
  SlicePolicy p{16 * kKiB, 4 * kKiB, 0, 1};
  EXPECT_TRUE(plan_slices(0, p).empty());
  EXPECT_EQ(slice_count(0, p), 0u);
}

TEST(Slicing, TailFoldMergesOnlyTheTail) {
  // Documented rule: a tail shorter than min_tail_bytes joins the previous slice; the others keep S.
  SlicePolicy p{16 * kKiB, 4 * kKiB, 0, 1};
  auto s = plan_slices(10 * kMiB + 1, p);
  expect_well_formed(s, 10 * kMiB + 1, 16 * kKiB + 4 * kKiB - 1);
  ASSERT_EQ(s.size(), 640u);
  EXPECT_EQ(s.back().length, 16385u);
  for (size_t i = 0; i + 1 < s.size(); ++i) EXPECT_EQ(s[i].length, 16 * kKiB);
  // A tail of at least min_tail_bytes stays its own slice.
  auto t = plan_slices(16 * kKiB + 4 * kKiB, p);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].length, 4 * kKiB);
  // A request shorter than one slice is one slice, whatever the tail rule.
  auto one = plan_slices(7, p);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].length, 7u);
}

TEST(Slicing, CapGrowsSliceSizeWithoutEmptySlices) {
  SlicePolicy cap64{16 * kKiB, 0, 64, 1};
  auto a = plan_slices(10 * kMiB, cap64);
  expect_well_formed(a, 10 * kMiB, 160 * kKiB);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.front().length, 160 * kKiB);
  SlicePolicy cap32{16 * kKiB, 0, 32, 64 * kKiB};
  auto b = plan_slices(3 * kMiB, cap32);
  expect_well_formed(b, 3 * kMiB, 128 * kKiB);
  EXPECT_EQ(b.size(), 24u) << "3 MiB at cap 32 and 64 KiB alignment: 24 x 128 KiB, not 32";
  for (uint64_t len : std::initializer_list<uint64_t>{1, 16385, 10 * kMiB + 1, 3 * kMiB + 7}) {
    for (const auto* p : {&cap64, &cap32}) {
      auto s = plan_slices(len, *p);
      EXPECT_LE(s.size(), p->max_slices);
      uint64_t sum = 0;
      for (auto& r : s) {
        EXPECT_GT(r.length, 0u);
        sum += r.length;
      }
      EXPECT_EQ(sum, len);
    }
  }
}

TEST(Slicing, FieldReport10FourGiBPlusIsNotTruncated) {
  const uint64_t len = 4ull * 1024 * kMiB + 16 * kKiB + 7;  // 4,294,983,687
  ASSERT_EQ(len, 4294983687ull);
  SlicePolicy p{16 * kKiB, 0, 0, 1};
  EXPECT_EQ(slice_count(len, p), 262146u);
  uint64_t sum = 0, n = 0, last = 0;
  for_each_slice(len, p, [&](SliceRange r) {
    ASSERT_GT(r.length, 0u);
    ASSERT_EQ(r.offset, sum);
    sum += r.length;
    last = r.length;
    ++n;
  });
  EXPECT_EQ(sum, len);
  EXPECT_NE(sum, 16391u) << "truncated to 32 bits";
  EXPECT_EQ(n, 262146u);
  EXPECT_EQ(last, 7u);
}

TEST(Slicing, ValidateRejectsBadPolicies) {
  EXPECT_EQ(validate(SlicePolicy{0, 0, 0, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(validate(SlicePolicy{16, 0, 0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(validate(SlicePolicy{16, 32, 0, 1}).code(), Code::kInvalidArgument);
  EXPECT_TRUE(validate(SlicePolicy{}).is_ok());
}

TEST(PathPolicy, WeightAndBytesInFlightSteerSlices) {
  ManualClock clock;
  PathSelector sel(clock, QuarantinePolicy{100, 1000});
  int a = sel.add_path("a", 1.0);
  int b = sel.add_path("b", 0.5);
  // Spray 30 slices with nothing completing: the preferred path gets about twice the bytes.
  int on_a = 0, on_b = 0;
  for (int i = 0; i < 30; ++i) {
    int p = sel.pick(64 * kKiB);
    ASSERT_GE(p, 0);
    sel.on_post(p, 64 * kKiB);
    (p == a ? on_a : on_b)++;
  }
  EXPECT_EQ(on_a, 20);
  EXPECT_EQ(on_b, 10);
  // A path with bytes piled up (slow) is avoided while the other drains.
  for (int i = 0; i < 20; ++i) sel.on_done(a, 64 * kKiB, true);
  EXPECT_EQ(sel.pick(64 * kKiB), a);
  // `avoid` skips the path a slice just failed on, unless it is the only one.
  EXPECT_EQ(sel.pick(64 * kKiB, a), b);
  // Window: a path at its in-flight cap is not usable now.
  EXPECT_EQ(sel.pick(64 * kKiB, -1, 10 * 64 * kKiB), a);
  EXPECT_EQ(sel.path(b).bytes_in_flight, 10 * 64 * kKiB);
}

// Issue 3, failover: the retry of a failed slice moves to another local device (and another remote one)
// where one exists, and a local-side failure takes every path of that local device out at once.
TEST(PathPolicy, RetryAvoidsTheFailedDevicesAndLocalFaultsTakeTheDeviceOut) {
  ManualClock clock;
  PathSelector sel(clock, QuarantinePolicy{1000, 1000});
  const int e0a = sel.add_path("eth0->A", 1.0, "eth0", "A");
  const int e0b = sel.add_path("eth0->B", 1.0, "eth0", "B");
  const int e1a = sel.add_path("eth1->A", 1.0, "eth1", "A");
  const int e1b = sel.add_path("eth1->B", 1.0, "eth1", "B");
  // Load the path that shares nothing with eth0->A: it still wins the retry over the idle ones that share
  // the local device (eth0->B) or the remote one (eth1->A).
  sel.on_post(e1b, 1 << 20);
  EXPECT_EQ(sel.pick(4096), e0a) << "no failure: the least loaded path (ties: first)";
  EXPECT_EQ(sel.pick(4096, e0a), e1b);
  // With eth1->B gone, the retry takes a path that shares one device; the failed path itself comes last.
  sel.on_done(e1b, 1 << 20, false);
  EXPECT_EQ(sel.path(e1b).health, PathHealth::kQuarantined);
  const int next = sel.pick(4096, e0a);
  EXPECT_TRUE(next == e0b || next == e1a) << next;
  // A failure of unknown side quarantines only its own path.
  sel.on_post(e0a, 4096);
  sel.on_done(e0a, 4096, false, true, false);
  EXPECT_EQ(sel.path(e0a).health, PathHealth::kQuarantined);
  EXPECT_EQ(sel.path(e0b).health, PathHealth::kHealthy);
  // A local-side failure on eth0->B takes eth0 out: no eth0 path is left, eth1->A carries on alone.
  sel.on_post(e0b, 4096);
  sel.on_done(e0b, 4096, false, true, true);
  EXPECT_EQ(sel.path(e0b).health, PathHealth::kQuarantined);
  EXPECT_EQ(sel.pick(4096), e1a);
  EXPECT_EQ(sel.pick(4096, e1a), e1a) << "the failed path is used when nothing else is usable";
  // Paths without device names share nothing: the old rule (skip the failed path unless alone) holds.
  PathSelector plain(clock, QuarantinePolicy{1000, 1000});
  const int p0 = plain.add_path("p0", 1.0);
  const int p1 = plain.add_path("p1", 1.0);
  plain.on_post(p1, 1 << 20);
  EXPECT_EQ(plain.pick(4096, p0), p1);
  plain.on_done(p0, 0, false, true, true);  // a local fault without a device name: only this path
  EXPECT_EQ(plain.path(p0).health, PathHealth::kQuarantined);
  EXPECT_EQ(plain.path(p1).health, PathHealth::kHealthy);
  // A fallback path (an rdma segment's tcp path, weight <= kFallbackPathWeight) shares no device with the
  // failed rdma path, yet the retry takes the other rdma path (which shares the local NIC) first.
  PathSelector rdma(clock, QuarantinePolicy{1000, 1000});
  const int m0r0 = rdma.add_path("rdma mlx5_0->r0", 1.0, "mlx5_0", "r0");
  const int m0r1 = rdma.add_path("rdma mlx5_0->r1", 1.0, "mlx5_0", "r1");
  const int tcp = rdma.add_path("tcp *->peer", 1e-9);
  EXPECT_EQ(rdma.pick(4096, m0r0), m0r1);
  rdma.on_done(m0r0, 0, false);
  rdma.on_done(m0r1, 0, false);
  EXPECT_EQ(rdma.pick(4096, m0r1), tcp) << "the fallback when no rdma path is left";
}

TEST(PathPolicy, QuarantineBackoffAndProbe) {
  ManualClock clock;
  PathSelector sel(clock, QuarantinePolicy{100, 350});
  int a = sel.add_path("a", 1.0);
  int b = sel.add_path("b", 1.0);
  sel.on_post(a, 10);
  sel.on_post(a, 10);
  sel.on_done(a, 10, false);
  sel.on_done(a, 10, false);  // a second failure of the same outage does not lengthen the backoff
  EXPECT_EQ(sel.path(a).health, PathHealth::kQuarantined);
  EXPECT_EQ(sel.path(a).backoff_ms, 100);
  EXPECT_EQ(sel.path(a).failures, 2u);
  EXPECT_EQ(sel.pick(1), b);
  EXPECT_EQ(sel.pick(1, b), b) << "only b is usable";
  EXPECT_TRUE(sel.due_for_probe().empty());
  clock.advance_ms(101);
  auto due = sel.due_for_probe();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(sel.path(a).health, PathHealth::kProbing);
  EXPECT_EQ(sel.pick(1, b), b) << "a probing path carries no slices";
  sel.on_probe(a, false);
  EXPECT_EQ(sel.path(a).backoff_ms, 200);
  clock.advance_ms(201);
  ASSERT_EQ(sel.due_for_probe().size(), 1u);
  sel.on_probe(a, false);
  EXPECT_EQ(sel.path(a).backoff_ms, 350) << "capped at max_backoff_ms";
  clock.advance_ms(351);
  ASSERT_EQ(sel.due_for_probe().size(), 1u);
  sel.on_probe(a, true);
  EXPECT_EQ(sel.path(a).health, PathHealth::kHealthy);
  EXPECT_EQ(sel.path(a).backoff_ms, 0);
  // A refusal by the peer (path_fault=false) does not quarantine.
  sel.on_post(b, 5);
  sel.on_done(b, 5, false, false);
  EXPECT_EQ(sel.path(b).health, PathHealth::kHealthy);
  sel.on_done(b, 5, false);
  sel.on_done(a, 5, false);
  EXPECT_EQ(sel.pick(1), -1) << "no usable path";
  EXPECT_FALSE(sel.any_healthy());
}

TEST(TransferProtocol, MessagesRoundTrip) {
  proto::SegmentDescriptor d;
  d.format_version = proto::kSegmentDescriptorVersion;
  d.name = "127.0.0.1:4000";
  d.host_id = "boot/host";
  d.pid = 42;
  d.endpoints = {"tcp://127.0.0.1:4000", "tcp://127.0.0.2:4000"};
  d.rdma_devices = {"mlx5_0"};
  d.rdma_gids = {"fe80::1"};
  proto::RegionDescriptor r{1ull << 40, (4ull << 30) + 7, "cpu:1", "/proc/1/fd/3", 4096, 0xdeadbeef000ull, {7, 9}};
  d.regions = {r};
  d.topology_json = R"({"version":1})";
  auto d2 = codec::unpack<proto::SegmentDescriptor>(codec::pack(d), "t").value();
  EXPECT_EQ(d2.format_version, proto::kSegmentDescriptorVersion);
  EXPECT_EQ(d2.endpoints, d.endpoints);
  EXPECT_EQ(d2.pid, 42);
  ASSERT_EQ(d2.regions.size(), 1u);
  EXPECT_EQ(d2.regions[0].segment_offset, 1ull << 40);
  EXPECT_EQ(d2.regions[0].length_bytes, (4ull << 30) + 7);
  EXPECT_EQ(d2.regions[0].shm_path, "/proc/1/fd/3");
  EXPECT_EQ(d2.regions[0].shm_offset_bytes, 4096u);
  EXPECT_EQ(d2.regions[0].rdma_rkeys, (std::vector<uint32_t>{7, 9}));
  EXPECT_EQ(d2.rdma_gids, d.rdma_gids);
  EXPECT_EQ(d2.topology_json, d.topology_json);
  auto p = codec::unpack<proto::PublishSegmentRequest>(codec::pack(proto::PublishSegmentRequest{d}), "t").value();
  EXPECT_EQ(p.descriptor.name, d.name);
  EXPECT_EQ(codec::unpack<proto::PublishSegmentReply>(codec::pack(proto::PublishSegmentReply{3}), "t")->region_count,
            3u);
  EXPECT_EQ(codec::unpack<proto::GetSegmentRequest>(codec::pack(proto::GetSegmentRequest{"h:1"}), "t")->name, "h:1");
  EXPECT_EQ(codec::unpack<proto::GetSegmentReply>(codec::pack(proto::GetSegmentReply{d}), "t")->descriptor.host_id,
            "boot/host");
  proto::TransferNotification n{"req7/layer3", "127.0.0.1:5000", 2, 1ull << 33, 65536};
  auto n2 = codec::unpack<proto::TransferNotification>(codec::pack(n), "t").value();
  EXPECT_EQ(n2.tag, "req7/layer3");
  EXPECT_EQ(n2.from, "127.0.0.1:5000");
  EXPECT_EQ(n2.op, 2);
  EXPECT_EQ(n2.segment_offset, 1ull << 33);
  EXPECT_EQ(n2.length_bytes, 65536u);
  // Truncated descriptors are errors, not crashes.
  std::string bytes = codec::pack(d);
  for (size_t cut = 0; cut < bytes.size(); cut += 7) {
    EXPECT_FALSE(codec::unpack<proto::SegmentDescriptor>(bytes.substr(0, cut), "cut").is_ok());
  }
}

}  // namespace
}  // namespace mc::transfer
