#include "mc/store/master_link.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "mc/common/etcd.hpp"
#include "mc/common/log.hpp"

namespace mc::store {

struct MasterLocator::Impl {
  MasterAddress address;
  etcd::Options etcd_options;
  std::string key;
  std::unique_ptr<etcd::Client> client;

  mutable std::mutex mu;
  mutable std::condition_variable changed;
  std::optional<LeaderInfo> leader;
  uint64_t generation = 0;
  int64_t revision = 0;
  bool reread = false;  // the watch ended (compaction): read the key again
  std::unique_ptr<etcd::Watch> watch;

  // Caller holds mu. A new value (or none) of the leader key.
  void set(std::optional<LeaderInfo> now) {
    const bool same = leader.has_value() == now.has_value() &&
                      (!now || (leader->endpoint == now->endpoint && leader->revision == now->revision));
    if (same) return;
    leader = std::move(now);
    ++generation;
    changed.notify_all();
  }

  // Reads the key and (re)starts the watch from there.
  Status read_and_watch() {
    Result<etcd::RangeResult> r = client->range(key);
    if (!r.is_ok()) return r.status();
    std::optional<LeaderInfo> now;
    if (!r->kvs.empty()) {
      Result<LeaderInfo> info = decode_leader(r->kvs.front().value);
      if (info.is_ok()) {
        now = info.value();
        now->revision = r->kvs.front().create_revision;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      set(std::move(now));
      revision = r->revision;
      reread = false;
    }
    watch = std::make_unique<etcd::Watch>(
        etcd_options, key, "", r->revision + 1,
        [this](const std::vector<etcd::WatchEvent>& events, int64_t) {
          std::lock_guard<std::mutex> lock(mu);
          for (const etcd::WatchEvent& e : events) {
            if (e.type == etcd::WatchEvent::Type::kDelete) {
              set(std::nullopt);
              continue;
            }
            Result<LeaderInfo> info = decode_leader(e.kv.value);
            if (!info.is_ok()) continue;
            LeaderInfo l = info.value();
            l.revision = e.kv.create_revision;
            set(std::move(l));
          }
        },
        [this](const Status& s) {
          MC_LOG_WARN << "watch of " << key << " ended (" << s.to_string() << "): reading it again";
          std::lock_guard<std::mutex> lock(mu);
          reread = true;
          changed.notify_all();
        });
    return Status::ok();
  }
};

MasterLocator::MasterLocator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MasterLocator::~MasterLocator() {
  if (impl_) impl_->watch.reset();
}

Result<std::shared_ptr<MasterLocator>> MasterLocator::create(const MasterAddress& address, int64_t etcd_timeout_ms) {
  auto impl = std::make_unique<Impl>();
  impl->address = address;
  if (!address.etcd.empty()) {
    MC_RETURN_IF_ERROR(validate_cluster_id(address.cluster_id));
    MC_ASSIGN_OR_RETURN(impl->etcd_options, etcd::parse_endpoints(address.etcd));
    impl->etcd_options.timeout_ms = etcd_timeout_ms;
    impl->key = leader_key(address.cluster_id);
    impl->client = std::make_unique<etcd::Client>(impl->etcd_options);
    Status s = impl->read_and_watch();
    if (!s.is_ok()) {
      // etcd may come up later: leader() reads again.
      MC_LOG_WARN << "store master of cluster " << address.cluster_id << ": etcd " << address.etcd
                  << " does not answer yet (" << s.message() << ")";
      impl->reread = true;
    }
  } else if (address.master.empty()) {
    return Status(Code::kInvalidArgument, "no store master: give --master ENDPOINT, or --etcd and --cluster-id");
  }
  return std::shared_ptr<MasterLocator>(new MasterLocator(std::move(impl)));
}

bool MasterLocator::follows_etcd() const { return impl_->client != nullptr; }

Result<LeaderInfo> MasterLocator::leader(int64_t wait_ms) const {
  Impl& m = *impl_;
  if (!m.client) {
    LeaderInfo fixed;
    fixed.endpoint = m.address.master;
    return fixed;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, wait_ms));
  for (;;) {
    bool reread = false;
    {
      std::unique_lock<std::mutex> lock(m.mu);
      m.changed.wait_until(lock, deadline, [&] { return m.leader.has_value() || m.reread; });
      if (m.leader) return *m.leader;
      reread = m.reread;
    }
    if (reread) {
      Status s = const_cast<Impl&>(m).read_and_watch();
      if (!s.is_ok() && std::chrono::steady_clock::now() >= deadline) {
        return Status(Code::kUnavailable, "store master of cluster '" + m.address.cluster_id + "': etcd " +
                                              m.address.etcd + " does not answer (" + s.message() +
                                              "); is etcd running? (--etcd / MC_ETCD)");
      }
      if (!s.is_ok()) {
        std::unique_lock<std::mutex> lock(m.mu);
        m.changed.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
      }
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(Code::kUnavailable, "store master of cluster '" + m.address.cluster_id +
                                            "': no leader is elected (etcd " + m.address.etcd +
                                            "); start an `mc-store master --etcd ... --cluster-id " +
                                            m.address.cluster_id + "`");
    }
  }
}

uint64_t MasterLocator::generation() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->generation;
}

bool MasterLocator::wait_change(uint64_t seen, int64_t wait_ms) const {
  if (!impl_->client) return false;
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->changed.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, wait_ms)),
                                 [&] { return impl_->generation != seen && impl_->leader.has_value(); });
}

std::string MasterLocator::describe() const {
  if (!impl_->client) return impl_->address.master;
  return "cluster '" + impl_->address.cluster_id + "' (etcd " + impl_->address.etcd + ")";
}

// ---------------------------------------------------------------------------------------------

MasterLink::MasterLink(std::shared_ptr<MasterLocator> locator, rpc::ClientOptions options)
    : locator_(std::move(locator)), options_(std::move(options)) {}

Result<std::unique_ptr<MasterLink>> MasterLink::connect(std::shared_ptr<MasterLocator> locator,
                                                        rpc::ClientOptions options) {
  std::unique_ptr<MasterLink> link(new MasterLink(std::move(locator), std::move(options)));
  MC_RETURN_IF_ERROR(link->reconnect(link->options_.connect_timeout_ms));
  return link;
}

Status MasterLink::reconnect(int64_t wait_ms) {
  const uint64_t gen = locator_->generation();
  MC_ASSIGN_OR_RETURN(LeaderInfo l, locator_->leader(wait_ms));
  conn_.reset();
  endpoint_ = l.endpoint;
  leader_ = l;
  generation_ = gen;
  rpc::ClientOptions co = options_;
  co.connect_timeout_ms = static_cast<int>(std::max<int64_t>(100, std::min<int64_t>(wait_ms, co.connect_timeout_ms)));
  MC_ASSIGN_OR_RETURN(conn_, rpc::RpcClient::connect(l.endpoint, co));
  return Status::ok();
}

bool MasterLink::follow() {
  if (!locator_->follows_etcd() || locator_->generation() == generation_) return false;
  const std::string before = endpoint_;
  Status s = reconnect(options_.connect_timeout_ms);
  if (!s.is_ok()) {
    MC_LOG_WARN << options_.client_name << ": the store master changed and the new one is not reachable yet ("
                << s.message() << ")";
    conn_.reset();
    return false;
  }
  if (endpoint_ != before) {
    MC_LOG_INFO << options_.client_name << ": following the store master leader " << endpoint_ << " (was "
                << (before.empty() ? "none" : before) << ")";
  }
  return true;
}

}  // namespace mc::store
