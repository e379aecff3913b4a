// The rdma transport (rdma-core ibverbs; internal header). Built when configure finds infiniband/verbs.h
// and libibverbs (MC_HAVE_RDMA); otherwise stub.cpp implements the same functions and every entry point
// answers "rdma transport not built".
//
// Model (Mooncake §5: one-sided RDMA READ/WRITE between registered memory, the NIC closest to the memory)
//  - RdmaDomain (one per engine) opens every RDMA device of the host with an ACTIVE port, one protection
//    domain each, and registers each memory registration of the engine with every device (ibv_reg_mr),
//    split into memory regions of at most the device's max_mr_size. The descriptor publishes, per device,
//    its name, GID and LID, and per descriptor region its virtual address and one rkey per device.
//  - The target side of a queue-pair handshake: a peer sends RdmaConnectRequest over the engine's tcp control
//    port; accept() creates an RC QP on the named device, moves it to RTR/RTS with the initiator's values and
//    returns RdmaConnectReply; the QP lives as long as the returned lease (the server holds it while the
//    handshake's tcp connection stays open).
//  - The initiator side (make_transport): paths are (local device x remote device) pairs chosen from both
//    topology matrices (plan_paths); RC QPs per path are created on first use (up to connections_per_path),
//    reused, evicted when idle, torn down when broken. Each slice is one signalled RDMA READ or WRITE; one
//    thread per opened segment posts work requests and polls the completion queue, calling
//    SliceSink::slice_done per completion. A QP that sees an error completion, or makes no progress for
//    slice_timeout_ms, is moved to the error state: its outstanding work requests flush (each slice fails,
//    the engine retries it on another path) and the QP is destroyed once all of them came back, so a slice
//    is never reported before the NIC is done with its memory. The segment also carries the peer's tcp paths
//    at a tiny weight: they take slices only when every rdma path is quarantined (failover rdma -> tcp).
//
// Errors name the device, port or QP and include ibverbs' text (strerror(errno), ibv_wc_status_str).
// Thread-safety: RdmaDomain is thread-safe; transports follow transport.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/topology.hpp"
#include "mc/transfer/transport.hpp"

