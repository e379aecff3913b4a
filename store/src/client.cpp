#include "mc/store/client.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>

#include "mc/common/log.hpp"

namespace mc::store {

namespace {

std::string default_host() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

Status item_status(uint16_t code, const std::string& message) {
  return code == 0 ? Status::ok() : Status(static_cast<Code>(code), message);
}

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A read-write mapping of a storage node's shared-memory segment file.
struct Mapping {
  void* addr = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
};

}  // namespace

class Client::Impl {
 public:
  ClientOptions options;
  std::unique_ptr<rpc::RpcClient> master;
  std::map<std::string, std::unique_ptr<rpc::RpcClient>> nodes;  // data endpoint -> connection
  std::map<std::string, std::unique_ptr<Mapping>> maps;          // shm path -> mapping
  ClientCounters counters;

  Result<rpc::RpcClient*> node(const std::string& endpoint) {
    auto it = nodes.find(endpoint);
    if (it != nodes.end()) return it->second.get();
    rpc::ClientOptions co;
    co.client_name = options.client_id;
    co.connect_timeout_ms = options.node_timeout_ms;
    co.default_timeout_ms = options.node_timeout_ms;
    MC_ASSIGN_OR_RETURN(auto c, rpc::RpcClient::connect(endpoint, co));
    rpc::RpcClient* raw = c.get();
    nodes[endpoint] = std::move(c);
    return raw;
  }

  // Same-host DRAM replica that we can map; nullptr when it must go through the node.
  std::byte* mapped(const proto::StoreReplica& r) {
    if (!options.use_shm || r.shm_path.empty() || r.host != options.host) return nullptr;
    auto it = maps.find(r.shm_path);
    if (it == maps.end()) {
      int fd = ::open(r.shm_path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        maps[r.shm_path] = nullptr;  // not reachable from here: use the node (remembered)
        return nullptr;
      }
      struct stat st {};
      auto m = std::make_unique<Mapping>();
      if (fstat(fd, &st) == 0 && st.st_size > 0) {
        void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
          m->addr = p;
          m->size = static_cast<uint64_t>(st.st_size);
        }
      }
      ::close(fd);
      if (!m->addr) m.reset();
      it = maps.emplace(r.shm_path, std::move(m)).first;
    }
    if (!it->second || r.offset_bytes + r.size_bytes > it->second->size) return nullptr;
    return static_cast<std::byte*>(it->second->addr) + r.offset_bytes;
  }

  void drop_node(const std::string& endpoint) { nodes.erase(endpoint); }

  Status write_replica(const proto::StoreReplica& r, std::span<const std::byte> data) {
    if (data.size() != r.size_bytes) {
      return Status(Code::kInternal, "replica on " + r.segment + " is " + std::to_string(r.size_bytes) + " bytes, data " +
                                         std::to_string(data.size()));
    }
    if (std::byte* dst = mapped(r)) {
      std::memcpy(dst, data.data(), data.size());
      counters.bytes_written_shm += data.size();
      return Status::ok();
    }
    MC_ASSIGN_OR_RETURN(rpc::RpcClient * c, node(r.endpoint));
    for (uint64_t done = 0; done < data.size();) {
      uint64_t n = std::min<uint64_t>(proto::kStoreMaxChunkBytes, data.size() - done);
      proto::StoreNodeWriteRequest req;
      req.segment = r.segment;
      req.offset_bytes = r.offset_bytes + done;
      req.data.assign(reinterpret_cast<const char*>(data.data()) + done, reinterpret_cast<const char*>(data.data()) + done + n);
      auto reply = c->call(req, options.node_timeout_ms);
      if (!reply.is_ok()) {
        drop_node(r.endpoint);
        return reply.status().with_context("writing " + r.segment + " on " + r.endpoint);
      }
      done += n;
    }
    counters.bytes_written_tcp += data.size();
    return Status::ok();
  }

  Status read_replica(const proto::StoreReplica& r, std::span<std::byte> out) {
    if (const std::byte* src = mapped(r)) {
      std::memcpy(out.data(), src, out.size());
      counters.bytes_read_shm += out.size();
      return Status::ok();
    }
    MC_ASSIGN_OR_RETURN(rpc::RpcClient * c, node(r.endpoint));
    for (uint64_t done = 0; done < out.size();) {
      uint64_t n = std::min<uint64_t>(proto::kStoreMaxChunkBytes, out.size() - done);
      proto::StoreNodeReadRequest req{r.segment, r.offset_bytes + done, n};
      auto reply = c->call(req, options.node_timeout_ms);
      if (!reply.is_ok()) {
        drop_node(r.endpoint);
        return reply.status().with_context("reading " + r.segment + " on " + r.endpoint);
      }
      if (reply->data.size() != n) {
        return Status(Code::kDataLoss, "node " + r.endpoint + " returned " + std::to_string(reply->data.size()) +
                                           " bytes of " + r.segment + " for a read of " + std::to_string(n));
      }
      std::memcpy(out.data() + done, reply->data.data(), n);
      done += n;
    }
    counters.bytes_read_tcp += out.size();
    return Status::ok();
  }

