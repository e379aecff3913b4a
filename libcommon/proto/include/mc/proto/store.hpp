// The store's section of the protocol (store/, DESIGN.md §8): the master's and the storage nodes' RPCs.
// Wire rules: envelope.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/proto/message.hpp"

namespace mc::proto {

// ---------------------------------------------------------------------------------------------
// Store (store/): master RPCs, storage node RPCs
// ---------------------------------------------------------------------------------------------
// (section owned by mc_store)
// Master RPCs ("store.*"): the metadata service of mc-store master (store/include/mc/store/master_core.hpp
// documents the semantics). Batch requests carry parallel arrays and are answered item by item: one bad
// key never fails its neighbours. Per-item results carry `code` (an mc::Code value, 0 = ok) and
// `message`. Limits: at most kStoreMaxBatch keys per request. DRAM bytes move through the transfer engine
// (the node registers its DRAM segment with its engine; the master is the engine's segment directory,
// answering xfer.publish_segment / xfer.get_segment). Node data RPCs ("store.node.*") move bytes of SSD
// segments only, which the transfer engine cannot address (they are files, not memory).

inline constexpr uint32_t kStoreMaxBatch = 4096;

struct StoreAck {
  bool ok = true;
  MC_MESSAGE(ok);
};

// Where one replica lives and how to reach it.
struct StoreReplica {
  std::string segment;  // segment name, e.g. "node1/dram"
  std::string node_id;
  std::string host;
  std::string domain;              // failure domain label
  std::string medium;              // cpu | disk
  std::string endpoint;            // the storage node's RPC endpoint (tcp://host:port; store.node.* for disk segments)
  std::string xfer_segment;        // transfer-engine segment serving these bytes ("host:port"); empty for disk
  uint64_t xfer_offset_bytes = 0;  // offset of the replica's first byte in xfer_segment
  uint64_t offset_bytes = 0;       // offset of the replica inside `segment`
  uint64_t size_bytes = 0;
  // With --auth-dir: the data-plane grant (mc/net/grant.hpp) for these bytes — of xfer_segment at
  // xfer_offset_bytes for a DRAM replica, of `segment` at offset_bytes for a disk one (store.node.read/write) —
  // issued by the master to the caller: read for get_replicas' replicas, write for put_start's and replicate_to,
  // expiring with the read lease or the put's takeover time. "" without a grant key.
  std::string grant{};
  MC_MESSAGE(segment, node_id, host, domain, medium, endpoint, xfer_segment, xfer_offset_bytes, offset_bytes,
             size_bytes, grant);
};

struct StoreMountRequest {
  static constexpr const char* kType = "store.mount";
  using Reply = StoreAck;
  std::string node_id;
  std::string segment;
  std::string host;
  std::string domain;
  std::string medium;  // cpu | disk
  uint64_t capacity_bytes = 0;
  std::string endpoint;                 // the node's RPC endpoint (store.node.* for disk segments)
  std::string xfer_segment;             // transfer-engine segment holding a cpu segment ("host:port"); "" for disk
  uint64_t xfer_base_offset_bytes = 0;  // where byte 0 of `segment` lies in xfer_segment
  // The node still holds objects on this segment (the master restarted) and re-reports them at once
  // (store.node_report): the segment is offered for reads and new puts only after the report's last page.
  bool restore = false;
  MC_MESSAGE(node_id, segment, host, domain, medium, capacity_bytes, endpoint, xfer_segment, xfer_base_offset_bytes,
             restore);
};

struct StoreUnmountRequest {
  static constexpr const char* kType = "store.unmount";
  using Reply = StoreAck;
  std::string node_id;
  std::string segment;
  MC_MESSAGE(node_id, segment);
};

// A DRAM -> SSD copy the node performs (bytes [src_offset, +size) of src_segment to dst_segment).
struct StoreDemoteTask {
  uint64_t task_id = 0;
  std::string key;
  std::string src_segment;
  uint64_t src_offset_bytes = 0;
  std::string dst_segment;
  uint64_t dst_offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // the object's XXH3-64: the node checks the DRAM bytes against it before copying
  MC_MESSAGE(task_id, key, src_segment, src_offset_bytes, dst_segment, dst_offset_bytes, size_bytes, checksum);
};
struct StoreDemoteResult {
  uint64_t task_id = 0;
  bool ok = false;
  // Why it failed (an mc::Code value, 0 with ok): kNoSpace or kIo make the SSD segment read-only at the
  // master (eviction then drops DRAM victims); kDataLoss means the DRAM source failed its checksum (dropped).
  uint16_t code = 0;
  std::string message;
  MC_MESSAGE(task_id, ok, code, message);
};
// The master's view of one of the node's segments, for the node's own `stat` (as of this heartbeat).
struct StoreNodeSegmentUsage {
  std::string segment;
  std::string medium;  // cpu | disk
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;  // replicas held (complete or being written)
  uint64_t hits = 0;     // reads whose nearest replica was here
  MC_MESSAGE(segment, medium, capacity_bytes, used_bytes, objects, hits);
};
// One change of the node's object table, in the master's order: a complete replica placed on one of the
// node's segments (present, with its key, size and checksum) or gone from it (present = false). The node
// keeps the table to re-report its objects (store.node_report) after a suspect spell or a master restart.
struct StoreNodeObjectChange {
  bool present = false;
  std::string segment;
  uint64_t offset_bytes = 0;
  std::string key;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the object's bytes
  MC_MESSAGE(present, segment, offset_bytes, key, size_bytes, checksum);
};
struct StoreNodeHeartbeatReply {
  std::vector<StoreDemoteTask> tasks;
  std::vector<StoreNodeSegmentUsage> segments;  // the node's segments (a master before issue 16: none)
  std::vector<StoreNodeObjectChange> changes;   // at most kStoreMaxBatch, oldest first
  bool more = false;                            // more changes are queued: heartbeat again at once
  bool report = false;  // the node was suspect: re-report every segment's objects (store.node_report)
  MC_MESSAGE(tasks, segments, changes, more, report);
};
// Sent every heartbeat interval; an unknown node gets kNotFound and mounts its segments again.
struct StoreNodeHeartbeatRequest {
  static constexpr const char* kType = "store.node_heartbeat";
  using Reply = StoreNodeHeartbeatReply;
  std::string node_id;
  std::vector<StoreDemoteResult> done;
  MC_MESSAGE(node_id, done);
};

struct StoreClientHeartbeatRequest {
  static constexpr const char* kType = "store.client_heartbeat";
  using Reply = StoreAck;
  std::string client_id;
  MC_MESSAGE(client_id);
};

struct StorePutStartItem {
  uint16_t code = 0;
  std::string message;
  uint64_t put_id = 0;
  std::vector<StoreReplica> replicas;
  MC_MESSAGE(code, message, put_id, replicas);
};
struct StorePutStartReply {
  std::vector<StorePutStartItem> items;
  MC_MESSAGE(items);
};
struct StorePutStartRequest {
  static constexpr const char* kType = "store.put_start";
  using Reply = StorePutStartReply;
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes_bytes;  // one per key
  uint32_t replicas = 1;
  std::string preferred_segment;
  bool overwrite = false;
  bool pin = false;         // never evicted nor demoted (master_core.hpp "Pins")
  std::string client_host;  // the writer's host label: the first replica goes there when a segment has room
  int64_t pin_ttl_ms = 0;   // with pin: 0 = until store.unpin, > 0 = soft pin ending this long after put_start
  MC_MESSAGE(client_id, keys, sizes_bytes, replicas, preferred_segment, overwrite, pin, client_host, pin_ttl_ms);
};

// Per-item result of batch calls without payload.
struct StoreItemsReply {
  std::vector<uint16_t> codes;
  std::vector<std::string> messages;
  MC_MESSAGE(codes, messages);
};
struct StorePutEndRequest {
  static constexpr const char* kType = "store.put_end";
  using Reply = StoreItemsReply;
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> put_ids;
  std::vector<uint64_t> checksums;  // XXH3-64 of each object's bytes, one per key
  // Optional, per key (empty: none for any key): the object's bytes cut into parts of part_bytes[i] (the last may be
  // shorter; 0: no parts) and the XXH3-64 of each, so a reader of a part-aligned range can check just those bytes
  // (a KV block's parts are its layers: a pipeline stage reads its layers only; DESIGN.md §18).
  std::vector<uint64_t> part_bytes{};
  std::vector<std::vector<uint64_t>> part_checksums{};
  MC_MESSAGE(client_id, keys, put_ids, checksums, part_bytes, part_checksums);
};
struct StorePutRevokeRequest {
  static constexpr const char* kType = "store.put_revoke";
  using Reply = StoreItemsReply;
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> put_ids;
  MC_MESSAGE(client_id, keys, put_ids);
};

struct StoreGetItem {
  uint16_t code = 0;  // kObjectNotFound (400) = miss
  std::string message;
  uint64_t size_bytes = 0;
  int64_t lease_ms = 0;                    // the read is valid only if it completes within this
  std::vector<StoreReplica> replicas;      // complete replicas, nearest first
  std::vector<StoreReplica> replicate_to;  // 0 or 1: hot object, copy it here and send store.replica_end
  uint64_t replicate_put_id = 0;
  uint64_t checksum = 0;  // XXH3-64 of the object's bytes: a replica that reads otherwise is store.report_corrupt
  // With StoreGetReplicasRequest::with_parts, the object's part checksums when its writer sent them (else empty).
  uint64_t part_bytes = 0;
  std::vector<uint64_t> part_checksums{};
  MC_MESSAGE(code, message, size_bytes, lease_ms, replicas, replicate_to, replicate_put_id, checksum, part_bytes,
             part_checksums);
};
struct StoreGetReplicasReply {
  std::vector<StoreGetItem> items;
  MC_MESSAGE(items);
};
struct StoreGetReplicasRequest {
  static constexpr const char* kType = "store.get_replicas";
  using Reply = StoreGetReplicasReply;
  std::string client_id;
  std::string client_host;  // nearest-first ordering: same host, then same domain
  std::string client_domain;
  std::vector<std::string> keys;
  bool with_parts = false;  // also send each object's part checksums (a reader of ranges)
  MC_MESSAGE(client_id, client_host, client_domain, keys, with_parts);
};

struct StoreReplicaEndRequest {
  static constexpr const char* kType = "store.replica_end";
  using Reply = StoreAck;
  std::string client_id;
  std::string key;
  uint64_t put_id = 0;
  bool ok = false;
  MC_MESSAGE(client_id, key, put_id, ok);
};

struct StoreExistsReply {
  std::vector<bool> present;
  MC_MESSAGE(present);
};
struct StoreExistsRequest {
  static constexpr const char* kType = "store.exists";
  using Reply = StoreExistsReply;
  std::vector<std::string> keys;
  MC_MESSAGE(keys);
};

struct StoreMatchPrefixReply {
  uint64_t matched_blocks = 0;  // leading keys present; stops at the first missing one
  MC_MESSAGE(matched_blocks);
};
struct StoreMatchPrefixRequest {
  static constexpr const char* kType = "store.match_prefix";
  using Reply = StoreMatchPrefixReply;
  std::vector<std::string> keys;  // block keys in chain order
  MC_MESSAGE(keys);
};

struct StoreRemoveRequest {
  static constexpr const char* kType = "store.remove";
  using Reply = StoreItemsReply;
  std::vector<std::string> keys;
  MC_MESSAGE(keys);
};

struct StoreObjectInfo {
  std::string key;
  uint64_t size_bytes = 0;
  bool complete = false;
  bool leased = false;
  bool pinned = false;
  std::vector<std::string> segments;
  std::vector<std::string> media;
  MC_MESSAGE(key, size_bytes, complete, leased, pinned, segments, media);
};
// One page of a listing; truncated: more keys match after the last one here (ask again with it as start_after).
struct StoreLsReply {
  std::vector<StoreObjectInfo> objects;
  bool truncated = false;
  MC_MESSAGE(objects, truncated);
};
// The objects whose keys start with prefix, in key order after start_after ("" = from the first): at most
// min(limit, kStoreLsPageObjects) of them, and past the first about kStoreLsPageBytes of keys and segment names
// (issue 51: one call costs the master one page, never a pass over the pool or an unbounded reply). A prefix
// "shared/NS" naming a shared namespace lists that namespace only ("shared/NS/...").
inline constexpr uint32_t kStoreLsPageObjects = 1000;
inline constexpr size_t kStoreLsPageBytes = 64u << 10;
struct StoreLsRequest {
  static constexpr const char* kType = "store.ls";
  using Reply = StoreLsReply;
  std::string prefix;
  uint32_t limit = 1000;
  std::string start_after;
  MC_MESSAGE(prefix, limit, start_after);
};

struct StoreSegmentStat {
  std::string segment;
  std::string node_id;
  std::string host;
  std::string domain;
  std::string medium;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t largest_free_bytes = 0;
  double fragmentation = 0.0;
  uint64_t objects = 0;
  uint64_t leased_objects = 0;
  uint64_t hits = 0;
  uint64_t evictions = 0;
  uint64_t demotions = 0;
  bool suspect = false;    // its node missed heartbeats (or is re-reporting): replicas kept, not offered
  bool read_only = false;  // an SSD segment after ENOSPC/EIO: read, never demoted to
  bool draining = false;   // its node drains (store.node_drain): no new replicas, readable until unmounted
  MC_MESSAGE(segment, node_id, host, domain, medium, capacity_bytes, used_bytes, largest_free_bytes, fragmentation,
             objects, leased_objects, hits, evictions, demotions, suspect, read_only, draining);
};
// One tenant's quota usage and limits (docs/SECURITY.md "Quotas (issue 51)"). Limits are the effective ones,
// UINT64_MAX where unlimited; `set` names the dimensions given by --quota or store.quota_set (the others default).
struct StoreTenantStat {
  std::string tenant;
  uint64_t bytes = 0, pinned_bytes = 0, puts = 0, put_bytes = 0, objects = 0;
  uint64_t limit_bytes = 0, limit_pinned_bytes = 0, limit_puts = 0, limit_put_bytes = 0, limit_objects = 0;
  uint64_t refused = 0;  // puts and pins refused over quota
  MC_MESSAGE(tenant, bytes, pinned_bytes, puts, put_bytes, objects, limit_bytes, limit_pinned_bytes, limit_puts,
             limit_put_bytes, limit_objects, refused);
};
struct StoreStatReply {
  std::vector<StoreSegmentStat> segments;
  uint64_t objects = 0, processing = 0, nodes = 0, clients = 0;
  uint64_t hits = 0, misses = 0, puts = 0, removes = 0, evictions = 0, demotions = 0;
  uint64_t reclaimed_puts = 0, refused_put_ends = 0, hot_replications = 0, dead_nodes = 0;
  uint64_t pending_free_bytes = 0;
  uint64_t last_event_id = 0;
  uint64_t pinned_objects = 0;           // objects pinned now (unexpired soft pins included)
  uint64_t pinned_bytes = 0;             // their sizes, one copy each
  uint64_t expired_pins = 0;             // soft pins that ran out
  uint64_t corrupt_replicas = 0;         // replicas dropped because their bytes failed the checksum
  uint64_t suspect_nodes = 0;            // nodes suspect now (missed heartbeats, within the grace period)
  uint64_t returned_nodes = 0;           // suspect nodes that came back within the grace period
  uint64_t reported_replicas = 0;        // replicas confirmed or restored from the nodes' store.node_report
  uint64_t refused_reports = 0;          // reported replicas refused (unknown, conflicting or overlapping)
  uint64_t ssd_failures = 0;             // SSD segments made read-only (ENOSPC/EIO) or lost (directory gone)
  uint64_t events_incarnation = 0;       // of the master's KV-event publisher (KvEvent::incarnation); 0: none
  uint64_t nodes_drained = 0;            // nodes that drained (store.node_drain) and unmounted; not in dead_nodes
  uint64_t drain_moved_objects = 0;      // objects copied off draining nodes
  uint64_t drain_moved_bytes = 0;        // ... their bytes
  uint64_t drain_dropped_objects = 0;    // objects lost by drains (no room anywhere, corrupt, not moved in time)
  std::vector<StoreTenantStat> tenants;  // quotas; a tenant's own call sees only its own row
  MC_MESSAGE(segments, objects, processing, nodes, clients, hits, misses, puts, removes, evictions, demotions,
             reclaimed_puts, refused_put_ends, hot_replications, dead_nodes, pending_free_bytes, last_event_id,
             pinned_objects, pinned_bytes, expired_pins, corrupt_replicas, suspect_nodes, returned_nodes,
             reported_replicas, refused_reports, ssd_failures, events_incarnation, nodes_drained, drain_moved_objects,
             drain_moved_bytes, drain_dropped_objects, tenants);
};
// Sets a tenant's quota (admin only): `limits` as mc-store quota set takes it ("bytes:2GiB,pinned:1GiB,puts:64,
// put-bytes:512MiB,objects:100000"; "default" resets a dimension). Dimensions not named keep their value.
struct StoreQuotaSetRequest {
  static constexpr const char* kType = "store.quota_set";
  using Reply = StoreAck;
  std::string tenant;
  std::string limits;
  MC_MESSAGE(tenant, limits);
};

struct StoreStatRequest {
  static constexpr const char* kType = "store.stat";
  using Reply = StoreStatReply;
  bool with_segments = true;
  MC_MESSAGE(with_segments);
};

// Where the master answers store.* messages without ZeroMQ (store/src/fast_rpc.hpp: length-prefixed frames
// [BE u32 header bytes, BE u32 body bytes, msgpack Header, msgpack body] on one plain TCP connection, in
// order, pipelining allowed). A client that gets fast_port 0 (or kUnimplemented from an older master)
// stays on the ZeroMQ endpoint. The host is the one the client reached the master's endpoint with.
struct StoreInfoReply {
  uint32_t fast_port = 0;  // 0: no fast endpoint
  std::string service;
  uint64_t epoch = 0;  // random per master start: a node told "unknown" learns here whether the master restarted
  MC_MESSAGE(fast_port, service, epoch);
};
struct StoreInfoRequest {
  static constexpr const char* kType = "store.info";
  using Reply = StoreInfoReply;
  std::string client_id;
  MC_MESSAGE(client_id);
};

// Storage node data RPCs for disk (SSD) segments (chunked by the client to stay under kMaxMessageBytes);
// a node refuses them for its DRAM segment, which is served through the transfer engine.
inline constexpr uint64_t kStoreMaxChunkBytes = 16ULL << 20;
struct StoreNodeWriteRequest {
  static constexpr const char* kType = "store.node.write";
  using Reply = StoreAck;
  std::string segment;
  uint64_t offset_bytes = 0;
  std::vector<char> data;  // msgpack bin
  std::string grant{};     // with --auth-dir: the replica's write grant (StoreReplica::grant) covering these bytes
  MC_MESSAGE(segment, offset_bytes, data, grant);
};
struct StoreNodeReadReply {
  std::vector<char> data;
  MC_MESSAGE(data);
};
struct StoreNodeReadRequest {
  static constexpr const char* kType = "store.node.read";
  using Reply = StoreNodeReadReply;
  std::string segment;
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;
  std::string grant{};  // with --auth-dir: the replica's read grant (StoreReplica::grant) covering these bytes
  MC_MESSAGE(segment, offset_bytes, length_bytes, grant);
};

// admin -> master: pins (master_core.hpp "Pins"). A pinned object is never evicted nor demoted to SSD.
// Answered item by item: kObjectNotFound for an absent key (naming it), kObjectBusy while it is written.
struct StorePinRequest {
  static constexpr const char* kType = "store.pin";
  using Reply = StoreItemsReply;
  std::vector<std::string> keys;  // at most kStoreMaxBatch
  int64_t ttl_ms = 0;             // 0: until store.unpin; > 0: soft pin ending ttl_ms after the master got this
  MC_MESSAGE(keys, ttl_ms);
};
struct StoreUnpinRequest {
  static constexpr const char* kType = "store.unpin";
  using Reply = StoreItemsReply;
  std::vector<std::string> keys;  // at most kStoreMaxBatch
  MC_MESSAGE(keys);
};

// client -> master: the bytes read from a replica failed the object's checksum. The master drops that
// replica (counted in stat corrupt_replicas; an object left without one is gone) and never offers it again.
struct StoreReportCorruptRequest {
  static constexpr const char* kType = "store.report_corrupt";
  using Reply = StoreAck;
  std::string client_id;
  std::string key;
  std::string segment;
  uint64_t offset_bytes = 0;
  MC_MESSAGE(client_id, key, segment, offset_bytes);
};

// node -> master: the node's objects on one segment, in pages (after a suspect spell, when the heartbeat
// reply asks for it, or after mounting at a restarted master). Page `first` opens a round, `last` ends
// it: a suspect node's replicas of that segment that were not reported are dropped, and its segment is
// offered again; a restarted master creates the reported objects (leases expired, no pins). Refused
// entries (unknown after a suspect spell, size or checksum conflicting with the object's, a range that
// overlaps another) come back by offset: the node forgets them.
struct StoreNodeObject {
  std::string key;
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;
  MC_MESSAGE(key, offset_bytes, size_bytes, checksum);
};
struct StoreNodeReportReply {
  uint64_t accepted = 0;
  std::vector<uint64_t> refused_offsets;
  MC_MESSAGE(accepted, refused_offsets);
};
struct StoreNodeReportRequest {
  static constexpr const char* kType = "store.node_report";
  using Reply = StoreNodeReportReply;
  std::string node_id;
  std::string segment;
  std::vector<StoreNodeObject> objects;  // at most kStoreMaxBatch
  bool first = false;
  bool last = false;
  MC_MESSAGE(node_id, segment, objects, first, last);
};

// node -> master: the graceful drain of a storage node that leaves (mc-store serve on SIGTERM; master_core.hpp
// "Drain"). The first call marks the node's segments draining (no new replicas; still readable). Each reply hands
// out a page of copy tasks — objects whose every complete replica is on the node, each with a new replica
// (`target`, with its write grant) on another node's DRAM — and the next call reports them in `done` (kDataLoss:
// the source failed the checksum). The node unmounts its segments when a reply has no tasks and `more` is false,
// or when it gives up: then it sends `final` (the master records `done`, hands out nothing, and answers how many
// objects are still only on the node). The master refuses more than kStoreMaxBatch results and names a node that is
// not the caller's (storage role, own node id only). A result's message is cut to kStoreMaxDrainMessageBytes.
inline constexpr uint32_t kStoreMaxDrainTasks = 256;  // tasks per reply
inline constexpr size_t kStoreMaxDrainMessageBytes = 512;
struct StoreDrainTask {
  std::string key;
  std::string src_segment;  // the node's DRAM segment (its memory) or SSD segment (its file)
  uint64_t src_offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // the object's XXH3-64: the node checks the source bytes against it before copying
  uint64_t put_id = 0;    // of the new replica: echoed in the result
  StoreReplica target;    // WRITE the bytes to target.xfer_segment at target.xfer_offset_bytes (grant: target.grant)
  MC_MESSAGE(key, src_segment, src_offset_bytes, size_bytes, checksum, put_id, target);
};
struct StoreDrainResult {
  std::string key;
  uint64_t put_id = 0;
  bool ok = false;
  uint16_t code = 0;  // an mc::Code value, 0 with ok; kDataLoss: the source failed its checksum
  std::string message;
  MC_MESSAGE(key, put_id, ok, code, message);
};
struct StoreNodeDrainReply {
  std::vector<StoreDrainTask> tasks;  // at most kStoreMaxDrainTasks
  bool more = false;                  // objects remain or copies are not reported yet: call again
  uint64_t moved_objects = 0;         // this node's drain so far
  uint64_t dropped_objects = 0;       // ... dropped (no room on any other node, corrupt source)
  uint64_t remaining_objects = 0;     // with final: objects still only on the node (lost when it unmounts)
  MC_MESSAGE(tasks, more, moved_objects, dropped_objects, remaining_objects);
};
struct StoreNodeDrainRequest {
  static constexpr const char* kType = "store.node_drain";
  using Reply = StoreNodeDrainReply;
  std::string node_id;
  std::vector<StoreDrainResult> done;  // at most kStoreMaxBatch
  bool final = false;
  MC_MESSAGE(node_id, done, final);
};

// conductor -> store master: hot-prefix replication (DESIGN.md §3 step 2). Sent before the prefill job of
// a decision with replicate_prefix: the master marks each key so that the next read of it by a client on
// `host` (the chosen prefill instance's host) is granted a copy on a DRAM segment there, which that
// reader fills with the bytes it read (store.replica_end; master_core.hpp replicate_near).
struct StoreReplicateNearReply {
  uint32_t marked = 0;  // keys that will be copied (absent keys and keys already on `host` are skipped)
  MC_MESSAGE(marked);
};
struct StoreReplicateNearRequest {
  static constexpr const char* kType = "store.replicate_near";
  using Reply = StoreReplicateNearReply;
  std::vector<std::string> keys;  // block store keys, at most kStoreMaxBatch
  std::string host;               // host label of the reader that will copy them
  MC_MESSAGE(keys, host);
};

}  // namespace mc::proto
