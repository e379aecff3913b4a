#include "mc/infer/block_cache.hpp"

#include <cstring>

#include "mc/store/client.hpp"

namespace mc::infer {

Result<std::vector<Status>> MemoryBlockCache::get(std::span<const BlockGet> items) {
  std::lock_guard lock(mu_);
  if (!available_) return error(Code::kUnavailable, "in-process block cache: unavailable");
  std::vector<Status> out;
  for (const auto& item : items) {
    const uint64_t object = item.object_bytes != 0 ? item.object_bytes : item.buffer.size();
    if (item.offset_bytes > object || item.buffer.size() > object - item.offset_bytes) {
      out.push_back(error(Code::kInvalidArgument, "range of block " + item.key + " lies past its end"));
      continue;
    }
    auto it = blocks_.find(item.key);
    if (it == blocks_.end() || it->second.size() != object) {
      out.push_back(error(Code::kObjectNotFound, "block " + item.key + " not cached"));
      continue;
    }
    std::memcpy(item.buffer.data(), it->second.data() + item.offset_bytes, item.buffer.size());
    counters_.local_bytes += static_cast<int64_t>(item.buffer.size());
    out.push_back(Status::ok());
  }
  return out;
}

Result<std::vector<Status>> MemoryBlockCache::put(std::span<const BlockPut> items, uint64_t /*part_bytes*/) {
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

namespace {

// The KV store through its client library (one client; not thread-safe, like the client).
class StoreBlockCache final : public KvBlockCache {
 public:
  StoreBlockCache(std::string master, std::string host, std::unique_ptr<store::Client> client)
      : master_(std::move(master)), host_(std::move(host)), client_(std::move(client)) {}

  Result<std::vector<Status>> get(std::span<const BlockGet> items) override {
    std::vector<store::GetItem> gets;
    for (const auto& i : items) gets.push_back({i.key, i.buffer, i.offset_bytes, i.object_bytes});
    return client_->batch_get(gets);
  }
  Result<std::vector<Status>> put(std::span<const BlockPut> items, uint64_t part_bytes) override {
    std::vector<store::PutItem> puts;
    for (const auto& i : items) puts.push_back({i.key, i.data});
    store::WriteOptions options;
    options.part_bytes = part_bytes;
    return client_->batch_put(puts, options);
  }
  BlockCacheCounters counters() const override {
    const auto& c = client_->counters();
    BlockCacheCounters out{static_cast<int64_t>(c.bytes_read_shm),
                           static_cast<int64_t>(c.bytes_read_tcp),
                           static_cast<int64_t>(c.bytes_read_ssd),
                           static_cast<int64_t>(c.read_ssd_ns),
                           {}};
    // Local means this host's memory, whatever the transport: shared memory, or TCP to a node on this host (a
    // node serving no shm, DESIGN.md §16); remote is TCP from the other hosts.
    for (const auto& [host, bytes] : c.bytes_read_tcp_by_host) {
      if (!host_.empty() && host == host_) {
        out.local_bytes += static_cast<int64_t>(bytes);
        out.remote_bytes -= static_cast<int64_t>(bytes);
      } else {
        out.remote_bytes_by_host[host] = static_cast<int64_t>(bytes);
      }
    }
    return out;
  }
  std::string describe() const override { return "mc-store at " + master_; }

 private:
  std::string master_;
  std::string host_;  // this host's label (the replicas' StoreReplica::host names it)
  std::unique_ptr<store::Client> client_;
};

}  // namespace

Result<std::unique_ptr<KvBlockCache>> connect_store_cache(const std::string& master, const std::string& host,
                                                          const std::string& etcd, const std::string& cluster_id) {
  store::ClientOptions o;
  o.master = master;
  o.host = host;
  o.etcd = etcd;
  o.cluster_id = cluster_id;
  auto client = store::Client::connect(o);
  if (!client.is_ok()) {
    return client.status().with_context("prefix cache (--store " + master +
                                        (etcd.empty() ? "" : ", cluster " + cluster_id + " via etcd " + etcd) + ")");
  }
  return std::unique_ptr<KvBlockCache>(new StoreBlockCache(master, host, std::move(client).value()));
}

}  // namespace mc::infer
