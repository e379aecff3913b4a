// mc::infer::KvBuffer: a paged KV-cache buffer, the memory a prefill or decode instance registers with the
// transfer engine and fills from / spills to the store.
//
// Layout. The buffer holds num_blocks blocks of block_size tokens. A block holds every layer of its tokens:
//   block b                   at offset b · block_bytes                         block_bytes = L · layer_block_bytes
//   layer l of block b        at offset b · block_bytes + l · layer_block_bytes (ONE contiguous range: one transfer)
//   inside a layer block      [K: block_size × token_bytes/2][V: block_size × token_bytes/2]
//   token t of K              at + t · token_bytes/2, then per KV head, head_dim elements
// where token_bytes = bytes_per_token_layer (K and V of one token in one layer). So one layer of one block is one
// contiguous transfer (layer-wise streaming), and one whole block (all layers) is one contiguous store object.
//
// Block allocation is a free list; a sequence owns an ordered block table (token i lives in
// block_table[i / block_size], slot i % block_size).
//
// Ownership: the buffer owns its memory: an anonymous private mapping (KvMemory::kPrivate), or a memfd shared
// buffer (KvMemory::kShared, transfer/shared_buffer.hpp) that a same-host transfer engine peer can map, which a
// decode instance needs so that prefill's layer writes over the shm transport are one memcpy. Both are
// page-aligned and zero-filled on first touch. Thread-safety: allocate/free take a mutex;
// reading and writing bytes of blocks a caller owns needs no lock (disjoint ranges). Errors: kResourceExhausted
// when no blocks are free (naming the counts), kOutOfRange for bad block ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/transfer/shared_buffer.hpp"

namespace mc::infer {

struct KvLayout {
  int64_t num_layers = 1;
  int64_t block_size = 16;            // tokens per block
  int64_t bytes_per_token_layer = 0;  // K+V bytes of one token in one layer (even)

  int64_t layer_block_bytes() const { return block_size * bytes_per_token_layer; }
  int64_t block_bytes() const { return num_layers * layer_block_bytes(); }
  int64_t bytes_per_token() const { return num_layers * bytes_per_token_layer; }
  int64_t blocks_for_tokens(int64_t tokens) const { return tokens <= 0 ? 0 : (tokens + block_size - 1) / block_size; }
};

enum class KvMemory : uint8_t { kPrivate, kShared };

class KvBuffer {
 public:
  // kInvalidArgument for a non-positive shape or an odd bytes_per_token_layer; kResourceExhausted when the
  // memory cannot be allocated (naming the size).
  static Result<std::unique_ptr<KvBuffer>> create(KvLayout layout, int64_t num_blocks,
                                                  KvMemory memory = KvMemory::kPrivate);
  ~KvBuffer();
  KvBuffer(const KvBuffer&) = delete;
  KvBuffer& operator=(const KvBuffer&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const;
  int64_t size_bytes() const { return num_blocks_ * layout_.block_bytes(); }
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }

  // Takes n blocks off the free list (all or none).
  Result<std::vector<int32_t>> allocate(int64_t n);
  // Returns blocks to the free list; ids not currently allocated are ignored (idempotent release).
  void free(std::span<const int32_t> blocks);

  // Byte offset of layer `layer` of block `block` from data().
  int64_t layer_block_offset(int32_t block, int64_t layer) const {
    return static_cast<int64_t>(block) * layout_.block_bytes() + layer * layout_.layer_block_bytes();
  }
  std::span<std::byte> block_span(int32_t block) {
    return {data_ + static_cast<int64_t>(block) * layout_.block_bytes(), static_cast<size_t>(layout_.block_bytes())};
  }
  std::span<std::byte> layer_block_span(int32_t block, int64_t layer) {
    return {data_ + layer_block_offset(block, layer), static_cast<size_t>(layout_.layer_block_bytes())};
  }
  // K (kv = 0) or V (kv = 1) bytes of token slot `slot` (0..block_size-1) in one layer of one block.
  std::byte* token_kv(int32_t block, int64_t layer, int kv, int64_t slot) {
    const int64_t half = layout_.layer_block_bytes() / 2;
    return data_ + layer_block_offset(block, layer) + kv * half + slot * (layout_.bytes_per_token_layer / 2);
  }
  Status check_block(int32_t block) const;

 private:
  KvBuffer(KvLayout layout, int64_t num_blocks, std::byte* data, transfer::SharedBuffer shared);
  KvLayout layout_;
  int64_t num_blocks_;
  std::byte* data_;
  transfer::SharedBuffer shared_;  // owns data_ when KvMemory::kShared (else empty; data_ is an mmap)
  mutable std::mutex mu_;
  std::vector<int32_t> free_list_;
  std::vector<bool> allocated_;
};

}  // namespace mc::infer
