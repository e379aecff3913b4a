// The store master replicated on etcd (issue 21; DESIGN.md §17 "The master on etcd").
//
// Any number of `mc-store master --etcd ENDPOINTS --cluster-id NAME` share one cluster. Keys, under
// /mc/<cluster-id>/:
//   leader        the leader's LeaderInfo (JSON), written with the leader's etcd lease: it vanishes when the
//                 leader stops renewing (killed, paused, cut off) and a standby may then take its place
//   seg/<name>    one mounted store segment (JSON: SegmentInfo + read_only)
//   obj/<key>     one object (JSON: size, checksum, complete, pin, replicas)          -- master_core.hpp Durable*
//   xseg/<name>   one transfer-engine segment descriptor (msgpack; the segment directory, directory.hpp)
// The leader writes every change of these records in one etcd transaction guarded by "leader is still held by my
// lease" before it answers the call that made it (durable before acknowledged); a change from the periodic work
// (eviction, dead nodes) is written at the end of that work. etcd's revisions are the ordered op log; a standby
// follows them with a watch from the revision of its first full read, applying every put and delete to its copy of
// the records (parsed as they come, so a takeover only loads them). The leader compacts etcd's history every
// compact_interval_ms, keeping the last one; a standby whose watch falls behind a compaction reads everything again.
// One record that does not parse is skipped, counted and logged; it never discards the others.
//
// Election: a standby that sees no leader key creates it in a transaction (create_revision == 0) with its own
// lease. It then waits until its watch has applied everything up to that revision (so it holds every change the old
// leader committed), and loads the records into a fresh MasterCore. The leader renews its lease every TTL/3 on a
// thread of its own and serves only while the last renewal is younger than TTL - margin (the lease is surely still
// held at etcd): a leader paused past its lease refuses every call when it wakes, and its next write fails the
// transaction's lease check anyway. A leader that loses its lease, or cannot write to etcd, steps down: it drops its
// in-memory state, becomes a standby and reads the records again.
//
// Thread-safety: the election and commit calls are made from the master's serve thread only; the lease thread and
// the watch thread are internal. is_leader() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/coord/etcd.hpp"
#include "mc/coord/leader.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/store/master_core.hpp"

namespace mc::store {

struct HaOptions {
  std::string etcd;                     // "HOST:PORT[,HOST:PORT...]" (--etcd / MC_ETCD); empty: no replication
  std::string cluster_id;               // --cluster-id / MC_CLUSTER_ID: [A-Za-z0-9._-], 1..64 characters
  int64_t lease_ttl_s = 2;              // the leader's etcd lease; a dead leader is replaced about this long after
  int64_t etcd_timeout_ms = 1000;       // per etcd call
  int64_t compact_interval_ms = 60000;  // the leader compacts etcd's history this often
};

// Key layout (also for tools and tests that read etcd); the leader key is leader.hpp's leader_key().
std::string ha_prefix(const std::string& cluster_id);                                         // "/mc/<id>/"
std::string directory_record_key(const std::string& cluster_id, const std::string& segment);  // ".../xseg/<segment>"

// Record codecs (JSON), exposed for tests.
std::string encode_segment_record(const DurableSegment& s);
// Decoders check bounds (a record is a peer's input): a capacity above kMaxSegmentCapacityBytes, an offset beyond any
// segment, an oversized name or an out-of-range time is kDataLoss, as a record that does not parse.
Result<DurableSegment> decode_segment_record(std::string_view json);
// pin_until_unix_ms: a soft pin's end on the wall clock (records outlive the process that wrote them).
std::string encode_object_record(const DurableObject& o, int64_t now_unix_ms);
Result<DurableObject> decode_object_record(const std::string& key, std::string_view json, int64_t now_unix_ms);

// Everything a new leader loads.
struct TakeoverState {
  int64_t revision = 0;  // of its election
  std::vector<DurableSegment> segments;
  std::vector<DurableObject> objects;
  std::vector<proto::SegmentDescriptor> directory;
  uint64_t corrupt_records = 0;  // skipped while following (counted once per bad put)
};

struct HaCounters {
  uint64_t commits = 0, commit_ops = 0, commit_failures = 0;
  uint64_t commit_us_total = 0, commit_us_max = 0;
  uint64_t takeovers = 0, step_downs = 0, corrupt_records = 0, watch_reloads = 0;
  int64_t applied_revision = 0;
};

class MasterHa {
 public:
  // Validates the options, reads every record once and starts following them (watch) and the lease thread.
  // kInvalidArgument for a bad cluster id or endpoint list; kUnavailable when etcd does not answer the first read.
  static Result<std::unique_ptr<MasterHa>> start(const HaOptions& options, LeaderInfo self);
  ~MasterHa();

  // A standby's try: when no leader holds the key, takes it and returns what to load (after its watch caught up
  // with the election's revision). nullopt: another member leads (or the watch did not catch up within the etcd
  // timeout: tried again later). kUnavailable when etcd cannot be reached.
  Result<std::optional<TakeoverState>> campaign();
  // True while this member leads and its lease is surely held (the last renewal is younger than TTL - margin).
  bool is_leader() const;
  // Writes the changes (and extra operations: the segment directory) in transactions guarded by the leader key
  // still carrying this member's lease. Any failure: kUnavailable naming the reason; the caller steps down.
  Status commit(const DurableChanges& changes, const std::vector<etcd::Op>& extra);
  // Gives up the leadership (the lease is revoked when etcd answers, so a standby takes over at once).
  void step_down(const std::string& why);
  // The leader as the records say now (nullopt: none).
  std::optional<LeaderInfo> leader() const;
  // Periodic work of the leader: etcd history compaction. Cheap when not due.
  void maintain();
  HaCounters counters() const;
  // Records that decoded but were refused when loaded at a takeover (load_durable: out of bounds, contradicting the
  // others; a directory record publish refused): counted with the corrupt ones (mc_store_ha_corrupt_records_total).
  void count_refused(uint64_t records);
  const HaOptions& options() const;

  // etcd keys of the directory records.
  std::string directory_key(const std::string& name) const;

 private:
  struct Impl;
  explicit MasterHa(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc::store
