// Every control-plane message of mc, in one schema header (SYSTEM.md §2).
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

#include <cstdint>
#include <map>
#include <string>
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
// KV events (SYSTEM.md §4, after the open KV-events contract, Mooncake RFC #1527)
// Published on a ZeroMQ PUB socket as three frames:
//   [topic (str, e.g. "kv"), event_id as big-endian u64, msgpack KvEvent]
// event_id increases by exactly 1 per event on one stream; a subscriber that sees a gap resyncs.
// ---------------------------------------------------------------------------------------------

inline constexpr const char* kKvEventStored = "stored";
inline constexpr const char* kKvEventRemoved = "removed";
inline constexpr const char* kKvEventCleared = "cleared";  // every block of backend_id is gone

struct KvEvent {
  std::string type;                  // stored | removed | cleared
  uint64_t event_id = 0;             // same as frame 1
  int64_t ts_unix_ms = 0;
  std::vector<uint64_t> seq_hashes;  // prefix-chained block hashes (block_key.hpp)
  std::string backend_id;            // the holder: storage segment or instance name
  std::string medium;                // gpu | cpu | disk
  MSGPACK_DEFINE_MAP(type, event_id, ts_unix_ms, seq_hashes, backend_id, medium);
};

// ---------------------------------------------------------------------------------------------
// Transfer engine (transfer/): segment descriptors and the peer-to-peer directory
// ---------------------------------------------------------------------------------------------
// (section owned by mc_transfer)

// Format version of SegmentDescriptor; a reader rejects a descriptor whose format_version it does not know.
inline constexpr uint32_t kSegmentDescriptorVersion = 1;

// One registered memory region of a segment. Regions occupy disjoint ranges of the segment's 64-bit
// offset space; peers address bytes as (segment, offset). A registration larger than the per-region
// limit of a transport is published as several regions (field report #10), each covering exactly the
// bytes it says.
struct RegionDescriptor {
  uint64_t segment_offset = 0;    // first byte of the region in the segment's offset space
  uint64_t length_bytes = 0;      // bytes covered; never truncated
  std::string location;           // "cpu:0", "cuda:0"
  std::string shm_path;           // memfd/dev-shm file a same-host peer maps ("/proc/<pid>/fd/<fd>"); "" = none
  uint64_t shm_offset_bytes = 0;  // offset of the region's first byte inside shm_path
  uint64_t rdma_addr = 0;         // virtual address for one-sided RDMA (0 when not registered with a NIC)
  std::vector<uint32_t> rdma_rkeys;  // one rkey per RDMA device, in SegmentDescriptor::rdma_devices order
  MSGPACK_DEFINE_MAP(segment_offset, length_bytes, location, shm_path, shm_offset_bytes, rdma_addr, rdma_rkeys);
};

// What a peer needs to reach a segment: published by its owner, fetched by name from the peer itself
// ("host:port", over the transfer engine's own TCP control op) or from a directory service.
struct SegmentDescriptor {
  uint32_t format_version = 0;         // kSegmentDescriptorVersion
  std::string name;                    // "host:port" of the first endpoint
  std::string host_id;                 // boot id + hostname: equal host_id means shared memory may work
  int32_t pid = 0;                     // owner process (for shm paths and logs)
  std::vector<std::string> endpoints;  // "tcp://ADDR:PORT", one per listen address (one path each)
  std::vector<std::string> rdma_devices;  // "mlx5_0", with GIDs in rdma_gids (same order)
  std::vector<std::string> rdma_gids;
  std::vector<RegionDescriptor> regions;  // sorted by segment_offset, disjoint
  std::string topology_json;           // the owner's topology matrix (topology.hpp), so a peer can pick its side
  MSGPACK_DEFINE_MAP(format_version, name, host_id, pid, endpoints, rdma_devices, rdma_gids, regions,
                     topology_json);
};

// Sent by an initiator to the target of a request that carried a notify tag, after its last byte landed
// (transfer engine's own TCP control op; the target acknowledges it before the request completes).
struct TransferNotification {
  std::string tag;
  std::string from;               // initiator's segment name, "" when it serves none
  uint8_t op = 0;                 // 1 read, 2 write
  uint64_t segment_offset = 0;    // range of the request in the target's segment
  uint64_t length_bytes = 0;
  MSGPACK_DEFINE_MAP(tag, from, op, segment_offset, length_bytes);
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

// ---------------------------------------------------------------------------------------------
// Workers (infer/): prefill and decode instances
// ---------------------------------------------------------------------------------------------
// (section owned by mc_infer)

// ---------------------------------------------------------------------------------------------
// Conductor (sched/): client submissions, worker registration, heartbeats, job reports
// ---------------------------------------------------------------------------------------------
// (section owned by mc_sched / mc-conductor)

}  // namespace mc::proto
