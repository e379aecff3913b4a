// The protocol's envelope: the wire format and rules of every control-plane message of mc (DESIGN.md §2, §4),
// and the messages every daemon answers (hello, ping, stat).
//
// Wire format (ZeroMQ, see rpc.hpp): a request or reply is two frames
//   frame 0: header, a msgpack map {"v": protocol version (u32), "type": message type (str), "id": call id (u64)}
//   frame 1: body, a msgpack map of the struct named by "type" (fields by name, see message.hpp)
// A reply carries the request's "id" and the type "<request type>.reply", or "error" with an ErrorReply body.
// Pushed messages (no request) carry id 0. KV events use their own three-frame form (kv_events.hpp).
//
// Rules for every message struct of every section: field names carry units (_ms, _ns, _bytes, _tokens); integers are
// fixed-width; a missing field decodes to its default (so fields can be added compatibly); a field of
// the wrong type fails the whole decode with kMalformedMessage. Every request type declares
// `static constexpr const char* kType` and `using Reply`. Bump kProtocolVersion on any incompatible
// change; peers compare versions on connect (HelloRequest) and in every header.
//
// One header per section, each owned by its area: envelope.hpp (this), kv_events.hpp, transfer.hpp, store.hpp,
// worker.hpp, conductor.hpp; a file includes the sections it uses (protocol.hpp, all of them, is for the round-trip
// tests). Add a round-trip test in tests/common/protocol_test.cpp for every new message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/proto/message.hpp"

namespace mc::proto {

// 2: the workers' messages named by area (decode.*, prefill.*, worker.load, client.*; before: decode_reserve, ...).
inline constexpr uint32_t kProtocolVersion = 2;
// Largest frame a peer accepts; larger frames are dropped with a log line (ZMQ_MAXMSGSIZE).
inline constexpr int64_t kMaxMessageBytes = 64LL << 20;

// ---------------------------------------------------------------------------------------------
// Envelope and common messages (libcommon)
// ---------------------------------------------------------------------------------------------

struct Header {
  uint32_t v = 0;
  std::string type;
  uint64_t id = 0;
  MC_MESSAGE(v, type, id);
};

inline constexpr const char* kErrorType = "error";

// Body of an "error" reply. code is an mc::Code value.
struct ErrorReply {
  uint16_t code = 0;
  std::string message;
  MC_MESSAGE(code, message);
};

struct HelloReply {
  uint32_t protocol_version = 0;
  std::string service;  // "mc-store master", "mc-conductor", ...
  std::string build;    // version+git revision
  MC_MESSAGE(protocol_version, service, build);
};
// Sent by RpcClient::connect before any other call; a version mismatch is answered with an error.
struct HelloRequest {
  static constexpr const char* kType = "hello";
  using Reply = HelloReply;
  uint32_t protocol_version = 0;
  std::string client_name;
  MC_MESSAGE(protocol_version, client_name);
};

struct PingReply {
  int64_t server_unix_ms = 0;
  MC_MESSAGE(server_unix_ms);
};
struct PingRequest {
  static constexpr const char* kType = "ping";
  using Reply = PingReply;
  int64_t client_unix_ms = 0;
  MC_MESSAGE(client_unix_ms);
};

// Every daemon answers "stat" with its metrics registry rendered as JSON (metrics.hpp).
struct StatReply {
  std::string service;
  std::string metrics_json;     // Registry::json()
  std::string prometheus_text;  // Registry::prometheus_text(), only when asked
  MC_MESSAGE(service, metrics_json, prometheus_text);
};
struct StatRequest {
  static constexpr const char* kType = "stat";
  using Reply = StatReply;
  bool with_prometheus_text = false;
  MC_MESSAGE(with_prometheus_text);
};

}  // namespace mc::proto
