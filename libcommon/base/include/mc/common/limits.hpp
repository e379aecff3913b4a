// Helpers for the bounds every listening port keeps against hostile or broken peers (DESIGN.md §2,
// "Bounds"): a budget for log lines that a peer can trigger, and the connection cap a server can keep
// under the process's file-descriptor limit.
// Thread-safety: LogBudget is not thread-safe (one per thread or under the owner's lock); the functions are.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mc::limits {

// Descriptors kept free for everything else a daemon opens (its ZeroMQ sockets, files, the transfer
// engine) when a server derives its connection cap from RLIMIT_NOFILE.
inline constexpr size_t kReservedFds = 64;

// The connection cap a server can honour: `wanted`, lowered to (soft RLIMIT_NOFILE - kReservedFds), at
// least 1, so that its accepted connections alone never exhaust the process's descriptors.
size_t cap_to_fd_limit(size_t wanted);

// Lets the first event through, then at most one per interval_ms, and counts the ones held back: a
// log line an abuser can trigger (accept failures, refused connections) costs at most one line per
// interval. Times are the caller's monotonic milliseconds.
class LogBudget {
 public:
  explicit LogBudget(int64_t interval_ms) : interval_ms_(interval_ms) {}
  // True when this event may be logged now; the caller then reports take_suppressed() with it.
  bool allow(int64_t now_ms) {
    if (started_ && now_ms < next_ms_) {
      ++suppressed_;
      return false;
    }
    started_ = true;
    next_ms_ = now_ms + interval_ms_;
    return true;
  }
  // Events held back since the last allowed one; resets the count.
  uint64_t take_suppressed() {
    const uint64_t n = suppressed_;
    suppressed_ = 0;
    return n;
  }

 private:
  int64_t interval_ms_;
  int64_t next_ms_ = 0;
  bool started_ = false;
  uint64_t suppressed_ = 0;
};

// Lets `burst` events through per window of window_ms, and counts the ones held back: refusals an abuser triggers
// are each logged while they are few, and summarized once a flood starts, in every window (not only at the start
// of the process). Times are the caller's monotonic milliseconds.
class BurstBudget {
 public:
  BurstBudget(uint32_t burst, int64_t window_ms) : burst_(burst), window_ms_(window_ms) {}
  // True when this event may be logged now; the caller then reports take_suppressed() with it.
  bool allow(int64_t now_ms) {
    if (!started_ || now_ms >= window_start_ms_ + window_ms_) {
      started_ = true;
      window_start_ms_ = now_ms;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++in_window_;
    return true;
  }
  // Events held back since the last allowed one; resets the count.
  uint64_t take_suppressed() {
    const uint64_t n = suppressed_;
    suppressed_ = 0;
    return n;
  }

 private:
  uint32_t burst_;
  int64_t window_ms_;
  int64_t window_start_ms_ = 0;
  uint32_t in_window_ = 0;
  bool started_ = false;
  uint64_t suppressed_ = 0;
};

}  // namespace mc::limits
