// MasterCore: the metadata of the KV pool (Mooncake Store's master, paper §3/§4): segments mounted by
// storage nodes, objects -> replicas with states, leases, approximate-LRU eviction with SSD demotion,
// liveness of nodes and clients, stale-writer reclaim, hot-object replication and the KV event stream.
// The bytes never pass through it: it hands out (segment, offset) ranges that clients read and write
// through the data path, and it tells nodes which DRAM ranges to demote to their SSD segment.
//
// Pure policy: no sockets, no threads, no real time. State and clock are injected; every time-driven
// rule (heartbeat TTLs, lease ends, stale-writer takeover, delayed frees, eviction) happens either in a
// call or in tick(), so unit tests drive it with a ManualClock and the daemon calls tick() every ~100 ms.
// Thread-safety: none; one owner serialises all calls (the master daemon's RPC thread).
//
// Object life (DESIGN.md §13.7, Mooncake#974 and its fix #993):
//   put_start -> processing (invisible; put_id and writer recorded) -> put_end(put_id) -> complete.
//   put_revoke(put_id), a dead writer, or takeover by another writer after put_takeover_ms discards
//   the processing replicas; their space is freed only free_delay_ms later (a stale writer may still
//   be writing into it), and a late put_end from the old put_id is refused with kFailedPrecondition.
// Leases: get_replicas grants lease_ms; until it ends the object is never evicted, removed or
// overwritten. A reader that finishes after its lease must discard what it read (client.hpp does).
// Pins (DESIGN.md §8): a pinned object is never evicted nor demoted to SSD (remove, overwrite and the
// death of its node still take it). A pin is hard (until unpin) or soft: it ends pin_ttl_ms after it was
// set, on the injected clock, and the object is then an eviction candidate like any other.
// Liveness (DESIGN.md §8, §13.5, Mooncake#1914): a node whose heartbeat is older than node_ttl_ms is
// *suspect*: its replicas stay in the metadata but are not offered (get, exists, match_prefix, placement,
// eviction and demotion skip them). A suspect node that heartbeats again within node_grace_ms re-reports
// its objects (node_report; the heartbeat reply asks for it): the replicas it confirms (same key, offset,
// size, checksum) are offered again, the others dropped. After the grace period, or with node_grace_ms 0
// at once, or when it unmounts, the node loses every replica on every one of its segments (DRAM and SSD
// alike) at once; an object whose last complete replica is gone no longer exists, so match_prefix stops
// at the gap.
// Node object tables: every complete replica placed on or removed from a node's segment is queued for
// that node (node_heartbeat hands the changes out in order), so the node knows its objects (key, offset,
// size, checksum) and can re-report them after a suspect spell or to a restarted master, which mounts its
// segments with restore and rebuilds the objects from the reports (leases expired, no pins).
// Integrity (DESIGN.md §8): every object carries the XXH3-64 of its bytes, given at put_end and handed to
// readers and to demotions; report_corrupt drops a replica whose bytes failed it (counted).
// Drain (DESIGN.md §8 "Drain", issue 19): a node leaving on purpose calls drain_node. Its segments become
// draining at once: never chosen for new placements (put_start, hot copies, replicate_near, demotions, drain
// copies of other nodes) and never evicted, while their complete replicas stay readable until the unmount.
// For each complete object whose every complete replica is on the node, drain_node allocates one new replica
// on a DRAM segment of another live, non-draining node (evicting there as put_start does) — a copy like a hot
// object's (put_id, processing replica, grant, abandoned after put_takeover_ms, freed free_delay_ms later) —
// and hands the node a page of copy tasks; objects with no room anywhere are dropped and counted. The node
// copies each task's bytes and reports it (drain_done): the copy becomes a complete replica, or is abandoned
// (kDataLoss: the source failed its checksum and is dropped as corrupt). A failed key is not retried. When
// drain_node hands out nothing more the node unmounts; the master then counts it in nodes_drained (never
// in dead_nodes), and objects still only on it (timeout, failed copies) in drain_dropped_objects.
// Disks: a demotion that fails with kNoSpace or kIo makes that SSD segment read-only (no more demotions to
// it; its replicas stay readable); eviction then drops DRAM victims instead.
// Quotas (docs/SECURITY.md "Quotas (issue 51)"): an object put for a tenant (PutOptions::tenant) is that
// tenant's: it counts its logical bytes times the replicas the put asked for (charged_bytes; copies the cluster makes
// itself — hot copies, drain copies, SSD demotions — are not charged), as pinned bytes while it holds a pin, as an
// unfinished put (count and bytes) until put_end, and as one object. Usage is derived from the objects (a takeover
// rebuilds it from the records). put_start refuses with kResourceExhausted a put that would take a tenant over a limit
// (set_quota) or, with quota_default_share > 0, over that share of the mounted DRAM capacity in pinned bytes or in
// unfinished put bytes; a tenant's unfinished put expires put_takeover_ms after put_start (tick()).
// Errors: kInvalidArgument for bad input (empty or oversized key, size 0 or > max_object_bytes,
// unknown medium), kObjectNotFound, kObjectBusy (retryable: being written, leased), kNoSpace,
// kAlreadyExists, kFailedPrecondition (stale put_id).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <absl/container/btree_set.h>

