// Memory locations: where a registered buffer lives, as the transfer engine, the topology matrix and the
// segment descriptors name it (DESIGN.md §9): "cpu:N" (host memory on NUMA node N) or "cuda:N" (memory
// of GPU N). A GPU location is served only by a CUDA build (CMake MC_WITH_CUDA, cmake/McDeps.cmake);
// without one it is refused, never served from host memory under a GPU name.
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

// True when this build was configured with CUDA (MC_HAVE_CUDA in cmake/McDeps.cmake).
bool build_has_cuda();

// Ok for "cpu:N", and for "cuda:N" in a CUDA build (N: decimal index). kInvalidArgument naming the value
// otherwise: a malformed location, or a GPU location in a build without CUDA (with the remedy: build with
// CUDA, -DMC_WITH_CUDA=on, or use a host location cpu:N).
Status check_memory_location(std::string_view location);
// The same rule for a build with (`with_cuda`) or without CUDA support.
Status check_memory_location(std::string_view location, bool with_cuda);

}  // namespace mc
