// mc-auth: a cluster's keys (docs/SECURITY.md). `init DIR` makes the cluster key pair, the grant key and one key
// pair per role, instance and tenant, and the etcd certificates; `ls DIR` prints the roster.
#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/net/auth.hpp"

int main(int argc, char** argv) {
  CLI::App app{"mc-auth: make and list a cluster's keys (CURVE key pairs, roster, data-plane grant key)"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-auth");

  mc::auth::InitOptions init;
  bool json = false;
  auto* init_cmd = app.add_subcommand(
      "init",
      "Make DIR: cluster key pair, grant key, and key pairs for admin, conductor, master, node, worker, "
      "each --tenant, --worker and --node; DIR/etcd: the CA, server and client certificates for TLS to etcd");
  init_cmd->add_option("dir", init.dir, "Directory to create (secrets are written mode 0600)")->required();
  init_cmd->add_option("--tenant", init.tenants, "A tenant's client identity, repeatable (default: one 'default')");
  init_cmd->add_option("--worker", init.workers, "A prefill/decode instance id with its own key, repeatable");
  init_cmd->add_option("--node", init.nodes, "A storage node with its own key, repeatable");
  init_cmd->add_option("--shared", init.shared,
                       "A shared key namespace every tenant made here opts into (e.g. public), repeatable");
  init_cmd->add_option("--etcd-host", init.etcd_hosts,
                       "An address or DNS name of an etcd member that DIR/etcd/server.pem names besides 127.0.0.1, "
                       "::1 and localhost, repeatable");
  init_cmd->add_flag("--force", init.force, "Replace the keys of an existing DIR");
  mc::cli::add_json_flag(*init_cmd, json, "Print the identities as JSON");

  std::string ls_dir;
  auto* ls_cmd = app.add_subcommand("ls", "Print the roster of DIR (names, roles, tenants, public keys)");
  ls_cmd->add_option("dir", ls_dir, "Directory made by mc-auth init")->required();
  mc::cli::add_json_flag(*ls_cmd, json, "Print the identities as JSON");

  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (init_cmd->parsed()) return mc::cli::report("mc-auth init", mc::auth::run_init_command(init, json, std::cout));
  return mc::cli::report("mc-auth ls", mc::auth::run_ls_command(ls_dir, json, std::cout));
}