  // Reads one granted object into `out` (exactly item.size_bytes), nearest replica first, under its lease.
  Status read_object(const std::string& key, const proto::StoreGetItem& item, int64_t granted_ms, std::span<std::byte> out) {
    Status last(Code::kObjectNotFound, "object '" + key + "' has no replica");
    for (size_t i = 0; i < item.replicas.size(); ++i) {
      Status s = read_replica(item.replicas[i], out.first(item.size_bytes));
      if (s.is_ok()) {
        if (steady_ms() - granted_ms > item.lease_ms) {
          ++counters.lease_expired;
          return Status(Code::kLeaseExpired, "read of '" + key + "' finished after its " + std::to_string(item.lease_ms) +
                                                 " ms lease; the bytes were discarded, read again");
        }
        if (!item.replicate_to.empty() && options.replicate_hot) replicate(key, item, out.first(item.size_bytes));
        return Status::ok();
      }
      MC_LOG_DEBUG << "replica " << item.replicas[i].segment << " of '" << key << "' failed: " << s.to_string();
      ++counters.replica_fallbacks;
      last = s;
    }
    return Status(Code::kUnavailable, "every replica of '" + key + "' failed; last: " + last.message());
  }

  void replicate(const std::string& key, const proto::StoreGetItem& item, std::span<const std::byte> data) {
    Status s = write_replica(item.replicate_to.front(), data);
    proto::StoreReplicaEndRequest req{options.client_id, key, item.replicate_put_id, s.is_ok()};
    auto r = master->call(req, options.rpc_timeout_ms);
    if (!r.is_ok()) MC_LOG_DEBUG << "hot copy of '" << key << "' not recorded: " << r.status().to_string();
  }

  Result<std::vector<Status>> batch_put(std::span<const PutItem> items, const WriteOptions& options, bool exists_is_ok);

  Result<proto::StoreGetReplicasReply> get_replicas(std::vector<std::string> keys) {
    proto::StoreGetReplicasRequest req;
    req.client_id = options.client_id;
    req.client_host = options.host;
    req.client_domain = options.domain;
    req.keys = std::move(keys);
    MC_ASSIGN_OR_RETURN(auto reply, master->call(req, options.rpc_timeout_ms));
    if (reply.items.size() != req.keys.size()) {
      return Status(Code::kMalformedMessage, "get_replicas reply from " + options.master + " has " +
                                                 std::to_string(reply.items.size()) + " items for " +
                                                 std::to_string(req.keys.size()) + " keys");
    }
    return reply;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  if (options.host.empty()) options.host = default_host();
  if (options.client_id.empty()) {
    std::random_device rd;
    options.client_id = options.host + "-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  rpc::ClientOptions co;
  co.client_name = options.client_id;
  co.connect_timeout_ms = options.rpc_timeout_ms;
  co.default_timeout_ms = options.rpc_timeout_ms;
  MC_ASSIGN_OR_RETURN(impl->master, rpc::RpcClient::connect(options.master, co));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::client_id() const { return impl_->options.client_id; }
const ClientCounters& Client::counters() const { return impl_->counters; }

Status Client::put(const std::string& key, std::span<const std::byte> data, const WriteOptions& options) {
  PutItem item{key, data};
  MC_ASSIGN_OR_RETURN(std::vector<Status> st, impl_->batch_put(std::span<const PutItem>(&item, 1), options, false));
  return st.front();
}

Result<std::vector<Status>> Client::batch_put(std::span<const PutItem> items, const WriteOptions& options) {
  return impl_->batch_put(items, options, true);
}

Result<std::vector<Status>> Client::Impl::batch_put(std::span<const PutItem> items, const WriteOptions& options,
                                                    bool exists_is_ok) {
  Impl& m = *this;
  proto::StorePutStartRequest start;
  start.client_id = m.options.client_id;
  start.replicas = m.options.replicas;
  start.preferred_segment = m.options.preferred_segment;
  start.overwrite = options.overwrite;
  start.pin = options.pin;
  for (const PutItem& it : items) {
    start.keys.push_back(it.key);
    start.sizes_bytes.push_back(it.data.size());
  }
  MC_ASSIGN_OR_RETURN(auto grants, m.master->call(start, m.options.rpc_timeout_ms));
  if (grants.items.size() != items.size()) {
    return Status(Code::kMalformedMessage, "put_start reply from " + m.options.master + " has the wrong item count");
  }
  std::vector<Status> out(items.size());
  proto::StorePutEndRequest end;
  proto::StorePutRevokeRequest revoke;
  end.client_id = revoke.client_id = m.options.client_id;
  std::vector<size_t> end_index;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& g = grants.items[i];
    if (g.code == static_cast<uint16_t>(Code::kAlreadyExists) && exists_is_ok) {
      out[i] = Status::ok();
      continue;
    }
    if (g.code != 0) {
      out[i] = item_status(g.code, g.message);
      continue;
    }
    Status s = Status::ok();
    for (const auto& r : g.replicas) {
      s = m.write_replica(r, items[i].data);
      if (!s.is_ok()) break;
    }
    if (s.is_ok()) {
      end.keys.push_back(items[i].key);
      end.put_ids.push_back(g.put_id);
      end_index.push_back(i);
    } else {
      out[i] = s;
      revoke.keys.push_back(items[i].key);
      revoke.put_ids.push_back(g.put_id);
    }
  }
  if (!revoke.keys.empty()) (void)m.master->call(revoke, m.options.rpc_timeout_ms);
  if (!end.keys.empty()) {
    MC_ASSIGN_OR_RETURN(auto ends, m.master->call(end, m.options.rpc_timeout_ms));
    for (size_t j = 0; j < end_index.size() && j < ends.codes.size(); ++j) {
      out[end_index[j]] = item_status(ends.codes[j], j < ends.messages.size() ? ends.messages[j] : "");
    }
  }
  return out;
}

Result<uint64_t> Client::get(const std::string& key, std::span<std::byte> buffer) {
  int64_t granted = steady_ms();
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas({key}));
  const auto& item = reply.items.front();
  MC_RETURN_IF_ERROR(item_status(item.code, item.message));
  if (item.size_bytes > buffer.size()) {
    return Status(Code::kInvalidArgument, "object '" + key + "' is " + std::to_string(item.size_bytes) +
                                              " bytes; the buffer holds " + std::to_string(buffer.size()));
  }
  MC_RETURN_IF_ERROR(impl_->read_object(key, item, granted, buffer));
  return item.size_bytes;
}

Result<uint64_t> Client::size_of(const std::string& key) {
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas({key}));
  const auto& item = reply.items.front();
  MC_RETURN_IF_ERROR(item_status(item.code, item.message));
  return item.size_bytes;
}