#include "mc/common/clock.hpp"
#include "mc/common/medium.hpp"
#include "mc/common/status.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/store.hpp"
#include "mc/store/allocator.hpp"

namespace mc::store {

// A segment's medium: cpu (DRAM) or disk (SSD). gpu, or any other name, is
// kInvalidArgument: the store pools no GPU memory.
Result<Medium> parse_segment_medium(std::string_view name);

struct MasterConfig {
  double high_watermark = 0.90;     // a segment above this fraction used is evicted ...
  double low_watermark = 0.80;      // ... down to this fraction
  int64_t node_ttl_ms = 3000;       // 3 missed heartbeats of 1 s: the node is suspect
  int64_t node_grace_ms = 30000;    // ... and dead this long after that (0: dead at node_ttl_ms)
  int64_t client_ttl_ms = 10000;    // a client silent this long is dead; its puts are discarded
  int64_t lease_ms = 5000;          // read lease granted by get_replicas
  int64_t put_takeover_ms = 30000;  // another writer may take over a put older than this
  int64_t put_reclaim_ms = 600000;  // tick() discards puts (and replica copies) older than this
  int64_t free_delay_ms = 5000;     // discarded ranges are freed this long after discard
  // Data-plane grants (docs/SECURITY.md "Data-plane grants"; 0 = none are issued). A replica range handed out with
  // a grant — put_start's and a hot copy's (write, for put_takeover_ms), get_replicas' (read, for lease_ms) — is
  // not freed for reuse before that lifetime plus this hold has passed since it was handed out, whatever ends the
  // object meanwhile (rm, overwrite, eviction, a failed put): an old grant never covers another object's bytes.
  // The master sets it to twice the issuers' clock slack (grant.hpp kGrantClockSlackMs) when it holds a grant key.
  int64_t grant_hold_ms = 0;
  uint64_t alignment_bytes = 64;  // allocation granularity inside a segment
  uint64_t max_object_bytes = 1ULL << 32;
  size_t max_key_bytes = 512;
  uint32_t max_replicas = 4;        // upper bound, including hot-object copies
  uint32_t hot_read_threshold = 0;  // reads within hot_window_ms that trigger one more replica; 0 = off
  int64_t hot_window_ms = 10000;
  // Quotas: a tenant without its own limit may hold at most this fraction of the mounted DRAM capacity in pinned
  // bytes, and as much again in unfinished put bytes; 0 = no default (one trust domain). The master sets 0.5 when it
  // runs with keys.
  double quota_default_share = 0;
};

// ---- Quotas per tenant (docs/SECURITY.md "Quotas (issue 51)") ----
// A limit that is not set: the default applies (quota_default_share for pinned_bytes and put_bytes, none otherwise).
inline constexpr uint64_t kQuotaDefault = UINT64_MAX;
// No limit, as an effective limit in TenantStats.
inline constexpr uint64_t kQuotaNone = UINT64_MAX;
// What a tenant holds. bytes and pinned_bytes are charged bytes: the object's size times the replicas its put asked
// for (DRAM or SSD alike); puts and put_bytes are the unfinished puts; objects counts complete and unfinished ones.
struct TenantUsage {
  uint64_t bytes = 0, pinned_bytes = 0, puts = 0, put_bytes = 0, objects = 0;
  uint64_t held_bytes = 0;  // pinned or unfinished, each object once: what eviction cannot take (the default's bound)
};
// Limits per dimension, kQuotaDefault where not set.
struct QuotaLimits {
  uint64_t bytes = kQuotaDefault, pinned_bytes = kQuotaDefault, puts = kQuotaDefault, put_bytes = kQuotaDefault,
           objects = kQuotaDefault;
};
// Parses "bytes:2GiB,pinned:1GiB,puts:64,put-bytes:512MiB,objects:100000" (units::parse_size_bytes for bytes;
// "default" resets a dimension to its default) over `base` (the dimensions not named keep base's value).
// kInvalidArgument naming the bad item and the accepted names.
Result<QuotaLimits> parse_quota_limits(std::string_view text, const QuotaLimits& base = {});
// "alice=bytes:2GiB,..." -> (tenant, limits).
Result<std::pair<std::string, QuotaLimits>> parse_tenant_quota(std::string_view text);
struct TenantStats {
  std::string tenant;
  TenantUsage usage;
  TenantUsage limits;    // effective, kQuotaNone where unlimited
  QuotaLimits set;       // as set by set_quota (kQuotaDefault where not)
  uint64_t refused = 0;  // puts refused over quota
};

// What a storage node declares when it mounts a segment.
struct SegmentInfo {
  std::string name;  // unique in the cluster, e.g. "node1/dram"
  std::string node_id;
  std::string host;    // for nearest-first ordering (same host first)
  std::string domain;  // failure domain label, e.g. "rack1"
  Medium medium = Medium::kCpu;
  uint64_t capacity_bytes = 0;
  std::string endpoint;           // the node's RPC endpoint (store.node.* reads/writes of disk segments)
  std::string xfer_segment;       // transfer-engine segment holding the bytes ("host:port"); "" for disk
  uint64_t xfer_base_offset = 0;  // offset of the segment's byte 0 in xfer_segment
};

// One replica as the caller sees it: where to read or write `size_bytes` bytes.
struct ReplicaView {
  SegmentInfo segment;
  uint64_t offset = 0;
  uint64_t size_bytes = 0;
};

struct PutGrant {
  uint64_t put_id = 0;
  std::vector<ReplicaView> replicas;  // distinct nodes, spread over failure domains where possible
};

struct ReadGrant {
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;              // XXH3-64 of the object's bytes
  std::vector<ReplicaView> replicas;  // complete replicas only, nearest first for the caller
  int64_t lease_ms = 0;               // the read is valid only if it finishes within this
  // Hot object: the caller is asked to copy the bytes it read here and call replica_end(put_id).
  std::optional<ReplicaView> replicate_to;
  uint64_t replicate_put_id = 0;
  // get_replicas(with_parts): the writer's part checksums (checksum.hpp); 0 and empty: none.
  uint64_t part_bytes = 0;
  std::vector<uint64_t> part_checksums{};
};

// A DRAM -> SSD copy the node must perform (delivered in the node's heartbeat reply).
struct DemoteTask {
  uint64_t task_id = 0;
  std::string key;
  std::string src_segment;
  uint64_t src_offset = 0;
  std::string dst_segment;
  uint64_t dst_offset = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // the object's: the node checks the source bytes before copying
};

// A copy a draining node performs: the object's bytes at (src_segment, src_offset) — its DRAM, or its SSD
// file — to `target`, a new replica on another node; then drain_done(key, put_id).
struct DrainTask {
  std::string key;
  std::string src_segment;
  uint64_t src_offset = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // the object's: the node checks the source bytes before copying
  ReplicaView target;     // a DRAM segment of another node (xfer_segment set)
  uint64_t put_id = 0;
};

// One answer of drain_node.
struct DrainPage {
  std::vector<DrainTask> tasks;    // at most the page size asked for
  bool more = false;               // objects remain queued or copies are not reported yet: ask again
  uint64_t moved_objects = 0;      // this node's drain so far
  uint64_t dropped_objects = 0;    // ... objects dropped (no room anywhere, corrupt source)
  uint64_t remaining_objects = 0;  // with final: complete objects still only on the node (lost at unmount)
};

struct ObjectInfo {
  std::string key;
  uint64_t size_bytes = 0;
  bool complete = false;
  bool leased = false;
  bool pinned = false;
  std::vector<std::string> segments;  // complete replicas
  std::vector<std::string> media;
};

struct SegmentStats {
  SegmentInfo info;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;  // replicas held (complete or being written)
  uint64_t leased_objects = 0;
  uint64_t hits = 0;  // reads whose nearest replica was here
  uint64_t evictions = 0;
  uint64_t demotions = 0;
  uint64_t largest_free_bytes = 0;
  double fragmentation = 0.0;
  bool suspect = false;      // not offered: its node is suspect or re-reporting
  bool read_only = false;    // SSD segment after a failed demotion
  bool draining = false;     // its node drains: no new placements
  bool unconfirmed = false;  // loaded at a takeover, its node not heard by this master yet: no new placements
};

struct MasterStats {
  std::vector<SegmentStats> segments;
  uint64_t objects = 0, processing = 0, nodes = 0, clients = 0;
  uint64_t hits = 0, misses = 0, puts = 0, removes = 0, evictions = 0, demotions = 0;
  uint64_t reclaimed_puts = 0, refused_put_ends = 0, dead_nodes = 0;
  uint64_t hot_replications = 0;  // copies granted to readers: hot objects and replicate_near
  uint64_t pending_free_bytes = 0;
  uint64_t pinned_objects = 0;         // complete objects pinned now (soft pins not yet expired included)
  uint64_t pinned_bytes = 0;           // their sizes (one copy each, whatever their replica count)
  uint64_t expired_pins = 0;           // soft pins that ran out (counted by tick())
  uint64_t corrupt_replicas = 0;       // replicas dropped by report_corrupt or a demotion's checksum check
  uint64_t suspect_nodes = 0;          // suspect now (stat() fills it)
  uint64_t returned_nodes = 0;         // suspect nodes that came back within node_grace_ms
  uint64_t reported_replicas = 0;      // replicas confirmed or restored by node_report
  uint64_t refused_reports = 0;        // reported replicas refused
  uint64_t ssd_failures = 0;           // SSD segments made read-only by a failed demotion (ENOSPC, EIO)
  uint64_t nodes_drained = 0;          // nodes that drained and unmounted (never counted in dead_nodes)
  uint64_t drain_moved_objects = 0;    // objects copied off draining nodes
  uint64_t drain_moved_bytes = 0;      // ... their bytes
  uint64_t drain_dropped_objects = 0;  // objects lost by drains: no room anywhere, corrupt, or not moved in time
  std::vector<TenantStats> tenants;    // tenants with usage, limits set or refusals, by name
};

// What a heartbeat hands the node: demotions to do and the changes of its object table.
struct NodeBeat {
  std::vector<DemoteTask> tasks;
  std::vector<proto::StoreNodeObjectChange> changes;  // at most proto::kStoreMaxBatch, oldest first
  bool more = false;                                  // more changes are queued
  bool report = false;                                // re-report every segment (node_report)
};

// The longest soft pin (one year, in ms): a peer's TTL beyond it is refused, as the CLI refuses it, so
// now + TTL in ns can never overflow.
inline constexpr int64_t kMaxPinTtlMs = int64_t{86'400'000} * 365;

// The largest segment a node may mount, and a durable record may describe (1 PiB): beyond any memory or SSD a node
// contributes, so a larger capacity is a forged or corrupt claim, never a real one.
inline constexpr uint64_t kMaxSegmentCapacityBytes = uint64_t{1} << 50;

struct PutOptions {
  uint32_t replicas = 1;
  std::string preferred_segment;  // tried first, e.g. the writer's own node
  bool overwrite = false;         // replace a complete object (refused while leased)
  bool pin = false;               // never evicted nor demoted
  int64_t pin_ttl_ms = 0;         // with pin: 0 = until unpinned, > 0 = soft pin ending this long after put_start
  std::string tenant{};           // the tenant charged for the object (quotas); "": exempt (workers, the Conductor)
};

struct Caller {
  std::string client_id;
  std::string host;
  std::string domain;
};

// ---- Durable metadata (issue 21; DESIGN.md §17 "The master on etcd") ----
// What a replicated master keeps in etcd: one record per mounted segment and one per object, written after every
// change and read back by a standby that takes over. Leases, liveness, LRU order, hot-read windows, drains and
// demotion tasks are not durable: a new leader starts them afresh (nodes heartbeat it; readers take new leases).
struct DurableReplica {
  std::string segment;
  uint64_t offset = 0;    // bytes into the segment
  bool complete = false;  // false: a range being written (a put, a hot copy, a demotion target)
};
struct DurableObject {
  std::string key;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes (complete objects)
  bool complete = false;  // false: a put in progress (its ranges are held, never offered)
  bool pinned = false;
  int64_t pin_left_ms = 0;  // with pinned: 0 = until unpin, else how long the soft pin still runs (>= 1)
  std::vector<DurableReplica> replicas;
  uint64_t part_bytes = 0;  // the writer's part checksums (checksum.hpp), 0 / empty: none
  std::vector<uint64_t> part_checksums{};
  std::string owner{};  // the tenant charged for it ("": none; a "tenant/T/" key is T's whatever this says)
};
struct DurableSegment {
  SegmentInfo info;
  bool read_only = false;  // an SSD segment after a failed demotion
};
// The changes since the last take_durable_changes(), as the records' new values (nullopt: the record is gone).
// Each name appears once, whatever happened to it meanwhile: only the current state counts.
struct DurableChanges {
  std::vector<std::pair<std::string, std::optional<DurableSegment>>> segments;  // by segment name
  std::vector<std::pair<std::string, std::optional<DurableObject>>> objects;    // by key
  bool empty() const { return segments.empty() && objects.empty(); }
};
// What load_durable() made of a set of records.
struct DurableLoad {
  uint64_t segments = 0, objects = 0, replicas = 0;
  uint64_t held_ranges = 0;           // ranges being written at the old leader: held free_delay_ms, then freed
  uint64_t refused_records = 0;       // records that contradict the others (unknown segment, overlapping range, ...)
  std::vector<std::string> refusals;  // why, for the first few (logged by the caller)
};

class MasterCore {
 public:
  MasterCore(MasterConfig config, const Clock* clock);
  // Moved, never copied: key_order_ views the keys of objects_'s nodes, which a move hands over and a copy would not.
  MasterCore(MasterCore&&) = default;
  MasterCore& operator=(MasterCore&&) = default;
  MasterCore(const MasterCore&) = delete;
  MasterCore& operator=(const MasterCore&) = delete;

