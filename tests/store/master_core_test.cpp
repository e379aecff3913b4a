#include "mc/store/master_core.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "mc/common/block_key.hpp"
#include "mc/proto/store.hpp"
#include "mc/testkit/units.hpp"

namespace mc::store {
namespace {

using testkit::kMiB;

SegmentInfo seg(const std::string& node, const std::string& host, const std::string& domain, uint64_t cap,
                Medium m = Medium::kCpu) {
  SegmentInfo s;
  s.name = node + (m == Medium::kCpu ? "/dram" : "/ssd");
  s.node_id = node;
  s.host = host;
  s.domain = domain;
  s.medium = m;
  s.capacity_bytes = cap;
  s.endpoint = "tcp://127.0.0.1:1";
  return s;
}

std::string block_key(uint64_t i) {
  KeyNamespace ns;
  ns.model_id = "m";
  return block_store_key(ns, 0x1000 + i);
}

class MasterCoreTest : public ::testing::Test {
 protected:
  MasterCoreTest() : core_(make_config(), &clock_) {}
  static MasterConfig make_config() {
    MasterConfig c;
    c.lease_ms = 1000;
    c.put_takeover_ms = 5000;
    c.free_delay_ms = 2000;
    c.client_ttl_ms = 60000;
    c.node_grace_ms = 0;  // dead at the TTL (the suspect state has tests of its own)
    return c;
  }
  void mount3() {
    ASSERT_TRUE(core_.mount_segment(seg("n1", "h1", "rack1", 16 * kMiB)).is_ok());
    ASSERT_TRUE(core_.mount_segment(seg("n2", "h2", "rack1", 16 * kMiB)).is_ok());
    ASSERT_TRUE(core_.mount_segment(seg("n3", "h3", "rack2", 16 * kMiB)).is_ok());
  }
  // put_start + put_end; returns the grant.
  PutGrant put(const std::string& key, uint64_t size, uint32_t replicas = 1, const std::string& pref = "",
               const std::string& client = "c1") {
    PutOptions o;
    o.replicas = replicas;
    o.preferred_segment = pref;
    auto g = core_.put_start({client, "", ""}, key, size, o);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (!g.is_ok()) return {};
    EXPECT_TRUE(core_.put_end({client, "", ""}, key, g->put_id, 0).is_ok());
    return g.value();
  }
  // put_start + put_end into `core` (checksum 0), the first replica preferably on `pref`.
  void put_into(MasterCore& core, const std::string& key, const std::string& pref, uint64_t size = 4096) {
    PutOptions o;
    o.preferred_segment = pref;
    auto g = core.put_start({"c", "", ""}, key, size, o);
    ASSERT_TRUE(g.is_ok()) << key << ": " << g.status().to_string();
    ASSERT_TRUE(core.put_end({"c", "", ""}, key, g->put_id, 0).is_ok());
  }
  void heartbeat_all() {
    for (const char* n : {"n1", "n2", "n3"}) (void)core_.node_heartbeat(n);
  }
  const SegmentStats* seg_stat(const MasterStats& s, const std::string& name) {
    for (const auto& x : s.segments)
      if (x.info.name == name) return &x;
    return nullptr;
  }

