// The tcp transport: initiator side of the tcp protocol (wire.hpp). Internal header.
#pragma once

#include <memory>

#include "mc/transfer/engine.hpp"
#include "mc/transfer/transport.hpp"

namespace mc::transfer::tcp {

// Paths: every (local address, remote endpoint) pair; connections per path are opened on first use (up to
// options.connections_per_path), reused, closed when idle or broken. Each opened segment runs
// options.tcp_io_threads I/O threads (default one per connection), each with its own epoll set and share of
// every path's connections; runs of contiguous slices stay on one thread and merge into wire ops of up to
// 1 MiB, and a new connection is opened once the least loaded one carries a full wire op, so the target
// serves a path on several threads. On each non-blocking socket slices are pipelined, WRITE payloads are sent with
// sendmsg straight from registered memory (header and payload in one scatter/gather list), READ data is received
// straight into the local buffer. A connection that makes no progress for slice_timeout_ms while it has work
// is declared broken and its slices fail (the engine retries them on another path).
std::unique_ptr<Transport> make_tcp_transport(const EngineOptions& options, const Topology& topology);

}  // namespace mc::transfer::tcp
