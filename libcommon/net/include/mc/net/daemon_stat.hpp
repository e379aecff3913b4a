// The client side of every daemon's `stat` (protocol.hpp StatRequest, answered by RpcServer::serve_stat
// from the daemon's metrics::Registry): what `mc-store stat --node` and `mc-xfer stat` print.
// Thread-safety: one call at a time (it owns its RPC client for the call).
#pragma once

#include <ostream>
#include <string>

#include "mc/common/status.hpp"

namespace mc::daemon {

// Asks the daemon at `endpoint` (tcp://HOST:PORT) for its metrics, waiting up to timeout_ms for the
// handshake and for the reply, and prints them on `out`: a table (metric, value) of its counters and
// gauges, histograms as name_count and name_sum rows, then its service name; with `json` one document
// {"service", "endpoint", "metrics": {"counters", "gauges", "histograms"}}. Prints nothing on failure:
// kUnavailable / kTimeout naming the endpoint, kMalformedMessage when the metrics are not JSON.
Status print_stat(const std::string& endpoint, bool json, int timeout_ms, std::ostream& out);

}  // namespace mc::daemon