  ManualClock clock_{1'000'000'000};
  MasterCore core_;
};

TEST_F(MasterCoreTest, PutIsInvisibleUntilPutEnd) {
  mount3();
  auto g = core_.put_start({"c1", "", ""}, "a", 1000, {});
  ASSERT_TRUE(g.is_ok());
  ASSERT_EQ(g->replicas.size(), 1u);
  EXPECT_FALSE(core_.exists("a"));
  EXPECT_EQ(core_.get_replicas({"c2", "", ""}, "a").status().code(), Code::kObjectNotFound);
  ASSERT_TRUE(core_.put_end({"c1", "", ""}, "a", g->put_id, 0).is_ok());
  EXPECT_TRUE(core_.exists("a"));
  auto r = core_.get_replicas({"c2", "", ""}, "a");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->size_bytes, 1000u);
  EXPECT_EQ(r->replicas[0].offset, g->replicas[0].offset);
  EXPECT_EQ(r->replicas[0].segment.name, g->replicas[0].segment.name);
  // Second put of the same key: already exists.
  EXPECT_EQ(core_.put_start({"c1", "", ""}, "a", 1000, {}).status().code(), Code::kAlreadyExists);
}

// Part checksums (a stage's ranged reads) that do not cut the object's size are refused; the put can still end
// right, and a reader is handed them.
TEST_F(MasterCoreTest, PartChecksumsMustFitTheObjectAndReachItsReaders) {
  mount3();
  auto g = core_.put_start({"c1", "", ""}, "parts", 4000, {});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(core_.put_end({"c1", "", ""}, "parts", g->put_id, 0, 1024, {1, 2}).code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.put_end({"c1", "", ""}, "parts", g->put_id, 0, 0, {1}).code(), Code::kInvalidArgument);
  // Parts under kMinPartBytes: the checksums would outweigh 1/64 of the object.
  EXPECT_EQ(core_.put_end({"c1", "", ""}, "parts", g->put_id, 0, 8, std::vector<uint64_t>(500, 0)).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(core_.put_end({"c1", "", ""}, "parts", g->put_id, 0, 1024, {1, 2, 3, 4}).code(), Code::kOk);
  auto whole = core_.get_replicas({"c1", "", ""}, "parts");  // a whole reader is handed none
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_TRUE(whole->part_checksums.empty());
  auto r = core_.get_replicas({"c1", "", ""}, "parts", /*with_parts=*/true);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->part_bytes, 1024u);
  EXPECT_EQ(r->part_checksums, (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST_F(MasterCoreTest, BadInputIsRejected) {
  mount3();
  EXPECT_EQ(core_.put_start({"c1", "", ""}, "", 10, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.put_start({"c1", "", ""}, "k", 0, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.put_start({"c1", "", ""}, "k", 1ULL << 40, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.put_start({"c1", "", ""}, std::string(10000, 'x'), 10, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.put_start({"", "", ""}, "k", 10, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.put_end({"c1", "", ""}, "k", 99, 0).code(), Code::kFailedPrecondition);
  EXPECT_EQ(core_.remove("nope").code(), Code::kObjectNotFound);
  // Larger than any segment but under the object limit: no space, nothing leaks.
  EXPECT_EQ(core_.put_start({"c1", "", ""}, "big", 64 * kMiB, {}).status().code(), Code::kNoSpace);
  for (const auto& s : core_.stat().segments) EXPECT_EQ(s.used_bytes, 0u);
  SegmentInfo bad = seg("n9", "h9", "r", 10);
  EXPECT_EQ(core_.mount_segment(bad).code(), Code::kInvalidArgument);
  EXPECT_EQ(parse_medium("tape").status().code(), Code::kInvalidArgument);
}

TEST_F(MasterCoreTest, PlacementSpreadsOverFailureDomainsAndDistinctNodes) {
  mount3();
  for (int i = 0; i < 20; ++i) {
    PutGrant g = put("k" + std::to_string(i), 4096, 2);
    ASSERT_EQ(g.replicas.size(), 2u);
    EXPECT_NE(g.replicas[0].segment.node_id, g.replicas[1].segment.node_id);
    EXPECT_NE(g.replicas[0].segment.domain, g.replicas[1].segment.domain) << "replicas of k" << i << " share a rack";
  }
  // More replicas than nodes: one per node, never two on one node.
  PutGrant g = put("wide", 4096, 4);
  EXPECT_EQ(g.replicas.size(), 3u);
  // A preferred segment is used first.
  PutGrant p = put("pref", 4096, 1, "n2/dram");
  ASSERT_EQ(p.replicas.size(), 1u);
  EXPECT_EQ(p.replicas[0].segment.name, "n2/dram");
}

// Field report 20 (Mooncake#3688): three nodes about 88 % full and a fourth that restarted empty. The emptiest
// segment alone would take every put; with the share cap (place() in master_core.hpp) the empty node takes its fair
// quarter plus the 10 % margin of a 4 s burst, the full ones the rest. A handful of puts still goes to the emptiest.
TEST_F(MasterCoreTest, PlacementGivesARestartedEmptyNodeItsShareNotEveryPut) {
  mount3();
  for (const char* n : {"n1", "n2", "n3"}) {
    for (int i = 0; i < 14; ++i)
      put_into(core_, std::string(n) + "-fill" + std::to_string(i), std::string(n) + "/dram",
               kMiB);  // 14 of 16 MiB
  }
  ASSERT_TRUE(core_.mount_segment(seg("n4", "h4", "rack2", 16 * kMiB)).is_ok());
  clock_.advance_ms(60'000);  // the fill's placements are long forgotten
  heartbeat_all();
  (void)core_.node_heartbeat("n4");
  std::map<std::string, int> placed;
  for (int i = 0; i < 4; ++i) ++placed[put("few" + std::to_string(i), 4096).replicas.at(0).segment.node_id];
  EXPECT_EQ(placed["n4"], 4) << "a few puts go to the emptiest node";
  placed.clear();
  constexpr int kPuts = 200;
  for (int i = 0; i < kPuts; ++i) {
    ++placed[put("burst" + std::to_string(i), 4096).replicas.at(0).segment.node_id];
    clock_.advance_ms(20);  // 4 s in all
  }
  // At most a quarter plus the margin, and the 16 placements before the cap applies.
  EXPECT_LE(placed["n4"], static_cast<int>((0.25 + 0.10) * kPuts) + 16) << placed["n4"] << " of " << kPuts;
  EXPECT_GE(placed["n4"], kPuts / 4) << "the empty node still takes at least its fair share";
  for (const char* n : {"n1", "n2", "n3"}) EXPECT_GT(placed[n], 0) << n;
  EXPECT_EQ(placed["n1"] + placed["n2"] + placed["n3"] + placed["n4"], kPuts);
}

TEST_F(MasterCoreTest, GetReplicasNearestFirst) {
  mount3();
  put("k", 4096, 3);
  auto r = core_.get_replicas({"c", "h3", "rack2"}, "k");
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->replicas.size(), 3u);
  EXPECT_EQ(r->replicas[0].segment.host, "h3");
  auto r2 = core_.get_replicas({"c", "h9", "rack1"}, "k");
  EXPECT_EQ(r2->replicas[0].segment.domain, "rack1");
  EXPECT_EQ(r2->replicas[1].segment.domain, "rack1");
  EXPECT_EQ(r2->replicas[2].segment.domain, "rack2");
}

TEST_F(MasterCoreTest, LeaseBlocksRemoveAndOverwriteUntilItEnds) {
  mount3();
  put("k", 4096);
  ASSERT_TRUE(core_.get_replicas({"r", "", ""}, "k").is_ok());
  EXPECT_EQ(core_.remove("k").code(), Code::kObjectBusy);
  PutOptions o;
  o.overwrite = true;
  EXPECT_EQ(core_.put_start({"c1", "", ""}, "k", 4096, o).status().code(), Code::kObjectBusy);
  EXPECT_EQ(core_.stat().segments[0].leased_objects + core_.stat().segments[1].leased_objects +
                core_.stat().segments[2].leased_objects,
            1u);
  clock_.advance_ms(999);
  EXPECT_EQ(core_.remove("k").code(), Code::kObjectBusy);
  clock_.advance_ms(2);
  EXPECT_TRUE(core_.remove("k").is_ok());
  EXPECT_FALSE(core_.exists("k"));
  for (const auto& s : core_.stat().segments) EXPECT_EQ(s.used_bytes, 0u);
}

TEST_F(MasterCoreTest, MatchPrefixAndExists) {
  mount3();
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back(block_key(i));
  for (int i = 0; i < 6; ++i)
    if (i != 3) put(keys[i], 1024);
  EXPECT_EQ(core_.match_prefix(keys), 3u);
  EXPECT_EQ(core_.match_prefix({}), 0u);
  EXPECT_EQ(core_.match_prefix({"absent", keys[0]}), 0u);
  EXPECT_TRUE(core_.exists(keys[5]));
  EXPECT_FALSE(core_.exists(keys[3]));
}

TEST_F(MasterCoreTest, EvictionLruBetweenWatermarksSkipsLeasedPinnedAndUnfinished) {
  MasterConfig c = make_config();
  c.lease_ms = 100000;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 100 * 64 * 1024)).is_ok());  // 100 slots of 64 KiB
  const uint64_t sz = 64 * 1024;
  auto put1 = [&](const std::string& k, bool pin = false) {
    PutOptions o;
    o.pin = pin;
    auto g = core.put_start({"c", "", ""}, k, sz, o);
    ASSERT_TRUE(g.is_ok()) << k << ": " << g.status().to_string();
    ASSERT_TRUE(core.put_end({"c", "", ""}, k, g->put_id, 0).is_ok());
    clock_.advance_ms(1);
  };
  put1("pinned", true);
  put1("leased");
  for (int i = 0; i < 80; ++i) put1("o" + std::to_string(i));
  ASSERT_TRUE(core.get_replicas({"r", "", ""}, "leased").is_ok());  // leased and freshly used
  // A put that stays unfinished.
  auto unfinished = core.put_start({"w", "", ""}, "unfinished", sz, {});
  ASSERT_TRUE(unfinished.is_ok());
  clock_.advance_ms(1);
  // Touch o0 so it becomes most recently used.
  ASSERT_TRUE(core.get_replicas({"r", "", ""}, "o0").is_ok());
  clock_.advance_ms(1);
  // Push usage past 90 %: the put that crosses triggers eviction down to 80 %.
  for (int i = 80; i < 90; ++i) put1("o" + std::to_string(i));
  MasterStats s = core.stat();
  EXPECT_LE(s.segments[0].used_bytes, static_cast<uint64_t>(0.90 * 100 * sz));
  EXPECT_GT(s.segments[0].evictions, 0u);
  EXPECT_TRUE(core.exists("pinned"));
  EXPECT_TRUE(core.exists("leased"));
  EXPECT_TRUE(core.exists("o0"));   // recently read
  EXPECT_FALSE(core.exists("o1"));  // least recently used goes first
  EXPECT_TRUE(core.exists("o89"));
  EXPECT_TRUE(core.put_end({"w", "", ""}, "unfinished", unfinished->put_id, 0).is_ok());
  // Leases end: nothing special, leased object is now an ordinary candidate.
  EXPECT_EQ(s.evictions, s.segments[0].evictions);
}

// Pins (issue 16 item 4): eviction and demotion never take a pinned object; unpin makes it an ordinary
// candidate; a soft pin ends on the injected clock; a pin of a missing key names it.
TEST_F(MasterCoreTest, PinsSurviveEvictionAndDemotionUntilUnpinnedOrExpired) {
  const uint64_t sz = 64 * 1024;
  MasterConfig c = make_config();
  c.lease_ms = 1;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 10 * sz)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 100 * sz, Medium::kDisk)).is_ok());
  auto put1 = [&](const std::string& k, bool pin = false, int64_t ttl_ms = 0) {
    PutOptions o;
    o.pin = pin;
    o.pin_ttl_ms = ttl_ms;
    auto g = core.put_start({"c", "", ""}, k, sz, o);
    ASSERT_TRUE(g.is_ok()) << k << ": " << g.status().to_string();
    ASSERT_TRUE(core.put_end({"c", "", ""}, k, g->put_id, 0).is_ok());
    clock_.advance_ms(1);
  };
  put1("hard", true);
  put1("soft", true, 1000);
  put1("later");
  ASSERT_TRUE(core.pin("later", 0).is_ok());
  MasterStats s = core.stat();
  EXPECT_EQ(s.pinned_objects, 3u);
  EXPECT_EQ(s.pinned_bytes, 3 * sz);
  // Fill DRAM past the high watermark twice over: only unpinned objects are demoted.
  for (int i = 0; i < 14; ++i) {
    put1("o" + std::to_string(i));
    auto tasks = core.node_heartbeat("n1");
    ASSERT_TRUE(tasks.is_ok());
    for (const DemoteTask& t : tasks->tasks) {
      EXPECT_NE(t.key, "hard");
      EXPECT_NE(t.key, "soft");
      EXPECT_NE(t.key, "later");
      ASSERT_TRUE(core.demote_done("n1", t.task_id, true).is_ok());
    }
    core.tick();
  }
  auto medium_of = [&](const std::string& k) {
    auto objs = core.ls(k, 1);
    return objs.size() == 1 && objs[0].key == k && !objs[0].media.empty() ? objs[0].media[0] : std::string("gone");
  };
  for (const char* k : {"hard", "soft", "later"}) EXPECT_EQ(medium_of(k), "cpu") << k;
  EXPECT_EQ(medium_of("o0"), "disk");
  EXPECT_GT(core.stat().demotions, 0u);
  // The soft pin ends on the clock; tick() counts it.
  clock_.advance_ms(1000);
  core.tick();
  s = core.stat();
  EXPECT_EQ(s.pinned_objects, 2u);
  EXPECT_EQ(s.expired_pins, 1u);
  EXPECT_FALSE(core.ls("soft", 1).at(0).pinned);
  // Unpinned, "later" is the least recently used object: the next fill demotes it (and "soft").
  ASSERT_TRUE(core.unpin("later").is_ok());
  for (int i = 14; i < 20; ++i) {
    put1("o" + std::to_string(i));
    auto tasks = core.node_heartbeat("n1");
    ASSERT_TRUE(tasks.is_ok());
    for (const DemoteTask& t : tasks->tasks) ASSERT_TRUE(core.demote_done("n1", t.task_id, true).is_ok());
    core.tick();
  }
  EXPECT_EQ(medium_of("hard"), "cpu");
  EXPECT_EQ(medium_of("later"), "disk");
  EXPECT_EQ(medium_of("soft"), "disk");
  s = core.stat();
  EXPECT_EQ(s.pinned_objects, 1u);
  EXPECT_EQ(s.pinned_bytes, sz);
  // Errors name the key.
  Status missing = core.pin("nope", 0);
  EXPECT_EQ(missing.code(), Code::kObjectNotFound);
  EXPECT_NE(missing.message().find("'nope'"), std::string::npos) << missing.message();
  EXPECT_EQ(core.unpin("nope").code(), Code::kObjectNotFound);
  EXPECT_EQ(core.pin("hard", -1).code(), Code::kInvalidArgument);
  // A TTL past a year is refused (now + TTL in ns would overflow near 1e13 ms, and the pin silently ended).
  EXPECT_EQ(core.pin("hard", kMaxPinTtlMs + 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(core.pin("hard", int64_t{10'000'000'000'000}).code(), Code::kInvalidArgument);
  PutOptions long_pin;
  long_pin.pin = true;
  long_pin.pin_ttl_ms = int64_t{1} << 62;
  EXPECT_EQ(core.put_start({"w", "", ""}, "long", sz, long_pin).status().code(), Code::kInvalidArgument);
  auto writing = core.put_start({"w", "", ""}, "writing", sz, {});
  ASSERT_TRUE(writing.is_ok());
  EXPECT_EQ(core.pin("writing", 0).code(), Code::kObjectBusy);
}

TEST_F(MasterCoreTest, PinnedObjectsAreNeverEvictedWithoutSsd) {
  const uint64_t sz = 64 * 1024;
  MasterConfig c = make_config();
  c.lease_ms = 1;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 10 * sz)).is_ok());
  for (int i = 0; i < 30; ++i) {
    PutOptions o;
    o.pin = i == 0;
    o.pin_ttl_ms = 0;
    auto g = core.put_start({"c", "", ""}, "k" + std::to_string(i), sz, o);
    ASSERT_TRUE(g.is_ok()) << i << ": " << g.status().to_string();
    ASSERT_TRUE(core.put_end({"c", "", ""}, "k" + std::to_string(i), g->put_id, 0).is_ok());
    clock_.advance_ms(1);
    core.tick();
  }
  EXPECT_TRUE(core.exists("k0"));
  EXPECT_FALSE(core.exists("k1"));
  EXPECT_GT(core.stat().evictions, 0u);
  // A pinned-full segment refuses a put with kNoSpace instead of taking a pin.
  MasterCore full(c, &clock_);
  ASSERT_TRUE(full.mount_segment(seg("n1", "h1", "r1", 2 * sz)).is_ok());
  PutOptions pin;
  pin.pin = true;
  for (const char* k : {"a", "b"}) {
    auto g = full.put_start({"c", "", ""}, k, sz, pin);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    ASSERT_TRUE(full.put_end({"c", "", ""}, k, g->put_id, 0).is_ok());
  }
  clock_.advance_ms(10);
  EXPECT_EQ(full.put_start({"c", "", ""}, "x", sz, {}).status().code(), Code::kNoSpace);
  EXPECT_TRUE(full.exists("a"));
  EXPECT_TRUE(full.exists("b"));
}

TEST_F(MasterCoreTest, FullOfLeasedObjectsMeansNoSpaceNotCorruption) {
  MasterConfig c = make_config();
  c.lease_ms = 100000;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 4 * 4096)).is_ok());
  for (int i = 0; i < 3; ++i) {
    auto g = core.put_start({"c", "", ""}, "k" + std::to_string(i), 4096, {});
    ASSERT_TRUE(g.is_ok());
    ASSERT_TRUE(core.put_end({"c", "", ""}, "k" + std::to_string(i), g->put_id, 0).is_ok());
    ASSERT_TRUE(core.get_replicas({"r", "", ""}, "k" + std::to_string(i)).is_ok());
  }
  // 3/4 used, all leased; 2 more do not fit without evicting a leased object.
  auto g = core.put_start({"c", "", ""}, "x", 8192, {});
  EXPECT_EQ(g.status().code(), Code::kNoSpace);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(core.exists("k" + std::to_string(i)));
}

