#include "mc/net/flags.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "mc/cli/cli.hpp"
#include "mc/common/endpoint.hpp"
#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/coord/etcd.hpp"
#include "mc/coord/etcd_flags.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/metrics_http.hpp"

namespace mc::cli {
namespace {
struct AuthFlags {
  CLI::App* cmd = nullptr;
  std::string dir, name;
  bool allow_unauthenticated = false;
};
std::vector<std::unique_ptr<AuthFlags>>& auth_flags() {
  static std::vector<std::unique_ptr<AuthFlags>> flags;
  return flags;
}

// Loads the key ring of the command that ran; the exit code on failure, -1 when fine.
int apply_auth_flags(int argc, char** argv) {
  for (const auto& f : auth_flags()) {
    if (!f->cmd->parsed() && f->cmd->get_parent() != nullptr) continue;
    auth::set_allow_unauthenticated(f->allow_unauthenticated);
    if (f->dir.empty()) continue;
    Status st = Status::ok();
    Result<std::shared_ptr<const auth::Keyring>> ring = auth::Keyring::load(f->dir, f->name);
    st = ring.is_ok() ? auth::set_process_keyring(ring.value()) : ring.status();
    if (!st.is_ok()) {
      const Status shown = st.with_context("--auth-dir " + f->dir + " --auth-name " + f->name);
      if (json_requested(argc, argv))
        std::cout << report::error_json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      MC_LOG_ERROR << shown.message();
      return kExitUsage;
    }
    MC_LOG_DEBUG << "authenticated as " << ring.value()->self().describe() << " with the keys of " << f->dir;
    // The cluster's etcd certificates (mc-auth init writes DIR/etcd): every etcd client of this process uses TLS.
    // Keys without etcd/ (made before it existed, or not copied) mean plain HTTP to etcd: said when --etcd is given.
    // etcd/ present but unusable is a usage error, never a silent fallback to plain HTTP.
    const std::string etcd_dir = f->dir + "/etcd";
    const etcd::TlsFiles tls = etcd::tls_files_in(etcd_dir);
    struct ::stat etcd_stat {};
    if (::stat(etcd_dir.c_str(), &etcd_stat) != 0 && errno == ENOENT) {
      if (const std::optional<std::string> etcd_endpoints = parsed_etcd_endpoints()) {
        MC_LOG_WARN << "--auth-dir " << f->dir << " has no etcd/ certificates: etcd " << *etcd_endpoints
                    << " is reached over plain HTTP, unauthenticated (make the keys again with mc-auth init, or copy "
                       "etcd/ca.pem, etcd/client.pem and etcd/client.key of the cluster's keys; docs/SECURITY.md "
                       "\"etcd\")";
      }
      continue;
    }
    for (const std::string& file : {tls.ca_file, tls.cert_file, tls.key_file}) {
      if (::access(file.c_str(), R_OK) != 0) {
        MC_LOG_ERROR << "--auth-dir " << f->dir << ": the etcd certificate file " << file << " cannot be read ("
                     << std::strerror(errno)
                     << "): copy etcd/ca.pem, etcd/client.pem and etcd/client.key of the cluster's keys there (never "
                        "ca.key; server.* only to the etcd members; docs/SECURITY.md \"etcd\")";
        return kExitUsage;
      }
    }
    etcd::set_default_tls(tls);
  }
  return -1;
}

}  // namespace

void add_auth_flags(CLI::App& cmd, const std::string& default_name) {
  auto f = std::make_unique<AuthFlags>();
  f->cmd = &cmd;
  f->name = default_name;
  cmd.add_option("--auth-dir", f->dir,
                 "Keys of the cluster (`mc-auth init DIR`): authenticate every connection (empty: none, loopback only)")
      ->envname("MC_AUTH_DIR");
  cmd.add_option("--auth-name", f->name, "Identity in the roster of --auth-dir that this process is")
      ->envname("MC_AUTH_NAME")
      ->capture_default_str();
  cmd.add_flag("--allow-unauthenticated", f->allow_unauthenticated,
               "Without --auth-dir, listen on addresses other than loopback anyway (anyone who reaches them may "
               "call everything)")
      ->envname("MC_ALLOW_UNAUTHENTICATED");
  if (auth_flags().empty()) add_after_parse(kAfterParseAuth, apply_auth_flags);
  auth_flags().push_back(std::move(f));
}

CLI::Option* add_metrics_flags(CLI::App& cmd, std::string& listen) {
  return cmd
      .add_option_function<std::string>(
          "--metrics-listen",
          [&listen](const std::string& v) {
            if (!v.empty()) {
              Result<Endpoint> ep = metrics::parse_listen_address(v);
              if (!ep.is_ok()) throw CLI::ValidationError("--metrics-listen", ep.status().message());
            }
            listen = v;
          },
          "Serve GET /metrics (Prometheus text format) at ADDR:PORT, e.g. 127.0.0.1:9400 or [::1]:0 (port 0: any "
          "free port, printed as metrics= in the ready line); it has no authentication, so an address other than "
          "loopback needs --allow-unauthenticated (default: empty, no metrics endpoint)")
      ->type_name("ADDR:PORT")
      ->envname("MC_METRICS_LISTEN");
}

}  // namespace mc::cli