  // ---- storage nodes ----
  // Mounting an existing segment name replaces it (a restarted node starts empty: its old replicas go).
  // restore: the node still holds objects there (this master restarted) and re-reports them at once with
  // node_report; the segment is offered only after the report's last page.
  Status mount_segment(const SegmentInfo& info, bool restore = false);
  Status unmount_segment(const std::string& node_id, const std::string& segment);
  // Records a heartbeat; returns the demotion tasks and object-table changes queued for the node, and
  // asks a suspect node to re-report. An unknown node -> kNotFound (the node then mounts its segments again).
  Result<NodeBeat> node_heartbeat(const std::string& node_id);
  // The node's report of a demotion: ok -> the SSD replica becomes the copy, the DRAM one is freed.
  // Failed with kNoSpace/kIo: the SSD segment becomes read-only. kDataLoss: the DRAM source failed its
  // checksum and is dropped (counted as corrupt).
  Status demote_done(const std::string& node_id, uint64_t task_id, bool ok, Code code = Code::kOk,
                     const std::string& message = "");
  // One page of a node's objects on `segment` (protocol.hpp store.node_report has the rules). Returns the
  // offsets refused. kNotFound for an unknown node or segment, kFailedPrecondition for a page without an
  // open round, kInvalidArgument for a bad entry (the page is refused whole).
  Result<proto::StoreNodeReportReply> node_report(const std::string& node_id, const std::string& segment,
                                                  const std::vector<proto::StoreNodeObject>& objects, bool first,
                                                  bool last);

