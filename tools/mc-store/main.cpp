// mc-store: the KV store's tool. Subcommands: keys (block keys of token ids).
#include <iostream>

#include "mc/common/cli.hpp"
#include "mc/store/keys_command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"mc-store: the KV-cache store (master, storage nodes, admin and debugging commands)"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-store");

  mc::store::KeysOptions keys;
  auto* keys_cmd = app.add_subcommand(
      "keys", "Read token ids (whitespace-separated) on stdin; print the prefix-chained key of each complete block");
  keys_cmd->add_option("--block-size", keys.ns.block_size, "Tokens per block")
      ->envname("MC_BLOCK_SIZE")->capture_default_str()->check(CLI::Range(1u, 1u << 24));
  keys_cmd->add_option("--seed", keys.ns.seed, "XXH3 seed of the hash chain")
      ->envname("MC_HASH_SEED")->capture_default_str();
  keys_cmd->add_option("--model", keys.ns.model_id, "Model id of the key namespace (empty: plain RFC chain)")
      ->envname("MC_MODEL");
  keys_cmd->add_option("--revision", keys.ns.model_revision, "Model revision of the key namespace");
  keys_cmd->add_option("--kv-dtype", keys.ns.kv_dtype, "KV cache dtype of the key namespace (bf16, fp8, ...)");
  keys_cmd->add_option("--layout", keys.ns.layout, "Layer/parallel layout of the key namespace (e.g. tp8)");
  keys_cmd->add_option("--lora", keys.ns.lora_name, "LoRA adapter name of the key namespace");
  keys_cmd->add_option("--lora-version", keys.ns.lora_version, "LoRA adapter version of the key namespace");
  keys_cmd->add_option("--salt", keys.ns.salt, "Tenant salt of the key namespace")->envname("MC_SALT");
  keys_cmd->add_flag("--store-keys", keys.store_keys, "Print full store keys (kv/<namespace>/<hash>)");

  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (keys_cmd->parsed()) {
    return mc::cli::report("mc-store keys", mc::store::run_keys(std::cin, std::cout, keys));
  }
  return mc::cli::kExitUsage;
}
