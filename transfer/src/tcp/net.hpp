// The transfer engine's control exchanges over plain TCP (internal header), on the net layer's socket helpers.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mc/common/endpoint.hpp"
#include "mc/common/fd.hpp"
#include "mc/common/status.hpp"
#include "mc/net/socket.hpp"
#include "tcp/wire.hpp"

namespace mc::transfer::tcp {

// The shared owned descriptor and endpoint type (libcommon) and the socket helpers of the net layer
// (mc/net/socket.hpp), under the names this code has used.
using mc::Endpoint;
using mc::Fd;
using mc::net::connect_blocking;
using mc::net::idle_connection_broken;
using mc::net::listen_on;
using mc::net::recv_all;
using mc::net::resolve;
using mc::net::send_all;
using mc::net::start_connect;
using mc::net::tune_data_socket;

// One control exchange on an open blocking connection `fd` to `what` ("peer 10.0.0.2:4000").
Result<std::string> control_exchange(int fd, WireOp op, const std::string& aux, const std::string& what);

// Several control requests of one op sent back to back on the open blocking connection `fd`, then their
// replies read in order (the target serves a connection's requests in order). (*replies)[i] is the i-th
// reply: ok, or the peer's error (code and message). Returns how many replies arrived; when the connection
// breaks first, *conn_error says why and the requests from the returned index on have no reply (the peer
// may or may not have served the first of them).
size_t control_pipeline(int fd, WireOp op, const std::vector<std::string>& auxes, std::vector<Status>* replies,
                        Status* conn_error, const std::string& what);

// One control exchange on a fresh blocking connection: request with aux bytes, reply with aux bytes.
// Returns the reply's aux on success; an error reply becomes its Status (code and message from the peer).
Result<std::string> control_call(const std::string& endpoint, const std::string& local_address, WireOp op,
                                 const std::string& aux, int64_t timeout_ms);

}  // namespace mc::transfer::tcp