  // Drain (see "Drain" above). The first call marks the node's segments draining; each call hands out up to
  // max_tasks copy tasks. final: hand out nothing (the node gives up: timeout or a second stop signal) and
  // count in remaining_objects what is still only on the node. kNotFound for an unknown node.
  Result<DrainPage> drain_node(const std::string& node_id, size_t max_tasks, bool final = false);
  // The node's report of a drain copy: ok -> the copy is a complete replica; else it is abandoned (its space
  // freed free_delay_ms later) and the key is not retried; kDataLoss also drops the source replica as corrupt.
  // kNotFound when the node has no such copy in flight (abandoned after put_takeover_ms, target node gone).
  Status drain_done(const std::string& node_id, const std::string& key, uint64_t put_id, bool ok, Code code = Code::kOk,
                    const std::string& message = "");

  // ---- clients ----
  void client_heartbeat(const std::string& client_id);

  Result<PutGrant> put_start(const Caller& caller, const std::string& key, uint64_t size_bytes,
                             const PutOptions& options);
  // checksum: XXH3-64 of the bytes written (handed to every reader and demotion). part_bytes and part_checksums:
  // optional part checksums (checksum.hpp; 0 and empty: none), handed to readers of ranges; kInvalidArgument
  // when they do not fit the object's size (parts_fit).
  Status put_end(const Caller& caller, const std::string& key, uint64_t put_id, uint64_t checksum,
                 uint64_t part_bytes = 0, std::vector<uint64_t> part_checksums = {});
  Status put_revoke(const Caller& caller, const std::string& key, uint64_t put_id);
  // Replicas nearest first for `caller` (rank_for). When the object is hot (hot_read_threshold) or a copy
  // near the caller's host was asked for (replicate_near), the grant also names one new replica for the
  // caller to fill with the bytes it read (replicate_to, then replica_end).
  // with_parts: the grant carries the object's part checksums (a reader of ranges).
  Result<ReadGrant> get_replicas(const Caller& caller, const std::string& key, bool with_parts = false);
  // Asks for one more replica of each key on a DRAM segment of `host`: the Conductor moves a hot prefix
  // near the prefill instance that will read it (paper §4 "hot blocks replicated"; DESIGN.md §3 step 2).
  // The master moves no bytes: the next get_replicas of that key by a caller on `host` within
  // hot_window_ms is granted replicate_to on a segment of `host` (when one has room), and that reader
  // copies the bytes it has just read, as for hot objects. Keys that are absent or incomplete, that
  // already have a replica (complete or being copied) on `host`, or that are at max_replicas are skipped;
  // the result is how many keys were marked. kInvalidArgument for an empty host or a bad key.
  Result<uint32_t> replicate_near(const std::vector<std::string>& keys, const std::string& host);
  // Completes (ok) or abandons (!ok) a hot-object copy granted by get_replicas.
  Status replica_end(const Caller& caller, const std::string& key, uint64_t put_id, bool ok);
  // A reader found the bytes of `key`'s replica at (segment, offset) failing the checksum: the replica is
  // dropped (an object left without a complete one is gone) and counted. kObjectNotFound when there is no
  // such replica (already dropped).
  Status report_corrupt(const std::string& key, const std::string& segment, uint64_t offset);
  bool exists(const std::string& key) const;
  // Number of leading keys that exist (complete). Stops at the first missing one.
  uint64_t match_prefix(const std::vector<std::string>& keys) const;
  Status remove(const std::string& key);
  // Pins a complete object: ttl_ms 0 until unpin, > 0 a soft pin ending ttl_ms from now (replacing an
  // earlier pin of the key). kObjectNotFound naming the key when it does not exist, kObjectBusy while it is
  // being written, kInvalidArgument for a bad key or ttl_ms < 0, kResourceExhausted when pinning it would take its
  // tenant over its quota of pinned bytes. caller_tenant (a tenant's client; "" another role): kPermissionDenied when
  // another tenant wrote the object (a shared namespace's), whose quota the pin would charge.
  Status pin(const std::string& key, int64_t ttl_ms, const std::string& caller_tenant = "");
  // Ends the pin of an object (no-op when it has none); kObjectNotFound naming the key when absent.
  Status unpin(const std::string& key);
  // One page of the objects whose keys start with `prefix`, in key order, from the first key after `start_after`
  // ("" = from the start): at most `limit` objects and, past the first, about max_bytes of keys and replica names.
  // O(page x log objects) through the ordered key index, never a pass over the pool. `more` (when given) tells
  // whether keys past the page match.
  std::vector<ObjectInfo> ls(const std::string& prefix, size_t limit, const std::string& start_after = "",
                             size_t max_bytes = SIZE_MAX, bool* more = nullptr) const;
  // The serving loop was busy for stall_ms (a long handler, the host paused): heartbeats that waited in its
  // sockets meanwhile could not be seen, so every node's silence is shortened by it (tick() would otherwise
  // find them missing and make them suspect for the master's own delay).
  void credit_loop_stall(int64_t stall_ms);
  // scan_objects=false skips the pass over every object (O(objects)); it leaves leased_objects at 0 and
  // counts objects/processing from the unfinished-put set: what the master's periodic metrics use.
  MasterStats stat(bool scan_objects = true) const;
  // Sets a tenant's limits (kQuotaDefault: the default for that dimension); usage already over a new limit stays
  // (nothing is removed), further puts are refused. kInvalidArgument for an empty tenant name.
  Status set_quota(const std::string& tenant, const QuotaLimits& limits);
  // Usage, effective limits and refusals per tenant (the ones stat() lists).
  std::vector<TenantStats> tenant_stats() const;
  // The limits set for a tenant (kQuotaDefault where none is).
  QuotaLimits quota(const std::string& tenant) const;

