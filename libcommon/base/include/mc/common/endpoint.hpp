// Endpoints: the one parser and printer of the addresses that daemons, tools and transports listen on
// and connect to.
//
// Forms:
//   tcp://HOST:PORT     HOST is an IPv4 address, a name ("node-a", "localhost") or "*" (every address;
//                       meaningful to listen only); PORT is 0-65535, 0 = any free port (listen only).
//   tcp://[IPV6]:PORT   an IPv6 address in brackets ("tcp://[::1]:0"); host holds it without brackets.
//   ipc://PATH          a Unix-domain socket path (ZeroMQ's ipc transport); "ipc:///tmp/mc.sock".
// parse_tcp_endpoint() also takes a bare "HOST:PORT" (the transfer engine's segment names).
//
// Errors: kInvalidArgument whose message quotes the text, says what is wrong and shows the expected form.
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

struct Endpoint {
  enum class Kind { kTcp, kIpc };

  Kind kind = Kind::kTcp;
  std::string host;   // tcp: "127.0.0.1", "::1" (no brackets), "node-a", "*"
  uint16_t port = 0;  // tcp: 0 = any free port
  std::string path;   // ipc: the socket path ("/tmp/mc.sock")

  static Endpoint tcp(std::string host, uint16_t port) { return Endpoint{Kind::kTcp, std::move(host), port, {}}; }
  static Endpoint ipc(std::string path) { return Endpoint{Kind::kIpc, {}, 0, std::move(path)}; }

  bool is_tcp() const { return kind == Kind::kTcp; }
  // "HOST:PORT", IPv6 hosts in brackets ("[::1]:4000"); tcp only.
  std::string host_port() const;
  // The canonical text: "tcp://127.0.0.1:4000", "tcp://[::1]:4000", "ipc:///tmp/mc.sock".
  std::string str() const;

  bool operator==(const Endpoint&) const = default;
};

// Parses "tcp://HOST:PORT", "tcp://[IPV6]:PORT" or "ipc://PATH".
Result<Endpoint> parse_endpoint(std::string_view text);
// Parses a TCP endpoint, "tcp://HOST:PORT" or bare "HOST:PORT"; ipc:// and other schemes are errors.
Result<Endpoint> parse_tcp_endpoint(std::string_view text);

// "HOST:PORT" with IPv6 hosts bracketed ("[::1]:4000").
std::string format_host_port(std::string_view host, uint16_t port);

}  // namespace mc
