// Every control-plane message of mc, in one schema header (DESIGN.md §2).
//
// Wire format (ZeroMQ, see rpc.hpp): a request or reply is two frames
//   frame 0: header, a msgpack map {"v": protocol version (u32), "type": message type (str), "id": call id (u64)}
//   frame 1: body, a msgpack map of the struct named by "type" (fields by name, see MSGPACK_DEFINE_MAP)
// A reply carries the request's "id" and the type "<request type>.reply", or "error" with an ErrorReply body.
// Pushed messages (no request) carry id 0. KV events use their own three-frame form (kv_events below).
//
// Rules for every struct here: field names carry units (_ms, _ns, _bytes, _tokens); integers are
// fixed-width; a missing field decodes to its default (so fields can be added compatibly); a field of
// the wrong type fails the whole decode with kMalformedMessage. Every request type declares
// `static constexpr const char* kType` and `using Reply`. Bump kProtocolVersion on any incompatible
// change; peers compare versions on connect (HelloRequest) and in every header.
//
// Each area owns one section below; keep sections in this order and add a round-trip test in
// tests/common/protocol_test.cpp for every new message.
#pragma once

#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <msgpack.hpp>

namespace mc::proto {

inline constexpr uint32_t kProtocolVersion = 1;
// Largest frame a peer accepts; larger frames are dropped with a log line (ZMQ_MAXMSGSIZE).
inline constexpr int64_t kMaxMessageBytes = 64LL << 20;

// ---------------------------------------------------------------------------------------------
// Envelope and common messages (libcommon)
// ---------------------------------------------------------------------------------------------

struct Header {
  uint32_t v = 0;
  std::string type;
  uint64_t id = 0;
  MSGPACK_DEFINE_MAP(v, type, id);
};

inline constexpr const char* kErrorType = "error";

// Body of an "error" reply. code is an mc::Code value.
struct ErrorReply {
  uint16_t code = 0;
  std::string message;
  MSGPACK_DEFINE_MAP(code, message);
};

struct HelloReply {
  uint32_t protocol_version = 0;
  std::string service;  // "mc-store master", "mc-conductor", ...
  std::string build;    // version+git revision
  MSGPACK_DEFINE_MAP(protocol_version, service, build);
};
// Sent by RpcClient::connect before any other call; a version mismatch is answered with an error.
struct HelloRequest {
  static constexpr const char* kType = "hello";
  using Reply = HelloReply;
  uint32_t protocol_version = 0;
  std::string client_name;
  MSGPACK_DEFINE_MAP(protocol_version, client_name);
};

struct PingReply {
  int64_t server_unix_ms = 0;
  MSGPACK_DEFINE_MAP(server_unix_ms);
};
struct PingRequest {
  static constexpr const char* kType = "ping";
  using Reply = PingReply;
  int64_t client_unix_ms = 0;
  MSGPACK_DEFINE_MAP(client_unix_ms);
};

// Every daemon answers "stat" with its metrics registry rendered as JSON (metrics.hpp).
struct StatReply {
  std::string service;
  std::string metrics_json;     // Registry::json()
  std::string prometheus_text;  // Registry::prometheus_text(), only when asked
  MSGPACK_DEFINE_MAP(service, metrics_json, prometheus_text);
};
struct StatRequest {
  static constexpr const char* kType = "stat";
  using Reply = StatReply;
  bool with_prometheus_text = false;
  MSGPACK_DEFINE_MAP(with_prometheus_text);
};

// ---------------------------------------------------------------------------------------------
// KV events (DESIGN.md §4, after the open KV-events contract, Mooncake RFC #1527)
// Published on a ZeroMQ PUB socket as three frames:
//   [topic (str, e.g. "kv"), event_id as big-endian u64, msgpack KvEvent]
// event_id increases by exactly 1 per event on one stream; a subscriber that sees a gap resyncs.
// ---------------------------------------------------------------------------------------------

inline constexpr const char* kKvEventStored = "stored";
inline constexpr const char* kKvEventRemoved = "removed";
inline constexpr const char* kKvEventCleared = "cleared";  // every block of backend_id is gone

struct KvEvent {
  std::string type;       // stored | removed | cleared
  uint64_t event_id = 0;  // same as frame 1
  int64_t ts_unix_ms = 0;
  std::vector<uint64_t> seq_hashes;  // prefix-chained block hashes (block_key.hpp)
  std::string backend_id;            // the holder: storage segment or instance name
  std::string medium;                // gpu | cpu | disk
  // Random per publisher start (EventPublisher::incarnation), never 0; 0 from a publisher that does not say.
  // Another value on a stream means its publisher restarted: its event ids begin again at 1.
  uint64_t incarnation = 0;
  MSGPACK_DEFINE_MAP(type, event_id, ts_unix_ms, seq_hashes, backend_id, medium, incarnation);
};

// ---------------------------------------------------------------------------------------------
// Transfer engine (transfer/): segment descriptors and the peer-to-peer directory
// ---------------------------------------------------------------------------------------------
// (section owned by mc_transfer)

// Format version of SegmentDescriptor; a reader rejects a descriptor whose format_version it does not know.
inline constexpr uint32_t kSegmentDescriptorVersion = 1;

// One registered memory region of a segment. Regions occupy disjoint ranges of the segment's 64-bit
// offset space; peers address bytes as (segment, offset). A registration larger than the per-region
// limit of a transport is published as several regions (DESIGN.md §13.10), each covering exactly the
// bytes it says.
struct RegionDescriptor {
  uint64_t segment_offset = 0;       // first byte of the region in the segment's offset space
  uint64_t length_bytes = 0;         // bytes covered; never truncated
  std::string location;              // "cpu:0", "cuda:0"
  std::string shm_path;              // memfd/dev-shm file a same-host peer maps ("/proc/<pid>/fd/<fd>"); "" = none
  uint64_t shm_offset_bytes = 0;     // offset of the region's first byte inside shm_path
  uint64_t rdma_addr = 0;            // virtual address for one-sided RDMA (0 when not registered with a NIC)
  std::vector<uint32_t> rdma_rkeys;  // one rkey per RDMA device, in SegmentDescriptor::rdma_devices order
  MSGPACK_DEFINE_MAP(segment_offset, length_bytes, location, shm_path, shm_offset_bytes, rdma_addr, rdma_rkeys);
};

// What a peer needs to reach a segment: published by its owner, fetched by name from the peer itself
// ("host:port", over the transfer engine's own TCP control op) or from a directory service.
struct SegmentDescriptor {
  uint32_t format_version = 0;            // kSegmentDescriptorVersion
  std::string name;                       // "host:port" of the first endpoint
  std::string host_id;                    // boot id + hostname: equal host_id means shared memory may work
  int32_t pid = 0;                        // owner process (for shm paths and logs)
  std::vector<std::string> endpoints;     // "tcp://ADDR:PORT", one per listen address (one path each)
  std::vector<std::string> rdma_devices;  // "mlx5_0", with GIDs in rdma_gids (same order)
  std::vector<std::string> rdma_gids;     // 32 hex digits (the port's GID at the index the owner uses)
  std::vector<RegionDescriptor> regions;  // sorted by segment_offset, disjoint
  std::string topology_json;              // the owner's topology matrix (topology.hpp), so a peer can pick its side
  // Added within format version 1 (map keys: a reader of an older descriptor sees them empty, an older
  // reader ignores them): per RDMA device, its port's LID (InfiniBand; 0 on RoCE) in rdma_devices order.
  std::vector<uint32_t> rdma_lids;
  MSGPACK_DEFINE_MAP(format_version, name, host_id, pid, endpoints, rdma_devices, rdma_gids, regions, topology_json,
                     rdma_lids);
};

// One side of an RDMA RC queue-pair handshake (carried over the transfer engine's tcp control op
// "rdma connect": the initiator sends RdmaConnectRequest, the target creates its QP and answers
// RdmaConnectReply; both then move their QP to RTR/RTS with the other's values). The target keeps its QP
// while the control connection of the handshake stays open and destroys it when that connection closes.
struct RdmaQpInfo {
  std::string device;  // "mlx5_0"
  uint32_t port = 1;   // port number on the device
  uint32_t qp_num = 0;
  uint32_t psn = 0;  // initial packet sequence number (24 bits)
  uint32_t lid = 0;  // InfiniBand LID (0 on RoCE)
  std::string gid;   // 32 hex digits; all zero when the port has none (IB without GRH)
  uint32_t gid_index = 0;
  uint32_t mtu_bytes = 0;  // active MTU of the port (256..4096); both sides use the smaller
  MSGPACK_DEFINE_MAP(device, port, qp_num, psn, lid, gid, gid_index, mtu_bytes);
};
struct RdmaConnectReply {
  RdmaQpInfo target;           // the target's QP, device and port
  uint32_t max_rd_atomic = 0;  // RDMA READs the target accepts in flight on this QP
  MSGPACK_DEFINE_MAP(target, max_rd_atomic);
};
struct RdmaConnectRequest {
  std::string segment;        // target segment name (for its logs and errors)
  std::string target_device;  // which of the target's rdma_devices the QP is to live on
  RdmaQpInfo initiator;
  uint32_t max_rd_atomic = 0;  // RDMA READs the initiator keeps in flight on this QP
  MSGPACK_DEFINE_MAP(segment, target_device, initiator, max_rd_atomic);
};

// Sent by an initiator to the target of a request that carried a notify tag, after its last byte landed
// (transfer engine's own TCP control op; the target acknowledges it before the request completes).
struct TransferNotification {
  std::string tag;
  std::string from;             // initiator's segment name, "" when it serves none
  uint8_t op = 0;               // 1 read, 2 write
  uint64_t segment_offset = 0;  // range of the request in the target's segment
  uint64_t length_bytes = 0;
  std::string grant{};  // the request's grant (mc/common/grant.hpp) where the target enforces grants; "" otherwise
  MSGPACK_DEFINE_MAP(tag, from, op, segment_offset, length_bytes, grant);
};

// Directory service (implemented by the store master): publish and look up descriptors by name.
struct PublishSegmentReply {
  uint64_t region_count = 0;  // regions accepted
  MSGPACK_DEFINE_MAP(region_count);
};
struct PublishSegmentRequest {
  static constexpr const char* kType = "xfer.publish_segment";
  using Reply = PublishSegmentReply;
  SegmentDescriptor descriptor;
  MSGPACK_DEFINE_MAP(descriptor);
};
struct GetSegmentReply {
  SegmentDescriptor descriptor;
  MSGPACK_DEFINE_MAP(descriptor);
};
struct GetSegmentRequest {
  static constexpr const char* kType = "xfer.get_segment";
  using Reply = GetSegmentReply;
  std::string name;  // "host:port"
  MSGPACK_DEFINE_MAP(name);
};

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
  MSGPACK_DEFINE_MAP(ok);
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
  // With --auth-dir: the data-plane grant (mc/common/grant.hpp) for these bytes — of xfer_segment at
  // xfer_offset_bytes for a DRAM replica, of `segment` at offset_bytes for a disk one (store.node.read/write) —
  // issued by the master to the caller: read for get_replicas' replicas, write for put_start's and replicate_to,
  // expiring with the read lease or the put's takeover time. "" without a grant key.
  std::string grant{};
  MSGPACK_DEFINE_MAP(segment, node_id, host, domain, medium, endpoint, xfer_segment, xfer_offset_bytes, offset_bytes,
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
  MSGPACK_DEFINE_MAP(node_id, segment, host, domain, medium, capacity_bytes, endpoint, xfer_segment,
                     xfer_base_offset_bytes, restore);
};

struct StoreUnmountRequest {
  static constexpr const char* kType = "store.unmount";
  using Reply = StoreAck;
  std::string node_id;
  std::string segment;
  MSGPACK_DEFINE_MAP(node_id, segment);
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
  MSGPACK_DEFINE_MAP(task_id, key, src_segment, src_offset_bytes, dst_segment, dst_offset_bytes, size_bytes, checksum);
};
struct StoreDemoteResult {
  uint64_t task_id = 0;
  bool ok = false;
  // Why it failed (an mc::Code value, 0 with ok): kNoSpace or kIo make the SSD segment read-only at the
  // master (eviction then drops DRAM victims); kDataLoss means the DRAM source failed its checksum (dropped).
  uint16_t code = 0;
  std::string message;
  MSGPACK_DEFINE_MAP(task_id, ok, code, message);
};
// The master's view of one of the node's segments, for the node's own `stat` (as of this heartbeat).
struct StoreNodeSegmentUsage {
  std::string segment;
  std::string medium;  // cpu | disk
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;  // replicas held (complete or being written)
  uint64_t hits = 0;     // reads whose nearest replica was here
  MSGPACK_DEFINE_MAP(segment, medium, capacity_bytes, used_bytes, objects, hits);
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
  MSGPACK_DEFINE_MAP(present, segment, offset_bytes, key, size_bytes, checksum);
};
struct StoreNodeHeartbeatReply {
  std::vector<StoreDemoteTask> tasks;
  std::vector<StoreNodeSegmentUsage> segments;  // the node's segments (a master before issue 16: none)
  std::vector<StoreNodeObjectChange> changes;   // at most kStoreMaxBatch, oldest first
  bool more = false;                            // more changes are queued: heartbeat again at once
  bool report = false;  // the node was suspect: re-report every segment's objects (store.node_report)
  MSGPACK_DEFINE_MAP(tasks, segments, changes, more, report);
};
// Sent every heartbeat interval; an unknown node gets kNotFound and mounts its segments again.
struct StoreNodeHeartbeatRequest {
  static constexpr const char* kType = "store.node_heartbeat";
  using Reply = StoreNodeHeartbeatReply;
  std::string node_id;
  std::vector<StoreDemoteResult> done;
  MSGPACK_DEFINE_MAP(node_id, done);
};

struct StoreClientHeartbeatRequest {
  static constexpr const char* kType = "store.client_heartbeat";
  using Reply = StoreAck;
  std::string client_id;
  MSGPACK_DEFINE_MAP(client_id);
};

struct StorePutStartItem {
  uint16_t code = 0;
  std::string message;
  uint64_t put_id = 0;
  std::vector<StoreReplica> replicas;
  MSGPACK_DEFINE_MAP(code, message, put_id, replicas);
};
struct StorePutStartReply {
  std::vector<StorePutStartItem> items;
  MSGPACK_DEFINE_MAP(items);
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
  MSGPACK_DEFINE_MAP(client_id, keys, sizes_bytes, replicas, preferred_segment, overwrite, pin, client_host,
                     pin_ttl_ms);
};

// Per-item result of batch calls without payload.
struct StoreItemsReply {
  std::vector<uint16_t> codes;
  std::vector<std::string> messages;
  MSGPACK_DEFINE_MAP(codes, messages);
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
  MSGPACK_DEFINE_MAP(client_id, keys, put_ids, checksums, part_bytes, part_checksums);
};
struct StorePutRevokeRequest {
  static constexpr const char* kType = "store.put_revoke";
  using Reply = StoreItemsReply;
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> put_ids;
  MSGPACK_DEFINE_MAP(client_id, keys, put_ids);
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
  MSGPACK_DEFINE_MAP(code, message, size_bytes, lease_ms, replicas, replicate_to, replicate_put_id, checksum,
                     part_bytes, part_checksums);
};
struct StoreGetReplicasReply {
  std::vector<StoreGetItem> items;
  MSGPACK_DEFINE_MAP(items);
};
struct StoreGetReplicasRequest {
  static constexpr const char* kType = "store.get_replicas";
  using Reply = StoreGetReplicasReply;
  std::string client_id;
  std::string client_host;  // nearest-first ordering: same host, then same domain
  std::string client_domain;
  std::vector<std::string> keys;
  bool with_parts = false;  // also send each object's part checksums (a reader of ranges)
  MSGPACK_DEFINE_MAP(client_id, client_host, client_domain, keys, with_parts);
};

struct StoreReplicaEndRequest {
  static constexpr const char* kType = "store.replica_end";
  using Reply = StoreAck;
  std::string client_id;
  std::string key;
  uint64_t put_id = 0;
  bool ok = false;
  MSGPACK_DEFINE_MAP(client_id, key, put_id, ok);
};

struct StoreExistsReply {
  std::vector<bool> present;
  MSGPACK_DEFINE_MAP(present);
};
struct StoreExistsRequest {
  static constexpr const char* kType = "store.exists";
  using Reply = StoreExistsReply;
  std::vector<std::string> keys;
  MSGPACK_DEFINE_MAP(keys);
};

struct StoreMatchPrefixReply {
  uint64_t matched_blocks = 0;  // leading keys present; stops at the first missing one
  MSGPACK_DEFINE_MAP(matched_blocks);
};
struct StoreMatchPrefixRequest {
  static constexpr const char* kType = "store.match_prefix";
  using Reply = StoreMatchPrefixReply;
  std::vector<std::string> keys;  // block keys in chain order
  MSGPACK_DEFINE_MAP(keys);
};

struct StoreRemoveRequest {
  static constexpr const char* kType = "store.remove";
  using Reply = StoreItemsReply;
  std::vector<std::string> keys;
  MSGPACK_DEFINE_MAP(keys);
};

struct StoreObjectInfo {
  std::string key;
  uint64_t size_bytes = 0;
  bool complete = false;
  bool leased = false;
  bool pinned = false;
  std::vector<std::string> segments;
  std::vector<std::string> media;
  MSGPACK_DEFINE_MAP(key, size_bytes, complete, leased, pinned, segments, media);
};
struct StoreLsReply {
  std::vector<StoreObjectInfo> objects;
  bool truncated = false;
  MSGPACK_DEFINE_MAP(objects, truncated);
};
struct StoreLsRequest {
  static constexpr const char* kType = "store.ls";
  using Reply = StoreLsReply;
  std::string prefix;
  uint32_t limit = 1000;
  MSGPACK_DEFINE_MAP(prefix, limit);
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
  MSGPACK_DEFINE_MAP(segment, node_id, host, domain, medium, capacity_bytes, used_bytes, largest_free_bytes,
                     fragmentation, objects, leased_objects, hits, evictions, demotions, suspect, read_only, draining);
};
struct StoreStatReply {
  std::vector<StoreSegmentStat> segments;
  uint64_t objects = 0, processing = 0, nodes = 0, clients = 0;
  uint64_t hits = 0, misses = 0, puts = 0, removes = 0, evictions = 0, demotions = 0;
  uint64_t reclaimed_puts = 0, refused_put_ends = 0, hot_replications = 0, dead_nodes = 0;
  uint64_t pending_free_bytes = 0;
  uint64_t last_event_id = 0;
  uint64_t pinned_objects = 0;         // objects pinned now (unexpired soft pins included)
  uint64_t pinned_bytes = 0;           // their sizes, one copy each
  uint64_t expired_pins = 0;           // soft pins that ran out
  uint64_t corrupt_replicas = 0;       // replicas dropped because their bytes failed the checksum
  uint64_t suspect_nodes = 0;          // nodes suspect now (missed heartbeats, within the grace period)
  uint64_t returned_nodes = 0;         // suspect nodes that came back within the grace period
  uint64_t reported_replicas = 0;      // replicas confirmed or restored from the nodes' store.node_report
  uint64_t refused_reports = 0;        // reported replicas refused (unknown, conflicting or overlapping)
  uint64_t ssd_failures = 0;           // SSD segments made read-only (ENOSPC/EIO) or lost (directory gone)
  uint64_t events_incarnation = 0;     // of the master's KV-event publisher (KvEvent::incarnation); 0: none
  uint64_t nodes_drained = 0;          // nodes that drained (store.node_drain) and unmounted; not in dead_nodes
  uint64_t drain_moved_objects = 0;    // objects copied off draining nodes
  uint64_t drain_moved_bytes = 0;      // ... their bytes
  uint64_t drain_dropped_objects = 0;  // objects lost by drains (no room anywhere, corrupt, not moved in time)
  MSGPACK_DEFINE_MAP(segments, objects, processing, nodes, clients, hits, misses, puts, removes, evictions, demotions,
                     reclaimed_puts, refused_put_ends, hot_replications, dead_nodes, pending_free_bytes, last_event_id,
                     pinned_objects, pinned_bytes, expired_pins, corrupt_replicas, suspect_nodes, returned_nodes,
                     reported_replicas, refused_reports, ssd_failures, events_incarnation, nodes_drained,
                     drain_moved_objects, drain_moved_bytes, drain_dropped_objects);
};
struct StoreStatRequest {
  static constexpr const char* kType = "store.stat";
  using Reply = StoreStatReply;
  bool with_segments = true;
  MSGPACK_DEFINE_MAP(with_segments);
};

// Where the master answers store.* messages without ZeroMQ (store/src/fast_rpc.hpp: length-prefixed frames
// [BE u32 header bytes, BE u32 body bytes, msgpack Header, msgpack body] on one plain TCP connection, in
// order, pipelining allowed). A client that gets fast_port 0 (or kUnimplemented from an older master)
// stays on the ZeroMQ endpoint. The host is the one the client reached the master's endpoint with.
struct StoreInfoReply {
  uint32_t fast_port = 0;  // 0: no fast endpoint
  std::string service;
  uint64_t epoch = 0;  // random per master start: a node told "unknown" learns here whether the master restarted
  MSGPACK_DEFINE_MAP(fast_port, service, epoch);
};
struct StoreInfoRequest {
  static constexpr const char* kType = "store.info";
  using Reply = StoreInfoReply;
  std::string client_id;
  MSGPACK_DEFINE_MAP(client_id);
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
  MSGPACK_DEFINE_MAP(segment, offset_bytes, data, grant);
};
struct StoreNodeReadReply {
  std::vector<char> data;
  MSGPACK_DEFINE_MAP(data);
};
struct StoreNodeReadRequest {
  static constexpr const char* kType = "store.node.read";
  using Reply = StoreNodeReadReply;
  std::string segment;
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;
  std::string grant{};  // with --auth-dir: the replica's read grant (StoreReplica::grant) covering these bytes
  MSGPACK_DEFINE_MAP(segment, offset_bytes, length_bytes, grant);
};

// admin -> master: pins (master_core.hpp "Pins"). A pinned object is never evicted nor demoted to SSD.
// Answered item by item: kObjectNotFound for an absent key (naming it), kObjectBusy while it is written.
struct StorePinRequest {
  static constexpr const char* kType = "store.pin";
  using Reply = StoreItemsReply;
  std::vector<std::string> keys;  // at most kStoreMaxBatch
  int64_t ttl_ms = 0;             // 0: until store.unpin; > 0: soft pin ending ttl_ms after the master got this
  MSGPACK_DEFINE_MAP(keys, ttl_ms);
};
struct StoreUnpinRequest {
  static constexpr const char* kType = "store.unpin";
  using Reply = StoreItemsReply;
  std::vector<std::string> keys;  // at most kStoreMaxBatch
  MSGPACK_DEFINE_MAP(keys);
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
  MSGPACK_DEFINE_MAP(client_id, key, segment, offset_bytes);
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
  MSGPACK_DEFINE_MAP(key, offset_bytes, size_bytes, checksum);
};
struct StoreNodeReportReply {
  uint64_t accepted = 0;
  std::vector<uint64_t> refused_offsets;
  MSGPACK_DEFINE_MAP(accepted, refused_offsets);
};
struct StoreNodeReportRequest {
  static constexpr const char* kType = "store.node_report";
  using Reply = StoreNodeReportReply;
  std::string node_id;
  std::string segment;
  std::vector<StoreNodeObject> objects;  // at most kStoreMaxBatch
  bool first = false;
  bool last = false;
  MSGPACK_DEFINE_MAP(node_id, segment, objects, first, last);
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
  MSGPACK_DEFINE_MAP(key, src_segment, src_offset_bytes, size_bytes, checksum, put_id, target);
};
struct StoreDrainResult {
  std::string key;
  uint64_t put_id = 0;
  bool ok = false;
  uint16_t code = 0;  // an mc::Code value, 0 with ok; kDataLoss: the source failed its checksum
  std::string message;
  MSGPACK_DEFINE_MAP(key, put_id, ok, code, message);
};
struct StoreNodeDrainReply {
  std::vector<StoreDrainTask> tasks;  // at most kStoreMaxDrainTasks
  bool more = false;                  // objects remain or copies are not reported yet: call again
  uint64_t moved_objects = 0;         // this node's drain so far
  uint64_t dropped_objects = 0;       // ... dropped (no room on any other node, corrupt source)
  uint64_t remaining_objects = 0;     // with final: objects still only on the node (lost when it unmounts)
  MSGPACK_DEFINE_MAP(tasks, more, moved_objects, dropped_objects, remaining_objects);
};
struct StoreNodeDrainRequest {
  static constexpr const char* kType = "store.node_drain";
  using Reply = StoreNodeDrainReply;
  std::string node_id;
  std::vector<StoreDrainResult> done;  // at most kStoreMaxBatch
  bool final = false;
  MSGPACK_DEFINE_MAP(node_id, done, final);
};

// ---------------------------------------------------------------------------------------------
// Workers (infer/): prefill and decode instances
// ---------------------------------------------------------------------------------------------
// (section owned by mc_infer)
//
// A request's path through the workers (DESIGN.md §3):
//   1. reserver (Conductor or a client) -> mc-decode  "decode_reserve": admission; holds KV for input + output
//      tokens counting the future growth of everything running or reserved; refuses (kRejected) when it does
//      not fit, rejects bad lengths (kInvalidArgument, "input too long"; DESIGN.md §13.14).
//   2. reserver -> mc-prefill "prefill_job": tokens, how many leading blocks to fetch from the store, the decode
//      endpoint + reservation, the client endpoint. The reply is deferred until the job is done and carries the
//      ledger; an error reply means the decode side was told to abort.
//   3. mc-prefill -> mc-decode: each layer's KV as soon as it is computed. When the decode instance publishes a
//      transfer-engine segment (DecodeReserveReply::kv_segment, also in WorkerLoadReply), a transfer-engine WRITE
//      straight into the reserved blocks with notify_tag KvLayerTag ("kv/<reservation_id>/<layer>/<first block>-<end
//      block>", the layer-arrival notification); otherwise, as a fallback, "kv_write" RPCs carrying the bytes. Then
//      "kv_commit" (prompt length, first token, ledger) or "decode_abort" on failure.
//   4. mc-decode -> client endpoint: "token_event" per token (first token included), then "request_done" with
//      the ledger, or "request_error". A client never gets request_done after an abort.
//   "decode_release" frees a reservation that will get no job (the reserver changed its mind).

// Per-request cache and timing ledger (DESIGN.md §5). A time never measured is -1, not 0.
struct RequestLedger {
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;            // prefix tokens whose KV came from the store (= avoided prefill tokens)
  int64_t hit_tokens_local = 0;      // ... from a replica on this host (shared memory)
  int64_t hit_tokens_remote = 0;     // ... from another host or over the network
  int64_t missed_prefix_tokens = 0;  // tokens the job said to fetch that were missing/failed and recomputed
  int64_t computed_tokens = 0;       // tokens prefilled here
  int64_t fetch_bytes = 0;           // KV bytes read from the store (moved: a stage's layers of each block)
  int64_t kv_sent_bytes = 0;         // KV bytes written to the decode instance
  int64_t stored_blocks = 0;         // new complete blocks put into the store (pipelined: queued at decode)
  int64_t queue_ms = -1;             // job received -> started
  int64_t fetch_ms = -1;             // prefix batch_get
  int64_t prefill_ms = -1;           // compute of the new tokens
  int64_t kv_tail_ms = -1;           // last layer computed -> all KV acknowledged by decode
  int64_t decode_ms = -1;            // first token -> last token (decode side)
  int64_t output_tokens = 0;         // tokens actually generated (first token included)
  std::string decision;              // "fetch" (some prefix reused) | "recompute"
  // The SSD tier of the hits (DESIGN.md §5): hit tokens read from a storage node's SSD segment (not counted in
  // local or remote), and the bytes and wall time of those SSD reads (the Conductor refits its SSD bandwidth
  // from them; microseconds, since one block's read can take less than a millisecond). 0: none.
  int64_t hit_tokens_ssd = 0;
  int64_t fetch_ssd_bytes = 0;
  int64_t fetch_ssd_us = 0;
  // Per-path bandwidth (DESIGN.md §16 "Bandwidth decides, live"): the prefix fetch's wall time in microseconds
  // (fetch_ms is too coarse for one fast block), and the host every remote byte came from when it was one host
  // ("" otherwise: several hosts, none, or unknown).
  int64_t fetch_us = -1;
  std::string fetch_remote_host;
  MSGPACK_DEFINE_MAP(prompt_tokens, hit_tokens, hit_tokens_local, hit_tokens_remote, missed_prefix_tokens,
                     computed_tokens, fetch_bytes, kv_sent_bytes, stored_blocks, queue_ms, fetch_ms, prefill_ms,
                     kv_tail_ms, decode_ms, output_tokens, decision, hit_tokens_ssd, fetch_ssd_bytes, fetch_ssd_us,
                     fetch_us, fetch_remote_host);
};

struct DecodeReserveReply {
  uint64_t reservation_id = 0;
  int64_t block_tokens = 0;       // tokens per KV block of the decode buffer
  int64_t layer_block_bytes = 0;  // bytes of one layer of one block (one contiguous write)
  int64_t block_bytes = 0;        // bytes of one block (all layers)
  // Offset of each prompt block (its layer 0) in order: in the transfer-engine segment `kv_segment` when one is
  // published, else in the decode KV buffer. Layer l of block i is at block_offsets_bytes[i] + l * layer_block_bytes.
  std::vector<uint64_t> block_offsets_bytes;
  std::string kv_segment;   // transfer-engine segment of the buffer ("" = kv_write RPC only)
  int64_t free_blocks = 0;  // uncommitted blocks left after this reservation
  // With a grant key: the write grant (mc/common/grant.hpp) of kv_segment for this reservation (id =
  // reservation_id), which every WRITE and layer notification into its blocks must carry; it dies with the
  // reservation (released, expired, aborted or committed) or at its ttl. "" otherwise.
  std::string kv_grant{};
  MSGPACK_DEFINE_MAP(reservation_id, block_tokens, layer_block_bytes, block_bytes, block_offsets_bytes, kv_segment,
                     free_blocks, kv_grant);
};
struct DecodeReserveRequest {
  static constexpr const char* kType = "decode_reserve";
  using Reply = DecodeReserveReply;
  std::string request_id;
  int64_t input_length_tokens = 0;   // prompt tokens (> 0)
  int64_t output_length_tokens = 0;  // tokens to generate (> 0), first token included
  std::string client_endpoint;       // where token events go (ZeroMQ URI of the client's RpcServer)
  int64_t ttl_ms = 0;                // reservation dropped when no kv_commit arrives in time (0: worker default)
  // The request's key scope (block_key.hpp RequestKeyScope; all empty: base model, no salt): decode runs the
  // adapter and refuses a kv_commit whose KV namespace is not this scope in its own base namespace.
  std::string lora_name{};
  std::string lora_version{};
  std::string salt{};
  // With --auth-dir: the client's public key, which its token-event server serves with (docs/SECURITY.md); set by
  // the Conductor from the submitter's identity. Empty: the cluster key (no auth, or a daemon's server).
  std::string client_public_key{};
  MSGPACK_DEFINE_MAP(request_id, input_length_tokens, output_length_tokens, client_endpoint, ttl_ms, lora_name,
                     lora_version, salt, client_public_key);
};

struct DecodeReleaseReply {
  bool released = false;  // false: no such reservation (already released, finished or expired)
  int64_t free_blocks = 0;
  MSGPACK_DEFINE_MAP(released, free_blocks);
};
// Frees a reservation whose job was never dispatched; the client is not told.
struct DecodeReleaseRequest {
  static constexpr const char* kType = "decode_release";
  using Reply = DecodeReleaseReply;
  uint64_t reservation_id = 0;
  MSGPACK_DEFINE_MAP(reservation_id);
};
// The prefill failed or was aborted (DESIGN.md §13.14): decode frees the reservation, never generates from it,
// and sends "request_error" to the client.
struct DecodeAbortRequest {
  static constexpr const char* kType = "decode_abort";
  using Reply = DecodeReleaseReply;
  uint64_t reservation_id = 0;
  uint16_t code = 0;  // mc::Code of the failure
  std::string reason;
  MSGPACK_DEFINE_MAP(reservation_id, code, reason);
};

// Conductor -> mc-decode: the client cancelled request_id. A reservation of it is freed (a later kv_commit is
// refused), a running sequence leaves the batch and frees its KV blocks; no request_done follows. found = false:
// decode holds nothing of it (finished, or never reserved here).
struct DecodeCancelReply {
  bool found = false;
  int64_t free_blocks = 0;
  MSGPACK_DEFINE_MAP(found, free_blocks);
};
struct DecodeCancelRequest {
  static constexpr const char* kType = "decode_cancel";
  using Reply = DecodeCancelReply;
  std::string request_id;
  MSGPACK_DEFINE_MAP(request_id);
};
// Conductor -> mc-prefill: the client cancelled request_id. A queued job is dropped (its prefill_job is answered
// kCancelled after its decode reservation is aborted); a job already computing runs to its end.
struct PrefillCancelReply {
  bool dropped = false;  // false: not queued here (running, finished or unknown)
  MSGPACK_DEFINE_MAP(dropped);
};
struct PrefillCancelRequest {
  static constexpr const char* kType = "prefill_cancel";
  using Reply = PrefillCancelReply;
  std::string request_id;
  MSGPACK_DEFINE_MAP(request_id);
};

struct KvWriteReply {
  int64_t layers_received = 0;  // layers of this reservation with at least one write so far
  MSGPACK_DEFINE_MAP(layers_received);
};
// One layer's KV of some blocks, written into the reservation's blocks: data holds block_indexes.size()
// consecutive ranges of layer_block_bytes (the decode buffer's layout). block_indexes are positions in the
// reservation's block list. The fallback for decode instances that publish no transfer-engine segment.
struct KvWriteRequest {
  static constexpr const char* kType = "kv_write";
  using Reply = KvWriteReply;
  uint64_t reservation_id = 0;
  int64_t layer = 0;
  std::vector<uint32_t> block_indexes;
  std::vector<uint8_t> data;  // msgpack bin
  MSGPACK_DEFINE_MAP(reservation_id, layer, block_indexes, data);
};

// The notify_tag of the transfer-engine WRITE that completes one layer of prompt blocks [first_block, end_block)
// of a reservation (step 3 above; block numbers are positions in the reservation's block list, as in
// KvWriteRequest::block_indexes). Text form, all decimal: "kv/<reservation_id>/<layer>/<first_block>-<end_block>".
// decode() accepts exactly what encode() writes (no other prefix, no missing or trailing text) and checks no
// ranges: the decode worker checks them against the reservation. Plain value; pure functions.
struct KvLayerTag {
  uint64_t reservation_id = 0;
  int64_t layer = 0;
  int64_t first_block = 0;
  int64_t end_block = 0;  // exclusive

