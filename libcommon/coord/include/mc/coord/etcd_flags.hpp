// The etcd flag group, beside the etcd client it configures (the cli kit's conventions: mc/cli/cli.hpp).
// Not thread-safe: declare flags and parse on one thread before starting others.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace mc::cli {

// --etcd HOST:PORT[,...] (MC_ETCD) and --cluster-id NAME (MC_CLUSTER_ID): the replicated store master's cluster,
// whose leader is followed through etcd (leader.hpp; DESIGN.md §17). `instead` names the flag they replace ("": the
// store master itself, which joins the cluster). --cluster-id (or MC_CLUSTER_ID) without --etcd is a usage error:
// parse() prints "PROGRAM: error: ..." naming both flags and returns 2.
void add_etcd_flags(CLI::App& cmd, std::string& etcd, std::string& cluster_id, const std::string& instead);

// After parse(): the --etcd endpoints of the command that ran, when it has the etcd flags and they are not empty.
std::optional<std::string> parsed_etcd_endpoints();

}  // namespace mc::cli
