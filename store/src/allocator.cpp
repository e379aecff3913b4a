#include "mc/store/allocator.hpp"

#include <string>

namespace mc::store {

OffsetAllocator::OffsetAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes)
    : capacity_(0), alignment_(alignment_bytes == 0 ? 1 : alignment_bytes) {
  if ((alignment_ & (alignment_ - 1)) != 0) alignment_ = 1;  // not a power of two: byte granularity
  capacity_ = capacity_bytes - capacity_bytes % alignment_;
  if (capacity_ > 0) insert_free(0, capacity_);
}

uint64_t OffsetAllocator::rounded(uint64_t size_bytes) const {
  if (size_bytes > UINT64_MAX - alignment_) return 0;
  return (size_bytes + alignment_ - 1) & ~(alignment_ - 1);
}

void OffsetAllocator::insert_free(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void OffsetAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

Result<uint64_t> OffsetAllocator::allocate(uint64_t size_bytes) {
  if (size_bytes == 0) return Status(Code::kInvalidArgument, "allocation of 0 bytes");
  uint64_t need = rounded(size_bytes);
  if (need == 0 || need > capacity_) {
    return Status(Code::kNoSpace, "allocation of " + std::to_string(size_bytes) +
                                      " bytes exceeds the segment capacity of " + std::to_string(capacity_) + " bytes");
  }
  auto best = free_by_size_.lower_bound({need, 0});
  if (best == free_by_size_.end()) {
    return Status(Code::kNoSpace, "no free range of " + std::to_string(need) + " bytes (free " +
                                      std::to_string(free_bytes()) + " bytes, largest range " +
                                      std::to_string(largest_free_bytes()) + " bytes)");
  }
  uint64_t offset = best->second;
  uint64_t size = best->first;
  erase_free(free_by_offset_.find(offset));
  if (size > need) insert_free(offset + need, size - need);
  allocated_.emplace(offset, need);
  used_ += need;
  return offset;
}

Status OffsetAllocator::allocate_at(uint64_t offset, uint64_t size_bytes) {
  const uint64_t need = rounded(size_bytes);
  if (size_bytes == 0 || need == 0 || offset % alignment_ != 0 || offset > capacity_ || need > capacity_ - offset) {
    return Status(Code::kInvalidArgument, "range [" + std::to_string(offset) + ", +" + std::to_string(size_bytes) +
                                              ") is not an aligned range inside the segment of " +
                                              std::to_string(capacity_) + " bytes");
  }
  auto it = free_by_offset_.upper_bound(offset);
  if (it == free_by_offset_.begin()) {
    return Status(Code::kNoSpace, "range at offset " + std::to_string(offset) + " overlaps an allocated one");
  }
  --it;
  const uint64_t start = it->first, size = it->second;
  if (offset + need > start + size) {
    return Status(Code::kNoSpace, "range at offset " + std::to_string(offset) + " overlaps an allocated one");
  }
  erase_free(it);
  if (offset > start) insert_free(start, offset - start);
  if (start + size > offset + need) insert_free(offset + need, start + size - offset - need);
  allocated_.emplace(offset, need);
  used_ += need;
  return Status::ok();
}

Status OffsetAllocator::free(uint64_t offset) {
  auto a = allocated_.find(offset);
  if (a == allocated_.end()) {
    return Status(Code::kInvalidArgument, "free of offset " + std::to_string(offset) + " that is not allocated");
  }
  uint64_t start = offset;
  uint64_t size = a->second;
  allocated_.erase(a);
  used_ -= size;
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    erase_free(next);
  }
  auto after = free_by_offset_.lower_bound(start);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  insert_free(start, size);
  return Status::ok();
}

uint64_t OffsetAllocator::largest_free_bytes() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

double OffsetAllocator::fragmentation() const {
  uint64_t total = free_bytes();
  if (total == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_bytes()) / static_cast<double>(total);
}

}  // namespace mc::store
