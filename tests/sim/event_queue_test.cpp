#include "mc/sim/event_queue.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mc::sim {
namespace {

TEST(EventQueue, RunsInTimeOrderAndMovesTheClock) {
  ManualClock clock;
  EventQueue q(clock);
  std::vector<std::pair<int, int64_t>> ran;
  q.schedule_at(300, [&] { ran.emplace_back(3, clock.now_ns()); });
  q.schedule_at(100, [&] { ran.emplace_back(1, clock.now_ns()); });
  q.schedule_at(200, [&] { ran.emplace_back(2, clock.now_ns()); });
  EXPECT_EQ(q.pending(), 3u);
  EXPECT_EQ(q.run(), 3);
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[0], std::make_pair(1, int64_t{100}));
  EXPECT_EQ(ran[1], std::make_pair(2, int64_t{200}));
  EXPECT_EQ(ran[2], std::make_pair(3, int64_t{300}));
  EXPECT_EQ(clock.now_ns(), 300);
  EXPECT_EQ(q.pending(), 0u);
}

TEST(EventQueue, EqualTimesRunInSchedulingOrder) {
  ManualClock clock;
  EventQueue q(clock);
  std::string order;
  for (char c : std::string("abcdefghij")) q.schedule_at(50, [&order, c] { order += c; });
  q.run();
  EXPECT_EQ(order, "abcdefghij");
}

TEST(EventQueue, CallbacksScheduleAndPastTimesRunNow) {
  ManualClock clock;
  EventQueue q(clock);
  std::vector<int64_t> at;
  q.schedule_at(1000, [&] {
    at.push_back(clock.now_ns());
    q.schedule_after(500, [&] { at.push_back(clock.now_ns()); });
    q.schedule_at(10, [&] { at.push_back(clock.now_ns()); });  // in the past: runs at now
  });
  q.run();
  EXPECT_EQ(at, (std::vector<int64_t>{1000, 1000, 1500}));
}

TEST(EventQueue, CancelAndRunUntil) {
  ManualClock clock;
  EventQueue q(clock);
  int ran = 0;
  EventId a = q.schedule_at(10, [&] { ran += 1; });
  q.schedule_at(20, [&] { ran += 10; });
  q.schedule_at(30, [&] { ran += 100; });
  EXPECT_TRUE(q.cancel(a));
  EXPECT_FALSE(q.cancel(a));
  EXPECT_EQ(q.pending(), 2u);
  EXPECT_EQ(q.run(25), 1);
  EXPECT_EQ(ran, 10);
  EXPECT_EQ(clock.now_ns(), 20);
  EXPECT_EQ(q.next_time_ns(), 30);
  EXPECT_TRUE(q.step());
  EXPECT_FALSE(q.step());
  EXPECT_EQ(ran, 110);
  EXPECT_EQ(q.executed(), 2);
}

TEST(EventQueue, MaxEventsBoundsARun) {
  ManualClock clock;
  EventQueue q(clock);
  // A self-rescheduling event never drains; max_events bounds the loop.
  std::function<void()> tick = [&] { q.schedule_after(1, tick); };
  q.schedule_at(0, tick);
  EXPECT_EQ(q.run(std::numeric_limits<int64_t>::max(), 1000), 1000);
  EXPECT_EQ(q.pending(), 1u);
}

}  // namespace
}  // namespace mc::sim
