#include "mc/common/log.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace mc::log {
namespace {
std::string& program_storage() {
  static std::string name = "mc";
  return name;
}
}  // namespace

Result<Level> parse_level(std::string_view name) {
  if (name == "trace") return Level::kTrace;
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warn" || name == "warning") return Level::kWarn;
  if (name == "error") return Level::kError;
  if (name == "off") return Level::kOff;
  return Status(Code::kInvalidArgument,
                "log level '" + std::string(name) + "' is not one of trace, debug, info, warn, error, off");
}

std::string_view level_name(Level level) {
  switch (level) {
    case Level::kTrace:
      return "trace";
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
    case Level::kOff:
      return "off";
  }
  return "?";
}

void set_level(Level lvl) { level_storage().store(static_cast<int>(lvl), std::memory_order_relaxed); }
Level level() { return static_cast<Level>(level_storage().load(std::memory_order_relaxed)); }

void init_from_env() {
  const char* env = std::getenv("MC_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return;
  Result<Level> lvl = parse_level(env);
  if (!lvl.is_ok()) {
    std::fprintf(stderr, "mc: warning: MC_LOG_LEVEL: %s; keeping '%s'\n", lvl.status().message().c_str(),
                 std::string(level_name(level())).c_str());
    return;
  }
  set_level(lvl.value());
}

void set_program(std::string_view name) { program_storage() = std::string(name); }

Line::Line(Level level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  static const char kLetters[] = "TDIWE-";
  os_ << ts << '.' << static_cast<char>('0' + (ms / 100) % 10) << static_cast<char>('0' + (ms / 10) % 10)
      << static_cast<char>('0' + ms % 10) << "Z " << kLetters[static_cast<int>(level)] << ' ' << program_storage()
      << '[' << ::getpid() << "] " << base << ':' << line << "] ";
}

Line::~Line() {
  // One record is one line: control characters a peer put into a message (a message type, a name, a path) are
  // written escaped (\n, \xNN), so no peer forges a line of its own in the log (issue 51).
  const std::string raw = os_.str();
  std::string s;
  s.reserve(raw.size() + 1);
  for (const char c : raw) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      s.push_back(c);
    } else if (c == '\n') {
      s += "\\n";
    } else if (c == '\r') {
      s += "\\r";
    } else if (c == '\t') {
      s.push_back(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      s += "\\x";
      s.push_back(kHex[u >> 4]);
      s.push_back(kHex[u & 15]);
    }
  }
  s.push_back('\n');
  (void)level_;
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(s.size())) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += n;
  }
}

}  // namespace mc::log
