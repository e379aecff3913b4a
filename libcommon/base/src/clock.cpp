#include "mc/common/clock.hpp"

#include <chrono>

namespace mc {

int64_t RealClock::now_ns() const { return steady_ns(); }

RealClock& RealClock::instance() {
  static RealClock clock;
  return clock;
}

void ManualClock::set_ns(int64_t t_ns) {
  int64_t cur = now_ns_.load(std::memory_order_acquire);
  while (t_ns > cur && !now_ns_.compare_exchange_weak(cur, t_ns, std::memory_order_acq_rel)) {
  }
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t steady_us() { return steady_ns() / 1'000; }
int64_t steady_ms() { return steady_ns() / 1'000'000; }

int64_t unix_time_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t unix_time_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace mc
