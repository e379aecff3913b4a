#include "mc/store/checksum.hpp"

#include <xxhash.h>

namespace mc::store {

uint64_t object_checksum(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

}  // namespace mc::store