namespace mc::transfer::rdma {

inline constexpr const char* kNotBuiltMessage =
    "rdma transport not built (configure did not find infiniband/verbs.h and libibverbs; install "
    "libibverbs-dev and reconfigure)";
inline constexpr const char* kNoDeviceMessage = "no RDMA device: ibv_get_device_list returned 0";

// Weight of the tcp fallback paths an rdma segment carries (relative to rdma paths of weight <= 1): they
// take a slice only when no rdma path is healthy.
inline constexpr double kTcpFallbackWeight = 1e-9;

// True when this build has the rdma transport.
bool built();

// One usable (local device, remote device) pair.
struct DevicePair {
  std::string local_device;  // one of local_devices
  size_t remote_index = 0;   // index into the descriptor's rdma_devices
  double weight = 0;         // local topology weight x remote topology weight
};
// Pure: the paths for memory at `local_location` (ours) and `remote_location` (the peer's first region).
// Each local device is paired with each remote device; pairs are ordered by weight (highest first, then
// name) and, when some local device is preferred for the location, pairs of devices that are neither
// preferred nor fallback on both sides are dropped (they would cross sockets for nothing). Empty when
// either side has no device.
std::vector<DevicePair> plan_paths(const Topology& local, const std::vector<std::string>& local_devices,
                                   const std::string& local_location, const Topology& remote,
                                   const std::vector<std::string>& remote_devices, const std::string& remote_location);

// "fe800000000000000202c9fffe000001" <-> 16 raw bytes; kInvalidArgument for bad text.
std::string gid_to_hex(const uint8_t (&raw)[16]);
Status gid_from_hex(const std::string& hex, uint8_t (&raw)[16]);
// ibv_mtu enum value (1..5) for 256..4096 bytes; 0 for anything else.
int mtu_enum(uint32_t mtu_bytes);

// The message a caller of ibv_get_device_list gives when it finds no device: kNoDeviceMessage when the list
// was empty (`list_is_null` false, n == 0); when the call failed (NULL: no RDMA in the kernel, no
// ib_uverbs, EPROTONOSUPPORT/ENOSYS) "no RDMA device: ibv_get_device_list failed: <strerror(errno_value)>".
std::string no_device_message(bool list_is_null, int errno_value);

// One entry of a port's GID table (ibv_query_gid_ex), with the fields GID selection looks at.
enum class GidType { kIb, kRoceV1, kRoceV2 };
struct GidEntry {
  uint32_t index = 0;
  GidType type = GidType::kIb;
  uint8_t raw[16] = {};
};
// Pure: the GID index a port uses. `override_text` (MC_RDMA_GID_INDEX; empty = unset) must be a decimal
// index present in `entries` with a non-zero GID. Otherwise on InfiniBand (ethernet false) the first
// non-zero IB GID (index 0 in practice); on RoCE (ethernet true) a RoCE v2 GID, preferring an IPv4-mapped
// address (::ffff:a.b.c.d, routable and what RoCE v2 fabrics configure), then a global IPv6 address, then
// a link-local one (fe80::/10, same L2 only). Zero GIDs (empty slots) are never chosen; RoCE v1 entries are
// not used (both ends must use v2). Errors (kNoPath / kInvalidArgument) say what the table held and how
// to choose (MC_RDMA_GID_INDEX, `show_gids`).
Result<uint32_t> choose_gid_index(const std::vector<GidEntry>& entries, bool ethernet, const std::string& override_text,
                                  const std::string& where);

// Pure: checks a peer's half of the QP handshake before any of it reaches ibv_modify_qp. `local_ethernet`:
// this side's link layer (RoCE needs the peer's GID and refuses a peer with a LID, i.e. an InfiniBand port;
// InfiniBand needs a LID or a GID). Checks: qp_num in
// [2, 2^24) (0 and 1 are the special QPs), psn < 2^24, mtu_bytes one of 256..4096, gid 32 hex digits, lid
// < 2^16. kInvalidArgument naming `what` and the field.
Status validate_peer_qp(const proto::RdmaQpInfo& peer, bool local_ethernet, const std::string& what);

// Pure: RDMA READs in flight on one QP (max_rd_atomic of the initiator = max_dest_rd_atomic of the target):
// the smaller of what the initiator offers (its device's max_qp_init_rd_atom) and what the target's device
// accepts (max_qp_rd_atom), at least 1 and at most 255 (the field is 8 bits wide).
uint8_t negotiate_rd_atomic(int64_t initiator_offer, int64_t target_limit);

// Pure: the path MTU (ibv_mtu enum 1..5) both ends use: the smaller of this port's active MTU enum and the
// peer's MTU in bytes; 0 when either is not a valid MTU.
int negotiate_mtu(int local_active_mtu_enum, uint32_t peer_mtu_bytes);

// Pure: memory-region split of a registration [0, length) into chunks of chunk_bytes (clamped to
// [1, max_region_bytes]); (offset, length) pairs, the last one shorter, summing to `length`.
std::vector<std::pair<uint64_t, uint64_t>> split_registration(uint64_t length, uint64_t chunk_bytes,
                                                              uint64_t max_region_bytes);

// Pure: the remedy part of an ibv_reg_mr failure message for errno `err` given RLIMIT_MEMLOCK's soft limit
// (`memlock_limit_bytes`, UINT64_MAX for unlimited): ENOMEM/EPERM point at the pinned-memory limit (ulimit
// -l, systemd LimitMEMLOCK=, docker --ulimit memlock=-1); anything else gets no remedy text.
std::string reg_mr_remedy(int err, uint64_t memlock_limit_bytes);

class RdmaDomain {
 public:
  // Opens every device with an ACTIVE port. Errors: kUnimplemented kNotBuiltMessage (no rdma in this build),
  // kNoPath kNoDeviceMessage (no device, or none with an active port: the message lists them), kIo
  // (ibv_open_device/ibv_alloc_pd failed: device and strerror).
  static Result<std::unique_ptr<RdmaDomain>> open(const EngineOptions& options, const Topology& topology);
  virtual ~RdmaDomain() = default;

  virtual const std::vector<std::string>& devices() const = 0;
  // Largest memory region every device registers (min of max_mr_size); registrations are split by it.
  virtual uint64_t max_region_bytes() const = 0;
  // Registers [addr, addr+length) with every device as memory regions of chunk_bytes (the last one shorter;
  // chunk_bytes <= max_region_bytes(), the same split as the descriptor's regions); kIo naming the device
  // and strerror on failure (nothing stays registered then).
  virtual Status register_memory(char* addr, uint64_t length, uint64_t chunk_bytes) = 0;
  virtual void unregister_memory(char* addr) = 0;
  // Fills rdma_devices, rdma_gids, rdma_lids of `d`.
  virtual void describe_devices(proto::SegmentDescriptor& d) const = 0;
  // Fills rdma_addr and rdma_rkeys of a descriptor region covering local [addr, addr+length), which must lie
  // inside one registration chunk; leaves them empty (and logs) otherwise.
  virtual void describe_region(const char* addr, uint64_t length, proto::RegionDescriptor& r) const = 0;
  // Target side of the QP handshake: packed RdmaConnectRequest in, packed RdmaConnectReply out, with the
  // lease that keeps the QP alive.
  virtual Result<std::pair<std::string, std::shared_ptr<void>>> accept(const std::string& packed_request) = 0;
  // The initiator-side transport ("rdma", rank 10). The domain must outlive it.
  virtual std::unique_ptr<Transport> make_transport(const EngineOptions& options, const Topology& topology) = 0;
};

}  // namespace mc::transfer::rdma
