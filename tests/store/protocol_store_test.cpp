// Round trip of every store message of protocol.hpp: pack -> unpack -> pack gives the same bytes, and
// the non-default values survive (a field missing from MC_MESSAGE would come back as default).
#include <gtest/gtest.h>

#include "mc/proto/codec.hpp"
#include "mc/proto/store.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/testkit/round_trip.hpp"

namespace mc::proto {
namespace {

using mc::testkit::round_trip;

StoreReplica replica() {
  return StoreReplica{"n1/dram",           "n1",       "h1", "rack1", "cpu", "tcp://127.0.0.1:5", "127.0.0.1:6",
                      (1ULL << 40) + 4096, 1ULL << 40, 12345};
}

TEST(StoreProtocol, ReplicaAndMount) {
  StoreReplica r = round_trip(replica());
  EXPECT_EQ(r.offset_bytes, 1ULL << 40);
  EXPECT_EQ(r.xfer_segment, "127.0.0.1:6");
  EXPECT_EQ(r.xfer_offset_bytes, (1ULL << 40) + 4096);
  EXPECT_EQ(r.domain, "rack1");
  StoreMountRequest m{"n1", "n1/ssd", "h1", "rack2", "disk", 5ULL << 30, "tcp://h:1", "", 0, false};
  EXPECT_EQ(round_trip(m).capacity_bytes, 5ULL << 30);
  EXPECT_EQ(round_trip(m).medium, "disk");
  StoreMountRequest dram{"n1",        "n1/dram",       "h1",       "rack2", "cpu", 1ULL << 33,
                         "tcp://h:1", "10.0.0.1:4000", 1ULL << 36, false};
  EXPECT_EQ(round_trip(dram).xfer_segment, "10.0.0.1:4000");
  EXPECT_EQ(round_trip(dram).xfer_base_offset_bytes, 1ULL << 36);
  EXPECT_EQ(round_trip(StoreUnmountRequest{"n1", "n1/dram"}).segment, "n1/dram");
  EXPECT_EQ(std::string(StoreMountRequest::kType), "store.mount");
}

TEST(StoreProtocol, HeartbeatsAndDemotion) {
  StoreNodeHeartbeatRequest hb{"n1", {{7, true, 0, ""}, {8, false, 403, "full"}}};
  auto b = round_trip(hb);
  ASSERT_EQ(b.done.size(), 2u);
  EXPECT_TRUE(b.done[0].ok);
  EXPECT_EQ(b.done[1].task_id, 8u);
  StoreNodeHeartbeatReply r{{StoreDemoteTask{3, "k", "n1/dram", 64, "n1/ssd", 128, 4096, 0}}, {}, {}, false, false};
  auto rb = round_trip(r);
  ASSERT_EQ(rb.tasks.size(), 1u);
  EXPECT_EQ(rb.tasks[0].dst_offset_bytes, 128u);
  EXPECT_TRUE(rb.segments.empty());
  r.segments = {StoreNodeSegmentUsage{"n1/dram", "cpu", 1ULL << 34, 4096, 3, 9}};
  rb = round_trip(r);
  ASSERT_EQ(rb.segments.size(), 1u);
  EXPECT_EQ(rb.segments[0].capacity_bytes, 1ULL << 34);
  EXPECT_EQ(rb.segments[0].used_bytes, 4096u);
  EXPECT_EQ(rb.segments[0].objects, 3u);
  EXPECT_EQ(rb.segments[0].hits, 9u);
  EXPECT_EQ(round_trip(StoreClientHeartbeatRequest{"c9"}).client_id, "c9");
  EXPECT_TRUE(round_trip(StoreAck{}).ok);
}

TEST(StoreProtocol, PutMessages) {
  StorePutStartRequest ps{"c1", {"a", "b"}, {1, 1ULL << 33}, 3, "n2/dram", true, true, "h1", 0};
  auto p = round_trip(ps);
  EXPECT_EQ(p.sizes_bytes[1], 1ULL << 33);
  EXPECT_EQ(p.replicas, 3u);
  EXPECT_TRUE(p.overwrite);
  EXPECT_TRUE(p.pin);
  EXPECT_EQ(p.pin_ttl_ms, 0);
  ps.pin_ttl_ms = 86400000;
  EXPECT_EQ(round_trip(ps).pin_ttl_ms, 86400000);
  StorePinRequest pin{{"a", "b"}, 1500};
  EXPECT_EQ(round_trip(pin).keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(round_trip(pin).ttl_ms, 1500);
  EXPECT_EQ(round_trip(StoreUnpinRequest{{"c"}}).keys.at(0), "c");
  StorePutStartReply pr{{StorePutStartItem{0, "", 42, {replica()}}, StorePutStartItem{401, "busy", 0, {}}}};
  auto prb = round_trip(pr);
  EXPECT_EQ(prb.items[0].put_id, 42u);
  EXPECT_EQ(prb.items[1].code, 401);
  EXPECT_EQ(round_trip(StorePutEndRequest{"c1", {"a"}, {42}, {1}}).put_ids[0], 42u);
  EXPECT_EQ(round_trip(StorePutRevokeRequest{"c1", {"a"}, {43}}).put_ids[0], 43u);
  StoreItemsReply ir{{0, 400}, {"", "not found"}};
  EXPECT_EQ(round_trip(ir).messages[1], "not found");
}

TEST(StoreProtocol, ReadMessages) {
  StoreGetReplicasRequest g{"c1", "h1", "rack1", {"k1", "k2"}};
  EXPECT_EQ(round_trip(g).client_domain, "rack1");
  StoreGetItem item{0, "", 4096, 5000, {replica(), replica()}, {replica()}, 77};
  StoreGetReplicasReply gr{{item}};
  auto grb = round_trip(gr);
  EXPECT_EQ(grb.items[0].replicas.size(), 2u);
  EXPECT_EQ(grb.items[0].replicate_put_id, 77u);
  EXPECT_EQ(grb.items[0].lease_ms, 5000);
  EXPECT_TRUE(round_trip(StoreReplicaEndRequest{"c1", "k", 77, true}).ok);
  EXPECT_EQ(round_trip(StoreExistsRequest{{"a", "b"}}).keys.size(), 2u);
  auto ex = round_trip(StoreExistsReply{{true, false, true}});
  EXPECT_EQ(ex.present, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(round_trip(StoreMatchPrefixRequest{{"a", "b", "c"}}).keys.size(), 3u);
  EXPECT_EQ(round_trip(StoreMatchPrefixReply{24}).matched_blocks, 24u);
  EXPECT_EQ(round_trip(StoreRemoveRequest{{"x"}}).keys[0], "x");
}

TEST(StoreProtocol, ListingStatAndData) {
  EXPECT_EQ(round_trip(StoreLsRequest{"kv/", 7, ""}).limit, 7u);
  EXPECT_EQ(round_trip(StoreLsRequest{"kv/", 7, "kv/a"}).start_after, "kv/a");
  StoreLsReply ls{{StoreObjectInfo{"k", 10, true, true, false, {"n1/dram"}, {"cpu"}}}, true};
  auto lsb = round_trip(ls);
  EXPECT_TRUE(lsb.truncated);
  EXPECT_TRUE(lsb.objects[0].leased);
  StoreStatReply st;
  st.segments.push_back(
      StoreSegmentStat{"n1/dram", "n1", "h", "r", "cpu", 100, 50, 40, 0.2, 3, 1, 9, 2, 1, false, false});
  st.misses = 5;
  st.last_event_id = 99;
  st.pending_free_bytes = 4096;
  st.pinned_objects = 2;
  st.pinned_bytes = 1ULL << 33;
  st.expired_pins = 7;
  auto stb = round_trip(st);
  EXPECT_EQ(stb.pinned_objects, 2u);
  EXPECT_EQ(stb.pinned_bytes, 1ULL << 33);
  EXPECT_EQ(stb.expired_pins, 7u);
  EXPECT_DOUBLE_EQ(stb.segments[0].fragmentation, 0.2);
  EXPECT_EQ(stb.segments[0].demotions, 1u);
  EXPECT_EQ(stb.last_event_id, 99u);
  EXPECT_FALSE(round_trip(StoreStatRequest{false}).with_segments);
  StoreNodeWriteRequest w{"n1/dram", 4096, {'\0', '\xff', 'a'}};
  auto wb = round_trip(w);
  EXPECT_EQ(wb.data, (std::vector<char>{'\0', '\xff', 'a'}));
  EXPECT_EQ(round_trip(StoreNodeReadRequest{"n1/ssd", 8, 16}).length_bytes, 16u);
  EXPECT_EQ(round_trip(StoreNodeReadReply{{'x'}}).data.size(), 1u);
}

// The transfer engine's directory messages, which the master answers.
TEST(StoreProtocol, SegmentDirectoryMessages) {
  SegmentDescriptor d;
  d.format_version = kSegmentDescriptorVersion;
  d.name = "127.0.0.1:4000";
  d.host_id = "boot-1/h";
  d.pid = 42;
  d.endpoints = {"tcp://127.0.0.1:4000"};
  RegionDescriptor r;
  r.segment_offset = 1ULL << 34;
  r.length_bytes = 5ULL << 30;
  r.shm_path = "/proc/42/fd/7";
  d.regions.push_back(r);
  auto p = round_trip(PublishSegmentRequest{d});
  EXPECT_EQ(p.descriptor.name, "127.0.0.1:4000");
  ASSERT_EQ(p.descriptor.regions.size(), 1u);
  EXPECT_EQ(p.descriptor.regions[0].length_bytes, 5ULL << 30);
  EXPECT_EQ(p.descriptor.regions[0].shm_path, "/proc/42/fd/7");
  EXPECT_EQ(round_trip(PublishSegmentReply{3}).region_count, 3u);
  EXPECT_EQ(round_trip(GetSegmentRequest{"h:1"}).name, "h:1");
  EXPECT_EQ(round_trip(GetSegmentReply{d}).descriptor.pid, 42);
  EXPECT_EQ(std::string(GetSegmentRequest::kType), "xfer.get_segment");
}

TEST(StoreProtocol, IllTypedFieldFailsDecode) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(1);
  pk.pack(std::string("sizes_bytes"));
  pk.pack(std::string("not a list"));
  auto r = codec::unpack<StorePutStartRequest>(std::string_view(buf.data(), buf.size()), "test");
  EXPECT_EQ(r.status().code(), Code::kMalformedMessage);
  auto t = codec::unpack<StorePutStartRequest>(std::string_view(buf.data(), buf.size() - 3), "test");
  EXPECT_EQ(t.status().code(), Code::kMalformedMessage);
}

TEST(StoreProtocol, Info) {
  EXPECT_EQ(round_trip(StoreInfoRequest{"client-7"}).client_id, "client-7");
  StoreInfoReply r = round_trip(StoreInfoReply{40123, "mc-store master", 0});
  EXPECT_EQ(r.fast_port, 40123u);
  EXPECT_EQ(r.service, "mc-store master");
  EXPECT_EQ(std::string(StoreInfoRequest::kType), "store.info");
}

// Issue 17: checksums, object tables, re-reports, corrupt replicas, SSD faults and the master's epoch.
TEST(StoreProtocol, FaultMessagesKeepTheirFields) {
  StorePutEndRequest end{"c", {"a", "b"}, {1, 2}, {0xfedcba9876543210ULL, 7}};
  EXPECT_EQ(round_trip(end).checksums, (std::vector<uint64_t>{0xfedcba9876543210ULL, 7}));
  StoreGetItem item;
  item.checksum = ~0ULL;
  EXPECT_EQ(round_trip(item).checksum, ~0ULL);
  StoreDemoteTask task{1, "k", "n/dram", 0, "n/ssd", 64, 100, 99};
  EXPECT_EQ(round_trip(task).checksum, 99u);
  StoreDemoteResult done{3, false, static_cast<uint16_t>(400 + 3), "No space left on device"};
  EXPECT_EQ(round_trip(done).code, 403u);
  EXPECT_EQ(round_trip(done).message, "No space left on device");
  StoreNodeHeartbeatReply beat;
  beat.changes.push_back({true, "n/dram", 4096, "k", 100, 5});
  beat.changes.push_back({false, "n/dram", 0, "", 0, 0});
  beat.more = true;
  beat.report = true;
  auto b = round_trip(beat);
  ASSERT_EQ(b.changes.size(), 2u);
  EXPECT_TRUE(b.changes[0].present);
  EXPECT_EQ(b.changes[0].offset_bytes, 4096u);
  EXPECT_EQ(b.changes[0].checksum, 5u);
  EXPECT_FALSE(b.changes[1].present);
  EXPECT_TRUE(b.more && b.report);
  StoreNodeReportRequest rep{"n", "n/dram", {{"k", 1ULL << 40, 3, 4}}, true, false};
  auto r = round_trip(rep);
  ASSERT_EQ(r.objects.size(), 1u);
  EXPECT_EQ(r.objects[0].offset_bytes, 1ULL << 40);
  EXPECT_TRUE(r.first);
  EXPECT_FALSE(r.last);
  EXPECT_EQ(round_trip(StoreNodeReportReply{2, {64, 128}}).refused_offsets, (std::vector<uint64_t>{64, 128}));
  EXPECT_EQ(round_trip(StoreReportCorruptRequest{"c", "k", "n/dram", 640}).offset_bytes, 640u);
  StoreMountRequest m{"n1", "n1/dram", "h1", "r", "cpu", 1 << 20, "tcp://h:1", "h:2", 0, true};
  EXPECT_TRUE(round_trip(m).restore);
  EXPECT_EQ(round_trip(StoreInfoReply{1, "mc-store master", 1ULL << 63}).epoch, 1ULL << 63);
  StoreStatReply st;
  st.corrupt_replicas = 1;
  st.suspect_nodes = 2;
  st.returned_nodes = 3;
  st.reported_replicas = 4;
  st.refused_reports = 5;
  st.ssd_failures = 6;
  StoreSegmentStat seg;
  seg.suspect = true;
  seg.read_only = true;
  st.segments.push_back(seg);
  auto s = round_trip(st);
  EXPECT_EQ(s.corrupt_replicas + s.suspect_nodes + s.returned_nodes + s.reported_replicas + s.refused_reports +
                s.ssd_failures,
            21u);
  ASSERT_EQ(s.segments.size(), 1u);
  EXPECT_TRUE(s.segments[0].suspect && s.segments[0].read_only);
  EXPECT_EQ(std::string(StoreNodeReportRequest::kType), "store.node_report");
  EXPECT_EQ(std::string(StoreReportCorruptRequest::kType), "store.report_corrupt");
}

TEST(StoreProtocol, NodeDrain) {
  StoreNodeDrainRequest req;
  req.node_id = "n1";
  req.done.push_back({"k1", 42, true, 0, ""});
  req.done.push_back({"k2", 43, false, 13, "checksum"});
  req.final = true;
  auto r = round_trip(req);
  EXPECT_EQ(r.node_id, "n1");
  ASSERT_EQ(r.done.size(), 2u);
  EXPECT_EQ(r.done[1].key, "k2");
  EXPECT_EQ(r.done[1].put_id, 43u);
  EXPECT_FALSE(r.done[1].ok);
  EXPECT_EQ(r.done[1].code, 13);
  EXPECT_EQ(r.done[1].message, "checksum");
  EXPECT_TRUE(r.final);
  StoreNodeDrainReply reply;
  reply.tasks.push_back({"k1", "n1/ssd", 4096, 777, 0xfeedULL, 42, replica()});
  reply.more = true;
  reply.moved_objects = 5;
  reply.dropped_objects = 6;
  reply.remaining_objects = 7;
  auto b = round_trip(reply);
  ASSERT_EQ(b.tasks.size(), 1u);
  EXPECT_EQ(b.tasks[0].src_segment, "n1/ssd");
  EXPECT_EQ(b.tasks[0].src_offset_bytes, 4096u);
  EXPECT_EQ(b.tasks[0].size_bytes, 777u);
  EXPECT_EQ(b.tasks[0].checksum, 0xfeedULL);
  EXPECT_EQ(b.tasks[0].put_id, 42u);
  EXPECT_EQ(b.tasks[0].target.xfer_segment, "127.0.0.1:6");
  EXPECT_TRUE(b.more);
  EXPECT_EQ(b.moved_objects + b.dropped_objects + b.remaining_objects, 18u);
  StoreStatReply st;
  st.nodes_drained = 1;
  st.drain_moved_objects = 2;
  st.drain_moved_bytes = 3;
  st.drain_dropped_objects = 4;
  StoreSegmentStat seg;
  seg.draining = true;
  st.segments.push_back(seg);
  auto s = round_trip(st);
  EXPECT_EQ(s.nodes_drained + s.drain_moved_objects + s.drain_moved_bytes + s.drain_dropped_objects, 10u);
  EXPECT_TRUE(s.segments.at(0).draining);
  EXPECT_EQ(std::string(StoreNodeDrainRequest::kType), "store.node_drain");
}

}  // namespace
}  // namespace mc::proto