Result<std::vector<Status>> Client::batch_get(std::span<const GetItem> items) {
  std::vector<std::string> keys;
  for (const GetItem& it : items) keys.push_back(it.key);
  int64_t granted = steady_ms();
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas(std::move(keys)));
  std::vector<Status> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& item = reply.items[i];
    if (item.code != 0) {
      out[i] = item_status(item.code, item.message);
      continue;
    }
    if (item.size_bytes != items[i].buffer.size()) {
      out[i] = Status(Code::kObjectNotFound, "object '" + items[i].key + "' is " + std::to_string(item.size_bytes) +
                                                 " bytes, expected " + std::to_string(items[i].buffer.size()) +
                                                 ": treated as a miss");
      continue;
    }
    out[i] = impl_->read_object(items[i].key, item, granted, items[i].buffer);
  }
  return out;
}

Result<std::vector<bool>> Client::exists(const std::vector<std::string>& keys) {
  proto::StoreExistsRequest req{keys};
  MC_ASSIGN_OR_RETURN(auto reply, impl_->master->call(req, impl_->options.rpc_timeout_ms));
  return reply.present;
}

Result<uint64_t> Client::match_prefix(const std::vector<std::string>& keys) {
  proto::StoreMatchPrefixRequest req{keys};
  MC_ASSIGN_OR_RETURN(auto reply, impl_->master->call(req, impl_->options.rpc_timeout_ms));
  return reply.matched_blocks;
}

Status Client::remove(const std::string& key) {
  proto::StoreRemoveRequest req{{key}};
  MC_ASSIGN_OR_RETURN(auto reply, impl_->master->call(req, impl_->options.rpc_timeout_ms));
  if (reply.codes.empty()) return Status(Code::kMalformedMessage, "remove reply without a result");
  return item_status(reply.codes[0], reply.messages.empty() ? "" : reply.messages[0]);
}

Result<proto::StoreLsReply> Client::ls(const std::string& prefix, uint32_t limit) {
  proto::StoreLsRequest req{prefix, limit};
  return impl_->master->call(req, impl_->options.rpc_timeout_ms);
}

Result<proto::StoreStatReply> Client::stat() {
  proto::StoreStatRequest req;
  return impl_->master->call(req, impl_->options.rpc_timeout_ms);
}

}  // namespace mc::store
