// An injectable clock, so policy code (scheduling, eviction, leases, liveness) runs unchanged in real
// time inside the daemons and in virtual time inside the simulator and the unit tests.
//
// Units: nanoseconds since an arbitrary epoch (monotonic). Thread-safety: RealClock is stateless;
// ManualClock's now/advance are atomic, so a test thread may advance while workers read.
#pragma once

#include <atomic>
#include <cstdint>

namespace mc {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time in nanoseconds.
  virtual int64_t now_ns() const = 0;
  int64_t now_ms() const { return now_ns() / 1'000'000; }
  double now_s() const { return static_cast<double>(now_ns()) * 1e-9; }
};

// std::chrono::steady_clock.
class RealClock final : public Clock {
 public:
  int64_t now_ns() const override;
  // A process-wide instance.
  static RealClock& instance();
};

// Time moves only when advanced: deterministic tests and discrete-event simulation.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_ns = 0) : now_ns_(start_ns) {}
  int64_t now_ns() const override { return now_ns_.load(std::memory_order_acquire); }
  void advance_ns(int64_t delta_ns) { now_ns_.fetch_add(delta_ns, std::memory_order_acq_rel); }
  void advance_ms(int64_t delta_ms) { advance_ns(delta_ms * 1'000'000); }
  // Sets the time; never moves backwards (a smaller value is ignored).
  void set_ns(int64_t t_ns);

 private:
  std::atomic<int64_t> now_ns_;
};

// std::chrono::steady_clock read directly (monotonic, arbitrary epoch; the same epoch as RealClock): deadlines and
// intervals in daemon code that takes no injected Clock. Thread-safe.
int64_t steady_ns();
int64_t steady_us();
int64_t steady_ms();

// Wall-clock time since the Unix epoch (for records that must be compared across hosts, such as a
// token's emission time sent to a client on another host). Not monotonic: never use it for intervals.
int64_t unix_time_ms();
int64_t unix_time_ns();

}  // namespace mc
