#include "mc/coord/leader.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "mc/common/endpoint.hpp"
#include "mc/common/log.hpp"
#include "mc/coord/etcd.hpp"

namespace mc {

Status validate_cluster_id(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
  if (!ok) {
    return Status(Code::kInvalidArgument, "cluster id '" + id.substr(0, 80) +
                                              "': use 1 to 64 of [A-Za-z0-9._-] (--cluster-id / MC_CLUSTER_ID)");
  }
  return Status::ok();
}

std::string leader_key(const std::string& cluster_id) { return "/mc/" + cluster_id + "/leader"; }

std::string encode_leader(const LeaderInfo& info) {
  nlohmann::json j = {{"member", info.member},
                      {"endpoint", info.endpoint},
                      {"events", info.events},
                      {"fast_port", info.fast_port},
                      {"since_unix_ms", info.since_unix_ms}};
  return j.dump();
}

Result<LeaderInfo> decode_leader(std::string_view json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object() || !j.contains("endpoint") || !j["endpoint"].is_string()) {
    return Status(Code::kDataLoss, "leader record is not {\"endpoint\": ...}: " + std::string(json.substr(0, 120)));
  }
  LeaderInfo info;
  info.endpoint = j["endpoint"].get<std::string>();
  // A peer's input: an endpoint that does not parse names no leader (never a usage error of whoever reads it).
  if (Result<Endpoint> ep = parse_endpoint(info.endpoint); !ep.is_ok()) {
    return Status(Code::kDataLoss, "leader record names endpoint '" + info.endpoint.substr(0, 120) +
                                       "', which is not an endpoint (" + ep.status().message() + ")");
  }
  if (j.contains("member") && j["member"].is_string()) info.member = j["member"].get<std::string>();
  if (j.contains("events") && j["events"].is_string()) info.events = j["events"].get<std::string>();
  if (!info.events.empty()) {
    if (Result<Endpoint> ep = parse_endpoint(info.events); !ep.is_ok()) {
      return Status(Code::kDataLoss, "leader record names KV-event endpoint '" + info.events.substr(0, 120) +
                                         "', which is not an endpoint (" + ep.status().message() + ")");
    }
  }
  if (j.contains("fast_port") && j["fast_port"].is_number_unsigned()) {
    info.fast_port = static_cast<uint16_t>(std::min<uint64_t>(j["fast_port"].get<uint64_t>(), 65535));
  }
  if (j.contains("since_unix_ms") && j["since_unix_ms"].is_number_integer()) {
    info.since_unix_ms = j["since_unix_ms"].get<int64_t>();
  }
  return info;
}

Result<LeaderInfo> check_leader_key(const std::string& key, std::string_view value, int64_t lease) {
  Result<LeaderInfo> info = decode_leader(value);
  if (!info.is_ok()) {
    return Status(Code::kDataLoss,
                  "the leader key " + key + " holds no valid leader record: " + info.status().message());
  }
  if (lease == 0) {
    return Status(Code::kDataLoss, "the leader key " + key + " (" + std::string(value.substr(0, 120)) +
                                       ") carries no etcd lease, so no live master wrote it (a leader holds its key "
                                       "under its lease; was it written by hand?)");
  }
  return info;
}

std::string leader_key_remedy(const std::string& key) {
  return "a starting or standing-by `mc-store master --etcd ...` replaces such a key; or delete it: `etcdctl del " +
         key + "`";
}

struct LeaderLocator::Impl {
  LeaderAddress address;
  etcd::Options etcd_options;
  std::string key;
  std::unique_ptr<etcd::Client> client;

  mutable std::mutex mu;
  mutable std::condition_variable changed;
  std::optional<LeaderInfo> leader;
  std::string problem;  // the leader key is there but names no live leader: what is wrong with it ("" otherwise)
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