TEST_F(MasterCoreTest, DemotionToSsdChangesMedium) {
  MasterConfig c = make_config();
  c.lease_ms = 10;
  MasterCore core(c, &clock_);
  const uint64_t sz = 64 * 1024;
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 10 * sz)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 100 * sz, Medium::kDisk)).is_ok());
  for (int i = 0; i < 10; ++i) {
    auto g = core.put_start({"c", "", ""}, block_key(i), sz, {});
    ASSERT_TRUE(g.is_ok()) << i << g.status().to_string();
    EXPECT_EQ(g->replicas[0].segment.medium, Medium::kCpu);
    ASSERT_TRUE(core.put_end({"c", "", ""}, block_key(i), g->put_id, 0).is_ok());
    clock_.advance_ms(1);
  }
  (void)core.take_events();
  // The 10th put pushed DRAM to 100 % > 90 %: the two oldest are queued for demotion.
  auto tasks = core.node_heartbeat("n1");
  ASSERT_TRUE(tasks.is_ok());
  ASSERT_EQ(tasks->tasks.size(), 2u);
  EXPECT_EQ(tasks->tasks.at(0).key, block_key(0));
  EXPECT_EQ(tasks->tasks.at(0).src_segment, "n1/dram");
  EXPECT_EQ(tasks->tasks.at(0).dst_segment, "n1/ssd");
  // Until the node reports, the DRAM copy is what readers get.
  auto before = core.get_replicas({"r", "h1", ""}, block_key(0));
  ASSERT_TRUE(before.is_ok());
  ASSERT_EQ(before->replicas.size(), 1u);
  EXPECT_EQ(before->replicas[0].segment.medium, Medium::kCpu);
  clock_.advance_ms(20);  // lease over
  for (const auto& t : tasks->tasks) ASSERT_TRUE(core.demote_done("n1", t.task_id, true).is_ok());
  auto after = core.get_replicas({"r", "h1", ""}, block_key(0));
  ASSERT_TRUE(after.is_ok());
  ASSERT_EQ(after->replicas.size(), 1u);
  EXPECT_EQ(after->replicas[0].segment.medium, Medium::kDisk);
  EXPECT_EQ(after->replicas[0].offset, tasks->tasks.at(0).dst_offset);
  MasterStats s = core.stat();
  EXPECT_EQ(s.demotions, 2u);
  EXPECT_EQ(s.segments[0].used_bytes, 8 * sz);
  auto ev = core.take_events();
  ASSERT_EQ(ev.size(), 4u);  // stored(disk) + removed(cpu) for each
  EXPECT_EQ(ev[0].type, "stored");
  EXPECT_EQ(ev[0].medium, "disk");
  EXPECT_EQ(ev[1].type, "removed");
  EXPECT_EQ(ev[1].medium, "cpu");
  // A failed demotion frees the SSD range and keeps the DRAM copy.
  EXPECT_EQ(core.demote_done("n1", 999, true).code(), Code::kNotFound);
}

// Field report #5 (Mooncake#1914): replicas on a dead node, DRAM and SSD alike, must vanish.
TEST_F(MasterCoreTest, FieldReport5DeadNodeReplicasVanishIncludingSsd) {
  ASSERT_TRUE(core_.mount_segment(seg("n1", "h1", "rack1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core_.mount_segment(seg("n2", "h2", "rack1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core_.mount_segment(seg("n2", "h2", "rack1", 16 * kMiB, Medium::kDisk)).is_ok());
  ASSERT_TRUE(core_.mount_segment(seg("n3", "h3", "rack2", 16 * kMiB)).is_ok());
  std::string k1 = block_key(101), k2 = block_key(102);
  put(k1, 4096, 1, "n2/dram");
  put(k2, 4096, 1, "n1/dram");
  std::vector<std::string> chain = {block_key(0), block_key(1), block_key(2), block_key(3)};
  put(chain[0], 4096, 1, "n1/dram");
  put(chain[1], 4096, 1, "n3/dram");
  put(chain[2], 4096, 1, "n2/dram");
  put(chain[3], 4096, 1, "n3/dram");
  EXPECT_EQ(core_.match_prefix(chain), 4u);
  (void)core_.take_events();
  // N2 stops heartbeating; the others go on. 2 x the TTL later:
  for (int i = 0; i < 6; ++i) {
    clock_.advance_ms(1000);
    (void)core_.node_heartbeat("n1");
    (void)core_.node_heartbeat("n3");
    core_.tick();
  }
  EXPECT_EQ(core_.get_replicas({"c", "", ""}, k1).status().code(), Code::kObjectNotFound);
  auto r2 = core_.get_replicas({"c", "", ""}, k2);
  ASSERT_TRUE(r2.is_ok());
  for (const auto& r : r2->replicas) EXPECT_NE(r.segment.node_id, "n2");
  EXPECT_EQ(core_.match_prefix(chain), 2u);
  for (const auto& o : core_.ls("", 100)) {
    for (const auto& s : o.segments) EXPECT_EQ(s.find("n2/"), std::string::npos) << o.key;
  }
  auto ev = core_.take_events();
  int cleared = 0;
  for (const auto& e : ev)
    if (e.type == "cleared") {
      ++cleared;
      EXPECT_EQ(e.backend_id.substr(0, 3), "n2/");
    }
  EXPECT_EQ(cleared, 2);  // DRAM and SSD segment
  EXPECT_EQ(core_.node_heartbeat("n2").status().code(), Code::kNotFound);
  // N2 comes back with fresh, empty segments: K1 does not come back.
  ASSERT_TRUE(core_.mount_segment(seg("n2", "h2", "rack1", 16 * kMiB)).is_ok());
  EXPECT_FALSE(core_.exists(k1));
  EXPECT_EQ(core_.match_prefix(chain), 2u);
}

TEST_F(MasterCoreTest, DeadNodeSsdReplicaFromDemotionIsDropped) {
  MasterConfig c = make_config();
  c.lease_ms = 1;
  MasterCore core(c, &clock_);
  const uint64_t sz = 64 * 1024;
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r1", 10 * sz)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r1", 10 * sz, Medium::kDisk)).is_ok());
  for (int i = 0; i < 10; ++i) {
    PutOptions o;
    o.preferred_segment = "n2/dram";
    auto g = core.put_start({"c", "", ""}, block_key(i), sz, o);
    ASSERT_TRUE(g.is_ok());
    ASSERT_TRUE(core.put_end({"c", "", ""}, block_key(i), g->put_id, 0).is_ok());
    clock_.advance_ms(1);
  }
  auto tasks = core.node_heartbeat("n2");
  ASSERT_FALSE(tasks->tasks.empty());
  for (const auto& t : tasks->tasks) ASSERT_TRUE(core.demote_done("n2", t.task_id, true).is_ok());
  auto r = core.get_replicas({"c", "", ""}, block_key(0));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->replicas[0].segment.medium, Medium::kDisk);
  for (int i = 0; i < 5; ++i) {
    clock_.advance_ms(1000);
    (void)core.node_heartbeat("n1");
    core.tick();
  }
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(core.exists(block_key(i))) << i;
  EXPECT_EQ(core.stat().objects, 0u);
}

