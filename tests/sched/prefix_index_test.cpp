// Prefix index consistency (issue 6): stored/removed events in order, duplicates, a gap in event_id
// (-> resync from the master's snapshot), a late joiner, a failing resync, cleared backends.
#include "mc/sched/prefix_index.hpp"
#include "mc/proto/kv_events.hpp"

#include <gtest/gtest.h>

namespace mc::sched {
namespace {

proto::KvEvent ev(const char* type, uint64_t id, std::vector<uint64_t> hashes, const char* backend,
                  const char* medium = "cpu") {
  proto::KvEvent e;
  e.type = type;
  e.event_id = id;
  e.seq_hashes = std::move(hashes);
  e.backend_id = backend;
  e.medium = medium;
  return e;
}

// A master that answers snapshots from a table the test fills, or fails.
class FakeMaster final : public ResyncSource {
 public:
  Result<IndexSnapshot> snapshot(const std::string& stream) override {
    ++calls;
    last_stream = stream;
    if (fail) return error(Code::kUnavailable, "master tcp://127.0.0.1:9 unreachable");
    return snap;
  }
  IndexSnapshot snap;
  bool fail = false;
  int calls = 0;
  std::string last_stream;
};

size_t holders_of(const PrefixIndex& idx, uint64_t h) { return idx.holders(h).size(); }

size_t longest(const PrefixIndex& idx, std::vector<uint64_t> hashes) {
  std::vector<std::span<const Holder>> out;
  idx.lookup(hashes, out);
  return out.size();
}

TEST(PrefixIndex, StoredAndRemovedInOrder) {
  FakeMaster master;
  PrefixIndex idx(&master);
  ASSERT_TRUE(idx.apply(ev("stored", 1, {1, 2, 3}, "seg-a")).is_ok());
  ASSERT_TRUE(idx.apply(ev("stored", 2, {1, 2}, "seg-b", "disk")).is_ok());
  EXPECT_EQ(longest(idx, {1, 2, 3, 4}), 3u);
  EXPECT_EQ(holders_of(idx, 1), 2u);
  EXPECT_EQ(idx.holders(1)[1].medium, Medium::kDisk);
  ASSERT_TRUE(idx.apply(ev("removed", 3, {2}, "seg-a")).is_ok());
  EXPECT_EQ(holders_of(idx, 2), 1u);
  EXPECT_EQ(longest(idx, {1, 2, 3}), 3u);                              // block 2 still on seg-b's disk
  ASSERT_TRUE(idx.apply(ev("removed", 4, {2}, "seg-b", "")).is_ok());  // no medium: every medium
  EXPECT_EQ(longest(idx, {1, 2, 3}), 1u);
  EXPECT_EQ(master.calls, 0);
  EXPECT_EQ(idx.counters().events_applied, 4u);
  // Replayed (duplicate) events change nothing.
  ASSERT_TRUE(idx.apply(ev("stored", 2, {2}, "seg-b")).is_ok());
  EXPECT_EQ(longest(idx, {1, 2, 3}), 1u);
  EXPECT_EQ(idx.counters().events_duplicate, 1u);
}

TEST(PrefixIndex, GapTriggersResyncFromTheMaster) {
  FakeMaster master;
  PrefixIndex idx(&master);
  ASSERT_TRUE(idx.apply(ev("stored", 1, {1, 2}, "seg-a"), "master").is_ok());
  // Events 2..4 are lost; the master's view at event 5: block 1 moved to seg-b, 7 was added.
  master.snap.as_of_event_id = 5;
  master.snap.entries = {{1, "seg-b", Medium::kCpu}, {7, "seg-b", Medium::kDisk}};
  ASSERT_TRUE(idx.apply(ev("stored", 6, {8}, "seg-b"), "master").is_ok());
  EXPECT_EQ(master.calls, 1);
  EXPECT_EQ(master.last_stream, "master");
  EXPECT_EQ(idx.counters().gaps, 1u);
  EXPECT_EQ(idx.counters().resyncs, 1u);
  EXPECT_EQ(holders_of(idx, 2), 0u);  // gone: the snapshot does not have it
  ASSERT_EQ(holders_of(idx, 1), 1u);
  EXPECT_EQ(idx.backend_name(idx.holders(1)[0].backend), "seg-b");
  EXPECT_EQ(holders_of(idx, 7), 1u);
  EXPECT_EQ(holders_of(idx, 8), 1u);  // event 6 applied on top
  ASSERT_TRUE(idx.apply(ev("removed", 7, {8}, "seg-b"), "master").is_ok());
  EXPECT_EQ(holders_of(idx, 8), 0u);
  EXPECT_EQ(master.calls, 1);
  // An event the snapshot already contains is skipped.
  master.snap.as_of_event_id = 20;
  master.snap.entries = {{30, "seg-c", Medium::kCpu}};
  ASSERT_TRUE(idx.apply(ev("removed", 15, {30}, "seg-c"), "master").is_ok());
  EXPECT_EQ(holders_of(idx, 30), 1u);
  EXPECT_EQ(holders_of(idx, 1), 0u);
}

TEST(PrefixIndex, LateJoinerResyncsAndStreamsAreIndependent) {
  FakeMaster master;
  master.snap.as_of_event_id = 100;
  master.snap.entries = {{1, "seg-a", Medium::kCpu}};
  PrefixIndex idx(&master);
  ASSERT_TRUE(idx.apply(ev("stored", 101, {2}, "seg-a"), "master").is_ok());
  EXPECT_EQ(master.calls, 1);
  EXPECT_EQ(longest(idx, {1, 2}), 2u);
  // Another publisher (an instance's GPU cache) numbers its own events from 1.
  ASSERT_TRUE(idx.apply(ev("stored", 1, {3}, "gpu-p0", "gpu"), "p0").is_ok());
  ASSERT_TRUE(idx.apply(ev("stored", 2, {4}, "gpu-p0", "gpu"), "p0").is_ok());
  EXPECT_EQ(master.calls, 1);
  EXPECT_EQ(longest(idx, {1, 2}), 2u);
  EXPECT_EQ(holders_of(idx, 4), 1u);
}

TEST(PrefixIndex, FailedResyncLeavesTheStreamStaleAndRetries) {
  FakeMaster master;
  PrefixIndex idx(&master);
  ASSERT_TRUE(idx.apply(ev("stored", 1, {1}, "seg-a")).is_ok());
  master.fail = true;
  ASSERT_TRUE(idx.apply(ev("stored", 5, {2}, "seg-a")).is_ok());  // applied best-effort
  EXPECT_TRUE(idx.stale());
  EXPECT_EQ(idx.counters().resync_failures, 1u);
  EXPECT_EQ(holders_of(idx, 2), 1u);
  master.fail = false;
  master.snap.as_of_event_id = 6;
  master.snap.entries = {{9, "seg-a", Medium::kCpu}};
  ASSERT_TRUE(idx.apply(ev("stored", 7, {10}, "seg-a")).is_ok());  // contiguous, but stale: retries
  EXPECT_FALSE(idx.stale());
  EXPECT_EQ(holders_of(idx, 1), 0u);
  EXPECT_EQ(holders_of(idx, 9), 1u);
  EXPECT_EQ(holders_of(idx, 10), 1u);
  // Without any resync source a gap is reported, not hidden.
  PrefixIndex lone;
  ASSERT_TRUE(lone.apply(ev("stored", 1, {1}, "seg-a")).is_ok());
  ASSERT_TRUE(lone.apply(ev("stored", 3, {2}, "seg-a")).is_ok());
  EXPECT_TRUE(lone.stale());
  EXPECT_FALSE(lone.resync_stale().is_ok());
}

TEST(PrefixIndex, ClearedAndNodeDeathDropEveryBlockOfTheBackend) {
  PrefixIndex idx;
  ASSERT_TRUE(idx.apply(ev("stored", 1, {1, 2, 3}, "seg-a")).is_ok());
  ASSERT_TRUE(idx.apply(ev("stored", 2, {1, 2}, "seg-b")).is_ok());
  ASSERT_TRUE(idx.apply(ev("stored", 3, {1}, "seg-a", "disk")).is_ok());
  EXPECT_EQ(idx.holder_entries(), 6u);
  ASSERT_TRUE(idx.apply(ev("cleared", 4, {}, "seg-a", "")).is_ok());
  EXPECT_EQ(idx.holder_entries(), 2u);
  EXPECT_EQ(longest(idx, {1, 2, 3}), 2u);
  EXPECT_EQ(idx.remove_backend("seg-b"), 2u);
  EXPECT_EQ(longest(idx, {1, 2, 3}), 0u);
  EXPECT_EQ(idx.blocks(), 0u);
  EXPECT_EQ(idx.remove_backend("nobody"), 0u);
}

TEST(PrefixIndex, BadEventsAreReportedAndSkipped) {
  PrefixIndex idx;
  Status st = idx.apply(ev("evicted", 1, {1}, "seg-a"));
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("evicted"), std::string::npos);
  st = idx.apply(ev("stored", 2, {1}, "seg-a", "tape"));
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("tape"), std::string::npos);
  EXPECT_EQ(idx.counters().bad_events, 2u);
  EXPECT_EQ(idx.blocks(), 0u);
  ASSERT_TRUE(idx.apply(ev("stored", 3, {1}, "seg-a")).is_ok());  // the stream continues
  EXPECT_EQ(idx.blocks(), 1u);
}

