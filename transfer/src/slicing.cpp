#include "mc/transfer/slicing.hpp"
#include "mc/transfer/types.hpp"

#include <string>

namespace mc::transfer {

Status validate(const SlicePolicy& policy) {
  if (policy.slice_bytes == 0) return Status(Code::kInvalidArgument, "slicing: slice_bytes must be > 0");
  if (policy.align_bytes == 0) return Status(Code::kInvalidArgument, "slicing: align_bytes must be > 0");
  if (policy.min_tail_bytes > policy.slice_bytes) {
    return Status(Code::kInvalidArgument, "slicing: min_tail_bytes (" + std::to_string(policy.min_tail_bytes) +
                                              ") must not exceed slice_bytes (" + std::to_string(policy.slice_bytes) +
                                              ")");
  }
  return Status::ok();
}

namespace detail {
uint64_t effective_slice_bytes(uint64_t length, const SlicePolicy& policy) {
  uint64_t size = policy.slice_bytes;
  if (policy.max_slices > 0) {
    const uint64_t count = length / size + (length % size != 0 ? 1 : 0);
    if (count > policy.max_slices) {
      const uint64_t per = length / policy.max_slices + (length % policy.max_slices != 0 ? 1 : 0);
      const uint64_t a = policy.align_bytes;
      size = per % a == 0 ? per : per + (a - per % a);
    }
  }
  return size;
}
}  // namespace detail

uint64_t slice_count(uint64_t length, const SlicePolicy& policy) {
  if (length == 0) return 0;
  const uint64_t size = detail::effective_slice_bytes(length, policy);
  uint64_t count = length / size + (length % size != 0 ? 1 : 0);
  const uint64_t tail = length - (count - 1) * size;
  if (count > 1 && tail < size && tail < policy.min_tail_bytes) --count;
  return count;
}

std::vector<SliceRange> plan_slices(uint64_t length, const SlicePolicy& policy) {
  std::vector<SliceRange> out;
  out.reserve(static_cast<size_t>(slice_count(length, policy)));
  for_each_slice(length, policy, [&](SliceRange r) { out.push_back(r); });
  return out;
}

const char* op_name(Op op) { return op == Op::kRead ? "read" : "write"; }

const char* state_name(TransferState state) {
  switch (state) {
    case TransferState::kPending:
      return "pending";
    case TransferState::kCompleted:
      return "completed";
    case TransferState::kFailed:
      return "failed";
    case TransferState::kTimeout:
      return "timeout";
  }
  return "unknown";
}

}  // namespace mc::transfer