// Field report #7 (Mooncake#974): a writer that dies mid-put.
TEST_F(MasterCoreTest, FieldReport7StaleWriterTakeover) {
  mount3();
  auto free_before = [&] {
    uint64_t used = 0;
    for (const auto& s : core_.stat().segments) used += s.used_bytes;
    return used;
  };
  uint64_t used0 = free_before();
  auto c1 = core_.put_start({"C1", "", ""}, "K", 8192, {});
  ASSERT_TRUE(c1.is_ok());
  // Step 2: read at once -> miss.
  EXPECT_FALSE(core_.exists("K"));
  EXPECT_EQ(core_.get_replicas({"R", "", ""}, "K").status().code(), Code::kObjectNotFound);
  EXPECT_EQ(core_.match_prefix({"K"}), 0u);
  // Step 3: C2 before the timeout -> retryable busy.
  clock_.advance_ms(1000);
  auto early = core_.put_start({"C2", "", ""}, "K", 8192, {});
  EXPECT_EQ(early.status().code(), Code::kObjectBusy);
  EXPECT_TRUE(early.status().is_retryable());
  EXPECT_EQ(core_.remove("K").code(), Code::kObjectBusy);
  // Step 4: past the 5 s takeover -> C2 succeeds.
  clock_.advance_ms(4500);
  auto c2 = core_.put_start({"C2", "", ""}, "K", 8192, {});
  ASSERT_TRUE(c2.is_ok()) << c2.status().to_string();
  ASSERT_TRUE(core_.put_end({"C2", "", ""}, "K", c2->put_id, 0).is_ok());
  // Step 5: C1's delayed put_end is refused; K stays C2's.
  EXPECT_EQ(core_.put_end({"C1", "", ""}, "K", c1->put_id, 0).code(), Code::kFailedPrecondition);
  auto r = core_.get_replicas({"R", "", ""}, "K");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->replicas[0].offset, c2->replicas[0].offset);
  // C1's range is freed only after the delay; then the pool is back to pre-C1 plus C2's object.
  EXPECT_GT(core_.stat().pending_free_bytes, 0u);
  uint64_t used_with_both = free_before();
  clock_.advance_ms(2001);
  heartbeat_all();
  core_.tick();
  EXPECT_EQ(core_.stat().pending_free_bytes, 0u);
  EXPECT_EQ(free_before(), used_with_both - 8192);
  EXPECT_EQ(free_before(), used0 + 8192);
  EXPECT_EQ(core_.stat().reclaimed_puts, 1u);
}

// Delayed frees (free_delay_ms after a revoke) come back exactly when each falls due, whatever the order they were
// queued in (the master keeps them in a heap: issue 48's quadratic erase from the front of a vector).
TEST_F(MasterCoreTest, DelayedFreesComeBackWhenEachFallsDue) {
  mount3();
  auto used_bytes = [&] {
    uint64_t used = 0;
    for (const auto& s : core_.stat().segments) used += s.used_bytes;
    return used;
  };
  const uint64_t used0 = used_bytes();
  constexpr int kPuts = 10;
  for (int i = 0; i < kPuts; ++i) {
    auto g = core_.put_start({"c1", "", ""}, "R" + std::to_string(i), 4096, {});
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    clock_.advance_ms(100);  // revoke i at 100 * (i + 1) ms: its range is free 2,000 ms later
    ASSERT_TRUE(core_.put_revoke({"c1", "", ""}, "R" + std::to_string(i), g->put_id).is_ok());
  }
  EXPECT_EQ(core_.stat().pending_free_bytes, uint64_t{kPuts} * 4096);
  // At 2,000 ms, 1,900 ms after the first revoke: nothing is due yet.
  clock_.advance_ms(1000);
  heartbeat_all();
  core_.tick();
  EXPECT_EQ(core_.stat().pending_free_bytes, uint64_t{kPuts} * 4096);
  // 500 ms more: revokes 0..4 (at 100..500 ms) are 2,000 ms old and their ranges come back; 5..9 not yet.
  clock_.advance_ms(500);
  heartbeat_all();
  core_.tick();
  EXPECT_EQ(core_.stat().pending_free_bytes, uint64_t{5} * 4096);
  EXPECT_EQ(used_bytes(), used0 + 5 * 4096);
  clock_.advance_ms(1000);
  heartbeat_all();
  core_.tick();
  EXPECT_EQ(core_.stat().pending_free_bytes, 0u);
  EXPECT_EQ(used_bytes(), used0);
}

TEST_F(MasterCoreTest, DeadWriterPutIsReclaimedByTick) {
  MasterConfig c = make_config();
  c.client_ttl_ms = 3000;
  c.free_delay_ms = 0;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB)).is_ok());
  auto g = core.put_start({"C1", "", ""}, "K", 8192, {});
  ASSERT_TRUE(g.is_ok());
  for (int i = 0; i < 4; ++i) {
    clock_.advance_ms(1000);
    (void)core.node_heartbeat("n1");
    core.tick();
  }
  EXPECT_EQ(core.stat().processing, 0u);
  EXPECT_EQ(core.stat().segments[0].used_bytes, 0u);
  // The revived writer's put_end is refused.
  EXPECT_EQ(core.put_end({"C1", "", ""}, "K", g->put_id, 0).code(), Code::kFailedPrecondition);
  EXPECT_FALSE(core.exists("K"));
}

// With data-plane grants, a range handed out with a grant is not reused while the grant could still be presented:
// alice's write grant (put_takeover_ms + hold) and a reader's read grant (lease_ms + hold) outlive the object.
TEST_F(MasterCoreTest, ARangeHandedOutWithAGrantIsNotReusedBeforeTheGrantEnds) {
  MasterConfig c = make_config();  // lease 1 s, put takeover 5 s, free delay 2 s
  c.grant_hold_ms = 10000;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB)).is_ok());
  // Time passes in 500 ms steps, the node heartbeating and the core ticking at each.
  auto pass_ms = [&](int64_t ms) {
    for (int64_t t = 0; t < ms; t += 500) {
      clock_.advance_ms(std::min<int64_t>(500, ms - t));
      (void)core.node_heartbeat("n1");
      core.tick();
    }
  };
  auto a = core.put_start({"alice", "", ""}, "tenant/alice/k", 8192, {});
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE(core.put_end({"alice", "", ""}, "tenant/alice/k", a->put_id, 0).is_ok());
  ASSERT_TRUE(core.remove("tenant/alice/k").is_ok());
  // Past the free delay but inside alice's write grant (5 s + 10 s): bob's object goes elsewhere.
  pass_ms(3000);
  auto b = core.put_start({"bob", "", ""}, "tenant/bob/k", 8192, {});
  ASSERT_TRUE(b.is_ok());
  EXPECT_NE(b->replicas[0].offset, a->replicas[0].offset);
  EXPECT_EQ(core.stat().pending_free_bytes, 8192u);
  // Once the grant is over, the range is free again.
  pass_ms(12001);
  EXPECT_EQ(core.stat().pending_free_bytes, 0u);
  // A read grant holds the range for lease_ms + hold after the get, however early the object ends.
  ASSERT_TRUE(core.put_end({"bob", "", ""}, "tenant/bob/k", b->put_id, 0).is_ok());
  pass_ms(16000);  // bob's own write grant is over
  ASSERT_TRUE(core.get_replicas({"reader", "", ""}, "tenant/bob/k").is_ok());
  pass_ms(1001);  // the read lease is over: removable
  ASSERT_TRUE(core.remove("tenant/bob/k").is_ok());
  pass_ms(2001);  // past the free delay, inside lease + hold
  EXPECT_EQ(core.stat().pending_free_bytes, 8192u);
  pass_ms(8000);
  EXPECT_EQ(core.stat().pending_free_bytes, 0u);
}

TEST_F(MasterCoreTest, RevokeFreesAfterDelay) {
  mount3();
  auto g = core_.put_start({"c1", "", ""}, "K", 8192, {});
  ASSERT_TRUE(g.is_ok());
  ASSERT_TRUE(core_.put_revoke({"c1", "", ""}, "K", g->put_id).is_ok());
  EXPECT_EQ(core_.stat().processing, 0u);
  EXPECT_EQ(core_.put_end({"c1", "", ""}, "K", g->put_id, 0).code(), Code::kFailedPrecondition);
  clock_.advance_ms(2001);
  heartbeat_all();
  core_.tick();
  for (const auto& s : core_.stat().segments) EXPECT_EQ(s.used_bytes, 0u);
}

