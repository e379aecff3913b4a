// The discrete-event core of the cluster simulator: a queue of timed callbacks driving a virtual
// clock (mc::ManualClock), so the scheduler's policy code, which reads an injected mc::Clock, runs
// unchanged in virtual time.
//
// Ordering: events run in (time, insertion sequence) order. Two events at the same nanosecond run in
// the order they were scheduled, so a run is a pure function of its inputs: same trace, same config,
// same seed -> the same event order and byte-identical output (no dependence on addresses, hash
// iteration order or wall time).
// Units: nanoseconds of virtual time (int64; 2^63 ns ~ 292 years).
// Thread-safety: none; one simulation per thread. Callbacks may schedule and cancel events.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mc/common/clock.hpp"

namespace mc::sim {

// Seconds (the cost model's and the trace's unit) to the queue's nanoseconds, rounded to the nearest.
inline int64_t seconds_to_ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

using EventFn = std::function<void()>;
using EventId = uint64_t;

class EventQueue {
 public:
  // `clock` is not owned and must outlive the queue; run() moves it forward to each event's time.
  explicit EventQueue(ManualClock& clock) : clock_(clock) {}

  int64_t now_ns() const { return clock_.now_ns(); }
  const Clock& clock() const { return clock_; }

  // Schedules `fn` at virtual time `at_ns`; a time in the past runs at now (never moves the clock
  // backwards). Returns an id for cancel().
  EventId schedule_at(int64_t at_ns, EventFn fn);
  EventId schedule_after(int64_t delay_ns, EventFn fn) { return schedule_at(now_ns() + delay_ns, std::move(fn)); }
  // Cancels a pending event; false when it already ran, was cancelled or never existed.
  bool cancel(EventId id);

  // Runs the earliest pending event (advancing the clock to its time). False when none is pending.
  bool step();
  // Runs events until none is pending, the next one is later than `until_ns`, or `max_events` ran.
  // Returns the number of events run.
  int64_t run(int64_t until_ns = std::numeric_limits<int64_t>::max(),
              int64_t max_events = std::numeric_limits<int64_t>::max());

  // Events scheduled and not yet run or cancelled.
  size_t pending() const { return heap_.size() - cancelled_.size(); }
  int64_t executed() const { return executed_; }
  // Time of the earliest pending event; nullopt-like max() when none.
  int64_t next_time_ns();

 private:
  struct Entry {
    int64_t at_ns;
    EventId id;  // doubles as the insertion sequence: the tie-breaker
    // Min-heap on (at_ns, id).
    bool operator>(const Entry& o) const { return at_ns != o.at_ns ? at_ns > o.at_ns : id > o.id; }
  };
  void drop_cancelled_top();

  ManualClock& clock_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  // Callbacks by id, stored apart from the heap so heap moves stay cheap.
  std::unordered_map<EventId, EventFn> fns_;
  std::unordered_set<EventId> cancelled_;
  EventId next_id_ = 1;
  int64_t executed_ = 0;
};

}  // namespace mc::sim
