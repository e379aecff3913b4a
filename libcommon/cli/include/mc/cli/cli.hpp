// What every mc tool's main shares: the common flags (--log-level), the flag groups several tools take
// (SLOs, byte sizes, model and key namespace, --json), each declared here once
// with its MC_* variable, and the mapping of a Status to the exit codes 0 (ok), 1 (runtime error),
// 2 (usage / bad input). Printed output (tables, run header, the JSON error document) is report.hpp's.
//
// Flag beats environment beats default; CLI11 names the MC_* variable in --help ("(Env:MC_...)").
// Every add_* function binds references that must outlive parsing; a value refused by a check exits
// 2 at parse time with CLI11's message naming the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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

// --json: print one JSON document instead of text; in that mode an error is the document
// {"error": {"code", "message"}} (report.hpp's print_error, or report(program, status, json) below).
CLI::Option* add_json_flag(CLI::App& cmd, bool& json,
                           const std::string& help = "Print one JSON document instead of text");

// A byte-size option: "4096", "64KiB", "1GiB", "1.5MB" (units::parse_size_bytes) stored in `bytes`, which
// holds the default (shown in --help in bytes); values outside [min_bytes, max_bytes] are refused.
CLI::Option* add_size_option(CLI::App& cmd, const std::string& name, uint64_t& bytes, const std::string& help,
                             uint64_t min_bytes = 0, uint64_t max_bytes = INT64_MAX);

// --location: a memory location (location.hpp: cpu:N, or cuda:N in a CUDA build) stored in `location`,
// which holds the default; anything else exits 2 at parse time naming the flag, the value and the remedy.
CLI::Option* add_location_option(CLI::App& cmd, std::string& location, const std::string& help);

// --time-scale (env MC_TIME_SCALE), > 0: how many times faster than the hardware they model the sim-backend
// workers run; one number for the whole cluster, `help` says what this tool does with it.
CLI::Option* add_time_scale_option(CLI::App& cmd, double& time_scale, const std::string& help);

// Checks of a number flag: a finite number > 0 ("POSITIVE" in --help), and >= 0 ("NONNEGATIVE"). CLI11's
// PositiveNumber and NonNegativeNumber let "nan" and "inf" through and name their range with a 309-digit bound.
extern const CLI::Validator kPositiveFinite;
extern const CLI::Validator kNonNegativeFinite;
// A finite number in [lo, hi] ("lo to hi" in the error): CLI11's Range lets "nan" through and calls "abc" out of range.
CLI::Validator finite_in(double lo, double hi);

// The SLO flags, in milliseconds, every value > 0.
// Defaults a daemon applies to requests that set none: --slo-ttft-ms, --slo-tbt-ms (env MC_SLO_TTFT_MS,
// MC_SLO_TBT_MS); the variables hold the defaults. zero_defers: 0 is accepted too (the caller then defers to
// another party's default, as mc-gateway does to the Conductor's).
void add_slo_default_flags(CLI::App& cmd, double& ttft_ms, double& tbt_ms, bool zero_defers = false);
// Overrides of a configuration's SLOs (empty: the configuration's); `config` names it in --help.
void add_slo_override_flags(CLI::App& cmd, std::optional<double>& ttft_ms, std::optional<double>& tbt_ms,
                            const std::string& config);
// Limits of a report's SLO-attainment table, comma-separated ("100,200,300"); the vectors hold the
// defaults. The flag names are the caller's (--slo-ttft-ms, --report-slo-tbt-ms, ...).
void add_slo_list_flags(CLI::App& cmd, const std::string& ttft_flag, std::vector<double>& ttft_ms,
                        const std::string& tbt_flag, std::vector<double>& tbt_ms, const std::string& help_suffix);

// Tokens per KV block (env MC_BLOCK_SIZE), 1 to kMaxBlockTokens: prefill, decode, the store's keys and
// the Conductor must agree. `name` is --block-size, or mc-trace-replay's --block-tokens.
inline constexpr int64_t kMaxBlockTokens = int64_t{1} << 20;
CLI::Option* add_block_size_option(CLI::App& cmd, int64_t& tokens, const std::string& name, const std::string& help);
CLI::Option* add_block_size_option(CLI::App& cmd, uint32_t& tokens, const std::string& name, const std::string& help);

// --model: a model preset (tiny, small, llama3-8b, llama3-70b) or a JSON config file, the model the tool
// runs or prices. With `env` the variable MC_MODEL is its fallback (daemons, mc-plan threshold); the
// overrides of a cluster file take none. (The key namespace's --model, below, is the model id hashed
// into block keys: the same variable with a different meaning, see add_key_namespace_flags.)
CLI::Option* add_model_option(CLI::App& cmd, std::string& model, bool env);
CLI::Option* add_model_option(CLI::App& cmd, std::optional<std::string>& model);
// --gpu: a GPU server preset (a800x8, h800x8), env MC_GPU.
CLI::Option* add_gpu_option(CLI::App& cmd, std::string& gpu);

// The bounds of a served transfer-engine tcp port (transfer::EngineOptions::max_connections_served and
// idle_timeout_served_ms), for every daemon that serves one: --xfer-max-connections (env
// MC_XFER_MAX_CONNECTIONS, >= 1) and --xfer-idle-timeout-ms (env MC_XFER_IDLE_TIMEOUT_MS, >= 1); the
// variables hold the defaults.
void add_xfer_server_flags(CLI::App& cmd, size_t& max_connections, int64_t& idle_timeout_ms);

// Exit code for a Status: ok -> 0; kInvalidArgument/kOutOfRange/kMalformedMessage -> 2; else 1.
int exit_code(const Status& status);
// Prints "program: error: <message>" on stderr and returns exit_code(status).
int report(const std::string& program, const Status& status);
// The same, and in --json mode (`json`) first the error document on stdout (report::print_error), for
// commands whose library prints nothing on failure.
int report(const std::string& program, const Status& status, bool json);

// Runs CLI11 parsing with mc's exit-code convention (2 for usage errors, 0 for --help), then the checks the flag
// groups of other libraries registered with add_after_parse (the key ring of --auth-dir: mc/net/flags.hpp; --etcd
// and --cluster-id: mc/coord/etcd_flags.hpp). Returns -1 when parsing succeeded and the program should continue.
int parse(CLI::App& app, int argc, char** argv);

// A flag group declared outside this kit checks or applies what it parsed once CLI11 has parsed: parse() runs every
// hook in ascending `order` (equal orders in the order added) until one returns an exit code >= 0. A hook that
// refuses its flags prints "PROGRAM: error: ..." itself (and the JSON error document when json_requested) and
// returns kExitUsage; -1 goes on. Not thread-safe: add hooks while declaring flags, before parse().
void add_after_parse(int order, std::function<int(int argc, char** argv)> hook);
// The orders of the hooks mc's libraries add: --cluster-id without --etcd is refused before any key is loaded.
inline constexpr int kAfterParseEtcd = 10;
inline constexpr int kAfterParseAuth = 20;
// Whether the command line asks for --json (an error is then also the JSON document on stdout).
bool json_requested(int argc, char** argv);
// "mc-store master": the (sub)command's name with those of its parents, for "PROGRAM: error: ..." lines.
std::string command_path(const CLI::App& cmd);

// Build identification "0.1.0+abc1234".
const char* build_id();

}  // namespace mc::cli
