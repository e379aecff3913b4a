#include "mc/store/checksum.hpp"

#include <algorithm>

#include <xxhash.h>

namespace mc::store {

uint64_t object_checksum(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::vector<uint64_t> part_checksums(std::span<const std::byte> bytes, uint64_t part_bytes) {
  std::vector<uint64_t> out;
  if (part_bytes == 0) return out;
  for (uint64_t at = 0; at < bytes.size(); at += part_bytes) {
    out.push_back(object_checksum(bytes.subspan(at, std::min<uint64_t>(part_bytes, bytes.size() - at))));
  }
  return out;
}

bool parts_fit(uint64_t size_bytes, uint64_t part_bytes, size_t count) {
  if (part_bytes < kMinPartBytes || count == 0 || count > kMaxObjectParts) return false;
  return size_bytes / part_bytes + (size_bytes % part_bytes != 0 ? 1 : 0) == count;
}

}  // namespace mc::store
