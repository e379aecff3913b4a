// The global prefix index (paper §6; DESIGN.md §4): block key (prefix-chained seq hash) -> holders,
// each a cache backend (a storage segment or an instance's own cache) and a medium (gpu/cpu/disk).
// Maintained from the store's KV events (stored / removed / cleared, proto::KvEvent).
//
// Consistency: events of one stream carry event_id increasing by exactly 1. An event whose id is
// not last+1 reveals a gap (lost events): the index asks its ResyncSource for a snapshot of that
// stream, replaces every block of the stream's backends with it, and continues with events newer
// than the snapshot. Events at or below the last applied id are duplicates and ignored. When the
// snapshot fails the stream is marked stale, the event is applied anyway (best effort: a wrong
// answer of the index only ever costs time: the worker finds the block missing and recomputes,
// DESIGN.md §3), and the resync is retried on the stream's next event or on resync_stale().
// A publisher restart (an event of another `incarnation`: a restarted store master numbers its events
// from 1 again) is a gap too: the stream is resynced at once, so blocks the old publisher knew and the new
// one does not are gone from the index (field report 24).
// Node death: remove_backend() drops every block of a backend at once. A suspect node (the master keeps
// its replicas but offers none for reads, DESIGN.md §5) is parked: set_backend_offline() takes its blocks
// out of lookups and keeps them aside (events still edit them); when it is back they return at once.
// Reconciliation: each resync compares the stream's blocks before and after and counts the differences
// (IndexCounters::resync_stale_replicas: held by the index, gone from the store: a planned hit that would
// have been a miss; resync_missing_replicas: in the store, unknown to the index).
//
// Memory: one hash-map entry per indexed block (~80 B with one holder). Lookups are O(blocks of the
// request). Pure: no I/O; the ResyncSource is called synchronously. Thread-safety: none.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

inline constexpr uint32_t kUnknownHost = UINT32_MAX;

struct Holder {
  uint32_t backend = 0;  // PrefixIndex::backend_name(backend)
  Medium medium = Medium::kCpu;
  bool operator==(const Holder&) const = default;
};

struct SnapshotEntry {
  uint64_t seq_hash = 0;
  std::string backend_id;
  Medium medium = Medium::kCpu;
};
// Everything one stream's backends hold, consistent with the stream up to as_of_event_id.
struct IndexSnapshot {
  uint64_t as_of_event_id = 0;
  std::vector<SnapshotEntry> entries;
};

// Implemented by the daemon (asking the store master) and by tests/the simulator.
class ResyncSource {
 public:
  virtual ~ResyncSource() = default;
  virtual Result<IndexSnapshot> snapshot(const std::string& stream) = 0;
};

struct IndexCounters {
  uint64_t events_applied = 0;
  uint64_t events_duplicate = 0;  // id <= last applied: ignored
  uint64_t gaps = 0;              // id > last + 1
  uint64_t resyncs = 0;           // successful snapshots
  uint64_t resync_failures = 0;
  uint64_t bad_events = 0;               // unknown type/medium: ignored with a counted error
  uint64_t publisher_restarts = 0;       // events of a new incarnation of a stream's publisher
  uint64_t resync_stale_replicas = 0;    // replicas the index had that a resync found gone
  uint64_t resync_missing_replicas = 0;  // replicas a resync found that the index lacked
  uint64_t backends_parked = 0;          // set_backend_offline(.., true) of an online backend
  uint64_t backends_returned = 0;        // set_backend_offline(.., false) of a parked backend
};

class PrefixIndex {
 public:
  explicit PrefixIndex(ResyncSource* resync = nullptr) : resync_(resync) {}
  void set_resync_source(ResyncSource* resync) { resync_ = resync; }

