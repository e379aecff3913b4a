// Slicing of a request into the units that are sprayed over paths (pure functions, no I/O).
//
// Rules (DESIGN.md §13.8, kvcache-ai/Mooncake#3981): for length L > 0 and slice size S,
//  - without a cap the count is ceil(L / S); every slice is S bytes except the last;
//  - a tail shorter than min_tail_bytes is folded into the previous slice (only the tail: the other
//    slices keep size S), so the last slice is at most S + min_tail_bytes - 1 bytes; min_tail_bytes = 0
//    disables folding;
//  - with max_slices > 0 and ceil(L / S) > max_slices, the size grows to roundup(ceil(L / max_slices),
//    align_bytes) and the count is ceil(L / size) (3 MiB, cap 32, align 64 KiB -> 24 x 128 KiB, not 32);
//  - slices are contiguous, never overlap, never have length 0, and their lengths sum to exactly L;
//  - L = 0 gives no slices (the request completes at once).
// All arithmetic is 64-bit: 4 GiB + 16 KiB + 7 B at 16 KiB is 262,146 slices (DESIGN.md §13.10).
#pragma once

#include <cstdint>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::transfer {

struct SlicePolicy {
  uint64_t slice_bytes = 64 << 10;  // S; the default was chosen by measurement (docs/BENCHMARKS.md)
  uint64_t min_tail_bytes = 0;      // tails shorter than this merge into the previous slice
  uint64_t max_slices = 0;          // 0 = no cap
  uint64_t align_bytes = 1;         // alignment of the grown slice size when the cap applies
};

struct SliceRange {
  uint64_t offset = 0;  // from the start of the request
  uint64_t length = 0;
};

// Checks the policy (slice_bytes > 0, align_bytes > 0); kInvalidArgument naming the field otherwise.
Status validate(const SlicePolicy& policy);

// Number of slices plan_slices would return, without building them.
uint64_t slice_count(uint64_t length, const SlicePolicy& policy);

// The slices of a request of `length` bytes. Precondition: validate(policy) is ok.
std::vector<SliceRange> plan_slices(uint64_t length, const SlicePolicy& policy);

// Calls fn(SliceRange) for each slice in order without materialising the vector.
template <typename Fn>
void for_each_slice(uint64_t length, const SlicePolicy& policy, Fn&& fn);

namespace detail {
// Effective slice size for `length` after the cap rule.
uint64_t effective_slice_bytes(uint64_t length, const SlicePolicy& policy);
}  // namespace detail

template <typename Fn>
void for_each_slice(uint64_t length, const SlicePolicy& policy, Fn&& fn) {
  if (length == 0) return;
  const uint64_t size = detail::effective_slice_bytes(length, policy);
  uint64_t count = length / size + (length % size != 0 ? 1 : 0);
  const uint64_t tail = length - (count - 1) * size;
  const bool fold = count > 1 && tail < size && tail < policy.min_tail_bytes;
  if (fold) --count;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t off = i * size;
    const uint64_t len = (i + 1 == count) ? length - off : size;
    fn(SliceRange{off, len});
  }
}

}  // namespace mc::transfer
