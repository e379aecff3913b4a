#include "mc/coord/etcd_flags.hpp"

#include <iostream>
#include <vector>

#include "mc/cli/cli.hpp"
#include "mc/common/report.hpp"
#include "mc/common/status.hpp"

namespace mc::cli {
namespace {

// --etcd and --cluster-id of one (sub)command (add_etcd_flags).
struct EtcdFlags {
  CLI::App* cmd = nullptr;
  const std::string* etcd = nullptr;
  const std::string* cluster_id = nullptr;
  CLI::Option* cluster_option = nullptr;
};
std::vector<EtcdFlags>& etcd_flags() {
  static std::vector<EtcdFlags> flags;
  return flags;
}

bool ran(const CLI::App& cmd) { return cmd.parsed() || cmd.get_parent() == nullptr; }

// A cluster id names a cluster only in etcd: given without --etcd (a forgotten flag or MC_ETCD, or a stray
// MC_CLUSTER_ID) it would be silently ignored and the tool would talk to --master instead. The exit code (2) when
// so, -1 when fine.
int check_etcd_flags(int argc, char** argv) {
  for (const EtcdFlags& f : etcd_flags()) {
    if (!ran(*f.cmd)) continue;
    if (f.cluster_option->count() == 0 || f.cluster_id->empty() || !f.etcd->empty()) continue;
    const Status s(Code::kInvalidArgument,
                   "--cluster-id " + f.cluster_id->substr(0, 80) +
                       " (or MC_CLUSTER_ID) is given without --etcd: a cluster id names a replicated master's cluster "
                       "in etcd. Give --etcd HOST:PORT[,...] (or MC_ETCD) as well, or drop --cluster-id (unset "
                       "MC_CLUSTER_ID)");
    if (json_requested(argc, argv))
      std::cout << report::error_json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    std::cerr << command_path(*f.cmd) << ": error: " << s.message() << '\n';
    return kExitUsage;
  }
  return -1;
}

}  // namespace

void add_etcd_flags(CLI::App& cmd, std::string& etcd, std::string& cluster_id, const std::string& instead) {
  const std::string help =
      instead.empty()
          ? "etcd client endpoints HOST:PORT[,HOST:PORT...]: this master joins the replicated cluster --cluster-id "
            "(one member leads through an etcd lease, the others stand by)"
          : "etcd client endpoints HOST:PORT[,HOST:PORT...] of a replicated store master: the leader of "
            "--cluster-id is followed (" +
                instead + " is then ignored)";
  cmd.add_option("--etcd", etcd, help)->envname("MC_ETCD");
  CLI::Option* id =
      cmd.add_option("--cluster-id", cluster_id,
                     "Name of the replicated store master's cluster in etcd ([A-Za-z0-9._-]; needs --etcd)")
          ->envname("MC_CLUSTER_ID");
  if (etcd_flags().empty()) add_after_parse(kAfterParseEtcd, check_etcd_flags);
  etcd_flags().push_back({&cmd, &etcd, &cluster_id, id});
}

std::optional<std::string> parsed_etcd_endpoints() {
  for (const EtcdFlags& e : etcd_flags()) {
    if (ran(*e.cmd) && !e.etcd->empty()) return *e.etcd;
  }
  return std::nullopt;
}

}  // namespace mc::cli