  // Applies one event of `stream` (the publisher's endpoint or name). Returns kInvalidArgument for an
  // unknown type or medium (the event is skipped and counted; the stream continues).
  Status apply(const proto::KvEvent& event, const std::string& stream = "");
  // Retries the resync of every stale stream. Returns the first failure.
  Status resync_stale();
  // The resync source restarted as `incarnation` (the store master's store.stat names another
  // events_incarnation): every stream not yet on that incarnation's events is stale, resynced by the next
  // resync_stale() or event. Counted once as a publisher restart unless the events told it first.
  void source_restarted(uint64_t incarnation);
  bool stale(const std::string& stream = "") const;
  // A stream the index has not heard yet but whose publisher holds blocks (a restarted Conductor, a new store
  // leader): marked stale, so resync_stale() (or its first event) loads it from a snapshot instead of waiting for
  // events that may never come for the blocks already stored (DESIGN.md §17, issue 21 item 5).
  void expect_stream(const std::string& stream);

  // Direct edits (tests, the simulator, snapshots).
  void add(uint64_t seq_hash, const std::string& backend_id, Medium medium);
  void remove(uint64_t seq_hash, const std::string& backend_id, Medium medium);
  // Drops every block of the backend (node death or "cleared"); returns how many holder entries went.
  size_t remove_backend(const std::string& backend_id);
  // Parks (offline = true) or returns a backend's blocks; returns how many holder entries moved. While
  // parked, lookups and holders() do not see them; events and resyncs still add and remove them.
  size_t set_backend_offline(const std::string& backend_id, bool offline);
  bool backend_offline(const std::string& backend_id) const;
  size_t offline_backends() const;

  // The host a backend sits on (ClusterState::host_index), kUnknownHost until told. Setting it interns
  // the backend, so it can be done before any of its blocks is indexed.
  void set_backend_host(const std::string& backend_id, uint32_t host_index);
  uint32_t backend_host(uint32_t backend) const { return backends_[backend].host; }
  const std::string& backend_name(uint32_t backend) const { return backends_[backend].name; }
  std::vector<std::string> backends_on_host(uint32_t host_index) const;

  // Holders of one block (empty span when nobody holds it). The span is valid until the next edit.
  std::span<const Holder> holders(uint64_t seq_hash) const;
  // Holders of the request's blocks in order, stopping at the first block nobody holds: out.size()
  // is the longest prefix anywhere in the pool. `out` is cleared first (reuse it: no allocation).
  void lookup(std::span<const uint64_t> seq_hashes, std::vector<std::span<const Holder>>& out) const;

  size_t blocks() const { return blocks_.size(); }  // distinct keys
  size_t holder_entries() const { return holder_entries_; }
  size_t backends() const { return backends_.size(); }
  const IndexCounters& counters() const { return counters_; }
  void reserve(size_t blocks) { blocks_.reserve(blocks); }

 private:
  struct Backend {
    std::string name;
    uint32_t host = kUnknownHost;
    uint32_t stream = UINT32_MAX;  // the stream that last reported it
    std::unordered_set<uint64_t> hashes;
    bool offline = false;
    std::unordered_map<uint64_t, Medium> parked;  // while offline: its blocks, out of blocks_
  };
  struct Stream {
    std::string name;
    uint64_t last_event_id = 0;
    bool stale = false;
    uint64_t incarnation = 0;  // of its publisher (KvEvent::incarnation); 0: not told
  };
  uint32_t intern_backend(const std::string& name);
  uint32_t intern_stream(const std::string& name);
  Status resync(uint32_t stream);
  void add_holder(uint64_t seq_hash, Holder h);
  void remove_holder(uint64_t seq_hash, Holder h);

  ResyncSource* resync_ = nullptr;
  std::unordered_map<uint64_t, std::vector<Holder>> blocks_;
  std::vector<Backend> backends_;
  std::unordered_map<std::string, uint32_t> backend_ids_;
  std::vector<Stream> streams_;
  std::unordered_map<std::string, uint32_t> stream_ids_;
  size_t holder_entries_ = 0;
  IndexCounters counters_;
};

}  // namespace mc::sched