TEST_F(MasterCoreTest, HotObjectGetsOneMoreReplicaNearItsReaders) {
  MasterConfig c = make_config();
  c.hot_read_threshold = 3;
  c.max_replicas = 2;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n3", "h3", "r2", 16 * kMiB)).is_ok());
  PutOptions o;
  o.preferred_segment = "n1/dram";
  auto g = core.put_start({"w", "", ""}, "sys", 4096, o);
  ASSERT_TRUE(core.put_end({"w", "", ""}, "sys", g->put_id, 0).is_ok());
  std::optional<ReadGrant> hot;
  for (int i = 0; i < 4; ++i) {
    auto r = core.get_replicas({"reader", "h3", "r2"}, "sys");
    ASSERT_TRUE(r.is_ok());
    if (r->replicate_to) hot = r.value();
    EXPECT_EQ(r->replicas.size(), 1u);
  }
  ASSERT_TRUE(hot.has_value());
  EXPECT_EQ(hot->replicate_to->segment.host, "h3");  // the copy goes where it is read
  ASSERT_TRUE(core.replica_end({"reader", "", ""}, "sys", hot->replicate_put_id, true).is_ok());
  auto r = core.get_replicas({"reader", "h3", "r2"}, "sys");
  ASSERT_EQ(r->replicas.size(), 2u);
  EXPECT_EQ(r->replicas[0].segment.host, "h3");
  EXPECT_FALSE(r->replicate_to.has_value());  // bounded by max_replicas
  EXPECT_EQ(core.stat().hot_replications, 1u);
}

TEST_F(MasterCoreTest, PutPlacesTheFirstReplicaOnTheWritersHost) {
  mount3();
  // Without a host label the emptiest segment wins; with one, the writer's host wins whatever the usage.
  put("filler", 4 * kMiB, 1, "n2/dram");
  for (const char* host : {"h1", "h2", "h3"}) {
    std::string key = std::string("k-") + host;
    auto g = core_.put_start({"c1", host, ""}, key, 4096, {});
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    ASSERT_EQ(g->replicas.size(), 1u);
    EXPECT_EQ(g->replicas[0].segment.host, host) << key;
    ASSERT_TRUE(core_.put_end({"c1", host, ""}, key, g->put_id, 0).is_ok());
  }
  // A host with no segment: placement as before (any segment with room).
  auto g = core_.put_start({"c1", "elsewhere", ""}, "k-elsewhere", 4096, {});
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->replicas.size(), 1u);
  // The host's only segment is full: the put goes to another host rather than failing.
  MasterCore small(make_config(), &clock_);
  ASSERT_TRUE(small.mount_segment(seg("n1", "h1", "rack1", 1 * kMiB)).is_ok());
  ASSERT_TRUE(small.mount_segment(seg("n2", "h2", "rack1", 16 * kMiB)).is_ok());
  auto big = small.put_start({"c1", "h1", ""}, "big", 2 * kMiB, {});
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_EQ(big->replicas[0].segment.host, "h2");
}

TEST_F(MasterCoreTest, ReplicateNearCopiesOnTheNextReadFromThatHost) {
  mount3();
  const std::string k0 = block_key(0), k1 = block_key(1), absent = block_key(2);
  for (const auto& k : {k0, k1}) {
    auto g = core_.put_start({"p1", "h1", ""}, k, 4096, {});
    ASSERT_TRUE(g.is_ok());
    ASSERT_EQ(g->replicas[0].segment.host, "h1");
    ASSERT_TRUE(core_.put_end({"p1", "h1", ""}, k, g->put_id, 0).is_ok());
  }
  (void)core_.take_events();
  // Already on h1, absent: skipped. Remote holders for h3: marked.
  EXPECT_EQ(core_.replicate_near({k0, k1, absent}, "h1").value(), 0u);
  EXPECT_EQ(core_.replicate_near({k0, k1, absent}, "h3").value(), 2u);
  EXPECT_EQ(core_.replicate_near({k0}, "").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(core_.replicate_near({""}, "h3").status().code(), Code::kInvalidArgument);

  // A reader on another host gets no copy order; the one on h3 does, on h3's segment.
  auto other = core_.get_replicas({"p2", "h2", ""}, k0);
  ASSERT_TRUE(other.is_ok());
  EXPECT_FALSE(other->replicate_to.has_value());
  auto r = core_.get_replicas({"p3", "h3", ""}, k0);
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->replicas.size(), 1u);
  EXPECT_EQ(r->replicas[0].segment.host, "h1");  // it reads the existing copy ...
  ASSERT_TRUE(r->replicate_to.has_value());      // ... and writes it here
  EXPECT_EQ(r->replicate_to->segment.host, "h3");
  // One copy: a second read while it is being written orders none.
  EXPECT_FALSE(core_.get_replicas({"p3", "h3", ""}, k0)->replicate_to.has_value());
  ASSERT_TRUE(core_.replica_end({"p3", "h3", ""}, k0, r->replicate_put_id, true).is_ok());
  auto events = core_.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, proto::kKvEventStored);
  EXPECT_EQ(events[0].backend_id, "n3/dram");
  // Now the nearest replica for h3 is local, and no further copy is made.
  auto again = core_.get_replicas({"p3", "h3", ""}, k0);
  ASSERT_EQ(again->replicas.size(), 2u);
  EXPECT_EQ(again->replicas[0].segment.host, "h3");
  EXPECT_FALSE(again->replicate_to.has_value());
  EXPECT_EQ(core_.stat().hot_replications, 1u);

  // The mark expires after hot_window_ms.
  clock_.advance_ms(core_.config().hot_window_ms + 1);
  heartbeat_all();
  EXPECT_FALSE(core_.get_replicas({"p3", "h3", ""}, k1)->replicate_to.has_value());
}

TEST_F(MasterCoreTest, ReplicateNearNeedsRoomOnThatHost) {
  MasterConfig c = make_config();
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "rack1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "rack1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n3", "h3", "rack1", 1 * kMiB)).is_ok());
  auto g = core.put_start({"w", "h1", ""}, "big", 2 * kMiB, {});
  ASSERT_TRUE(g.is_ok());
  ASSERT_TRUE(core.put_end({"w", "h1", ""}, "big", g->put_id, 0).is_ok());
  EXPECT_EQ(core.replicate_near({"big"}, "h3").value(), 1u);
  // h3 has no room: no copy elsewhere either (a copy on h2 would not be near the reader).
  auto r = core.get_replicas({"p3", "h3", ""}, "big");
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->replicate_to.has_value());
  EXPECT_EQ(core.stat().hot_replications, 0u);
}

TEST_F(MasterCoreTest, KvEventsCarrySeqHashBackendAndMedium) {
  mount3();
  std::string k = block_key(7);
  PutGrant g = put(k, 4096, 2);
  auto ev = core_.take_events();
  ASSERT_EQ(ev.size(), 2u);
  for (const auto& e : ev) {
    EXPECT_EQ(e.type, "stored");
    ASSERT_EQ(e.seq_hashes.size(), 1u);
    EXPECT_EQ(e.seq_hashes[0], 0x1000u + 7);
    EXPECT_EQ(e.medium, "cpu");
  }
  EXPECT_EQ(ev[0].backend_id, g.replicas[0].segment.name);
  ASSERT_TRUE(core_.remove(k).is_ok());
  ev = core_.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].type, "removed");
  // Keys that are not block keys are stored but not announced.
  put("plain-key", 10);
  EXPECT_TRUE(core_.take_events().empty());
  EXPECT_EQ(BlockStoreKey::parse("kv/0123456789abcdef/00000000000000ff")->seq_hash, 0xffu);
  EXPECT_FALSE(BlockStoreKey::parse("kv/x/zz").has_value());
}

TEST_F(MasterCoreTest, UnmountDropsReplicasAtOnce) {
  mount3();
  put("a", 4096, 1, "n1/dram");
  put("b", 4096, 2, "n1/dram");
  ASSERT_TRUE(core_.unmount_segment("n1", "n1/dram").is_ok());
  EXPECT_FALSE(core_.exists("a"));
  EXPECT_TRUE(core_.exists("b"));
  auto r = core_.get_replicas({"c", "", ""}, "b");
  ASSERT_EQ(r->replicas.size(), 1u);
  EXPECT_NE(r->replicas[0].segment.node_id, "n1");
  EXPECT_EQ(core_.unmount_segment("n1", "n1/dram").code(), Code::kNotFound);
  EXPECT_EQ(core_.stat().nodes, 2u);
}

// ls pages through the ordered key index (issue 51): a page is at most `limit` objects and, past the first, about
// max_bytes; the next starts after the last key of the one before; removed and re-put keys stay in order.
TEST_F(MasterCoreTest, LsPagesInKeyOrderWithinItsBounds) {
  mount3();
  for (const char* k : {"p/c", "p/a", "p/e", "p/b", "p/d", "q/a", "o/z"}) put(k, 100);
  bool more = false;
  auto page = core_.ls("p/", 2, "", SIZE_MAX, &more);
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[0].key, "p/a");
  EXPECT_EQ(page[1].key, "p/b");
  EXPECT_TRUE(more);
  page = core_.ls("p/", 2, "p/b", SIZE_MAX, &more);
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[0].key, "p/c");
  EXPECT_EQ(page[1].key, "p/d");
  EXPECT_TRUE(more);
  page = core_.ls("p/", 2, "p/d", SIZE_MAX, &more);
  ASSERT_EQ(page.size(), 1u);
  EXPECT_EQ(page[0].key, "p/e");
  EXPECT_FALSE(more);
  // A start_after before the prefix starts at the prefix; the byte bound stops a page after its first object.
  page = core_.ls("p/", 100, "a", 1, &more);
  ASSERT_EQ(page.size(), 1u);
  EXPECT_EQ(page[0].key, "p/a");
  EXPECT_TRUE(more);
  ASSERT_TRUE(core_.remove("p/c").is_ok());
  put("p/bb", 100);
  std::vector<std::string> keys;
  for (const auto& o : core_.ls("p/", 100)) keys.push_back(o.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"p/a", "p/b", "p/bb", "p/d", "p/e"}));
  EXPECT_EQ(core_.ls("", 100).size(), 7u);
}