  // Runs the time-driven rules: node/client liveness, stale puts, delayed frees, eviction.
  void tick();

  // KV events produced since the last call (event_id is assigned by the publisher).
  std::vector<proto::KvEvent> take_events();

  // ---- durable metadata (see DurableObject above) ----
  // From now on every change of a segment or an object is remembered for take_durable_changes().
  void track_durable_changes() { track_durable_ = true; }
  DurableChanges take_durable_changes();
  // Every record of the current state (a snapshot), segments and objects sorted by name.
  std::vector<DurableSegment> durable_segments() const;
  std::vector<DurableObject> durable_objects() const;
  // Rebuilds the metadata of a fresh core from records (a standby taking over): segments mounted and offered
  // (their nodes count as just heard, so they have node_ttl_ms to heartbeat this master), complete replicas at
  // their offsets, pins with their remaining time. Ranges being written at the old leader (incomplete objects and
  // replicas) are held for free_delay_ms from now, then freed: a writer that still holds a grant finishes into space
  // nobody else is given. A record that contradicts the ones loaded before it (segment unknown or of another node,
  // range outside the segment or overlapping another) is refused and counted, never the whole set. No KV events are
  // produced (subscribers rebuild from the master: DESIGN.md §17). kFailedPrecondition when the core is not empty.
  Result<DurableLoad> load_durable(const std::vector<DurableSegment>& segments,
                                   const std::vector<DurableObject>& objects);
  // Put and copy ids from here on start at `base` (a new leader takes its election's revision << 32, so an id of an
  // old leader is never taken for one of its own).
  void set_put_id_base(uint64_t base) { next_put_id_ = std::max(next_put_id_, base); }

