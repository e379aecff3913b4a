// The checksum every store object carries (DESIGN.md §8 integrity): XXH3-64 of its bytes, seed 0. The
// writer computes it at put, the master keeps it with the object, and every reader (DRAM or SSD replica)
// and every DRAM -> SSD demotion checks the bytes against it; a mismatch is a miss, never data.
//
// Part checksums (optional, DESIGN.md §18 "A stage reads its layers"): a writer may also cut the object into
// parts of part_bytes (the last one shorter when the size is not a multiple) and send the XXH3-64 of each; the
// master keeps them beside the whole-object checksum, and a reader of a range that starts and ends on part
// boundaries (or at the object's end) reads and checks just those parts. A KV block's parts are its layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mc::store {

uint64_t object_checksum(std::span<const std::byte> bytes);

// At most this many parts per object, each at least kMinPartBytes (a model's layers): the checksums a peer makes the
// master hold (and write to etcd) stay within 1/64 of the object's bytes and 32 KiB.
inline constexpr size_t kMaxObjectParts = 4096;
inline constexpr uint64_t kMinPartBytes = 512;

// The checksums of `bytes` cut into parts of `part_bytes` (> 0), in order.
std::vector<uint64_t> part_checksums(std::span<const std::byte> bytes, uint64_t part_bytes);

// Whether `count` part checksums of `part_bytes` each describe an object of `size_bytes`: part_bytes >=
// kMinPartBytes, count == ceil(size_bytes / part_bytes) and count <= kMaxObjectParts.
bool parts_fit(uint64_t size_bytes, uint64_t part_bytes, size_t count);

}  // namespace mc::store