// A stall of the master's own loop is not held against the nodes: credit_loop_stall moves their last heartbeat
// on by the stall, so the tick after it finds none missing; a node silent beyond it still is.
TEST_F(MasterCoreTest, LoopStallIsCreditedToTheNodesHeartbeats) {
  mount3();
  heartbeat_all();
  clock_.advance_ms(make_config().node_ttl_ms + 500);  // the loop was stuck: no heartbeat processed meanwhile
  core_.credit_loop_stall(make_config().node_ttl_ms + 500);
  core_.tick();
  EXPECT_EQ(core_.stat().suspect_nodes, 0u);
  EXPECT_EQ(core_.stat().segments.size(), 3u);
  clock_.advance_ms(make_config().node_ttl_ms + 1);  // now silent for real
  core_.tick();
  EXPECT_LT(core_.stat().segments.size(), 3u);
}

TEST_F(MasterCoreTest, LsByPrefixAndStat) {
  mount3();
  put("a/1", 100);
  put("a/2", 100);
  put("b/1", 100);
  auto l = core_.ls("a/", 10);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].key, "a/1");
  EXPECT_EQ(core_.ls("", 2).size(), 2u);
  (void)core_.get_replicas({"c", "", ""}, "a/1");
  (void)core_.get_replicas({"c", "", ""}, "zzz");
  MasterStats s = core_.stat();
  EXPECT_EQ(s.objects, 3u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.nodes, 3u);
  uint64_t used = 0;
  for (const auto& x : s.segments) used += x.used_bytes;
  EXPECT_EQ(used, 3u * 128);  // 100 bytes rounded to the 64-byte alignment
}

}  // namespace
}  // namespace mc::store

namespace mc::store {
namespace {
TEST_F(MasterCoreTest, DemotionFreesRoomForTheNextPut) {
  MasterConfig c = make_config();
  c.lease_ms = 50;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 2 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB, Medium::kDisk)).is_ok());
  for (int i = 0; i < 14; ++i) {
    auto g = core.put_start({"c", "", ""}, "d/" + std::to_string(i), 204800 + i * 7, {});
    if (g.status().code() == Code::kUnavailable) {
      auto tasks = core.node_heartbeat("n1");
      ASSERT_FALSE(tasks->tasks.empty()) << i;
      for (const auto& t : tasks->tasks) ASSERT_TRUE(core.demote_done("n1", t.task_id, true).is_ok());
      g = core.put_start({"c", "", ""}, "d/" + std::to_string(i), 204800 + i * 7, {});
    }
    ASSERT_TRUE(g.is_ok()) << i << ": " << g.status().to_string();
    ASSERT_TRUE(core.put_end({"c", "", ""}, "d/" + std::to_string(i), g->put_id, 0).is_ok());
    clock_.advance_ms(1);
  }
  EXPECT_GT(core.stat().demotions, 0u);
}
}  // namespace
}  // namespace mc::store

namespace mc::store {
namespace {

// Issue 17 (DESIGN.md §8 liveness): a node that misses heartbeats is suspect first — its replicas kept but not
// offered — and, back within the grace period, re-reports; what it confirms is offered again, the rest dropped.
TEST_F(MasterCoreTest, SuspectNodeKeepsItsReplicasAndGetsThemBackAfterReReporting) {
  MasterConfig c = make_config();
  c.node_ttl_ms = 1000;
  c.node_grace_ms = 10000;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r2", 16 * kMiB)).is_ok());
  std::vector<proto::StoreNodeObject> table;  // n2's object table, as the heartbeats tell it
  for (int i = 0; i < 3; ++i) {
    PutOptions o;
    o.preferred_segment = "n2/dram";
    auto g = core.put_start({"c", "", ""}, block_key(i), 4096, o);
    ASSERT_TRUE(g.is_ok());
    ASSERT_TRUE(core.put_end({"c", "", ""}, block_key(i), g->put_id, 100 + i).is_ok());
  }
  auto beat = core.node_heartbeat("n2");
  ASSERT_TRUE(beat.is_ok());
  ASSERT_EQ(beat->changes.size(), 3u);
  for (const auto& ch : beat->changes) {
    EXPECT_TRUE(ch.present);
    EXPECT_EQ(ch.segment, "n2/dram");
    table.push_back({ch.key, ch.offset_bytes, ch.size_bytes, ch.checksum});
  }
  EXPECT_EQ(table[1].checksum, 101u);
  // n2 goes silent past its TTL: suspect, its objects not offered, yet not dropped.
  for (int i = 0; i < 3; ++i) {
    clock_.advance_ms(600);
    (void)core.node_heartbeat("n1");
    core.tick();
  }
  MasterStats s = core.stat();
  EXPECT_EQ(s.suspect_nodes, 1u);
  EXPECT_EQ(s.dead_nodes, 0u);
  EXPECT_EQ(s.objects, 3u);
  EXPECT_EQ(core.get_replicas({"r", "", ""}, block_key(0)).status().code(), Code::kObjectNotFound);
  EXPECT_FALSE(core.exists(block_key(0)));
  // New puts avoid the suspect node.
  auto g = core.put_start({"c", "", ""}, "new", 4096, PutOptions{1, "n2/dram", false, false, 0, ""});
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->replicas.at(0).segment.name, "n1/dram");
  // Meanwhile block 2 is removed: the change waits for n2.
  ASSERT_TRUE(core.remove(block_key(2)).is_ok());
  // n2 is back: asked to re-report; it reports 0 and 1 (it applied the removal of 2), plus a bogus entry.
  auto back = core.node_heartbeat("n2");
  ASSERT_TRUE(back.is_ok());
  EXPECT_TRUE(back->report);
  ASSERT_EQ(back->changes.size(), 1u);
  EXPECT_FALSE(back->changes[0].present);
  std::vector<proto::StoreNodeObject> report = {table[0], table[1], {"bogus", 1 << 20, 4096, 7}};
  auto rep = core.node_report("n2", "n2/dram", report, true, true);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_EQ(rep->accepted, 2u);
  ASSERT_EQ(rep->refused_offsets.size(), 1u);
  EXPECT_EQ(rep->refused_offsets[0], uint64_t{1} << 20);
  auto got = core.get_replicas({"r", "", ""}, block_key(1));
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got->replicas.at(0).segment.name, "n2/dram");
  EXPECT_EQ(got->checksum, 101u);
  EXPECT_FALSE(core.exists("bogus"));
  s = core.stat();
  EXPECT_EQ(s.suspect_nodes, 0u);
  EXPECT_EQ(s.returned_nodes, 1u);
  EXPECT_EQ(s.reported_replicas, 2u);
  EXPECT_EQ(s.refused_reports, 1u);
}

TEST_F(MasterCoreTest, SuspectNodeUnconfirmedReplicasAreDroppedAndAfterTheGraceItIsDead) {
  MasterConfig c = make_config();
  c.node_ttl_ms = 1000;
  c.node_grace_ms = 2000;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB)).is_ok());
  put_into(core, "a", "n1/dram");
  put_into(core, "b", "n1/dram");
  clock_.advance_ms(1500);
  core.tick();
  ASSERT_EQ(core.stat().suspect_nodes, 1u);
  ASSERT_TRUE(core.node_heartbeat("n1")->report);
  // The node reports nothing (its memory was lost): both objects go.
  ASSERT_TRUE(core.node_report("n1", "n1/dram", {}, true, true).is_ok());
  EXPECT_EQ(core.stat().objects, 0u);
  EXPECT_EQ(core.stat().suspect_nodes, 0u);
  // Silent again, past TTL + grace: dead.
  put_into(core, "c", "n1/dram");
  clock_.advance_ms(1500);
  core.tick();
  EXPECT_FALSE(core.exists("c"));
  clock_.advance_ms(1600);
  core.tick();
  EXPECT_EQ(core.stat().dead_nodes, 1u);
  EXPECT_EQ(core.node_heartbeat("n1").status().code(), Code::kNotFound);
}

// Issue 17: a restarted master rebuilds the pool from the nodes' reports (mount with restore).
TEST_F(MasterCoreTest, RestartedMasterRebuildsObjectsFromNodeReports) {
  MasterCore core(make_config(), &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB), true).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r2", 16 * kMiB), true).is_ok());
  // Restoring segments are not offered before their report ends.
  EXPECT_EQ(core.put_start({"c", "", ""}, "x", 4096, {}).status().code(), Code::kNoSpace);
  auto r1 = core.node_report("n1", "n1/dram", {{"k", 0, 4096, 42}, {"solo", 4096, 100, 9}}, true, true);
  ASSERT_TRUE(r1.is_ok());
  EXPECT_EQ(r1->accepted, 2u);
  // n2 holds a second replica of k (same size and checksum) and a conflicting copy of solo.
  auto r2 = core.node_report("n2", "n2/dram", {{"k", 8192, 4096, 42}, {"solo", 0, 100, 10}}, true, true);
  ASSERT_TRUE(r2.is_ok());
  EXPECT_EQ(r2->accepted, 1u);
  ASSERT_EQ(r2->refused_offsets, std::vector<uint64_t>{0});
  auto g = core.get_replicas({"r", "", ""}, "k");
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->replicas.size(), 2u);
  EXPECT_EQ(g->checksum, 42u);
  // The restored ranges are allocated: a new put does not overlap them.
  auto p = core.put_start({"c", "", ""}, "x", 4096, PutOptions{1, "n1/dram", false, false, 0, ""});
  ASSERT_TRUE(p.is_ok());
  EXPECT_GE(p->replicas.at(0).offset, 4096u + 100u);
  // A page without an open round is refused.
  EXPECT_EQ(core.node_report("n1", "n1/dram", {}, false, true).status().code(), Code::kFailedPrecondition);
}