  const MasterConfig& config() const { return config_; }

 private:
  struct Replica {
    std::string segment;
    uint64_t offset = 0;
    bool complete = false;
    uint64_t put_id = 0;  // the put or copy that writes it
    std::string writer;   // client writing it (empty for demotion copies)
    int64_t started_ns = 0;
    uint64_t demote_task = 0;    // nonzero while this SSD replica is being filled by a demotion
    int64_t grant_until_ns = 0;  // with grant_hold_ms: the range is not freed before this (release_replica)
    std::string drain_node;      // a drain copy: the draining node that fills it (reported by drain_done)
  };
  struct Object {
    uint64_t size_bytes = 0;
    uint64_t checksum = 0;                   // XXH3-64 of the bytes
    uint64_t part_bytes = 0;                 // the writer's part checksums (checksum.hpp); 0: none
    std::vector<uint64_t> part_checksums{};  // at most kMaxObjectParts
    bool complete = false;                   // visible
    uint64_t put_id = 0;
    std::string writer;
    int64_t started_ns = 0;
    int64_t lease_until_ns = 0;
    int64_t last_access_ns = 0;
    bool pinned = false;
    int64_t pin_until_ns = 0;  // with pinned: 0 = hard pin, else the soft pin's end
    int64_t window_start_ns = 0;
    uint32_t window_reads = 0;
    std::string owner;            // the tenant charged for it ("": exempt)
    uint64_t charged_bytes = 0;   // size_bytes x the replicas its put asked for
    std::string wanted_host;      // replicate_near: copy for the next reader on this host ...
    int64_t wanted_until_ns = 0;  // ... until then
    std::vector<Replica> replicas;
  };
  struct Segment {
    SegmentInfo info;
    std::unique_ptr<OffsetAllocator> alloc;
    uint64_t replicas = 0, hits = 0, evictions = 0, demotions = 0;
    bool offline = false;    // node suspect or re-reporting, or restoring: not offered
    bool read_only = false;  // SSD after a failed demotion: never demoted to
    bool restoring = false;  // mounted with restore: node_report may create objects until its last page
    bool draining = false;   // its node drains: no new placements, no eviction
    // Loaded from the records at a takeover: its node has not heartbeaten to this master yet (it may have died during
    // the failover), so nothing new is placed on it until it does (load_durable; node_heartbeat confirms it).
    bool unconfirmed = false;
    bool report_open = false;
    std::unordered_set<uint64_t> reported;  // offsets confirmed in the open report round
  };
  struct Node {
    int64_t last_heartbeat_ns = 0;
    // Replicas placed on this node lately (place(): a count decaying with kPlacementHalfLifeMs, as of placed_at_ns).
    double placed_recent = 0;
    int64_t placed_at_ns = 0;
    std::vector<std::string> segments;
    std::deque<DemoteTask> tasks;
    bool suspect = false;    // missed heartbeats; dropped after node_grace_ms
    bool reporting = false;  // came back: offered again once every segment was re-reported
    std::set<std::string> reported_segments;
    std::deque<proto::StoreNodeObjectChange> journal;  // object-table changes not yet handed out
    // Drain: keys still to look at, copies handed out (put_id -> key, source segment and offset), keys not
    // retried (failed or abandoned copies), and the counts so far.
    bool draining = false;
    std::deque<std::string> drain_queue;
    struct DrainCopy {
      std::string key, src_segment;
      uint64_t src_offset = 0;
    };
    std::map<uint64_t, DrainCopy> drain_inflight;
    std::unordered_set<std::string> drain_skip;
    uint64_t drain_moved = 0, drain_dropped = 0;
  };
  struct PendingFree {
    std::string segment;
    uint64_t offset = 0;
    uint64_t size_bytes = 0;
    int64_t release_ns = 0;
  };
  // The heap order of pending_frees_: the earliest release_ns on top.
  struct ReleasesLater {
    bool operator()(const PendingFree& a, const PendingFree& b) const { return a.release_ns > b.release_ns; }
  };
  // Frees `p`'s range at p.release_ns (tick()).
  void defer_free(PendingFree p);

