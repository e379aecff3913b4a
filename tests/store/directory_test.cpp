// SegmentRegistry: the master's side of the transfer engine's segment directory.
#include <gtest/gtest.h>

#include "mc/proto/transfer.hpp"
#include "mc/store/directory.hpp"

namespace mc::store {
namespace {

proto::SegmentDescriptor descriptor(const std::string& name, uint64_t length = 1 << 20) {
  proto::SegmentDescriptor d;
  d.format_version = proto::kSegmentDescriptorVersion;
  d.name = name;
  d.endpoints = {"tcp://" + name};
  proto::RegionDescriptor r;
  r.segment_offset = 0;
  r.length_bytes = length;
  d.regions.push_back(r);
  return d;
}

TEST(SegmentRegistry, PublishLookupAndReplace) {
  SegmentRegistry reg;
  EXPECT_EQ(reg.lookup("127.0.0.1:1").status().code(), Code::kNotFound);
  ASSERT_EQ(reg.publish(descriptor("127.0.0.1:1")).value_or(0), 1u);
  EXPECT_EQ(reg.lookup("127.0.0.1:1").value().regions.at(0).length_bytes, 1u << 20);
  ASSERT_TRUE(reg.publish(descriptor("127.0.0.1:1", 4096)).is_ok());  // newest wins
  EXPECT_EQ(reg.lookup("127.0.0.1:1").value().regions.at(0).length_bytes, 4096u);
  EXPECT_EQ(reg.size(), 1u);
}

TEST(SegmentRegistry, RejectsUnknownFormatVersionAndBadRegions) {
  SegmentRegistry reg;
  auto d = descriptor("h:1");
  d.format_version = proto::kSegmentDescriptorVersion + 1;
  EXPECT_EQ(reg.publish(d).status().code(), Code::kProtocolMismatch);
  d.format_version = 0;  // a peer that never set it
  EXPECT_EQ(reg.publish(d).status().code(), Code::kProtocolMismatch);
  auto unnamed = descriptor("");
  EXPECT_EQ(reg.publish(unnamed).status().code(), Code::kInvalidArgument);
  auto overlap = descriptor("h:2");
  proto::RegionDescriptor r;
  r.segment_offset = 4096;  // inside the first region of 1 MiB
  r.length_bytes = 10;
  overlap.regions.push_back(r);
  EXPECT_EQ(reg.publish(overlap).status().code(), Code::kInvalidArgument);
  auto wrap = descriptor("h:3");
  wrap.regions[0].segment_offset = ~0ULL - 10;
  EXPECT_EQ(reg.publish(wrap).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.size(), 0u);
}

// A node's descriptor leaves with the node; descriptors no store segment ever named stay.
TEST(SegmentRegistry, DropsDescriptorsOfGoneNodesOnly) {
  SegmentRegistry reg;
  ASSERT_TRUE(reg.publish(descriptor("node-a:1")).is_ok());
  ASSERT_TRUE(reg.publish(descriptor("node-b:1")).is_ok());
  ASSERT_TRUE(reg.publish(descriptor("xfer-peer:1")).is_ok());
  EXPECT_TRUE(reg.retain_bound({"node-a:1", "node-b:1"}).empty());
  auto dropped = reg.retain_bound({"node-a:1"});  // node b unmounted or was declared dead
  EXPECT_EQ(dropped, std::set<std::string>{"node-b:1"});
  EXPECT_EQ(reg.lookup("node-b:1").status().code(), Code::kNotFound);
  EXPECT_TRUE(reg.lookup("node-a:1").is_ok());
  EXPECT_TRUE(reg.lookup("xfer-peer:1").is_ok());
  // Node b comes back: publishes again, then mounts.
  ASSERT_TRUE(reg.publish(descriptor("node-b:1")).is_ok());
  EXPECT_TRUE(reg.retain_bound({"node-a:1"}).empty());  // published, not yet mounted: kept
  EXPECT_TRUE(reg.retain_bound({"node-a:1", "node-b:1"}).empty());
  EXPECT_TRUE(reg.lookup("node-b:1").is_ok());
}

}  // namespace
}  // namespace mc::store
