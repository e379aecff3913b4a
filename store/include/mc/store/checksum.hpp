// The checksum every store object carries (DESIGN.md §8 integrity): XXH3-64 of its bytes, seed 0. The
// writer computes it at put, the master keeps it with the object, and every reader (DRAM or SSD replica)
// and every DRAM -> SSD demotion checks the bytes against it; a mismatch is a miss, never data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace mc::store {

uint64_t object_checksum(std::span<const std::byte> bytes);

}  // namespace mc::store
