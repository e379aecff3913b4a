// What the files of MasterCore share (master_core.cpp, master_membership.cpp, master_drain.cpp, master_space.cpp,
// master_durable.cpp). Internal to mc_store.
#pragma once

#include <cstdint>
#include <string>

namespace mc::store {

inline constexpr int64_t kNsPerMs = 1'000'000;

// The tenant whose space a pool key lies in: T for "tenant/T/...", else "".
inline std::string key_tenant(const std::string& key) {
  if (key.rfind("tenant/", 0) != 0) return "";
  const size_t end = key.find('/', 7);
  return end == std::string::npos ? "" : key.substr(7, end - 7);
}

}  // namespace mc::store
