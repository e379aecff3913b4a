// OffsetAllocator: the master's space manager inside one segment (a storage node's DRAM or SSD
// region). Hands out [offset, offset + size) ranges aligned to `alignment_bytes`, best fit, and
// coalesces neighbours on free. The master never touches the bytes; offsets are relative to the
// segment's base, which only the storage node and the transfer engine know.
//
// Units: bytes. Thread-safety: none (the master core serialises all calls).
// Errors: allocate() returns kNoSpace naming the request and the largest free range; free() of a range
// that was not allocated returns kInvalidArgument and changes nothing.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "mc/common/status.hpp"

namespace mc::store {

class OffsetAllocator {
 public:
  // capacity_bytes is rounded down to a multiple of alignment_bytes; alignment must be a power of two.
  OffsetAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes);

  // Reserves size_bytes (rounded up to the alignment); returns the offset. size 0 -> kInvalidArgument.
  Result<uint64_t> allocate(uint64_t size_bytes);
  // Reserves exactly [offset, offset + size_bytes rounded up): a range a storage node re-reports after a
  // master restart. kInvalidArgument for an unaligned or out-of-segment range, kNoSpace when it overlaps
  // an allocated one (nothing changes then).
  Status allocate_at(uint64_t offset, uint64_t size_bytes);
  // Releases the range that allocate() (or allocate_at()) reserved at `offset`.
  Status free(uint64_t offset);

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const { return used_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  uint64_t largest_free_bytes() const;
  uint64_t alignment_bytes() const { return alignment_; }
  size_t allocations() const { return allocated_.size(); }
  size_t free_ranges() const { return free_by_offset_.size(); }
  // External fragmentation: 1 - largest free range / total free bytes (0 when free space is one range
  // or there is none). 0.5 means half of the free space is in pieces smaller than the largest hole.
  double fragmentation() const;
  // Rounded size that allocate(size_bytes) would take.
  uint64_t rounded(uint64_t size_bytes) const;

 private:
  void insert_free(uint64_t offset, uint64_t size);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset)
  std::map<uint64_t, uint64_t> allocated_;                // offset -> rounded size
};

}  // namespace mc::store
