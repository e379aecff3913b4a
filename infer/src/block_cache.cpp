#include "mc/infer/block_cache.hpp"

#include <cstring>

namespace mc::infer {

Result<std::vector<Status>> MemoryBlockCache::get(std::span<const BlockGet> items) {
  std::lock_guard lock(mu_);
  if (!available_) return error(Code::kUnavailable, "in-process block cache: unavailable");
  std::vector<Status> out;
  for (const auto& item : items) {
    auto it = blocks_.find(item.key);
    if (it == blocks_.end() || it->second.size() != item.buffer.size()) {
      out.push_back(error(Code::kObjectNotFound, "block " + item.key + " not cached"));
      continue;
    }
    std::memcpy(item.buffer.data(), it->second.data(), item.buffer.size());
    counters_.local_bytes += static_cast<int64_t>(item.buffer.size());
    out.push_back(Status::ok());
  }
  return out;
}

Result<std::vector<Status>> MemoryBlockCache::put(std::span<const BlockPut> items) {
  std::lock_guard lock(mu_);
  if (!available_) return error(Code::kUnavailable, "in-process block cache: unavailable");
  std::vector<Status> out;
  for (const auto& item : items) {
    blocks_.try_emplace(item.key, item.data.begin(), item.data.end());
    out.push_back(Status::ok());
  }
  return out;
}

BlockCacheCounters MemoryBlockCache::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void MemoryBlockCache::set_available(bool available) {
  std::lock_guard lock(mu_);
  available_ = available;
}

size_t MemoryBlockCache::size() const {
  std::lock_guard lock(mu_);
  return blocks_.size();
}

Result<std::unique_ptr<KvBlockCache>> connect_store_cache(const std::string& master) {
  return error(Code::kUnimplemented, "store cache at " + master +
                                         ": this build has no KV store client yet; use --store mem or --store none");
}

}  // namespace mc::infer
