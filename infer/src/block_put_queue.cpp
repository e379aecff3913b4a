#include "mc/infer/block_put_queue.hpp"

#include <cstring>

#include "mc/common/log.hpp"

namespace mc::infer {

BlockPutQueue::BlockPutQueue(std::unique_ptr<KvBlockCache> cache, int64_t max_queued_bytes, metrics::Registry* metrics)
    : cache_(std::move(cache)), max_queued_bytes_(max_queued_bytes), metrics_(metrics) {
  metrics_->gauge("mc_decode_store_queued_bytes", "copies of KV blocks waiting to be put into the store").set(0);
  metrics_->counter("mc_decode_stored_blocks_total", "prompt blocks decode put into the store (pipelined prefills)");
  metrics_->counter("mc_decode_store_failed_blocks_total", "prompt blocks whose store put failed");
  metrics_->counter("mc_decode_store_dropped_blocks_total", "prompt blocks not stored: the put queue was full");
  thread_ = std::thread([this] { run(); });
}

BlockPutQueue::~BlockPutQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status BlockPutQueue::enqueue(const std::string& what, std::vector<std::string> keys,
                              const std::vector<std::span<const std::byte>>& blocks, uint64_t part_bytes) {
  if (keys.size() != blocks.size() || blocks.empty()) {
    return error(Code::kInvalidArgument, "store put of '" + what + "': " + std::to_string(keys.size()) + " keys for " +
                                             std::to_string(blocks.size()) + " blocks");
  }
  const size_t block_bytes = blocks.front().size();
  for (const auto& b : blocks) {
    if (b.size() != block_bytes) return error(Code::kInvalidArgument, "store put of '" + what + "': uneven blocks");
  }
  const auto total = static_cast<int64_t>(block_bytes * blocks.size());
  {
    std::lock_guard lock(mu_);
    if (queued_bytes_ + total > max_queued_bytes_) {
      metrics_->counter("mc_decode_store_dropped_blocks_total").inc(blocks.size());
      return error(Code::kResourceExhausted,
                   "store put of '" + what + "': " + std::to_string(total) + " B of blocks would exceed the queue's " +
                       std::to_string(max_queued_bytes_) + " B (" + std::to_string(queued_bytes_) +
                       " B waiting); not stored (raise --store-put-queue-bytes, or the store is slow)");
    }
    queued_bytes_ += total;
  }
  Batch batch;
  batch.what = what;
  batch.keys = std::move(keys);
  batch.block_bytes = block_bytes;
  batch.part_bytes = part_bytes;
  batch.bytes.resize(static_cast<size_t>(total));
  for (size_t i = 0; i < blocks.size(); ++i)
    std::memcpy(batch.bytes.data() + i * block_bytes, blocks[i].data(), block_bytes);
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(batch));
    ++enqueued_;
    metrics_->gauge("mc_decode_store_queued_bytes").set(static_cast<double>(queued_bytes_));
  }
  cv_.notify_one();
  return Status::ok();
}

void BlockPutQueue::flush() {
  std::unique_lock lock(mu_);
  const uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return finished_ >= target; });
}

void BlockPutQueue::run() {
  for (;;) {
    Batch batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every queued batch was put
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    std::vector<BlockPut> puts;
    puts.reserve(batch.keys.size());
    for (size_t i = 0; i < batch.keys.size(); ++i) {
      puts.push_back(
          {batch.keys[i], std::span<const std::byte>(batch.bytes.data() + i * batch.block_bytes, batch.block_bytes)});
    }
    int64_t stored = 0;
    auto put = cache_->put(puts, batch.part_bytes);
    if (put.is_ok()) {
      for (const auto& s : put.value()) stored += s.is_ok() ? 1 : 0;
      if (stored < static_cast<int64_t>(puts.size())) {
        MC_LOG_WARN << "decode: storing the blocks of '" << batch.what << "': " << puts.size() - stored << " of "
                    << puts.size() << " puts failed (first: " <<
            [&] {
              for (const auto& s : put.value()) {
                if (!s.is_ok()) return s.to_string();
              }
              return std::string();
            }() << ")";
      }
    } else {
      MC_LOG_WARN << "decode: storing the blocks of '" << batch.what << "' failed: " << put.status().to_string();
    }
    metrics_->counter("mc_decode_stored_blocks_total").inc(static_cast<uint64_t>(stored));
    metrics_->counter("mc_decode_store_failed_blocks_total").inc(puts.size() - static_cast<uint64_t>(stored));
    {
      std::lock_guard lock(mu_);
      queued_bytes_ -= static_cast<int64_t>(batch.bytes.size());
      ++finished_;
      metrics_->gauge("mc_decode_store_queued_bytes").set(static_cast<double>(queued_bytes_));
    }
    done_cv_.notify_all();
  }
}

}  // namespace mc::infer
