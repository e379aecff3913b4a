// The durable metadata of MasterCore (issue 21, DESIGN.md §17): a random workload on a tracked core, after every step
// the changes it hands out applied to a shadow copy of the records, which must equal the core's full snapshot; and a
// fresh core loaded from those records holds the same complete objects at the same offsets (what a standby that takes
// over serves). A missed change (a mutation site without its dirty mark) fails here, not in a failover.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

#include "mc/common/clock.hpp"
#include "mc/store/master_core.hpp"
#include "mc/testkit/units.hpp"

namespace mc::store {
namespace {

using testkit::kMiB;

SegmentInfo segment(const std::string& node, const std::string& host, uint64_t cap, Medium m) {
  SegmentInfo s;
  s.name = node + (m == Medium::kCpu ? "/dram" : "/ssd");
  s.node_id = node;
  s.host = host;
  s.domain = "rack-" + host;
  s.medium = m;
  s.capacity_bytes = cap;
  s.endpoint = "tcp://127.0.0.1:1";
  return s;
}

MasterConfig config() {
  MasterConfig c;
  c.lease_ms = 200;
  c.put_takeover_ms = 1000;
  c.free_delay_ms = 500;
  c.client_ttl_ms = 5000;
  c.node_ttl_ms = 3000;
  c.node_grace_ms = 0;
  c.hot_read_threshold = 3;
  return c;
}

std::string render(const DurableObject& o) {
  std::string s = o.key + " " + std::to_string(o.size_bytes) + " " + std::to_string(o.checksum) +
                  (o.complete ? " complete" : " processing") + (o.pinned ? " pinned" : "");
  for (const DurableReplica& r : o.replicas) {
    s += " " + r.segment + "@" + std::to_string(r.offset) + (r.complete ? "" : "(w)");
  }
  return s;
}
std::string render(const DurableSegment& d) {
  return d.info.name + " " + d.info.node_id + " " + std::to_string(d.info.capacity_bytes) + (d.read_only ? " ro" : "");
}

// The complete part of a snapshot: what a loaded core serves (ranges being written are held, not objects).
std::map<std::string, std::string> served(const std::vector<DurableObject>& objects) {
  std::map<std::string, std::string> out;
  for (DurableObject o : objects) {
    if (!o.complete) continue;
    std::erase_if(o.replicas, [](const DurableReplica& r) { return !r.complete; });
    if (o.replicas.empty()) continue;
    o.pinned = false;  // soft pins' remaining time is checked separately
    out[o.key] = render(o);
  }
  return out;
}

TEST(MasterDurable, ChangesKeepAShadowEqualToTheSnapshotAndALoadedCoreServesTheSame) {
  ManualClock clock(1'000'000'000);
  MasterCore core(config(), &clock);
  core.track_durable_changes();
  std::map<std::string, std::string> shadow_objects, shadow_segments;
  std::map<std::string, DurableObject> shadow_records;
  std::map<std::string, DurableSegment> shadow_segment_records;
  const auto apply = [&] {
    DurableChanges c = core.take_durable_changes();
    for (auto& [name, d] : c.segments) {
      if (d) {
        shadow_segments[name] = render(*d);
        shadow_segment_records[name] = *d;
      } else {
        shadow_segments.erase(name);
        shadow_segment_records.erase(name);
      }
    }
    for (auto& [key, d] : c.objects) {
      if (d) {
        shadow_objects[key] = render(*d);
        shadow_records[key] = *d;
      } else {
        shadow_objects.erase(key);
        shadow_records.erase(key);
      }
    }
  };
  const auto snapshot_equal = [&](int step) {
    std::map<std::string, std::string> objects, segments;
    for (const DurableObject& o : core.durable_objects()) objects[o.key] = render(o);
    for (const DurableSegment& d : core.durable_segments()) segments[d.info.name] = render(d);
    ASSERT_EQ(objects, shadow_objects) << "after step " << step;
    ASSERT_EQ(segments, shadow_segments) << "after step " << step;
  };

  std::mt19937_64 rng(21);
  const std::vector<std::string> nodes = {"n1", "n2", "n3", "n4"};
  for (const std::string& n : nodes) {
    ASSERT_TRUE(core.mount_segment(segment(n, "h-" + n, 256 * 1024, Medium::kCpu)).is_ok());
  }
  ASSERT_TRUE(core.mount_segment(segment("n1", "h-n1", 512 * 1024, Medium::kDisk)).is_ok());
  std::map<std::string, uint64_t> puts;  // key -> put_id of an unfinished put
  uint64_t task_seen = 0;
  for (int step = 0; step < 4000; ++step) {
    const std::string key = "k" + std::to_string(rng() % 60);
    const std::string client = "c" + std::to_string(rng() % 3);
    const Caller caller{client, "h-n" + std::to_string(1 + rng() % 4), ""};
    switch (rng() % 14) {
      case 0:
      case 1:
      case 2: {
        PutOptions o;
        o.replicas = 1 + static_cast<uint32_t>(rng() % 2);
        o.overwrite = rng() % 4 == 0;
        o.pin = rng() % 6 == 0;
        o.pin_ttl_ms = o.pin && rng() % 2 ? 700 : 0;
        auto g = core.put_start(caller, key, 1024 * (1 + rng() % 24), o);
        if (g.is_ok()) puts[key] = g->put_id;
        break;
      }
      case 3:
      case 4:
        if (auto p = puts.find(key); p != puts.end()) {
          (void)core.put_end(caller, key, p->second, rng());
          puts.erase(p);
        }
        break;
      case 5:
        if (auto p = puts.find(key); p != puts.end() && rng() % 3 == 0) {
          (void)core.put_revoke(caller, key, p->second);
          puts.erase(p);
        }
        break;
      case 6: {
        auto g = core.get_replicas(caller, key);
        if (g.is_ok() && g->replicate_to) (void)core.replica_end(caller, key, g->replicate_put_id, rng() % 2 == 0);
        break;
      }
      case 7:
        (void)core.remove(key);
        break;
      case 8:
        (void)(rng() % 2 ? core.pin(key, rng() % 2 ? 0 : 400) : core.unpin(key));
        break;
      case 9: {
        const std::string& n = nodes[rng() % nodes.size()];
        auto beat = core.node_heartbeat(n);
        if (beat.is_ok()) {
          for (const DemoteTask& t : beat->tasks) {
            const bool ok = rng() % 4 != 0;
            (void)core.demote_done(n, t.task_id, ok, ok ? Code::kOk : (rng() % 2 ? Code::kNoSpace : Code::kIo));
            ++task_seen;
          }
        }
        break;
      }
      case 10:
        (void)core.replicate_near({key}, "h-n" + std::to_string(1 + rng() % 4));
        break;
      case 11:
        clock.advance_ms(static_cast<int64_t>(rng() % 300));
        for (const std::string& n : nodes) (void)core.node_heartbeat(n);
        core.tick();
        break;
      case 12:
        if (rng() % 40 == 0) {  // a node leaves and comes back empty
          const std::string& n = nodes[1 + rng() % 3];
          (void)core.unmount_segment(n, n + "/dram");
          ASSERT_TRUE(core.mount_segment(segment(n, "h-" + n, 256 * 1024, Medium::kCpu)).is_ok());
        }
        break;
      default: {
        auto g = core.get_replicas(caller, key);
        if (g.is_ok() && !g->replicas.empty() && rng() % 30 == 0) {
          (void)core.report_corrupt(key, g->replicas.front().segment.name, g->replicas.front().offset);
        }
        break;
      }
    }
    apply();
    snapshot_equal(step);
    if (HasFatalFailure()) return;
    if (step % 500 == 499) {
      // A standby loading the shadow serves the same complete objects at the same offsets.
      ManualClock later(clock.now_ns());
      MasterCore standby(config(), &later);
      std::vector<DurableSegment> segs;
      std::vector<DurableObject> objs;
      for (const auto& [name, d] : shadow_segment_records) segs.push_back(d);
      for (const auto& [key, d] : shadow_records) objs.push_back(d);
      auto loaded = standby.load_durable(segs, objs);
      ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
      EXPECT_EQ(loaded->refused_records, 0u) << (loaded->refusals.empty() ? "" : loaded->refusals.front());
      EXPECT_EQ(served(standby.durable_objects()), served(core.durable_objects())) << "load at step " << step;
      for (const DurableObject& o : core.durable_objects()) {
        if (!o.complete) continue;
        EXPECT_EQ(standby.exists(o.key), core.exists(o.key)) << o.key;
      }
    }
  }
  EXPECT_GT(task_seen, 0u) << "the workload never demoted: it does not cover the SSD paths";
}

TEST(MasterDurable, LoadRefusesContradictingRecordsOneByOne) {
  ManualClock clock(1'000'000'000);
  MasterCore core(config(), &clock);
  std::vector<DurableSegment> segs = {{segment("n1", "h1", kMiB, Medium::kCpu), false},
                                      {segment("n2", "h2", kMiB, Medium::kCpu), false}};
  std::vector<DurableObject> objs;
  objs.push_back({"a", 4096, 7, true, false, 0, {{"n1/dram", 0, true}}});
  objs.push_back({"b", 4096, 8, true, false, 0, {{"n1/dram", 2048, true}}});          // overlaps a
  objs.push_back({"c", 4096, 9, true, false, 0, {{"n9/dram", 0, true}}});             // unknown segment
  objs.push_back({"d", 4096, 10, true, false, 0, {{"n2/dram", kMiB - 1024, true}}});  // past the end
  objs.push_back({"e", 4096, 11, true, true, 900, {{"n2/dram", 0, true}, {"n1/dram", 8192, true}}});
  objs.push_back({"f", 4096, 0, false, false, 0, {{"n2/dram", 8192, false}}});  // a put in progress: held
  auto loaded = core.load_durable(segs, objs);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->segments, 2u);
  EXPECT_EQ(loaded->objects, 2u);
  EXPECT_EQ(loaded->refused_records, 3u);
  EXPECT_EQ(loaded->held_ranges, 1u);
  EXPECT_TRUE(core.exists("a"));
  EXPECT_TRUE(core.exists("e"));
  EXPECT_FALSE(core.exists("b"));
  EXPECT_FALSE(core.exists("f"));
  EXPECT_EQ(core.stat().pinned_objects, 1u);
  clock.advance_ms(901);
  EXPECT_EQ(core.stat().pinned_objects, 0u) << "the soft pin keeps its remaining time, not a new one";
  // The held range is not handed out before free_delay_ms, then it is.
  EXPECT_GT(core.stat().pending_free_bytes, 0u);
  clock.advance_ms(config().free_delay_ms);
  core.tick();
  EXPECT_EQ(core.stat().pending_free_bytes, 0u);
  // A second load into a core with metadata is refused.
  EXPECT_EQ(core.load_durable(segs, {}).status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace mc::store
