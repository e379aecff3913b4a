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

namespace mc::transfer::tcp {

inline constexpr uint32_t kWireMagic = 0x3158434d;  // "MCX1"
inline constexpr uint8_t kWireVersion = 1;
inline constexpr uint32_t kMaxAuxBytes = 16u << 20;  // descriptors, notifications, error messages

// kRdmaConnect: aux = packed proto::RdmaConnectRequest, reply aux = packed proto::RdmaConnectReply; the target
// keeps the queue pair while this connection stays open (rdma/rdma.hpp).
enum class WireOp : uint8_t { kRead = 1, kWrite = 2, kDescribe = 3, kNotify = 4, kPing = 5, kRdmaConnect = 6 };

struct WireRequest {
  uint32_t magic = kWireMagic;
  uint8_t op = 0;
  uint8_t version = kWireVersion;
  uint16_t reserved = 0;
  uint32_t aux_bytes = 0;
  uint32_t reserved2 = 0;
  uint64_t offset = 0;  // segment offset
  uint64_t length = 0;  // bytes to read / payload bytes that follow
};
static_assert(sizeof(WireRequest) == 32);

struct WireReply {
  uint32_t magic = kWireMagic;
  uint16_t code = 0;  // mc::Code; 0 = ok
  uint8_t op = 0;
  uint8_t reserved = 0;
  uint32_t aux_bytes = 0;
  uint32_t reserved2 = 0;
  uint64_t length = 0;  // data bytes that follow (READ)
};
static_assert(sizeof(WireReply) == 24);

}  // namespace mc::transfer::tcp
