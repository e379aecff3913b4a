#include "mc/cli/cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string_view>

#include "mc/common/build_id.hpp"
#include "mc/common/location.hpp"
#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/common/units.hpp"

namespace mc::cli {

const char* build_id() { return mc::build_id(); }

void add_common_flags(CLI::App& app, const std::string& program) {
  log::set_program(program);
  log::init_from_env();
  app.set_version_flag("--version", std::string(program) + " " + mc::build_id());
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
  add_block_size_option(cmd, ns.block_size, "--block-size", "Tokens per keyed block (must match the workers)");
  cmd.add_option(seed_flag, ns.seed, "XXH3 seed of the block-key chain")
      ->envname("MC_HASH_SEED")
      ->capture_default_str();
  cmd.add_option("--model", ns.model_id, "Model id of the key namespace (empty: plain RFC chain)")
      ->envname("MC_KEY_MODEL");
  cmd.add_option("--revision", ns.model_revision, "Model revision of the key namespace");
  cmd.add_option("--kv-dtype", ns.kv_dtype, "KV cache dtype of the key namespace (bf16, fp8, ...)");
  cmd.add_option("--layout", ns.layout, "Layer/parallel layout of the key namespace (e.g. tp8)");
  cmd.add_option("--lora", ns.lora_name, "LoRA adapter name of the key namespace");
  cmd.add_option("--lora-version", ns.lora_version, "LoRA adapter version of the key namespace");
  cmd.add_option("--salt", ns.salt, "Tenant salt of the key namespace")->envname("MC_SALT");
}

namespace {
// A finite number above `lo` (or at least `lo` when inclusive), named `name` in --help.
CLI::Validator finite_from(double lo, bool inclusive, const std::string& name) {
  const std::string bound = (inclusive ? ">= " : "> ") + std::to_string(static_cast<int64_t>(lo));
  return CLI::Validator(
      [lo, inclusive, bound](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || !(inclusive ? v >= lo : v > lo))
          return "value " + text + " is not a finite number " + bound;
        return {};
      },
      name);
}
}  // namespace

CLI::Validator finite_in(double lo, double hi) {
  char range[64];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  return CLI::Validator(
      [lo, hi, bound = std::string(range)](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi)
          return "value " + text + " is not a finite number in " + bound;
        return {};
      },
      range);
}

const CLI::Validator kPositiveFinite = finite_from(0, false, "POSITIVE");
const CLI::Validator kNonNegativeFinite = finite_from(0, true, "NONNEGATIVE");

CLI::Option* add_json_flag(CLI::App& cmd, bool& json, const std::string& help) {
  return cmd.add_flag("--json", json, help);
}

namespace {

// A default as --help shows it and the flag takes it back: "256MiB", "1GiB", "1000" (bytes when no binary unit
// divides it exactly).
std::string exact_size_text(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes == 0) return "0";
  std::string unit;
  uint64_t v = bytes;
  for (const char* u : kUnits) {
    if (v % 1024 != 0) break;
    v /= 1024;
    unit = u;
  }
  return std::to_string(v) + unit;
}

}  // namespace

CLI::Option* add_size_option(CLI::App& cmd, const std::string& name, uint64_t& bytes, const std::string& help,
                             uint64_t min_bytes, uint64_t max_bytes) {
  return cmd
      .add_option_function<std::string>(
          name,
          [&bytes, name, min_bytes, max_bytes](const std::string& v) {
            Result<int64_t> r = units::parse_size_bytes(v);
            if (!r.is_ok()) throw CLI::ValidationError(name, r.status().message());
            if (r.value() < 0 || static_cast<uint64_t>(r.value()) < min_bytes ||
                static_cast<uint64_t>(r.value()) > max_bytes)
              throw CLI::ValidationError(
                  name, v + ": want " + std::to_string(min_bytes) + " to " + std::to_string(max_bytes) + " bytes");
            bytes = static_cast<uint64_t>(r.value());
          },
          help)
      ->default_str(exact_size_text(bytes));
}

CLI::Option* add_location_option(CLI::App& cmd, std::string& location, const std::string& help) {
  return cmd
      .add_option_function<std::string>(
          "--location",
          [&location](const std::string& v) {
            Status s = check_memory_location(v);
            if (!s.is_ok()) throw CLI::ValidationError("--location", s.message());
            location = v;
          },
          help)
      ->default_str(location);
}

CLI::Option* add_time_scale_option(CLI::App& cmd, double& time_scale, const std::string& help) {
  return cmd.add_option("--time-scale", time_scale, help)
      ->envname("MC_TIME_SCALE")
      ->capture_default_str()
      ->check(kPositiveFinite);
}

