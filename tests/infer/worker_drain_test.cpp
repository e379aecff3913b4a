// WorkerDrain (infer/include/mc/infer/worker_drain.hpp): the drain state machine both worker daemons run, driven
// turn by turn with an explicit clock.
#include "mc/infer/worker_drain.hpp"

#include <gtest/gtest.h>

namespace mc::infer {
namespace {

constexpr int64_t kS = 1'000'000'000;

TEST(WorkerDrain, NothingHappensWithoutAStopSignal) {
  WorkerDrain d(30);
  for (int64_t t = 0; t < 100 * kS; t += 10 * kS) {
    const WorkerDrain::Turn turn = d.step(t, false, false, true);
    EXPECT_FALSE(turn.started || turn.refuse || turn.end);
  }
  EXPECT_FALSE(d.draining());
  EXPECT_FALSE(d.refusing());
}

TEST(WorkerDrain, RefusesOnceTheConductorAcknowledgesAndEndsAtTheDeadline) {
  WorkerDrain d(30);
  WorkerDrain::Turn t = d.step(5 * kS, true, false, false);
  EXPECT_TRUE(t.started);
  EXPECT_FALSE(t.refuse);  // the Conductor has not taken the notice yet, and 1 s has not passed
  EXPECT_EQ(d.started_ns(), 5 * kS);
  t = d.step(5 * kS + kS / 2, true, false, true);
  EXPECT_FALSE(t.started);
  EXPECT_TRUE(t.refuse);
  t = d.step(5 * kS + kS / 2 + 1, true, false, true);
  EXPECT_FALSE(t.refuse);  // each change is told once
  t = d.step(35 * kS, true, false, true);
  EXPECT_FALSE(t.end);  // exactly at the deadline: not yet
  t = d.step(35 * kS + 1, true, false, true);
  EXPECT_TRUE(t.end);
  EXPECT_FALSE(t.refuse);  // already refusing
  EXPECT_TRUE(d.ended());
  EXPECT_FALSE(d.ended_by_signal());
  EXPECT_EQ(d.ended_ns(), 35 * kS + 1);
  t = d.step(36 * kS, true, false, true);
  EXPECT_FALSE(t.started || t.refuse || t.end);
}

TEST(WorkerDrain, ASilentConductorStillGetsRefusalsAfterOneSecond) {
  WorkerDrain d(30);
  EXPECT_TRUE(d.step(0, true, false, false).started);
  EXPECT_FALSE(d.step(WorkerDrain::kRefuseAfterNs, true, false, false).refuse);
  EXPECT_TRUE(d.step(WorkerDrain::kRefuseAfterNs + 1, true, false, false).refuse);
  EXPECT_TRUE(d.refusing());
  EXPECT_FALSE(d.ended());
}

TEST(WorkerDrain, ASecondSignalEndsAtOnceAndRefusesInTheSameTurn) {
  WorkerDrain d(3600);
  EXPECT_TRUE(d.step(0, true, false, false).started);
  const WorkerDrain::Turn t = d.step(kS / 10, true, true, false);
  EXPECT_TRUE(t.end);
  EXPECT_TRUE(t.refuse);
  EXPECT_TRUE(d.ended_by_signal());
}

TEST(WorkerDrain, AZeroTimeoutEndsAtTheFirstTurnAfterTheStart) {
  WorkerDrain d(0);
  const WorkerDrain::Turn first = d.step(10, true, false, false);
  EXPECT_TRUE(first.started);
  EXPECT_FALSE(first.end);  // no time has passed
  const WorkerDrain::Turn next = d.step(11, true, false, false);
  EXPECT_TRUE(next.end);
  EXPECT_TRUE(next.refuse);
}

}  // namespace
}  // namespace mc::infer
