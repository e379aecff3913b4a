// What every mc tool's main shares: the common flags (--log-level), the MC_* environment fallbacks,
// and the mapping of a Status to the exit codes 0 (ok), 1 (runtime error), 2 (usage / bad input).
//
// Flag beats environment beats default: declare each option once with add_env(), which names the
// MC_* variable in --help.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"

namespace mc::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;

// Adds --log-level (env MC_LOG_LEVEL) and --version to `app`; call before parsing.
void add_common_flags(CLI::App& app, const std::string& program);
// Applies --log-level after parsing (called from a parse callback set up by add_common_flags).

// Adds the block-key namespace flags (--block-size, the seed flag named `seed_flag`, --model, --revision,
// --kv-dtype, --layout, --lora, --lora-version, --salt; env MC_BLOCK_SIZE, MC_HASH_SEED, MC_MODEL, MC_SALT)
// bound to `ns`, which must outlive parsing. One declaration for every tool that computes block keys.
void add_key_namespace_flags(CLI::App& cmd, KeyNamespace& ns, const std::string& seed_flag = "--seed");

// Exit code for a Status: ok -> 0; kInvalidArgument/kOutOfRange/kMalformedMessage -> 2; else 1.
int exit_code(const Status& status);
// Prints "program: error: <message>" on stderr and returns exit_code(status).
int report(const std::string& program, const Status& status);

// Runs CLI11 parsing with mc's exit-code convention (2 for usage errors, 0 for --help).
// Returns -1 when parsing succeeded and the program should continue.
int parse(CLI::App& app, int argc, char** argv);

// Build identification "0.1.0+abc1234".
const char* build_id();

}  // namespace mc::cli
