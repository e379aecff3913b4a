// mc-decode: a decoding instance (admission, layer-wise KV receipt, continuous batching, token streaming).
#include "mc/cli/cli.hpp"
#include "mc/infer/daemons.hpp"
#include "mc/net/flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-decode: decoding instance: reserves KV at admission, receives KV from prefill, continuous "
      "batching, streams tokens to clients"};
  mc::cli::add_common_flags(app, "mc-decode");
  mc::infer::DecodeDaemonConfig config;
  mc::infer::add_decode_flags(app, config);
  mc::cli::add_auth_flags(app, "worker");
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  return mc::cli::report("mc-decode", mc::infer::run_decode_daemon(config));
}