  std::string encode() const {
    return "kv/" + std::to_string(reservation_id) + "/" + std::to_string(layer) + "/" + std::to_string(first_block) +
           "-" + std::to_string(end_block);
  }
  // nullopt when `tag` is not of the form above.
  static std::optional<KvLayerTag> decode(std::string_view tag) {
    constexpr std::string_view kPrefix = "kv/";
    if (!tag.starts_with(kPrefix)) return std::nullopt;
    const char* p = tag.data() + kPrefix.size();
    const char* const end = tag.data() + tag.size();
    KvLayerTag t;
    // One decimal field, then `sep` (or the end of the tag when sep is 0).
    auto field = [&](auto& value, char sep) {
      auto [next, ec] = std::from_chars(p, end, value);
      if (ec != std::errc() || next == p) return false;
      p = next;
      if (sep == 0) return p == end;
      if (p == end || *p != sep) return false;
      ++p;
      return true;
    };
    if (!field(t.reservation_id, '/') || !field(t.layer, '/') || !field(t.first_block, '-') || !field(t.end_block, 0)) {
      return std::nullopt;
    }
    return t;
  }
  bool operator==(const KvLayerTag&) const = default;
};

struct KvCommitReply {
  int64_t batch_size = 0;  // running sequences once this one joined
  // Of the request's store_block_hashes: how many blocks decode copied and queued for its store (0 without one,
  // or when its put queue was full). Their puts complete after this reply (mc_decode_store_*_blocks_total).
  int64_t store_blocks_queued = 0;
  MSGPACK_DEFINE_MAP(batch_size, store_blocks_queued);
};
// All layers are sent: decode checks that every layer of every prompt block arrived (else kDataLoss, the
// reservation is freed and the client gets request_error), then joins the request to its batch.
struct KvCommitRequest {
  static constexpr const char* kType = "kv_commit";
  using Reply = KvCommitReply;
  uint64_t reservation_id = 0;
  std::string request_id;
  int64_t prompt_tokens = 0;
  uint32_t first_token = 0;
  int64_t first_token_unix_ns = 0;  // when prefill produced it
  RequestLedger ledger;
  // KeyNamespace::digest_hex() of the namespace the KV was computed in (the prefill's base namespace with the
  // job's key scope); "" = not told (an older prefill). Decode refuses a digest that is not the request's.
  std::string kv_namespace_digest{};  // {}: older aggregate initialisations stay complete
  // Decode puts these prompt blocks into its store (a pipelined prefill, DESIGN.md §18 "Live groups": no stage
  // holds every layer of a block, decode does once the check above passed). Block store_first_block + i has the
  // sequence hash store_block_hashes[i] (block_key.hpp seq_hashes); decode keys it in the reservation's namespace
  // itself, so a prefill cannot name another namespace. Only complete prompt blocks: store_first_block >= 0 and
  // store_first_block + size <= prompt_tokens / block size, else the commit is refused (kInvalidArgument).
  // Empty: nothing to store here (a whole prefill stores its own blocks).
  int64_t store_first_block = 0;
  std::vector<uint64_t> store_block_hashes{};
  MSGPACK_DEFINE_MAP(reservation_id, request_id, prompt_tokens, first_token, first_token_unix_ns, ledger,
                     kv_namespace_digest, store_first_block, store_block_hashes);
};

struct PrefillJobReply {
  std::string request_id;
  uint32_t first_token = 0;
  RequestLedger ledger;
  MSGPACK_DEFINE_MAP(request_id, first_token, ledger);
};
// Work for a prefill instance. The reply comes when the job is done (KV committed at decode, new blocks stored);
// on any failure the decode reservation is aborted first and the reply is the error.
struct PrefillJobRequest {
  static constexpr const char* kType = "prefill_job";
  using Reply = PrefillJobReply;
  std::string request_id;
  std::vector<uint32_t> tokens;  // the prompt (traces: synthesized from hash_ids by the submitter)
  int64_t output_length_tokens = 0;
  int64_t fetch_prefix_blocks = -1;  // leading complete blocks to read from the store; -1: as many as present
  std::string prefix_source;         // where the Conductor expects the prefix (segment name; informational)
  std::string decode_endpoint;       // mc-decode RPC endpoint
  uint64_t reservation_id = 0;       // from decode_reserve
  std::vector<uint64_t> decode_block_offsets_bytes;  // from decode_reserve
  std::string decode_kv_segment;  // from decode_reserve (kv_segment); "": the prefill asks decode (worker_load)
  std::string decode_kv_grant{};  // from decode_reserve (kv_grant): carried by every WRITE into decode_kv_segment
  std::string client_endpoint;
  int64_t chunk_tokens = 0;        // 0: the worker's --chunk-tokens
  bool store_new_blocks = true;    // put new complete blocks into the store
  int64_t fail_after_layers = -1;  // fault injection (tests, DESIGN.md §13.14): fail once this many layer
                                   // writes were sent; -1 = never. Refused unless the worker allows it.
  // The request's key scope (block_key.hpp RequestKeyScope; all empty: base model, no salt): the prefill runs
  // the adapter and keys, fetches and stores the blocks in its base namespace with this scope.
  std::string lora_name{};
  std::string lora_version{};
  std::string salt{};
  // Chunked pipeline parallelism (DESIGN.md §18 "Live groups"). stage_layers > 0 makes this job stage stage_index
  // of a group of stage_count prefill instances: it computes the model's layers [stage_first_layer,
  // stage_first_layer + stage_layers) over the prompt's new tokens in chunks of chunk_tokens (the worker's when 0),
  // streams those layers' KV into the decode reservation like a whole prefill, and (all but the last stage) sends
  // each chunk's hidden states to next_stage_endpoint (prefill_stage_hidden). Stage 0 fetches the prefix and fixes
  // how many tokens are cached; the others learn it from its first chunk. Only the last stage commits at decode.
  // stage_layers 0: a whole prefill (the other stage fields are then ignored).
  int64_t stage_first_layer = 0;
  int64_t stage_layers = 0;
  int64_t stage_index = 0;
  int64_t stage_count = 1;
  std::string next_stage_endpoint{};
  bool is_stage() const { return stage_layers > 0; }
  // The job's place in the instance's queue (DESIGN.md §10 "Queue discipline"; mc/common/queue_order.hpp): waiting
  // jobs run in key order, equal keys in arrival order. Nanoseconds on the Conductor's clock, compared only with
  // other keys; in [0, kMaxQueueKeyNs], else the job is refused (kInvalidArgument). 0: no key (an older
  // Conductor, a client): the job joins the back of the queue, as first come, first served.
  int64_t queue_key_ns = 0;
  MSGPACK_DEFINE_MAP(request_id, tokens, output_length_tokens, fetch_prefix_blocks, prefix_source, decode_endpoint,
                     reservation_id, decode_block_offsets_bytes, decode_kv_segment, client_endpoint, chunk_tokens,
                     store_new_blocks, fail_after_layers, lora_name, lora_version, salt, decode_kv_grant,
                     stage_first_layer, stage_layers, stage_index, stage_count, next_stage_endpoint, queue_key_ns);
};

// Stage s -> stage s+1 of a pipelined prefill (DESIGN.md §18 "Live groups"): the hidden states of one chunk after
// stage s's last layer, (token_end - token_begin) rows of hidden_size fp32 values, little-endian, row per token.
// The receiver holds them (bounded: --stage-inbox-bytes) until its stage job of (request_id, reservation_id) asks
// for chunk chunk_index; chunk 0's token_begin is the prompt's cached tokens (stage 0 decided them). A sender
// drains its own KV stream to decode before it sends the last chunk, so when the last stage commits every earlier
// stage's layers have landed. Refused (kInvalidArgument, kResourceExhausted) when malformed or over the bound.
struct PrefillStageHiddenReply {
  bool held = true;
  MSGPACK_DEFINE_MAP(held);
};
struct PrefillStageHiddenRequest {
  static constexpr const char* kType = "prefill_stage_hidden";
  using Reply = PrefillStageHiddenReply;
  std::string request_id;
  uint64_t reservation_id = 0;
  int64_t chunk_index = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  bool last_chunk = false;
  std::vector<uint8_t> hidden;  // msgpack bin: (token_end - token_begin) x hidden_size x 4 bytes
  // Non-empty: stage s failed (this says why; it aborted the decode reservation) and sends no more chunks: the
  // receiver's stage job fails at once instead of waiting out --stage-wait-timeout-ms. hidden is then empty.
  std::string failed{};
  MSGPACK_DEFINE_MAP(request_id, reservation_id, chunk_index, token_begin, token_end, last_chunk, hidden, failed);
};

// Stage s asks stage s+1 where to WRITE one chunk's hidden states through the transfer engine (DESIGN.md §18
// "Live groups" point 2): the fields of PrefillStageHiddenRequest without the bytes, and their size. The receiver,
// when it serves a stage segment (mc-prefill --stage-listen), sets aside `bytes` of it for the chunk (counted
// against --stage-inbox-bytes, like a held chunk) and answers where, with a write grant of that range under the
// cluster's grant key; the sender WRITEs the bytes there tagged StageChunkTag{slot_id}, and the chunk is held as
// if sent by prefill_stage_hidden once that WRITE's notification arrived. kFailedPrecondition: the receiver serves
// no stage segment (send prefill_stage_hidden instead); kResourceExhausted: no room now (retry, bounded by the
// stage's wait); kInvalidArgument: malformed (the checks of prefill_stage_hidden). A slot never written expires
// after 2 x --stage-wait-timeout-ms.
struct PrefillStageSlotReply {
  std::string segment;  // the receiver's stage segment ("host:port")
  uint64_t offset = 0;  // where in it the chunk's `bytes` go
  uint64_t slot_id = 0;
  std::string grant;  // with --auth-dir: the write grant of [offset, +bytes) (grant.hpp); "" without
  MSGPACK_DEFINE_MAP(segment, offset, slot_id, grant);
};
struct PrefillStageSlotRequest {
  static constexpr const char* kType = "prefill_stage_slot";
  using Reply = PrefillStageSlotReply;
  std::string request_id;
  uint64_t reservation_id = 0;
  int64_t chunk_index = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  bool last_chunk = false;
  int64_t bytes = 0;  // (token_end - token_begin) x hidden_size x 4
  MSGPACK_DEFINE_MAP(request_id, reservation_id, chunk_index, token_begin, token_end, last_chunk, bytes);
};
// The notify tag of a stage chunk's WRITE: "stage/<slot_id>". Plain value; pure functions.
struct StageChunkTag {
  uint64_t slot_id = 0;
  std::string encode() const { return "stage/" + std::to_string(slot_id); }
  // nullopt when `tag` is not of the form above.
  static std::optional<StageChunkTag> decode(std::string_view tag) {
    constexpr std::string_view kPrefix = "stage/";
    if (!tag.starts_with(kPrefix)) return std::nullopt;
    StageChunkTag t;
    const char* p = tag.data() + kPrefix.size();
    const char* const end = tag.data() + tag.size();
    auto [next, ec] = std::from_chars(p, end, t.slot_id);
    if (ec != std::errc() || next == p || next != end) return std::nullopt;
    return t;
  }
};

struct WorkerLoadReply {
  std::string role;     // "prefill" | "decode"
  std::string backend;  // "ref" | "sim"
  std::string model;
  int64_t queued_jobs = 0;         // prefill: jobs waiting
  int64_t queued_tokens = 0;       // prefill: prompt tokens waiting
  int64_t running_tokens = 0;      // prefill: tokens of the job in progress; decode: context tokens in the batch
  int64_t predicted_queue_ms = 0;  // prefill: cost-model time of the queue (sim) or measured rate (ref)
  int64_t batch_size = 0;          // decode: running sequences
  int64_t reservations = 0;        // decode: reserved, not yet committed
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;       // physically holding KV
  int64_t kv_blocks_committed = 0;  // decode: promised to running + reserved requests at full length
  int64_t kv_blocks_free = 0;       // total - committed (decode) / total - used (prefill)
  double recent_step_ms = 0;        // decode: mean of the recent steps
  std::string kv_segment;           // decode: transfer-engine segment prefill writes KV into ("" = kv_write only)
  MSGPACK_DEFINE_MAP(role, backend, model, queued_jobs, queued_tokens, running_tokens, predicted_queue_ms, batch_size,
                     reservations, kv_blocks_total, kv_blocks_used, kv_blocks_committed, kv_blocks_free, recent_step_ms,
                     kv_segment);
};
struct WorkerLoadRequest {
  static constexpr const char* kType = "worker_load";
  using Reply = WorkerLoadReply;
  bool detailed = false;  // reserved; no effect yet
  MSGPACK_DEFINE_MAP(detailed);
};

struct ClientAck {
  bool ok = true;
  MSGPACK_DEFINE_MAP(ok);
};
// decode -> client: one output token. index 0 is the first token (produced by prefill).
struct TokenEvent {
  static constexpr const char* kType = "token_event";
  using Reply = ClientAck;
  std::string request_id;
  int64_t index = 0;
  uint32_t token = 0;
  int64_t emitted_unix_ns = 0;
  MSGPACK_DEFINE_MAP(request_id, index, token, emitted_unix_ns);
};
// decode -> client: the request finished (all output_length_tokens generated).
struct RequestDone {
  static constexpr const char* kType = "request_done";
  using Reply = ClientAck;
  std::string request_id;
  RequestLedger ledger;
  MSGPACK_DEFINE_MAP(request_id, ledger);
};
// decode -> client: the request failed (prefill aborted, KV incomplete, decode error). No request_done follows.
struct RequestError {
  static constexpr const char* kType = "request_error";
  using Reply = ClientAck;
  std::string request_id;
  uint16_t code = 0;  // mc::Code
  std::string message;
  int64_t output_tokens = 0;  // tokens sent before the failure
  MSGPACK_DEFINE_MAP(request_id, code, message, output_tokens);
};

// ---------------------------------------------------------------------------------------------
// Conductor (sched/): client submissions, worker registration, heartbeats, job reports
// ---------------------------------------------------------------------------------------------
// (section owned by mc_sched / mc-conductor)
//
// Clients (mc-trace-replay) and workers (mc-prefill, mc-decode) are RpcClients of mc-conductor's one
// ROUTER endpoint. A request's life:
//   client    -> conductor  conductor.submit       the Conductor decides at once; a rejection is the reply
//   conductor -> mc-decode  decode_reserve         (worker section) for the chosen decode instance
//                                                  conductor.submit is answered "accepted" once it holds
//   conductor -> mc-prefill prefill_job            (worker section) prefix plan, decode target, client_endpoint;
//                                                  its reply (job done, ledger) refits the predictors
//   mc-decode -> client     token_event, request_done / request_error   (worker section, to client_endpoint)
//   workers   -> conductor  conductor.register once (again when a heartbeat reply says so),
//                           conductor.heartbeat (load) every heartbeat_interval_ms,
//                           conductor.job_report (optional: first_token / done / failed seen by mc-decode),
//                           conductor.drain on SIGTERM (again after every re-registration while it drains)

// A request (DESIGN.md §3 step 1). The prompt is given by `tokens`; the Conductor keys its complete
// blocks with its own key namespace (block_key.hpp) unless the client sends `block_hashes` (the seq
// hashes of the complete blocks, computed with the same namespace). 0 for an SLO means the
// Conductor's default (--slo-ttft-ms, --slo-tbt-ms).
struct ConductorSubmitReply {
  std::string request_id;
  bool accepted = false;
  std::string prefill_id;        // chosen prefill instance (empty when rejected)
  std::string decode_id;         // chosen decode instance (empty when rejected)
  double predicted_ttft_ms = 0;  // also set when rejected: the best prediction seen
  double predicted_tbt_ms = 0;
  int64_t hit_tokens = 0;  // prefix tokens the prefill will reuse instead of computing
  // The longest prefix of the prompt held anywhere in the pool (complete blocks, tokens) when the
  // request was placed: hit_tokens < pool_prefix_tokens means recomputing part of it was predicted faster.
  int64_t pool_prefix_tokens = 0;
  bool replicate_prefix = false;  // the reused prefix is copied near the prefill instance
  // ttft_slo | tbt_slo | kv_capacity | no_prefill_instance | no_decode_instance | invalid_request |
  // decode_refused (the chosen decode instance refused the reservation); empty when accepted
  std::string reject_reason;
  std::string reason;  // human-readable explanation, names instances and predicted values
  MSGPACK_DEFINE_MAP(request_id, accepted, prefill_id, decode_id, predicted_ttft_ms, predicted_tbt_ms, hit_tokens,
                     pool_prefix_tokens, replicate_prefix, reject_reason, reason);
};
struct ConductorSubmitRequest {
  static constexpr const char* kType = "conductor.submit";
  using Reply = ConductorSubmitReply;
  std::string request_id;              // unique per client run
  int64_t input_tokens = 0;            // prompt length (== tokens.size() when tokens are given)
  int64_t output_tokens = 0;           // tokens to generate, first token included
  std::vector<uint32_t> tokens;        // the prompt
  std::vector<uint64_t> hash_ids;      // trace block ids, kept in the decision log
  std::vector<uint64_t> block_hashes;  // optional precomputed seq hashes of the complete blocks
  int64_t block_size_tokens = 0;       // 0: the Conductor's; otherwise must equal it
  double slo_ttft_ms = 0;
  double slo_tbt_ms = 0;
  std::string client_endpoint;  // where mc-decode sends token events (the client's RpcServer)
  // The request's key scope (block_key.hpp RequestKeyScope): the LoRA adapter it runs with and its tenant
  // salt. All empty: the Conductor's default (--lora, --lora-version, --salt; by default the base model, no
  // salt). The Conductor keys the blocks (block_hashes must then be computed in that scope too), matches the
  // prefix and places by it, and passes it on to the prefill and decode instances.
  std::string lora_name{};
  std::string lora_version{};
  std::string salt{};
  MSGPACK_DEFINE_MAP(request_id, input_tokens, output_tokens, tokens, hash_ids, block_hashes, block_size_tokens,
                     slo_ttft_ms, slo_tbt_ms, client_endpoint, lora_name, lora_version, salt);
};

// The client gave up on a request (an HTTP client that disconnected mid-stream, mc-gateway): the Conductor stops
// whatever of it is still under way and frees what it holds, and answers with the stage it found the request in.
// Only the identity that submitted the request may cancel it (with keys; docs/SECURITY.md). The client gets no
// further token events once the cancel is answered (a late one may still be in flight and is to be ignored).
struct ConductorCancelReply {
  std::string request_id;
  // dispatching (a reservation or a prefill not yet started: nothing runs for it any more) | prefilling (its
  // prefill runs; the decode instance drops it at commit) | decoding (the decode instance stops it and frees its
  // KV) | unknown (finished, failed, or never submitted by this client)
  std::string stage;
  MSGPACK_DEFINE_MAP(request_id, stage);
};
struct ConductorCancelRequest {
  static constexpr const char* kType = "conductor.cancel";
  using Reply = ConductorCancelReply;
  std::string request_id;
  MSGPACK_DEFINE_MAP(request_id);
};

struct ConductorRegisterReply {
  int64_t heartbeat_interval_ms = 0;  // send heartbeats at least this often
  int64_t heartbeat_timeout_ms = 0;   // silent longer than this = dead, removed with its cached blocks
  int64_t block_size_tokens = 0;      // the Conductor's key namespace block size (must match the worker's)
  MSGPACK_DEFINE_MAP(heartbeat_interval_ms, heartbeat_timeout_ms, block_size_tokens);
};
struct ConductorRegisterRequest {
  static constexpr const char* kType = "conductor.register";
  using Reply = ConductorRegisterReply;
  std::string instance_id;         // unique ("prefill-0")
  std::string role;                // prefill | decode
  std::string host;                // host name: same-host pricing with storage segments there
  std::string endpoint;            // the worker's own RPC endpoint (prefill_job / decode_reserve)
  std::string backend_id;          // its KV-event backend id (own GPU prefix cache); empty: instance_id
  int64_t kv_capacity_tokens = 0;  // decode: KV tokens it can reserve (required > 0)
  int64_t block_size_tokens = 0;   // 0: not checked; else must equal the Conductor's
  // The block-key namespace the worker stores KV under (block_key.hpp): its digest (store keys
  // "kv/<digest>/...") and chain seed (KeyNamespace::chain_seed()). Empty digest: not told.
  std::string key_namespace_digest;
  uint64_t key_chain_seed = 0;
  // The fields of that (base) namespace, from which the Conductor derives each request's namespace (its
  // adapter and salt added, block_key.hpp with_request). Checked against key_namespace_digest; a worker that
  // sends none (older) serves only requests of the base scope.
  std::string key_model_id{};
  std::string key_model_revision{};
  std::string key_kv_dtype{};
  std::string key_layout{};
  uint64_t key_seed = 0;
  // prefill: its backend runs pipeline stages (DESIGN.md §18 "Live groups"): only such instances join groups.
  bool runs_pipeline_stages = false;
  MSGPACK_DEFINE_MAP(instance_id, role, host, endpoint, backend_id, kv_capacity_tokens, block_size_tokens,
                     key_namespace_digest, key_chain_seed, key_model_id, key_model_revision, key_kv_dtype, key_layout,
                     key_seed, runs_pipeline_stages);
};

struct ConductorHeartbeatReply {
  bool registered = true;  // false: the Conductor forgot this worker (restart, expiry): register again
  MSGPACK_DEFINE_MAP(registered);
};
// One measured decode step: the batch it ran, the context tokens of that batch (sum over its sequences) and
// its wall time (the worker's ms; the Conductor multiplies by its --time-scale).
struct DecodeStepSample {
  int64_t batch_requests = 0;
  int64_t context_tokens = 0;
  double step_ms = 0;
  MSGPACK_DEFINE_MAP(batch_requests, context_tokens, step_ms);
};
// Most step samples one heartbeat carries (the latest ones; older steps of that interval are only counted).
inline constexpr size_t kMaxDecodeStepSamples = 256;

// Load report. Absent figures are 0, which is right for an idle worker (DESIGN.md §13.12).
struct ConductorHeartbeatRequest {
  static constexpr const char* kType = "conductor.heartbeat";
  using Reply = ConductorHeartbeatReply;
  std::string instance_id;
  int64_t queued_prefill_tokens = 0;  // prefill: tokens of queued or running jobs not yet prefilled
  int64_t queued_prefill_jobs = 0;
  int64_t running_requests = 0;    // decode: requests in the batch
  int64_t kv_reserved_tokens = 0;  // decode: KV tokens promised (input + output of running and reserved)
  int64_t context_tokens = 0;      // decode: sum of the batch's context lengths now
  // decode: steps run since the last heartbeat, and the latest of them (at most kMaxDecodeStepSamples; the
  // Conductor refuses more), each with its own batch and context: the Conductor refits its TBT model from them
  int64_t decode_steps = 0;
  std::vector<DecodeStepSample> decode_step_samples;
  // prefill: the request whose prefix fetch is running now, and for how long (microseconds): a fetch still
  // running bounds its path's bandwidth (DESIGN.md §16 "Bandwidth decides, live"). "" / 0: none.
  std::string fetch_request_id;
  int64_t fetch_elapsed_us = 0;
  MSGPACK_DEFINE_MAP(instance_id, queued_prefill_tokens, queued_prefill_jobs, running_requests, kv_reserved_tokens,
                     context_tokens, decode_steps, decode_step_samples, fetch_request_id, fetch_elapsed_us);
};

// A worker drains (SIGTERM; DESIGN.md §10 "Drain"): the Conductor places nothing new on it from now on but keeps it
// registered (its heartbeats accepted, the requests it holds running to their end), and counts its exit as a drain
// (mc_conductor_instances_drained_total), not a death. Requests it still holds when its process exits are settled as
// for a death (re-dispatched or failed). Sent from the worker's own key (bound to the instance like heartbeats);
// the flag is the Conductor's until the instance leaves, so a worker that re-registers (a Conductor restart) sends it
// again. A separate message rather than a heartbeat field: it is sent at once, not at the next heartbeat, and its
// answer tells the worker that no new placement will come.
struct ConductorDrainReply {
  bool registered = true;  // false: the Conductor does not know this instance (nothing will be placed on it anyway)
  // Requests the Conductor still sees on the instance (dispatching, prefilling or decoding) when the notice arrived.
  int64_t requests_held = 0;
  MSGPACK_DEFINE_MAP(registered, requests_held);
};
struct ConductorDrainRequest {
  static constexpr const char* kType = "conductor.drain";
  using Reply = ConductorDrainReply;
  std::string instance_id;
  MSGPACK_DEFINE_MAP(instance_id);
};

inline constexpr const char* kPhaseFirstToken = "first_token";  // mc-decode sent the first token
inline constexpr const char* kPhaseDone = "done";               // mc-decode sent the last token
inline constexpr const char* kPhaseFailed = "failed";           // the request cannot complete

struct ConductorJobReportReply {
  bool known = true;  // false: the Conductor has no such request in flight (late or duplicate report)
  MSGPACK_DEFINE_MAP(known);
};
// Optional report from a worker on one request: lets the Conductor measure TTFT where it predicted it
// and free its decode ledger entry at once (otherwise it frees it at the predicted end).
struct ConductorJobReportRequest {
  static constexpr const char* kType = "conductor.job_report";
  using Reply = ConductorJobReportReply;
  std::string request_id;
  std::string instance_id;
  std::string phase;          // first_token | done | failed
  int64_t event_unix_ns = 0;  // when it happened (wall clock of the worker)
  int64_t output_tokens = 0;  // done: tokens produced
  std::string message;        // failed: why
  MSGPACK_DEFINE_MAP(request_id, instance_id, phase, event_unix_ns, output_tokens, message);
};

// `mc-conductor stat`: the Conductor's state as one JSON document (instances with load and liveness,
// index size, decisions by kind, predictor state, TTFT prediction error).
struct ConductorStatusReply {
  std::string status_json;
  MSGPACK_DEFINE_MAP(status_json);
};
struct ConductorStatusRequest {
  static constexpr const char* kType = "conductor.status";
  using Reply = ConductorStatusReply;
  bool with_instances = true;
  MSGPACK_DEFINE_MAP(with_instances);
};

// conductor -> store master: hot-prefix replication (DESIGN.md §3 step 2). Sent before the prefill job of
// a decision with replicate_prefix: the master marks each key so that the next read of it by a client on
// `host` (the chosen prefill instance's host) is granted a copy on a DRAM segment there, which that
// reader fills with the bytes it read (store.replica_end; master_core.hpp replicate_near).
struct StoreReplicateNearReply {
  uint32_t marked = 0;  // keys that will be copied (absent keys and keys already on `host` are skipped)
  MSGPACK_DEFINE_MAP(marked);
};
struct StoreReplicateNearRequest {
  static constexpr const char* kType = "store.replicate_near";
  using Reply = StoreReplicateNearReply;
  std::vector<std::string> keys;  // block store keys, at most kStoreMaxBatch
  std::string host;               // host label of the reader that will copy them
  MSGPACK_DEFINE_MAP(keys, host);
};

}  // namespace mc::proto
