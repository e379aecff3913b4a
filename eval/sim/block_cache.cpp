#include "mc/sim/block_cache.hpp"

#include <algorithm>

namespace mc::sim {

int64_t BlockCache::match_prefix(std::span<const uint64_t> chain) const {
  int64_t n = 0;
  for (uint64_t key : chain) {
    if (!index_.count(key)) break;
    ++n;
  }
  return n;
}

void BlockCache::touch(std::span<const uint64_t> chain, int64_t blocks) {
  blocks = std::min<int64_t>(blocks, static_cast<int64_t>(chain.size()));
  for (int64_t i = blocks - 1; i >= 0; --i) {
    auto it = index_.find(chain[i]);
    if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second);
  }
}

int64_t BlockCache::insert(std::span<const uint64_t> chain, const Evicted& on_insert, const Evicted& on_evict) {
  if (capacity_blocks_ <= 0) return 0;
  const auto n = std::min<int64_t>(static_cast<int64_t>(chain.size()), capacity_blocks_);
  int64_t inserted = 0;
  for (int64_t i = n - 1; i >= 0; --i) {
    auto it = index_.find(chain[i]);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.push_front(chain[i]);
    index_.emplace(chain[i], lru_.begin());
    ++inserted;
    if (on_insert) on_insert(chain[i]);
  }
  while (static_cast<int64_t>(index_.size()) > capacity_blocks_) {
    uint64_t victim = lru_.back();
    lru_.pop_back();
    index_.erase(victim);
    ++evictions_;
    if (on_evict) on_evict(victim);
  }
  return inserted;
}

}  // namespace mc::sim