void add_slo_default_flags(CLI::App& cmd, double& ttft_ms, double& tbt_ms, bool zero_defers) {
  const CLI::Validator& check = zero_defers ? kNonNegativeFinite : kPositiveFinite;
  cmd.add_option("--slo-ttft-ms", ttft_ms, "Default TTFT SLO (ms) of requests that set none")
      ->envname("MC_SLO_TTFT_MS")
      ->capture_default_str()
      ->check(check);
  cmd.add_option("--slo-tbt-ms", tbt_ms, "Default TBT SLO (ms) of requests that set none")
      ->envname("MC_SLO_TBT_MS")
      ->capture_default_str()
      ->check(check);
}

void add_slo_override_flags(CLI::App& cmd, std::optional<double>& ttft_ms, std::optional<double>& tbt_ms,
                            const std::string& config) {
  cmd.add_option("--slo-ttft-ms", ttft_ms, "Override: TTFT SLO (ms; default: " + config + ")")->check(kPositiveFinite);
  cmd.add_option("--slo-tbt-ms", tbt_ms, "Override: TBT SLO (ms; default: " + config + ")")->check(kPositiveFinite);
}

void add_slo_list_flags(CLI::App& cmd, const std::string& ttft_flag, std::vector<double>& ttft_ms,
                        const std::string& tbt_flag, std::vector<double>& tbt_ms, const std::string& help_suffix) {
  cmd.add_option(ttft_flag, ttft_ms, "TTFT limits (ms), comma-separated" + help_suffix)
      ->delimiter(',')
      ->allow_extra_args(false)
      ->capture_default_str()
      ->check(kPositiveFinite);
  cmd.add_option(tbt_flag, tbt_ms,
                 "TBT limits (ms; mean of the longest 10 % of a request's gaps), comma-separated" + help_suffix)
      ->delimiter(',')
      ->allow_extra_args(false)
      ->capture_default_str()
      ->check(kPositiveFinite);
}

namespace {

template <typename T>
CLI::Option* add_block_size(CLI::App& cmd, T& tokens, const std::string& name, const std::string& help) {
  return cmd.add_option(name, tokens, help)
      ->envname("MC_BLOCK_SIZE")
      ->capture_default_str()
      ->check(CLI::Range(T{1}, static_cast<T>(kMaxBlockTokens)));
}

}  // namespace

CLI::Option* add_block_size_option(CLI::App& cmd, int64_t& tokens, const std::string& name, const std::string& help) {
  return add_block_size(cmd, tokens, name, help);
}

CLI::Option* add_block_size_option(CLI::App& cmd, uint32_t& tokens, const std::string& name, const std::string& help) {
  return add_block_size(cmd, tokens, name, help);
}

namespace {
const char* const kModelHelp =
    "Model preset (tiny, small, llama3-8b, llama3-70b), a Hugging Face model directory (its config.json) or a JSON "
    "config file";
}  // namespace

CLI::Option* add_model_option(CLI::App& cmd, std::string& model, bool env) {
  CLI::Option* opt = cmd.add_option("--model", model, kModelHelp)->capture_default_str();
  if (env) opt->envname("MC_MODEL");
  return opt;
}

CLI::Option* add_model_option(CLI::App& cmd, std::optional<std::string>& model) {
  return cmd.add_option("--model", model, std::string("Override: ") + kModelHelp);
}

CLI::Option* add_gpu_option(CLI::App& cmd, std::string& gpu) {
  return cmd.add_option("--gpu", gpu, "GPU server preset (a800x8, h800x8)")->envname("MC_GPU")->capture_default_str();
}