TEST_F(MasterCoreTest, CorruptReplicaIsDroppedAndCounted) {
  mount3();
  PutGrant g = put("k", 4096, 2);
  ASSERT_EQ(g.replicas.size(), 2u);
  const ReplicaView bad = g.replicas[0];
  ASSERT_TRUE(core_.report_corrupt("k", bad.segment.name, bad.offset).is_ok());
  auto r = core_.get_replicas({"r", "", ""}, "k");
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->replicas.size(), 1u);
  EXPECT_NE(r->replicas[0].segment.name, bad.segment.name);
  EXPECT_EQ(core_.report_corrupt("k", bad.segment.name, bad.offset).code(), Code::kObjectNotFound);
  clock_.advance_ms(2000);  // lease over
  ASSERT_TRUE(core_.report_corrupt("k", r->replicas[0].segment.name, r->replicas[0].offset).is_ok());
  EXPECT_FALSE(core_.exists("k"));
  EXPECT_EQ(core_.stat().corrupt_replicas, 2u);
}

// Issue 17 (disks): ENOSPC during a demotion makes the SSD read-only and eviction takes over.
TEST_F(MasterCoreTest, FailedDemotionMakesSsdReadOnlyAndPutsKeepSucceeding) {
  MasterConfig c = make_config();
  c.lease_ms = 1;
  MasterCore core(c, &clock_);
  const uint64_t sz = 64 * 1024;
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 10 * sz)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 100 * sz, Medium::kDisk)).is_ok());
  for (int i = 0; i < 10; ++i) put_into(core, block_key(i), "", sz);
  auto beat = core.node_heartbeat("n1");
  ASSERT_FALSE(beat->tasks.empty());
  for (const auto& t : beat->tasks) {
    ASSERT_TRUE(core.demote_done("n1", t.task_id, false, Code::kNoSpace, "No space left on device").is_ok());
  }
  MasterStats s = core.stat();
  EXPECT_EQ(s.ssd_failures, 1u);
  EXPECT_TRUE(s.segments.at(1).read_only);
  clock_.advance_ms(5);
  for (int i = 10; i < 40; ++i) {
    auto g = core.put_start({"c", "", ""}, block_key(i), sz, {});
    ASSERT_TRUE(g.is_ok()) << i << ": " << g.status().to_string();
    ASSERT_TRUE(core.put_end({"c", "", ""}, block_key(i), g->put_id, 0).is_ok());
    clock_.advance_ms(5);
  }
  EXPECT_TRUE(core.node_heartbeat("n1")->tasks.empty());
  EXPECT_GT(core.stat().evictions, 0u);
}

// ---- Drain (issue 19 item 3) ----

// Completes every task of a drain page (the node's copies all succeed).
void finish_page(MasterCore& core, const std::string& node, const DrainPage& page) {
  for (const DrainTask& t : page.tasks) {
    EXPECT_TRUE(core.drain_done(node, t.key, t.put_id, true).is_ok()) << t.key;
  }
}

TEST_F(MasterCoreTest, DrainMovesSoleReplicaObjectsAndSkipsThoseWithReplicasElsewhere) {
  mount3();
  for (int i = 0; i < 5; ++i) put("only/" + std::to_string(i), 4096 + i, 1, "n1/dram");
  put("both", 8192, 2, "n1/dram");  // a second replica on another node: not copied
  put("elsewhere", 4096, 1, "n2/dram");
  auto page = core_.drain_node("n1", 3);
  ASSERT_TRUE(page.is_ok()) << page.status().to_string();
  EXPECT_EQ(page->tasks.size(), 3u);  // bounded page
  EXPECT_TRUE(page->more);
  std::set<std::string> keys;
  for (const DrainTask& t : page->tasks) {
    keys.insert(t.key);
    EXPECT_EQ(t.src_segment, "n1/dram");
    EXPECT_NE(t.target.segment.node_id, "n1");
    EXPECT_EQ(t.target.segment.medium, Medium::kCpu);
    EXPECT_EQ(t.target.size_bytes, t.size_bytes);
    EXPECT_NE(t.put_id, 0u);
  }
  // The copies are processing replicas: invisible, and a client cannot complete them with replica_end.
  const DrainTask first = page->tasks.front();
  EXPECT_EQ(core_.replica_end({"c1", "", ""}, first.key, first.put_id, true).code(), Code::kFailedPrecondition);
  finish_page(core_, "n1", *page);
  auto page2 = core_.drain_node("n1", 3);
  ASSERT_TRUE(page2.is_ok());
  EXPECT_EQ(page2->tasks.size(), 2u);
  for (const DrainTask& t : page2->tasks) keys.insert(t.key);
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_FALSE(keys.count("both"));
  EXPECT_FALSE(keys.count("elsewhere"));
  EXPECT_TRUE(page2->more);  // reported by the next call
  finish_page(core_, "n1", *page2);
  auto last = core_.drain_node("n1", 3);
  ASSERT_TRUE(last.is_ok());
  EXPECT_TRUE(last->tasks.empty());
  EXPECT_FALSE(last->more);
  EXPECT_EQ(last->moved_objects, 5u);
  // Both copies are readable until the unmount; then only the new ones.
  for (int i = 0; i < 5; ++i) {
    auto r = core_.get_replicas({"c2", "", ""}, "only/" + std::to_string(i));
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->replicas.size(), 2u);
  }
  ASSERT_TRUE(core_.unmount_segment("n1", "n1/dram").is_ok());
  for (int i = 0; i < 5; ++i) {
    auto r = core_.get_replicas({"c2", "", ""}, "only/" + std::to_string(i));
    ASSERT_TRUE(r.is_ok()) << i;
    ASSERT_EQ(r->replicas.size(), 1u);
    EXPECT_NE(r->replicas[0].segment.node_id, "n1");
  }
  EXPECT_TRUE(core_.exists("both"));
  EXPECT_TRUE(core_.exists("elsewhere"));
  MasterStats st = core_.stat();
  EXPECT_EQ(st.nodes_drained, 1u);
  EXPECT_EQ(st.dead_nodes, 0u);
  EXPECT_EQ(st.drain_moved_objects, 5u);
  EXPECT_EQ(st.drain_moved_bytes, 5u * 4096 + 0 + 1 + 2 + 3 + 4);
  EXPECT_EQ(st.drain_dropped_objects, 0u);
  EXPECT_EQ(st.nodes, 2u);
}

TEST_F(MasterCoreTest, DrainFromSsdAndDrainingSegmentsTakeNoNewPlacements) {
  ASSERT_TRUE(core_.mount_segment(seg("n1", "h1", "rack1", 16 * kMiB)).is_ok());
  ASSERT_TRUE(core_.mount_segment(seg("n1", "h1", "rack1", 16 * kMiB, Medium::kDisk)).is_ok());
  ASSERT_TRUE(core_.mount_segment(seg("n2", "h2", "rack2", 16 * kMiB)).is_ok());
  put("k", 4096, 1, "n1/dram");
  ASSERT_TRUE(core_.drain_node("n1", 0).is_ok());  // marks draining, hands out nothing
  MasterStats st = core_.stat();
  EXPECT_TRUE(seg_stat(st, "n1/dram")->draining);
  EXPECT_TRUE(seg_stat(st, "n1/ssd")->draining);
  EXPECT_FALSE(seg_stat(st, "n2/dram")->draining);
  // New puts (even preferring n1, even from n1's host) land elsewhere; replicas=2 finds one node only.
  for (int i = 0; i < 20; ++i) {
    PutOptions o;
    o.preferred_segment = "n1/dram";
    o.replicas = 2;
    auto g = core_.put_start({"c1", "h1", ""}, "new/" + std::to_string(i), 4096, o);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    ASSERT_EQ(g->replicas.size(), 1u);
    EXPECT_EQ(g->replicas[0].segment.node_id, "n2");
    ASSERT_TRUE(core_.put_end({"c1", "", ""}, "new/" + std::to_string(i), g->put_id, 0).is_ok());
  }
  // No hot copy nor replicate_near copy to it either.
  ASSERT_TRUE(core_.replicate_near({"new/0"}, "h1").is_ok());
  EXPECT_FALSE(core_.get_replicas({"p1", "h1", ""}, "new/0")->replicate_to.has_value());
  // The draining node's replica stays readable.
  EXPECT_TRUE(core_.get_replicas({"c1", "", ""}, "k").is_ok());
}

