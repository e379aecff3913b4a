// Memory locations: where a registered buffer lives, as the transfer engine, the topology matrix and the
// segment descriptors name it (DESIGN.md §9): "cpu:N" (host memory on NUMA node N) or "cuda:N" (memory
// of GPU N). mc has no GPU memory backend yet, so a GPU location is refused in every build, never served
// from host memory under a GPU name.
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

// Ok for "cpu:N" (N: decimal index). kInvalidArgument naming the value otherwise: a malformed location, or
// a GPU location "cuda:N" (no GPU memory backend; the remedy: a host location cpu:N).
Status check_memory_location(std::string_view location);

}  // namespace mc
