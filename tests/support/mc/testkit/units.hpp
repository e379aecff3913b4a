// Quantities the tests write often, one definition for every test file (a program's files may be compiled together
// in one unity batch: CMakeLists.txt MC_UNITY_BUILD).
#pragma once

#include <cstdint>

namespace mc::testkit {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
// Nanoseconds in a millisecond (the injected clocks count nanoseconds).
inline constexpr int64_t kNsPerMs = 1'000'000;

}  // namespace mc::testkit
