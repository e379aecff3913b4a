// The transfer engine's section of the protocol (transfer/, DESIGN.md §9).
// Wire rules: envelope.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/proto/message.hpp"

namespace mc::proto {

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
  MC_MESSAGE(segment_offset, length_bytes, location, shm_path, shm_offset_bytes, rdma_addr, rdma_rkeys);
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
  MC_MESSAGE(format_version, name, host_id, pid, endpoints, rdma_devices, rdma_gids, regions, topology_json, rdma_lids);
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
  MC_MESSAGE(device, port, qp_num, psn, lid, gid, gid_index, mtu_bytes);
};
struct RdmaConnectReply {
  RdmaQpInfo target;           // the target's QP, device and port
  uint32_t max_rd_atomic = 0;  // RDMA READs the target accepts in flight on this QP
  MC_MESSAGE(target, max_rd_atomic);
};
struct RdmaConnectRequest {
  std::string segment;        // target segment name (for its logs and errors)
  std::string target_device;  // which of the target's rdma_devices the QP is to live on
  RdmaQpInfo initiator;
  uint32_t max_rd_atomic = 0;  // RDMA READs the initiator keeps in flight on this QP
  MC_MESSAGE(segment, target_device, initiator, max_rd_atomic);
};

// Sent by an initiator to the target of a request that carried a notify tag, after its last byte landed
// (transfer engine's own TCP control op; the target acknowledges it before the request completes).
struct TransferNotification {
  std::string tag;
  std::string from;             // initiator's segment name, "" when it serves none
  uint8_t op = 0;               // 1 read, 2 write
  uint64_t segment_offset = 0;  // range of the request in the target's segment
  uint64_t length_bytes = 0;
  std::string grant{};  // the request's grant (mc/net/grant.hpp) where the target enforces grants; "" otherwise
  MC_MESSAGE(tag, from, op, segment_offset, length_bytes, grant);
};

// Directory service (implemented by the store master): publish and look up descriptors by name.
struct PublishSegmentReply {
  uint64_t region_count = 0;  // regions accepted
  MC_MESSAGE(region_count);
};
struct PublishSegmentRequest {
  static constexpr const char* kType = "xfer.publish_segment";
  using Reply = PublishSegmentReply;
  SegmentDescriptor descriptor;
  MC_MESSAGE(descriptor);
};
struct GetSegmentReply {
  SegmentDescriptor descriptor;
  MC_MESSAGE(descriptor);
};
struct GetSegmentRequest {
  static constexpr const char* kType = "xfer.get_segment";
  using Reply = GetSegmentReply;
  std::string name;  // "host:port"
  MC_MESSAGE(name);
};

}  // namespace mc::proto
