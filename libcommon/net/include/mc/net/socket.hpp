// Plain TCP socket helpers: the one socket layer under the transfer engine's tcp transport, server and peer
// directory and the RPC fast path (fast_rpc.hpp). Blocking helpers take their bounds as arguments; errors are
// Status values naming the operation, the address and strerror (kNotFound: a host that does not resolve;
// kUnavailable: refused, reset or closed by the peer; kTimeout: a bound passed; kLocalDeviceDown: the local source
// address or its interface is gone; kIo: a local socket call failed). Thread-safety: functions of their arguments.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "mc/common/endpoint.hpp"
#include "mc/common/fd.hpp"
#include "mc/common/status.hpp"

namespace mc::net {

// Resolves host (numeric or name; "" is the wildcard) to its first stream socket address; *len is its length.
Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t* len);

// Binds (SO_REUSEADDR) and listens; returns the socket and the bound port (port 0 picks one).
Result<Fd> listen_on(const Endpoint& hp, uint16_t* bound_port);

// Non-blocking connect started; *in_progress tells whether EPOLLOUT must be awaited. local_address ("" =
// any) binds the source address.
Result<Fd> start_connect(const Endpoint& remote, const std::string& local_address, bool* in_progress);
// Blocking connect bounded by timeout_ms; the returned socket is blocking with SO_RCVTIMEO/SO_SNDTIMEO = io_timeout_ms
// and TCP_NODELAY.
Result<Fd> connect_blocking(const Endpoint& remote, const std::string& local_address, int64_t timeout_ms,
                            int64_t io_timeout_ms);

// TCP_NODELAY and SO_KEEPALIVE, and both socket buffers of buffer_bytes when > 0.
void tune_data_socket(int fd, int buffer_bytes);

// Blocking full send/recv; kTimeout past the socket's timeouts, kUnavailable with strerror naming `what` on an error
// or EOF.
Status send_all(int fd, const void* data, size_t n, const std::string& what);
Status recv_all(int fd, void* data, size_t n, const std::string& what);

// True when the idle blocking connection `fd` was closed or reset by the peer (or has unexpected bytes):
// a pooled connection to drop before reusing it. Does not block.
bool idle_connection_broken(int fd);

// "host:port" of a socket address (IPv4 or IPv6; ":0" for other families), for log lines.
std::string peer_name(const sockaddr_storage& ss);
// The address alone ("127.0.0.2", "::1"; "" for other families): what per-address connection caps count by.
std::string peer_address(const sockaddr_storage& ss);

}  // namespace mc::net