  std::mutex watch_mu;  // one (re)start of the watch at a time
  // Reads the key and (re)starts the watch from there.
  Status read_and_watch() {
    std::lock_guard<std::mutex> restart(watch_mu);
    Result<etcd::RangeResult> r = client->range(key);
    if (!r.is_ok()) return r.status();
    std::optional<LeaderInfo> now;
    std::string why;
    if (!r->kvs.empty()) {
      const etcd::KeyValue& kv = r->kvs.front();
      Result<LeaderInfo> info = check_leader_key(key, kv.value, kv.lease);
      if (info.is_ok()) {
        now = info.value();
        now->revision = kv.mod_revision;  // the key is written once per term: its term
      } else {
        why = info.status().message();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      problem = why;
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
              problem.clear();
              set(std::nullopt);
              continue;
            }
            // A key that names no live leader (no lease, not a record, a bad endpoint) is no leader: followed as
            // none, and what is wrong with it is said when a caller gives up waiting.
            Result<LeaderInfo> info = check_leader_key(key, e.kv.value, e.kv.lease);
            if (!info.is_ok()) {
              problem = info.status().message();
              set(std::nullopt);
              continue;
            }
            problem.clear();
            LeaderInfo l = info.value();
            l.revision = e.kv.mod_revision;
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

LeaderLocator::LeaderLocator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LeaderLocator::~LeaderLocator() {
  if (impl_) impl_->watch.reset();
}

Result<std::shared_ptr<LeaderLocator>> LeaderLocator::create(const LeaderAddress& address, int64_t etcd_timeout_ms) {
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
      MC_LOG_WARN << "leader of cluster " << address.cluster_id << ": etcd " << address.etcd << " does not answer yet ("
                  << s.message() << ")";
      impl->reread = true;
    }
  } else if (address.endpoint.empty()) {
    return Status(Code::kInvalidArgument,
                  "no endpoint: give one (--master, --store-master), or --etcd and --cluster-id");
  }
  return std::shared_ptr<LeaderLocator>(new LeaderLocator(std::move(impl)));
}

bool LeaderLocator::follows_etcd() const { return impl_->client != nullptr; }

Result<LeaderInfo> LeaderLocator::leader(int64_t wait_ms) const {
  Impl& m = *impl_;
  if (!m.client) {
    LeaderInfo fixed;
    fixed.endpoint = m.address.endpoint;
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
        return Status(Code::kUnavailable, "leader of cluster '" + m.address.cluster_id + "': etcd " + m.address.etcd +
                                              " does not answer (" + s.message() +
                                              "); is etcd running? (--etcd / MC_ETCD)");
      }
      if (!s.is_ok()) {
        std::unique_lock<std::mutex> lock(m.mu);
        m.changed.wait_until(lock,
                             std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
      }
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string problem;
      {
        std::lock_guard<std::mutex> lock(m.mu);
        problem = m.problem;
      }
      if (!problem.empty()) {
        return Status(Code::kUnavailable, "leader of cluster '" + m.address.cluster_id + "' (etcd " + m.address.etcd +
                                              "): " + problem + ": " + leader_key_remedy(m.key));
      }
      return Status(Code::kUnavailable,
                    "leader of cluster '" + m.address.cluster_id + "': no leader is elected (etcd " + m.address.etcd +
                        "); start an `mc-store master --etcd ... --cluster-id " + m.address.cluster_id + "`");
    }
  }
}

uint64_t LeaderLocator::generation() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->generation;
}

bool LeaderLocator::wait_change(uint64_t seen, int64_t wait_ms) const {
  if (!impl_->client) return false;
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->changed.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, wait_ms)),
                                 [&] { return impl_->generation != seen && impl_->leader.has_value(); });
}

std::string LeaderLocator::describe() const {
  if (!impl_->client) return impl_->address.endpoint;
  return "cluster '" + impl_->address.cluster_id + "' (etcd " + impl_->address.etcd + ")";
}

}  // namespace mc
