// What every mc daemon shares: stop on SIGTERM/SIGINT, and one "ready" line on stdout once it listens,
// which scripts (examples/local-cluster.sh) and e2e tests wait for:
//   ready <service> <endpoint> [<key>=<value> ...]
// e.g. "ready mc-store-master tcp://127.0.0.1:41234 events=tcp://127.0.0.1:41235".
// Thread-safety: install_stop_signals() once from main before starting threads; stop_requested()
// from any thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mc::daemon {

// Installs handlers for SIGTERM and SIGINT that set the stop flag (and ignores SIGPIPE).
void install_stop_signals();
bool stop_requested();
void request_stop();
// Stop signals received (SIGTERM and SIGINT together). Daemons that drain on the first one (mc-prefill,
// mc-decode: DESIGN.md §10 "Drain") stop draining and end what they hold at once on the second.
int stop_signals();
// True from the second stop signal on: the operator does not want to wait for a drain.
inline bool stop_now_requested() { return stop_signals() >= 2; }

// Prints the ready line on stdout and flushes it.
void announce_ready(const std::string& service, const std::string& endpoint,
                    const std::vector<std::pair<std::string, std::string>>& extra = {});

}  // namespace mc::daemon
