#include "mc/store/allocator.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace mc::store {
namespace {

TEST(OffsetAllocator, AlignsAndRoundsUp) {
  OffsetAllocator a(1000, 64);
  EXPECT_EQ(a.capacity_bytes(), 960u);  // rounded down to the alignment
  auto x = a.allocate(1);
  ASSERT_TRUE(x.is_ok());
  EXPECT_EQ(x.value(), 0u);
  auto y = a.allocate(65);
  ASSERT_TRUE(y.is_ok());
  EXPECT_EQ(y.value(), 64u);
  EXPECT_EQ(a.used_bytes(), 64u + 128u);
  EXPECT_EQ(y.value() % 64, 0u);
}

TEST(OffsetAllocator, RejectsZeroAndOversize) {
  OffsetAllocator a(4096, 64);
  EXPECT_EQ(a.allocate(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a.allocate(4097).status().code(), Code::kNoSpace);
  EXPECT_EQ(a.allocate(UINT64_MAX).status().code(), Code::kNoSpace);
  EXPECT_EQ(a.used_bytes(), 0u);
}

TEST(OffsetAllocator, FreeCoalescesAndReportsFragmentation) {
  OffsetAllocator a(64 * 10, 64);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 10; ++i) offs.push_back(a.allocate(64).value());
  EXPECT_EQ(a.allocate(64).status().code(), Code::kNoSpace);
  EXPECT_DOUBLE_EQ(a.fragmentation(), 0.0);
  // Free every other block: 5 holes of 64 bytes -> largest 64 of 320 free.
  for (int i = 0; i < 10; i += 2) ASSERT_TRUE(a.free(offs[i]).is_ok());
  EXPECT_EQ(a.free_bytes(), 320u);
  EXPECT_EQ(a.largest_free_bytes(), 64u);
  EXPECT_DOUBLE_EQ(a.fragmentation(), 1.0 - 64.0 / 320.0);
  EXPECT_EQ(a.allocate(128).status().code(), Code::kNoSpace);
  // Free the rest: one range again.
  for (int i = 1; i < 10; i += 2) ASSERT_TRUE(a.free(offs[i]).is_ok());
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 640u);
  EXPECT_DOUBLE_EQ(a.fragmentation(), 0.0);
}

TEST(OffsetAllocator, DoubleFreeAndUnknownOffsetAreErrors) {
  OffsetAllocator a(4096, 64);
  uint64_t o = a.allocate(100).value();
  ASSERT_TRUE(a.free(o).is_ok());
  EXPECT_EQ(a.free(o).code(), Code::kInvalidArgument);
  EXPECT_EQ(a.free(12345).code(), Code::kInvalidArgument);
  EXPECT_EQ(a.used_bytes(), 0u);
}

TEST(OffsetAllocator, BestFitPicksSmallestHole) {
  OffsetAllocator a(64 * 8, 64);
  uint64_t b0 = a.allocate(64).value();
  uint64_t b1 = a.allocate(64 * 3).value();
  uint64_t b2 = a.allocate(64).value();
  (void)a.allocate(64).value();
  (void)b2;
  ASSERT_TRUE(a.free(b1).is_ok());  // hole of 192 at 64; tail hole of 128
  ASSERT_TRUE(a.free(b0).is_ok());  // merges: hole of 256 at 0
  auto x = a.allocate(100);         // 128 fits the tail hole exactly
  ASSERT_TRUE(x.is_ok());
  EXPECT_EQ(x.value(), 64u * 6);
}

TEST(OffsetAllocator, RandomisedNeverOverlaps) {
  OffsetAllocator a(1 << 20, 256);
  std::mt19937_64 rng(7);
  std::map<uint64_t, uint64_t> live;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t size = 1 + rng() % 20000;
      auto r = a.allocate(size);
      if (!r.is_ok()) continue;
      uint64_t o = r.value();
      uint64_t end = o + a.rounded(size);
      auto next = live.lower_bound(o);
      if (next != live.end()) {
        ASSERT_LE(end, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->second, o);
      }
      ASSERT_LE(end, a.capacity_bytes());
      live[o] = end;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(a.free(it->first).is_ok());
      live.erase(it);
    }
  }
  uint64_t used = 0;
  for (auto& [o, e] : live) used += e - o;
  EXPECT_EQ(a.used_bytes(), used);
}

}  // namespace
}  // namespace mc::store
