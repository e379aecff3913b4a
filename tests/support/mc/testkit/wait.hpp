// Bounded waits for tests: poll a condition until it holds or a deadline passes, instead of sleeping a
// fixed time and hoping the other process got there. A test that waits on a condition states the
// condition, and a slow machine only makes it wait longer (up to the bound), never fail spuriously.
//
// wait_until(done, timeout_ms, poll_ms): calls done() at once, then every poll_ms milliseconds, until it
// returns true (result: true) or timeout_ms milliseconds have passed (result: false, after one last call
// at the deadline, so a condition that became true during the last sleep still counts).
// done() runs on the calling thread; it may do I/O (an RPC, reading /proc) and may take time itself: the
// deadline is on the steady clock and counts that time too.
// Thread-safety: stateless; the caller's predicate decides.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace mc::testkit {

template <typename Done>
bool wait_until(Done&& done, int64_t timeout_ms, int64_t poll_ms = 10) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (done()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(poll_ms), deadline - now));
  }
}

}  // namespace mc::testkit
