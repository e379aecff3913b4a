// The flag groups of the network layer, beside what they configure (the cli kit's conventions: mc/cli/cli.hpp):
// the key ring and the unauthenticated override (auth.hpp), and the /metrics endpoint (metrics_http.hpp).
// Not thread-safe: declare flags and parse on one thread before starting others.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace mc::cli {

// The authentication flags of a tool that talks to the cluster (docs/SECURITY.md): --auth-dir (MC_AUTH_DIR: the
// keys of `mc-auth init`), --auth-name (MC_AUTH_NAME: the identity this process is, default `default_name`) and
// --allow-unauthenticated (MC_ALLOW_UNAUTHENTICATED: listen beyond loopback without keys). On `cmd` (the app or a
// subcommand); parse() then loads the key ring of the command that ran into the process (auth::set_process_keyring)
// and the cluster's etcd certificates (DIR/etcd) into every etcd client (etcd::set_default_tls) before the tool does
// anything; a bad directory exits 2 naming the file and the remedy.
void add_auth_flags(CLI::App& cmd, const std::string& default_name);

// --metrics-listen ADDR:PORT (env MC_METRICS_LISTEN) stored in `listen`: where the daemon serves GET /metrics,
// its metrics in the Prometheus text format (mc/net/metrics_http.hpp: 127.0.0.1:9400, [::1]:9400,
// localhost:0; port 0 picks a free port, the ready line's metrics= field says which). Empty (the default): no
// metrics endpoint. The endpoint has no authentication: an address other than loopback needs
// --allow-unauthenticated. A malformed address exits 2 at parse time naming the flag. One declaration for every
// daemon (the mains pass `listen` to metrics::start_daemon_exporter through their options).
CLI::Option* add_metrics_flags(CLI::App& cmd, std::string& listen);

}  // namespace mc::cli
