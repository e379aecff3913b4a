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
// Node death: remove_backend() drops every block of a backend at once.
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

#include "mc/common/protocol.hpp"
#include "mc/common/status.hpp"
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
  uint64_t bad_events = 0;  // unknown type/medium: ignored with a counted error
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
  bool stale(const std::string& stream = "") const;

  // Direct edits (tests, the simulator, snapshots).
  void add(uint64_t seq_hash, const std::string& backend_id, Medium medium);
  void remove(uint64_t seq_hash, const std::string& backend_id, Medium medium);
  // Drops every block of the backend (node death or "cleared"); returns how many holder entries went.
  size_t remove_backend(const std::string& backend_id);

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
  };
  struct Stream {
    std::string name;
    uint64_t last_event_id = 0;
    bool stale = false;
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
