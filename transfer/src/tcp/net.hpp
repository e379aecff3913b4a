// Socket helpers shared by the tcp server, the tcp transport and the peer directory (internal header).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mc/common/endpoint.hpp"
#include "mc/common/fd.hpp"
#include "mc/common/status.hpp"
#include "tcp/wire.hpp"

namespace mc::transfer::tcp {

// The shared owned descriptor and endpoint type (libcommon), under the names this code has used.
using mc::Endpoint;
using mc::Fd;

// Resolves host (numeric or name) to a socket address.
Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t* len);

// Binds and listens; returns the socket and the bound port (port 0 picks one).
Result<Fd> listen_on(const Endpoint& hp, uint16_t* bound_port);

// Non-blocking connect started; *in_progress tells whether EPOLLOUT must be awaited. local_address ("" =
// any) binds the source address.
Result<Fd> start_connect(const Endpoint& remote, const std::string& local_address, bool* in_progress);
// Blocking connect bounded by timeout_ms; the returned socket is blocking with SO_RCVTIMEO/SO_SNDTIMEO = io_timeout_ms.
Result<Fd> connect_blocking(const Endpoint& remote, const std::string& local_address, int64_t timeout_ms,
                            int64_t io_timeout_ms);

void tune_data_socket(int fd, int buffer_bytes);

// Blocking full send/recv; kIo/kUnavailable with strerror naming `what` on error or EOF.
Status send_all(int fd, const void* data, size_t n, const std::string& what);
Status recv_all(int fd, void* data, size_t n, const std::string& what);

// One control exchange on an open blocking connection `fd` to `what` ("peer 10.0.0.2:4000").
Result<std::string> control_exchange(int fd, WireOp op, const std::string& aux, const std::string& what);

// Several control requests of one op sent back to back on the open blocking connection `fd`, then their
// replies read in order (the target serves a connection's requests in order). (*replies)[i] is the i-th
// reply: ok, or the peer's error (code and message). Returns how many replies arrived; when the connection
// breaks first, *conn_error says why and the requests from the returned index on have no reply (the peer
// may or may not have served the first of them).
size_t control_pipeline(int fd, WireOp op, const std::vector<std::string>& auxes, std::vector<Status>* replies,
                        Status* conn_error, const std::string& what);

// True when the idle blocking connection `fd` was closed or reset by the peer (or has unexpected bytes):
// a pooled connection to drop before reusing it. Does not block.
bool idle_connection_broken(int fd);

// One control exchange on a fresh blocking connection: request with aux bytes, reply with aux bytes.
// Returns the reply's aux on success; an error reply becomes its Status (code and message from the peer).
Result<std::string> control_call(const std::string& endpoint, const std::string& local_address, WireOp op,
                                 const std::string& aux, int64_t timeout_ms);

}  // namespace mc::transfer::tcp
