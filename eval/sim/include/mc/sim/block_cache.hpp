// One instance's DRAM KV cache in the simulator: a set of prefix-chained block keys with a capacity
// in blocks and LRU eviction, as the store evicts (DESIGN.md §2; paper §4: hot blocks replicated,
// cold ones evicted by LRU).
//
// A request's chain is touched tail first and head last, so the head of a chain is always more
// recently used than its tail: eviction removes leaves before the roots that make them reachable
// (evicting a chain's head would make every later block of it unreachable by prefix match).
// Keys are seq hashes (mc::chain_hash), so one key names a block *and* its whole prefix.
// Thread-safety: none. Memory: O(capacity_blocks).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>

namespace mc::sim {

class BlockCache {
 public:
  using Evicted = std::function<void(uint64_t key)>;

  // capacity_blocks <= 0 makes a cache that holds nothing.
  explicit BlockCache(int64_t capacity_blocks) : capacity_blocks_(capacity_blocks) {}

  // Number of leading keys of `chain` present (the prefix hit, in blocks). Does not touch LRU order.
  int64_t match_prefix(std::span<const uint64_t> chain) const;
  bool contains(uint64_t key) const { return index_.count(key) != 0; }

  // Makes every key of `chain` present and most recently used (head most recent), inserting missing
  // ones and evicting least recently used keys beyond capacity; `on_evict` (may be empty) is told of
  // each evicted key, `on_insert` of each newly inserted one. Returns the number inserted. A chain
  // longer than the capacity keeps its first capacity_blocks keys.
  int64_t insert(std::span<const uint64_t> chain, const Evicted& on_insert = {}, const Evicted& on_evict = {});
  // Marks the leading `blocks` keys of `chain` (which must be present) most recently used.
  void touch(std::span<const uint64_t> chain, int64_t blocks);

  int64_t size_blocks() const { return static_cast<int64_t>(index_.size()); }
  int64_t capacity_blocks() const { return capacity_blocks_; }
  int64_t evictions() const { return evictions_; }

 private:
  int64_t capacity_blocks_;
  std::list<uint64_t> lru_;  // front = most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
  int64_t evictions_ = 0;
};

}  // namespace mc::sim
