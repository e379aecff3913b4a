// mc-prefill: a prefill instance (prefix fetch, incremental prefill, layer-wise KV streaming, store put).
#include "mc/cli/cli.hpp"
#include "mc/infer/daemons.hpp"
#include "mc/net/flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-prefill: prefill instance: fetches cached prefix KV, prefills the rest, streams KV layer by "
      "layer to a decode instance, stores new blocks"};
  mc::cli::add_common_flags(app, "mc-prefill");
  mc::infer::PrefillDaemonConfig config;
  mc::infer::add_prefill_flags(app, config);
  mc::cli::add_auth_flags(app, "worker");
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  return mc::cli::report("mc-prefill", mc::infer::run_prefill_daemon(config));
}
