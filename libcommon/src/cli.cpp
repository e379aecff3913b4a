#include "mc/common/cli.hpp"

#include <iostream>

#include "mc/common/log.hpp"

namespace mc {
extern const char* const kBuildId;  // generated at build time (cmake/McBuildId.cmake)
const char* build_id_string() { return kBuildId; }
}  // namespace mc

namespace mc::cli {

const char* build_id() { return kBuildId; }

void add_common_flags(CLI::App& app, const std::string& program) {
  log::set_program(program);
  log::init_from_env();
  app.set_version_flag("--version", std::string(program) + " " + kBuildId);
  app.add_option_function<std::string>(
         "--log-level",
         [](const std::string& v) {
           Result<log::Level> lvl = log::parse_level(v);
           if (!lvl.is_ok()) throw CLI::ValidationError("--log-level", lvl.status().message());
           log::set_level(lvl.value());
         },
         "Diagnostics on stderr: trace|debug|info|warn|error|off (default: info)")
      ->envname("MC_LOG_LEVEL");
}

void add_key_namespace_flags(CLI::App& cmd, KeyNamespace& ns, const std::string& seed_flag) {
  cmd.add_option("--block-size", ns.block_size, "Tokens per keyed block (must match the workers)")
      ->envname("MC_BLOCK_SIZE")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24));
  cmd.add_option(seed_flag, ns.seed, "XXH3 seed of the block-key chain")
      ->envname("MC_HASH_SEED")
      ->capture_default_str();
  cmd.add_option("--model", ns.model_id, "Model id of the key namespace (empty: plain RFC chain)")->envname("MC_MODEL");
  cmd.add_option("--revision", ns.model_revision, "Model revision of the key namespace");
  cmd.add_option("--kv-dtype", ns.kv_dtype, "KV cache dtype of the key namespace (bf16, fp8, ...)");
  cmd.add_option("--layout", ns.layout, "Layer/parallel layout of the key namespace (e.g. tp8)");
  cmd.add_option("--lora", ns.lora_name, "LoRA adapter name of the key namespace");
  cmd.add_option("--lora-version", ns.lora_version, "LoRA adapter version of the key namespace");
  cmd.add_option("--salt", ns.salt, "Tenant salt of the key namespace")->envname("MC_SALT");
}

int exit_code(const Status& status) {
  switch (status.code()) {
    case Code::kOk:
      return kExitOk;
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
    case Code::kMalformedMessage:
      return kExitUsage;
    default:
      return kExitRuntime;
  }
}

int report(const std::string& program, const Status& status) {
  if (!status.is_ok()) std::cerr << program << ": error: " << status.message() << '\n';
  return exit_code(status);
}

int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  return -1;
}

}  // namespace mc::cli