// Issue 17 item 2 and field report 24: a restarted publisher (a store master killed and started again) numbers
// its events from 1 under another incarnation. Those events are not duplicates: the stream is resynced at once,
// the blocks the new master does not have leave the index, and the differences are counted.
TEST(PrefixIndex, PublisherRestartResyncsAndCountsTheMismatches) {
  FakeMaster master;
  PrefixIndex idx(&master);
  auto inc = [](proto::KvEvent e, uint64_t incarnation) {
    e.incarnation = incarnation;
    return e;
  };
  for (uint64_t id = 1; id <= 10; ++id) {
    ASSERT_TRUE(idx.apply(inc(ev("stored", id, {id}, "seg-a"), 111), "master").is_ok());
  }
  EXPECT_EQ(master.calls, 0);
  EXPECT_EQ(idx.blocks(), 10u);
  // The new master rebuilt blocks 1..4 from the node's report (and knows block 50 the index never saw).
  master.snap.as_of_event_id = 5;
  master.snap.entries = {{1, "seg-a", Medium::kCpu},
                         {2, "seg-a", Medium::kCpu},
                         {3, "seg-a", Medium::kCpu},
                         {4, "seg-a", Medium::kCpu},
                         {50, "seg-a", Medium::kCpu}};
  ASSERT_TRUE(idx.apply(inc(ev("stored", 1, {1}, "seg-a"), 222), "master").is_ok());
  EXPECT_EQ(master.calls, 1);
  EXPECT_EQ(idx.counters().publisher_restarts, 1u);
  EXPECT_EQ(idx.counters().events_duplicate, 0u);
  EXPECT_EQ(idx.counters().gaps, 0u);
  EXPECT_EQ(idx.counters().resync_stale_replicas, 6u);  // blocks 5..10: gone with the old master
  EXPECT_EQ(idx.counters().resync_missing_replicas, 1u);
  EXPECT_EQ(longest(idx, {1, 2, 3, 4, 5}), 4u);
  EXPECT_EQ(holders_of(idx, 50), 1u);
  // Its later events apply in order; the old incarnation's numbering is forgotten.
  ASSERT_TRUE(idx.apply(inc(ev("stored", 6, {60}, "seg-a"), 222), "master").is_ok());
  EXPECT_EQ(holders_of(idx, 60), 1u);
  EXPECT_EQ(master.calls, 1);
  EXPECT_EQ(idx.counters().events_applied, 11u);
}

