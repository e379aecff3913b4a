// mc::infer::KvBlockCache: where a prefill instance reads cached prefix blocks from and puts new blocks into.
//
// One object = one complete KV block, all layers (KvBuffer::block_span), under its block store key
// (block_key.hpp: "kv/<namespace digest>/<seq hash>"). The production implementation is the KV store
// (mc-store, through its client library); MemoryBlockCache is an in-process map for tests and single-process
// runs (`--store mem`).
//
// Contract: get() fills each buffer exactly or reports a per-item error (kObjectNotFound for a miss, or the
// read error); a failed item's buffer content is unspecified and must not be used. A failure is never fatal to
// a request: the prefill recomputes from the first block that did not arrive. put() stores copies; an existing
// key counts as stored (blocks are content-addressed).
// Thread-safety: implementations state their own; the prefill worker calls from its job thread only.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"

namespace mc::infer {

// A block, or a range of it: `buffer` receives the bytes [offset_bytes, offset_bytes + buffer.size()) of a block
// object that must be object_bytes long (0: buffer.size(), the whole block). A pipeline stage reads its layers'
// range of each prefix block (KvBuffer: one contiguous range per layer range; DESIGN.md §18).
struct BlockGet {
  std::string key;
  std::span<std::byte> buffer;
  uint64_t offset_bytes = 0;
  uint64_t object_bytes = 0;
};
struct BlockPut {
  std::string key;
  std::span<const std::byte> data;
};

struct BlockCacheCounters {
  int64_t local_bytes = 0;   // read from DRAM on this host (shared memory, in process, or TCP to a node here)
  int64_t remote_bytes = 0;  // read from DRAM on other hosts
  int64_t ssd_bytes = 0;     // read from an SSD tier (any host)
  int64_t ssd_read_ns = 0;   // wall time of the SSD reads
  std::map<std::string, int64_t> remote_bytes_by_host;  // remote_bytes by the sending host ("": unknown)
};

class KvBlockCache {
 public:
  virtual ~KvBlockCache() = default;
  // One Status per item, in order. The Result fails as a whole only when the cache is unreachable.
  virtual Result<std::vector<Status>> get(std::span<const BlockGet> items) = 0;
  // part_bytes > 0: also store the checksum of each part of that many bytes of every block (a layer of it,
  // KvLayout::layer_block_bytes), so that a reader of a range of layers moves and checks only those bytes.
  virtual Result<std::vector<Status>> put(std::span<const BlockPut> items, uint64_t part_bytes) = 0;
  // Bytes read so far, by tier (for the ledger's local/remote/SSD hit split).
  virtual BlockCacheCounters counters() const = 0;
  virtual std::string describe() const = 0;
};

// In-process map. Thread-safe (one mutex). set_available(false) makes every call fail with kUnavailable
// (a dead store, for tests).
class MemoryBlockCache final : public KvBlockCache {
 public:
  Result<std::vector<Status>> get(std::span<const BlockGet> items) override;
  Result<std::vector<Status>> put(std::span<const BlockPut> items, uint64_t part_bytes) override;
  BlockCacheCounters counters() const override;
  std::string describe() const override { return "in-process memory"; }
  void set_available(bool available);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::byte>> blocks_;
  bool available_ = true;
  BlockCacheCounters counters_;
};

// The KV store (mc-store master + storage nodes) through mc::store::Client; `master` is the master's endpoint,
// `host` the host label the client presents to the master (nearest-replica reads, puts placed on this host,
// copies of hot prefixes made here); empty: gethostname(). The prefill daemon passes its --host, so the
// master and the Conductor see one name per host. Not thread-safe (one store client). kUnavailable naming
// the endpoint when the master cannot be reached.
Result<std::unique_ptr<KvBlockCache>> connect_store_cache(const std::string& master, const std::string& host = "",
                                                          const std::string& etcd = "",
                                                          const std::string& cluster_id = "");

}  // namespace mc::infer
