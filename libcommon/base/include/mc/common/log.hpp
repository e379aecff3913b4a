// Levelled logging to stderr. Data goes to stdout; diagnostics (this) to stderr.
//
// Level from --log-level (set_level) or the MC_LOG_LEVEL environment variable (init_from_env);
// default "info". A line below the level costs one relaxed atomic load: the stream is never built.
// Format: "2026-11-30T16:40:01.123Z I mc-store[1234] master.cpp:88] message".
// Thread-safety: any thread; each line is written with one write(2) so lines never interleave.
#pragma once

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc::log {

enum class Level : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

Result<Level> parse_level(std::string_view name);  // trace|debug|info|warn|error|off
std::string_view level_name(Level level);

void set_level(Level level);
Level level();
// Reads MC_LOG_LEVEL; an invalid value is reported on stderr and ignored (level stays as it was).
void init_from_env();
// Program name printed in every line (defaults to "mc").
void set_program(std::string_view name);

inline std::atomic<int>& level_storage() {
  static std::atomic<int> lvl{static_cast<int>(Level::kInfo)};
  return lvl;
}
inline bool enabled(Level lvl) { return static_cast<int>(lvl) >= level_storage().load(std::memory_order_relaxed); }

// Rate limit for a warning repeated by a peer's behaviour (garbage messages, refused values): true for the n-th
// occurrence (n >= 1) when n <= 10 or n is a multiple of `every`, so a hostile peer cannot flood the log.
inline bool nth_worth_logging(uint64_t n, uint64_t every = 1000) { return n <= 10 || n % every == 0; }

class Line {
 public:
  Line(Level level, const char* file, int line);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  std::ostream& stream() { return os_; }

 private:
  Level level_;
  std::ostringstream os_;
};

}  // namespace mc::log

// A for-loop (not if/else) so that `if (x) MC_LOG_WARN << ...; else ...` parses as written.
#define MC_LOG(lvl)                                                                                       \
  for (bool mc_log_once_ = ::mc::log::enabled(::mc::log::Level::lvl); mc_log_once_; mc_log_once_ = false) \
  ::mc::log::Line(::mc::log::Level::lvl, __FILE__, __LINE__).stream()

#define MC_LOG_TRACE MC_LOG(kTrace)
#define MC_LOG_DEBUG MC_LOG(kDebug)
#define MC_LOG_INFO MC_LOG(kInfo)
#define MC_LOG_WARN MC_LOG(kWarn)
#define MC_LOG_ERROR MC_LOG(kError)
