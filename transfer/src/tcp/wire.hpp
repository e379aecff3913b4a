// The transfer engine's own TCP protocol (data and control on one port; internal header).
//
// Every message starts with a fixed little-endian header. Requests (initiator -> target):
//   WireRequest (32 bytes) [aux bytes] [payload: WRITE only, `length` bytes]
// Replies (target -> initiator), in request order on each connection:
//   WireReply (24 bytes) [aux bytes: error message, or descriptor/notification ack] [data: READ only]
// On error the reply carries code != 0, the message in aux and no data; after an error to a WRITE whose
// payload was not consumed, the target closes the connection (the payload length cannot be trusted).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"
#include "mc/proto/transfer.hpp"

namespace mc::transfer::tcp {

inline constexpr uint32_t kWireMagic = 0x3158434d;  // "MCX1"
inline constexpr uint8_t kWireVersion = 1;
inline constexpr uint32_t kMaxAuxBytes = 16u << 20;  // descriptors, notifications, error messages

// kRead/kWrite: aux = the request's grant token (mc/net/grant.hpp), empty when it carries none; a target that
// enforces grants refuses the op (kPermissionDenied) unless the grant covers it, and reads and drops a refused
// WRITE's payload. kNotify: aux = packed proto::TransferNotification, whose `grant` is checked the same way.
// kRdmaConnect: aux = packed proto::RdmaConnectRequest, reply aux = packed proto::RdmaConnectReply; the target
// keeps the queue pair while this connection stays open (rdma/rdma.hpp).
// kRawStream: the raw-TCP baseline of `mc-xfer bench --baseline` between the initiator's host and the target's.
// offset = the chunk size (bytes per send/recv, at most kMaxRawChunkBytes), length = the most bytes to move,
// reserved = kRawTargetSends (the target sends, as for a READ) or kRawTargetReceives (as for a WRITE); aux = a
// grant token when the target enforces grants (any valid grant: no segment memory is touched), reserved2 = the
// stream's span in chunks (0 or 1: one chunk-sized buffer, sent or received into again and again, cache-resident
// like an iperf buffer; N: the stream cycles through N chunks of a buffer of N x chunk bytes, so it touches as much
// memory as the engine's rows do). After an ok reply the connection carries only raw bytes (no headers) until
// `length` bytes moved or the initiator closes it; the target then closes it. Each stream has a buffer of its own (a
// constant is sent); chunk x span above kMaxRawSpanBytes bytes is refused (kInvalidArgument), and so is a stream past
// 256 MiB of such buffers at once, or one whose buffer cannot be allocated (kResourceExhausted). The ok reply
// carries the span served in its reserved2 (a target older than spans replies 0 there).
enum class WireOp : uint8_t {
  kRead = 1,
  kWrite = 2,
  kDescribe = 3,
  kNotify = 4,
  kPing = 5,
  kRdmaConnect = 6,
  kRawStream = 7
};
inline constexpr uint16_t kRawTargetSends = 0;
inline constexpr uint16_t kRawTargetReceives = 1;
inline constexpr uint64_t kMaxRawChunkBytes = 64ull << 20;
inline constexpr uint64_t kMaxRawSpanBytes = 256ull << 20;  // chunk x span chunks of one raw stream

struct WireRequest {
  uint32_t magic = kWireMagic;
  uint8_t op = 0;
  uint8_t version = kWireVersion;
  uint16_t reserved = 0;
  uint32_t aux_bytes = 0;
  uint32_t reserved2 = 0;  // kRawStream: the span in chunks (above); 0 otherwise
  uint64_t offset = 0;     // segment offset
  uint64_t length = 0;     // bytes to read / payload bytes that follow
};
static_assert(sizeof(WireRequest) == 32);

struct WireReply {
  uint32_t magic = kWireMagic;
  uint16_t code = 0;  // mc::Code; 0 = ok
  uint8_t op = 0;
  uint8_t reserved = 0;
  uint32_t aux_bytes = 0;
  uint32_t reserved2 = 0;  // kRawStream's ok reply: the span served (above); 0 otherwise
  uint64_t length = 0;     // data bytes that follow (READ)
};
static_assert(sizeof(WireReply) == 24);

// A header from the first sizeof(H) bytes of `bytes` (as recv'd into the struct); false when there are fewer.
template <typename H>
bool read_header(std::string_view bytes, H* out) {
  if (bytes.size() < sizeof(H)) return false;
  std::memcpy(out, bytes.data(), sizeof(H));
  return true;
}

// What the target checks of a request header before it reads the aux: the error it replies with (and
// closes the connection), ok otherwise. kProtocolMismatch for another magic or version (replied as a
// kPing), kMessageTooLarge for an aux over kMaxAuxBytes. The op and the range are checked after the aux.
inline mc::Status check_request_header(const WireRequest& req) {
  if (req.magic != kWireMagic || req.version != kWireVersion) {
    return mc::Status(
        mc::Code::kProtocolMismatch,
        "bad magic/version: not an mc transfer engine client of wire version " + std::to_string(kWireVersion));
  }
  if (req.aux_bytes > kMaxAuxBytes) {
    return mc::Status(mc::Code::kMessageTooLarge, "aux of " + std::to_string(req.aux_bytes) + " bytes");
  }
  return mc::Status::ok();
}

// What the initiator checks of a reply header before it reads the aux: the magic and the aux bound.
inline bool reply_header_valid(const WireReply& rep) {
  return rep.magic == kWireMagic && rep.aux_bytes <= kMaxAuxBytes;
}

}  // namespace mc::transfer::tcp
