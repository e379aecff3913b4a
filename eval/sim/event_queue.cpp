#include "mc/sim/event_queue.hpp"

#include <algorithm>

namespace mc::sim {

EventId EventQueue::schedule_at(int64_t at_ns, EventFn fn) {
  EventId id = next_id_++;
  heap_.push(Entry{std::max(at_ns, now_ns()), id});
  fns_.emplace(id, std::move(fn));
  return id;
}

bool EventQueue::cancel(EventId id) {
  auto it = fns_.find(id);
  if (it == fns_.end()) return false;
  fns_.erase(it);
  cancelled_.insert(id);
  return true;
}

void EventQueue::drop_cancelled_top() {
  while (!heap_.empty()) {
    auto it = cancelled_.find(heap_.top().id);
    if (it == cancelled_.end()) return;
    cancelled_.erase(it);
    heap_.pop();
  }
}

int64_t EventQueue::next_time_ns() {
  drop_cancelled_top();
  return heap_.empty() ? std::numeric_limits<int64_t>::max() : heap_.top().at_ns;
}

bool EventQueue::step() {
  drop_cancelled_top();
  if (heap_.empty()) return false;
  Entry top = heap_.top();
  heap_.pop();
  auto it = fns_.find(top.id);
  EventFn fn = std::move(it->second);
  fns_.erase(it);
  clock_.set_ns(top.at_ns);
  ++executed_;
  fn();
  return true;
}

int64_t EventQueue::run(int64_t until_ns, int64_t max_events) {
  int64_t n = 0;
  while (n < max_events) {
    drop_cancelled_top();
    if (heap_.empty() || heap_.top().at_ns > until_ns) break;
    step();
    ++n;
  }
  return n;
}

}  // namespace mc::sim
