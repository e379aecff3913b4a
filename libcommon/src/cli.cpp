#include "mc/common/cli.hpp"

#include <iostream>

#include "mc/common/log.hpp"

#ifndef MC_BUILD_ID
#define MC_BUILD_ID "unknown"
#endif

namespace mc {
const char* build_id_string() { return MC_BUILD_ID; }
}  // namespace mc

namespace mc::cli {

const char* build_id() { return MC_BUILD_ID; }

void add_common_flags(CLI::App& app, const std::string& program) {
  log::set_program(program);
  log::init_from_env();
  app.set_version_flag("--version", std::string(program) + " " + MC_BUILD_ID);
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

int exit_code(const Status& status) {
  switch (status.code()) {
    case Code::kOk: return kExitOk;
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
    case Code::kMalformedMessage: return kExitUsage;
    default: return kExitRuntime;
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
