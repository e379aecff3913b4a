// mc::infer::BlockPutQueue: puts KV blocks into a KvBlockCache (the store) on its own thread, from copies.
//
// The decode instance of a pipelined prefill (DESIGN.md §18 "Live groups", point 5) is the one place that holds
// every layer of the prompt's new blocks, once its commit check passed; it must not delay the first token for a
// store round trip, nor keep the blocks of a request that may finish before the put. So kv_commit copies the
// blocks (memcpy, under the decode lock) and enqueues them here; this thread puts them in order.
//
// Bounds: at most max_queued_bytes of copies wait; enqueue() refuses a batch that would pass it (kResourceExhausted,
// nothing queued: the blocks are simply not stored, as when a store put fails). Metrics in the given registry:
// mc_decode_store_queued_bytes (gauge), mc_decode_stored_blocks_total, mc_decode_store_failed_blocks_total (the put
// failed or the store was unreachable), mc_decode_store_dropped_blocks_total (queue full).
// Thread-safety: enqueue() and flush() from any thread. The destructor finishes the queued puts (each bounded by
// the store client's own timeouts), then joins the thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mc/common/metrics.hpp"
#include "mc/common/status.hpp"
#include "mc/infer/block_cache.hpp"

namespace mc::infer {

class BlockPutQueue {
 public:
  // `cache` non-null; `metrics` outlives the queue; max_queued_bytes > 0.
  BlockPutQueue(std::unique_ptr<KvBlockCache> cache, int64_t max_queued_bytes, metrics::Registry* metrics);
  ~BlockPutQueue();
  BlockPutQueue(const BlockPutQueue&) = delete;
  BlockPutQueue& operator=(const BlockPutQueue&) = delete;

  // Copies blocks[i] to be put under keys[i] (same sizes). `what` names the batch in logs (a request id).
  // kInvalidArgument on mismatched sizes; kResourceExhausted when the copies would exceed max_queued_bytes.
  // part_bytes: KvBlockCache::put's, for every block (a layer of it; 0: no part checksums).
  Status enqueue(const std::string& what, std::vector<std::string> keys,
                 const std::vector<std::span<const std::byte>>& blocks, uint64_t part_bytes = 0);
  // Waits until every batch enqueued before the call was put (or failed). For tests and shutdown.
  void flush();
  std::string describe() const { return cache_->describe(); }

 private:
  struct Batch {
    std::string what;
    std::vector<std::string> keys;
    std::vector<std::byte> bytes;  // the blocks back to back
    size_t block_bytes = 0;
    uint64_t part_bytes = 0;
  };
  void run();

  std::unique_ptr<KvBlockCache> cache_;
  const int64_t max_queued_bytes_;
  metrics::Registry* metrics_;
  std::mutex mu_;
  std::condition_variable cv_;       // a batch queued, or stopping
  std::condition_variable done_cv_;  // a batch finished
  std::deque<Batch> queue_;
  int64_t queued_bytes_ = 0;
  uint64_t enqueued_ = 0, finished_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace mc::infer