void add_xfer_server_flags(CLI::App& cmd, size_t& max_connections, int64_t& idle_timeout_ms) {
  cmd.add_option("--xfer-max-connections", max_connections,
                 "Open connections the transfer port accepts; more are closed at once (lowered to fit ulimit -n)")
      ->envname("MC_XFER_MAX_CONNECTIONS")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  cmd.add_option("--xfer-idle-timeout-ms", idle_timeout_ms,
                 "A transfer connection with no request for this long (ms), or a request or reply not complete this "
                 "long after its header, is closed and frees its slot, however it trickles (rdma ones excepted)")
      ->envname("MC_XFER_IDLE_TIMEOUT_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
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

int report(const std::string& program, const Status& status, bool json) {
  return report(program, mc::report::print_error(json, std::cout, status));
}

namespace {

// CLI11 2.1 reads the MC_* variables of every subcommand, also of those not on the command line, and runs
// their options' callbacks: where two subcommands bind one variable (each `mc-store` verb's --master), a later
// one's variable overwrote the flag given to the chosen one. A subcommand with a parse-complete callback has
// its variables read only when it is itself parsed.
void env_only_for_parsed_subcommands(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name().empty()) continue;  // an option group belongs to its parent
    sub->parse_complete_callback([] {});
    env_only_for_parsed_subcommands(*sub);
  }
}

// CLI11 (2.1) converts an integer with strtoull/strtoll in base 0 and no range check: "--seed -1" became
// 18446744073709551615, a number past 64 bits saturated without a word, and "010" was octal 8. Every option of
// an integer type (CLI11's type names INT and UINT) gets this check before its own checks: an unsigned option
// refuses a negative number, a number past the type's 64 bits is refused naming the limit, and leading blanks and
// zeros are dropped so the digits read as decimal. Hex (0x...) stays allowed; anything else is left to CLI11.
std::string check_integer_text(std::string& text, bool is_unsigned) {
  std::string_view body = text;
  while (!body.empty() && std::isspace(static_cast<unsigned char>(body.front())) != 0) body.remove_prefix(1);
  bool negative = false;
  if (!body.empty() && (body.front() == '-' || body.front() == '+')) {
    negative = body.front() == '-';
    body.remove_prefix(1);
  }
  const bool hex = body.size() > 2 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X');
  std::string_view digits = hex ? body.substr(2) : body;
  if (digits.empty()) return {};
  for (char c : digits) {
    if (hex ? std::isxdigit(static_cast<unsigned char>(c)) == 0 : (c < '0' || c > '9')) return {};
  }
  if (!hex) {
    while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
  }
  if (negative && is_unsigned) {
    if (digits != "0") return "must not be negative, got " + text;
    negative = false;  // "-0" is 0
  }
  // The magnitude against 2^64 - 1 (unsigned), 2^63 - 1 or 2^63 (signed, by sign).
  uint64_t value = 0;
  const uint64_t base = hex ? 16 : 10;
  for (char c : digits) {
    const auto lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto d = static_cast<uint64_t>(lower >= 'a' ? lower - 'a' + 10 : lower - '0');
    if (value > (UINT64_MAX - d) / base) {
      return "is out of range (at most " + std::string(is_unsigned ? "18446744073709551615" : "9223372036854775807") +
             "), got " + text;
    }
    value = value * base + d;
  }
  const uint64_t limit = is_unsigned ? UINT64_MAX : (negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1);
  if (value > limit) {
    return "is out of range (" +
           std::string(is_unsigned ? "at most 18446744073709551615"
                       : negative  ? "at least -9223372036854775808"
                                   : "at most 9223372036854775807") +
           "), got " + text;
  }
  text = std::string(negative ? "-" : "") + (hex ? "0x" : "") + std::string(digits);
  return {};
}

constexpr const char* kIntegerCheck = "mc-integer-range";

void harden_integer_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const bool is_unsigned = type.rfind("UINT", 0) == 0 && (type.size() == 4 || type[4] == ':');
    const bool is_signed = type.rfind("INT", 0) == 0 && (type.size() == 3 || type[3] == ':');
    if (!is_unsigned && !is_signed) continue;
    bool present = true;
    try {
      (void)opt->get_validator(kIntegerCheck);
    } catch (const CLI::OptionNotFound&) {
      present = false;
    }
    if (present) continue;
    // First (transform() puts it before the option's own checks, such as a CLI::Range, which then see the decimal
    // text), and allowed to rewrite the text.
    opt->transform(CLI::Validator([is_unsigned](std::string& text) { return check_integer_text(text, is_unsigned); },
                                  "", kIntegerCheck));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) harden_integer_options(*sub);
}

}  // namespace

namespace {
struct AfterParse {
  int order = 0;
  std::function<int(int, char**)> hook;
};
std::vector<AfterParse>& after_parse_hooks() {
  static std::vector<AfterParse> hooks;
  return hooks;
}
}  // namespace

void add_after_parse(int order, std::function<int(int argc, char** argv)> hook) {
  auto& hooks = after_parse_hooks();
  auto at = std::upper_bound(hooks.begin(), hooks.end(), order, [](int o, const AfterParse& h) { return o < h.order; });
  hooks.insert(at, AfterParse{order, std::move(hook)});
}

bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--json") return true;
  }
  return false;
}

std::string command_path(const CLI::App& cmd) {
  std::string program = cmd.get_name();
  for (const CLI::App* p = cmd.get_parent(); p != nullptr; p = p->get_parent()) program = p->get_name() + " " + program;
  return program;
}

int parse(CLI::App& app, int argc, char** argv) {
  env_only_for_parsed_subcommands(app);
  harden_integer_options(app);
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
    // A script that asked for --json reads the error document on stdout, as for every other error.
    if (json_requested(argc, argv)) {
      std::cout << report::error_json(Status(Code::kInvalidArgument, e.what()))
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    }
    return kExitUsage;
  }
  for (const AfterParse& h : after_parse_hooks()) {
    if (int rc = h.hook(argc, argv); rc >= 0) return rc;
  }
  return -1;
}

}  // namespace mc::cli
