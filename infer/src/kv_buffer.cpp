#include "mc/infer/kv_buffer.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace mc::infer {

Result<std::unique_ptr<KvBuffer>> KvBuffer::create(KvLayout layout, int64_t num_blocks, KvMemory memory) {
  if (layout.num_layers <= 0 || layout.block_size <= 0 || layout.bytes_per_token_layer <= 0 ||
      layout.bytes_per_token_layer % 2 != 0 || num_blocks <= 0 || num_blocks > (int64_t{1} << 30)) {
    return error(Code::kInvalidArgument,
                 "KV buffer: bad shape (layers " + std::to_string(layout.num_layers) + ", block_size " +
                     std::to_string(layout.block_size) + " tokens, " + std::to_string(layout.bytes_per_token_layer) +
                     " B per token and layer (must be even), " + std::to_string(num_blocks) + " blocks)");
  }
  const int64_t bytes = num_blocks * layout.block_bytes();
  if (bytes / num_blocks != layout.block_bytes()) {
    return error(Code::kInvalidArgument, "KV buffer: size overflows 64 bits");
  }
  if (memory == KvMemory::kShared) {
    auto shared = transfer::allocate_shared_buffer(static_cast<uint64_t>(bytes), "mc-kv");
    if (!shared.is_ok()) {
      return shared.status().with_context("KV buffer of " + std::to_string(bytes) +
                                          " B (lower --kv-blocks, --kv-buffer-size or --kv-bytes-per-token)");
    }
    auto* data = static_cast<std::byte*>(shared->data());
    return std::unique_ptr<KvBuffer>(new KvBuffer(layout, num_blocks, data, std::move(shared.value())));
  }
  // Anonymous mapping: page-aligned, zero-filled lazily (a large buffer costs nothing until used).
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return error(Code::kResourceExhausted, "KV buffer: cannot map " + std::to_string(bytes) +
                                               " B: " + std::strerror(errno) +
                                               "; lower --kv-blocks, --kv-buffer-size or --kv-bytes-per-token");
  }
  return std::unique_ptr<KvBuffer>(new KvBuffer(layout, num_blocks, static_cast<std::byte*>(p), {}));
}

KvBuffer::KvBuffer(KvLayout layout, int64_t num_blocks, std::byte* data, transfer::SharedBuffer shared)
    : layout_(layout),
      num_blocks_(num_blocks),
      data_(data),
      shared_(std::move(shared)),
      allocated_(static_cast<size_t>(num_blocks), false) {
  free_list_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<int32_t>(b));
}

KvBuffer::~KvBuffer() {
  if (shared_.data() == nullptr) munmap(data_, static_cast<size_t>(size_bytes()));
}

int64_t KvBuffer::free_blocks() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(free_list_.size());
}

Result<std::vector<int32_t>> KvBuffer::allocate(int64_t n) {
  std::lock_guard lock(mu_);
  if (n < 0 || n > static_cast<int64_t>(free_list_.size())) {
    return error(Code::kResourceExhausted, "KV buffer: " + std::to_string(n) + " blocks wanted, " +
                                               std::to_string(free_list_.size()) + " of " +
                                               std::to_string(num_blocks_) + " free");
  }
  std::vector<int32_t> out(free_list_.end() - n, free_list_.end());
  free_list_.resize(free_list_.size() - static_cast<size_t>(n));
  for (int32_t b : out) allocated_[static_cast<size_t>(b)] = true;
  return out;
}

void KvBuffer::free(std::span<const int32_t> blocks) {
  std::lock_guard lock(mu_);
  for (int32_t b : blocks) {
    if (b < 0 || b >= num_blocks_ || !allocated_[static_cast<size_t>(b)]) continue;
    allocated_[static_cast<size_t>(b)] = false;
    free_list_.push_back(b);
  }
}

Status KvBuffer::check_block(int32_t block) const {
  if (block < 0 || block >= num_blocks_) {
    return error(Code::kOutOfRange,
                 "KV buffer: block " + std::to_string(block) + " outside [0, " + std::to_string(num_blocks_) + ")");
  }
  return Status::ok();
}

}  // namespace mc::infer