  Status validate_key(const std::string& key) const;
  // Quotas: adds (sign +1) or takes away (-1) obj's share of its owner's usage. Every change of an object's owner,
  // charged_bytes, complete or pinned flag, and every insert or erase, sits between a -1 and a +1 (or after / before).
  void account(const Object& obj, int sign);
  // kResourceExhausted when a put of `charged` bytes (pinned when pin) by `tenant` would pass a limit; `replaced`:
  // the tenant's own object that the put overwrites (its usage is credited). pin_only: a pin of an object already
  // charged (only the pinned bytes are checked).
  Status check_quota(const std::string& key, const std::string& tenant, uint64_t charged, bool pin,
                     const Object* replaced, bool pin_only = false);
  TenantUsage effective_limits(const std::string& tenant) const;
  bool leased(const Object& obj) const;
  bool pinned(const Object& obj) const;  // pinned now (a soft pin past its end is not)
  bool pin_holds(const std::string& key,
                 Object& obj);  // pinned(); else ends a soft pin that ran out (counts expired_pins)
  void touch_client(const std::string& client_id);
  // Frees a replica's range now, or after free_delay_ms when a writer may still be using it.
  // Frees r's range now, or at the later of free_delay_ms (when `delayed`) and r.grant_until_ns.
  void release_replica(const Replica& r, uint64_t size_bytes, bool delayed);
  // now_ns + lifetime_ms + grant_hold_ms, or 0 without grants.
  int64_t grant_hold_until(int64_t now_ns, int64_t lifetime_ms) const;
  // Drops every replica of obj (events for complete ones) and erases the object.
  using ObjectMap = std::unordered_map<std::string, Object>;
  void discard_object(ObjectMap::iterator it, bool delayed, bool count_reclaim);
  // Returns how many complete objects lost their last complete replica with it.
  uint64_t drop_segment(const std::string& segment);
  void drop_node(const std::string& node_id);
  void emit(const char* type, const std::string& key, const std::string& segment);
  // Durable change tracking (track_durable_changes): the key's or the segment's record must be written again.
  void dirty(const std::string& key) {
    if (track_durable_) dirty_keys_.insert(key);
  }
  void dirty_segment(const std::string& name) {
    if (track_durable_) dirty_segments_.insert(name);
  }
  std::optional<DurableObject> durable_object(const std::string& key, const Object& obj) const;
  // The segment's replica can be offered to readers (complete, its node neither suspect nor reporting).
  bool offered(const Replica& r) const;
  bool any_offered(const Object& obj) const;
  void set_offline(Node& node, bool offline);
  // Queue an object-table change for the node of `segment` (present: a complete replica placed there).
  void journal(const std::string& segment, uint64_t offset, bool present, const std::string& key = "",
               const Object* obj = nullptr);
  // Drops one replica (by index) of the object at `it`: event, journal, space; the object goes when no
  // complete replica is left. Returns true when the object was erased.
  bool drop_replica(ObjectMap::iterator it, size_t index);
  // Up to `count` segments for new replicas, one per node: a new failure domain first, then near_host (the
  // writer's host), then the emptiest segment; host_first swaps the first two. Before "emptiest", a node that took
  // more than its fair share of the recent placements plus kPlacementShareMargin is passed over while another node
  // fits (field report 20: a restarted, empty node would otherwise take nearly every put and saturate its NIC);
  // host_first copies are not capped.
  std::vector<std::string> place(uint64_t size_bytes, uint32_t count, const std::string& preferred,
                                 const std::vector<std::string>& exclude_nodes, const std::string& near_host,
                                 bool host_first = false);
  // Evicts least-recently-used unleased, complete, unpinned objects from `segment` until its usage is
  // at most target_bytes and, when need_contiguous_bytes > 0, a free range of that size exists (demoting
  // to the node's SSD segment when it has one). Returns bytes freed now.
  uint64_t evict(const std::string& segment, uint64_t target_used_bytes, uint64_t need_contiguous_bytes = 0);
  std::string find_disk_segment(const std::string& node_id, uint64_t size_bytes);
  ReplicaView view(const Replica& r, uint64_t size_bytes) const;
  int rank_for(const Caller& caller, const Segment& seg) const;
  // True when obj has a replica (complete or being written) on a segment of `host`.
  bool has_replica_on_host(const Object& obj, const std::string& host) const;
  // Allocates one new replica of obj for `caller` to copy into (hot object or replicate_near): a node that
  // holds none yet, near_host preferred (required when require_near_host). Fills grant.replicate_to.
  bool grant_copy(const std::string& key, Object& obj, const Caller& caller, bool require_near_host, int64_t now_ns,
                  ReadGrant& grant);
  // Allocates one processing copy of obj on a DRAM segment of a node that holds none of its replicas (the
  // machinery of hot copies and drain copies); nullptr when none has room.
  Replica* add_copy(const std::string& key, Object& obj, const std::string& writer, const std::string& near_host,
                    bool require_near_host, int64_t now_ns);
  // Completes (ok) or abandons (!ok, freed free_delay_ms later) a processing copy.
  void finish_copy(const std::string& key, Object& obj, std::vector<Replica>::iterator r, bool ok);
  // Evicts in the fullest DRAM segments (not draining) so that size_bytes may fit (put_start's second try).
  void make_room(uint64_t size_bytes);
  // True when obj is complete and every complete replica of it lies on node_id's segments.
  bool only_on_node(const Object& obj, const std::string& node_id) const;

