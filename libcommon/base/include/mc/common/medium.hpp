// Where a KV block lives: the one Medium of mc (DESIGN.md §4, the KV events' `medium`), shared by the store
// (a segment is cpu or disk) and the Conductor's prefix index (an instance's gpu copies too).
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

enum class Medium : uint8_t { kGpu = 0, kCpu = 1, kDisk = 2 };

// "gpu" | "cpu" | "disk": the names the KV events and the store's messages carry.
std::string_view medium_name(Medium medium);
// "gpu", "cpu" (or "dram"), "disk" (or "ssd"); anything else is kInvalidArgument naming it.
Result<Medium> parse_medium(std::string_view name);

}  // namespace mc
