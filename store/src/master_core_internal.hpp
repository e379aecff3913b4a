// What the files of MasterCore share (master_core.cpp, master_membership.cpp, master_drain.cpp, master_space.cpp,
// master_durable.cpp). Internal to mc_store.
#pragma once

#include <cstdint>

namespace mc::store {

inline constexpr int64_t kNsPerMs = 1'000'000;

}  // namespace mc::store