  MasterConfig config_;
  const Clock* clock_;
  // Hashed: every put/get/match is a point lookup (one hash, one compare, not ~log2(n) string compares
  // over keys sharing a long prefix); ls --prefix (admin) scans and sorts.
  ObjectMap objects_;
  // The keys of objects_ in order (views of its keys, which stay put across rehashing): ls pages through it.
  // Kept by index_add/index_drop wherever an object is added or erased. A B-tree (abseil's): a put's insert costs
  // about half of std::set's (an allocation per node of many keys, not per key; fewer cache misses; docs/BENCHMARKS.md
  // "Tenants apart").
  absl::btree_set<std::string_view> key_order_;
  void index_add(ObjectMap::const_iterator it) { key_order_.insert(it->first); }
  void index_drop(ObjectMap::const_iterator it) { key_order_.erase(it->first); }
  std::map<std::string, Segment> segments_;
  std::map<std::string, Node> nodes_;
  std::map<std::string, int64_t> clients_;  // client_id -> last seen
  double placed_recent_ = 0;                // replicas placed on any node lately (decaying like Node::placed_recent)
  int64_t placed_at_ns_ = 0;
  // Keys that may hold an unfinished put or hot copy (a superset, pruned by tick()): tick() looks at
  // these instead of every object, so its cost does not grow with the number of stored objects.
  std::unordered_set<std::string> unfinished_;
  // Keys whose object may hold a pin (a superset, pruned by tick()): stat() counts pins from these.
  std::unordered_set<std::string> pinned_keys_;
  struct Tenant {
    QuotaLimits limits;
    TenantUsage usage;
    uint64_t refused = 0;
  };
  std::map<std::string, Tenant> tenants_;                              // tenants come from the roster: bounded
  std::map<uint64_t, std::pair<std::string, std::string>> demotions_;  // task_id -> (node, key)
  // Delayed frees: a min-heap on release_ns (ReleasesLater), so tick() takes each due one in O(log n). It was a
  // vector erased from the front one at a time: 150,000 frees after a drain held the master's loop for 7-8 s
  // (issue 48).
  std::vector<PendingFree> pending_frees_;
  uint64_t pending_free_bytes_ = 0;  // the sum of pending_frees_' size_bytes
  std::vector<proto::KvEvent> events_;
  uint64_t next_put_id_ = 1;
  uint64_t next_task_id_ = 1;
  MasterStats counters_;
  bool track_durable_ = false;
  std::unordered_set<std::string> dirty_keys_;
  std::set<std::string> dirty_segments_;
};

}  // namespace mc::store