// Issue 17 item 2: a suspect node's replicas are parked (no lookup finds them) while events still edit them,
// and they are offered again at once when the node is back.
TEST(PrefixIndex, SuspectBackendIsParkedAndReturns) {
  FakeMaster master;
  PrefixIndex idx(&master);
  ASSERT_TRUE(idx.apply(ev("stored", 1, {1, 2, 3}, "seg-a")).is_ok());
  ASSERT_TRUE(idx.apply(ev("stored", 2, {1}, "seg-b")).is_ok());
  EXPECT_EQ(idx.set_backend_offline("seg-a", true), 3u);
  EXPECT_TRUE(idx.backend_offline("seg-a"));
  EXPECT_EQ(idx.offline_backends(), 1u);
  EXPECT_EQ(idx.set_backend_offline("seg-a", true), 0u);  // already parked
  EXPECT_EQ(longest(idx, {1, 2, 3}), 1u);                 // only seg-b's block 1
  EXPECT_EQ(holders_of(idx, 1), 1u);
  EXPECT_EQ(idx.holder_entries(), 1u);
  // While parked: block 2 is removed and block 4 stored on it.
  ASSERT_TRUE(idx.apply(ev("removed", 3, {2}, "seg-a")).is_ok());
  ASSERT_TRUE(idx.apply(ev("stored", 4, {4}, "seg-a")).is_ok());
  EXPECT_EQ(holders_of(idx, 4), 0u);
  EXPECT_EQ(idx.set_backend_offline("seg-a", false), 3u);  // blocks 1, 3, 4
  EXPECT_EQ(idx.offline_backends(), 0u);
  EXPECT_EQ(longest(idx, {1, 2}), 1u);
  EXPECT_EQ(holders_of(idx, 1), 2u);
  EXPECT_EQ(holders_of(idx, 3), 1u);
  EXPECT_EQ(holders_of(idx, 4), 1u);
  EXPECT_EQ(idx.holder_entries(), 4u);
  EXPECT_EQ(idx.counters().backends_parked, 1u);
  EXPECT_EQ(idx.counters().backends_returned, 1u);
  // A resync while parked keeps it parked, and a node that dies parked leaves nothing behind.
  idx.set_backend_offline("seg-a", true);
  master.snap.as_of_event_id = 10;
  master.snap.entries = {{1, "seg-a", Medium::kCpu}, {7, "seg-a", Medium::kCpu}};
  ASSERT_TRUE(idx.apply(ev("stored", 11, {8}, "seg-b")).is_ok());
  EXPECT_EQ(holders_of(idx, 7), 0u);
  EXPECT_EQ(idx.counters().resync_stale_replicas, 3u);  // seg-a's 3 and 4, seg-b's 1
  EXPECT_EQ(holders_of(idx, 8), 1u);
  EXPECT_EQ(idx.remove_backend("seg-a"), 2u);
  EXPECT_EQ(idx.set_backend_offline("seg-a", false), 0u);
  EXPECT_EQ(holders_of(idx, 7), 0u);
}

}  // namespace
}  // namespace mc::sched