TEST_F(MasterCoreTest, DrainCopiesAnSsdOnlyObjectFromItsFile) {
  MasterConfig c = make_config();
  c.lease_ms = 1;
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 64 * 1024)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 16 * kMiB, Medium::kDisk)).is_ok());
  // Fill n1's DRAM past the high watermark: the oldest objects are demoted to its SSD.
  for (int i = 0; i < 15; ++i) {
    put_into(core, "d/" + std::to_string(i), "n1/dram", 4096);
    clock_.advance_ms(5);
  }
  auto beat = core.node_heartbeat("n1");
  ASSERT_TRUE(beat.is_ok());
  ASSERT_FALSE(beat->tasks.empty());
  for (const DemoteTask& t : beat->tasks) ASSERT_TRUE(core.demote_done("n1", t.task_id, true).is_ok());
  std::string ssd_key = beat->tasks.front().key;
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r2", 16 * kMiB)).is_ok());
  auto page = core.drain_node("n1", 1000);
  ASSERT_TRUE(page.is_ok());
  EXPECT_EQ(page->tasks.size(), 15u);
  bool from_ssd = false;
  for (const DrainTask& t : page->tasks) {
    if (t.key == ssd_key) {
      from_ssd = true;
      EXPECT_EQ(t.src_segment, "n1/ssd");
    }
    EXPECT_EQ(t.target.segment.node_id, "n2");
  }
  EXPECT_TRUE(from_ssd);
}

TEST_F(MasterCoreTest, DrainDropsWhatFitsNowhereAndCountsIt) {
  MasterConfig c = make_config();
  c.lease_ms = 100000;  // every object on n2 is leased: nothing there can be evicted for the drain
  MasterCore core(c, &clock_);
  ASSERT_TRUE(core.mount_segment(seg("n1", "h1", "r1", 4 * kMiB)).is_ok());
  ASSERT_TRUE(core.mount_segment(seg("n2", "h2", "r2", 1 * kMiB)).is_ok());
  put_into(core, "fill", "n2/dram", 900 * 1024);
  ASSERT_TRUE(core.get_replicas({"r", "", ""}, "fill").is_ok());  // leased
  put_into(core, "small", "n1/dram", 64 * 1024);
  put_into(core, "big1", "n1/dram", 1 * kMiB);
  put_into(core, "big2", "n1/dram", 1 * kMiB);
  auto page = core.drain_node("n1", 100);
  ASSERT_TRUE(page.is_ok());
  ASSERT_EQ(page->tasks.size(), 1u);
  EXPECT_EQ(page->tasks[0].key, "small");
  EXPECT_EQ(page->dropped_objects, 2u);
  EXPECT_FALSE(core.exists("big1"));
  EXPECT_FALSE(core.exists("big2"));
  EXPECT_TRUE(core.exists("small"));
  finish_page(core, "n1", *page);
  auto last = core.drain_node("n1", 100);
  ASSERT_TRUE(last.is_ok());
  EXPECT_FALSE(last->more);
  ASSERT_TRUE(core.unmount_segment("n1", "n1/dram").is_ok());
  MasterStats st = core.stat();
  EXPECT_EQ(st.drain_dropped_objects, 2u);
  EXPECT_EQ(st.drain_moved_objects, 1u);
  EXPECT_EQ(st.nodes_drained, 1u);
  EXPECT_TRUE(core.exists("small"));
  EXPECT_TRUE(core.exists("fill"));
}

TEST_F(MasterCoreTest, FailedDrainCopyIsAbandonedAndFreedAfterTheDelay) {
  mount3();
  put("a", 8192, 1, "n1/dram");
  put("b", 8192, 1, "n1/dram");
  put("c", 8192, 1, "n1/dram");
  auto page = core_.drain_node("n1", 10);
  ASSERT_TRUE(page.is_ok());
  ASSERT_EQ(page->tasks.size(), 3u);
  std::map<std::string, DrainTask> by_key;
  for (const DrainTask& t : page->tasks) by_key[t.key] = t;
  const auto used_elsewhere = [&] {
    uint64_t used = 0;
    for (const auto& s : core_.stat().segments) used += s.info.node_id == "n1" ? 0 : s.used_bytes;
    return used;
  };
  EXPECT_EQ(used_elsewhere(), 3u * 8192);
  // a: copied; b: the transfer failed; c: its source failed the checksum.
  ASSERT_TRUE(core_.drain_done("n1", "a", by_key["a"].put_id, true).is_ok());
  ASSERT_TRUE(core_.drain_done("n1", "b", by_key["b"].put_id, false, Code::kUnavailable, "peer gone").is_ok());
  ASSERT_TRUE(core_.drain_done("n1", "c", by_key["c"].put_id, false, Code::kDataLoss, "checksum").is_ok());
  // A second report of the same copy, another node's, or a made-up put id: refused.
  EXPECT_EQ(core_.drain_done("n1", "a", by_key["a"].put_id, true).code(), Code::kNotFound);
  EXPECT_EQ(core_.drain_done("n2", "b", by_key["b"].put_id, true).code(), Code::kNotFound);
  EXPECT_EQ(core_.drain_done("n1", "b", 999999, true).code(), Code::kNotFound);
  EXPECT_EQ(core_.drain_done("n1", "", 1, true).code(), Code::kInvalidArgument);
  EXPECT_FALSE(core_.exists("c"));  // dropped as corrupt
  EXPECT_TRUE(core_.exists("b"));   // still on n1 until the unmount, not retried
  auto next = core_.drain_node("n1", 10);
  ASSERT_TRUE(next.is_ok());
  EXPECT_TRUE(next->tasks.empty());
  EXPECT_FALSE(next->more);
  // The abandoned copies' ranges come back only after free_delay_ms.
  EXPECT_EQ(used_elsewhere(), 3u * 8192);
  clock_.advance_ms(2001);
  heartbeat_all();
  core_.tick();
  EXPECT_EQ(used_elsewhere(), 8192u);
  auto fin = core_.drain_node("n1", 10, true);
  ASSERT_TRUE(fin.is_ok());
  EXPECT_EQ(fin->remaining_objects, 1u);  // b: not retried, lost with the unmount
  ASSERT_TRUE(core_.unmount_segment("n1", "n1/dram").is_ok());
  MasterStats st = core_.stat();
  EXPECT_EQ(st.corrupt_replicas, 1u);
  EXPECT_EQ(st.drain_moved_objects, 1u);
  EXPECT_EQ(st.drain_dropped_objects, 2u);  // c (corrupt) and b (left with the node)
  EXPECT_EQ(st.nodes_drained, 1u);
  EXPECT_TRUE(core_.exists("a"));
  EXPECT_FALSE(core_.exists("b"));
}

TEST_F(MasterCoreTest, NodeDyingMidDrainIsDeadNotDrainedAndItsCopiesAreFreed) {
  mount3();
  put("x", 8192, 1, "n1/dram");
  put("y", 8192, 1, "n1/dram");
  auto page = core_.drain_node("n1", 10);
  ASSERT_TRUE(page.is_ok());
  ASSERT_EQ(page->tasks.size(), 2u);
  ASSERT_TRUE(core_.drain_done("n1", page->tasks[0].key, page->tasks[0].put_id, true).is_ok());
  const std::string saved = page->tasks[0].key, lost = page->tasks[1].key;
  // n1 goes silent: dead at the TTL (grace 0), its in-flight copy goes with it (freed free_delay_ms later).
  for (int i = 0; i < 8; ++i) {
    clock_.advance_ms(1000);
    (void)core_.node_heartbeat("n2");
    (void)core_.node_heartbeat("n3");
    core_.tick();
  }
  EXPECT_TRUE(core_.exists(saved));
  EXPECT_FALSE(core_.exists(lost));
  EXPECT_EQ(core_.drain_node("n1", 10).status().code(), Code::kNotFound);
  MasterStats st = core_.stat();
  EXPECT_EQ(st.dead_nodes, 1u);
  EXPECT_EQ(st.nodes_drained, 0u);
  EXPECT_EQ(st.drain_moved_objects, 1u);
  uint64_t used = 0;
  for (const auto& s : st.segments) used += s.used_bytes;
  EXPECT_EQ(used, 8192u);  // the lost object's copy was freed (after free_delay_ms, passed above)
  EXPECT_EQ(st.pending_free_bytes, 0u);
}

TEST_F(MasterCoreTest, AbandonedDrainCopyIsNotRetriedAndTheTimeoutCountsWhatIsLeft) {
  mount3();
  put("p", 4096, 1, "n1/dram");
  put("q", 4096, 1, "n1/dram");
  auto page = core_.drain_node("n1", 1);
  ASSERT_TRUE(page.is_ok());
  ASSERT_EQ(page->tasks.size(), 1u);
  // The node never reports it: after put_takeover_ms tick() abandons the copy like a hot copy's.
  for (int i = 0; i < 6; ++i) {
    clock_.advance_ms(1000);
    heartbeat_all();
    core_.tick();
  }
  auto next = core_.drain_node("n1", 1);
  ASSERT_TRUE(next.is_ok());
  ASSERT_EQ(next->tasks.size(), 1u);
  EXPECT_NE(next->tasks[0].key, page->tasks[0].key);  // the abandoned key is not handed out again
  // The node gives up (timeout): final hands out nothing and counts what is still only there.
  auto fin = core_.drain_node("n1", 10, true);
  ASSERT_TRUE(fin.is_ok());
  EXPECT_TRUE(fin->tasks.empty());
  EXPECT_EQ(fin->remaining_objects, 2u);  // p abandoned, q's copy never reported: both lost with the unmount
  ASSERT_TRUE(core_.unmount_segment("n1", "n1/dram").is_ok());
  MasterStats st = core_.stat();
  EXPECT_EQ(st.drain_dropped_objects, 2u);
  EXPECT_EQ(st.nodes_drained, 1u);
  EXPECT_FALSE(core_.exists("p"));
  EXPECT_FALSE(core_.exists("q"));
}

}  // namespace
}  // namespace mc::store
