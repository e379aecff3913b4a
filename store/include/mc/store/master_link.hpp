// How clients, storage nodes and tools reach the store master: a fixed endpoint (--master), or the leader of a
// replicated cluster named in etcd (--etcd ENDPOINTS --cluster-id NAME; master_ha.hpp, DESIGN.md §17).
//
// MasterLocator reads the leader key once and then watches it, so a takeover is known the moment etcd records it
// (no polling). MasterLink is one RPC connection to the master that follows the locator: before each call it
// reconnects when the leader changed, and a call that fails for the connection's sake (kUnavailable, kTimeout) is
// sent once more to the new leader when one takes over within the call's timeout — never twice to the same master
// (put_start is not idempotent; a put_end the old leader committed before dying is refused by the new one with
// kFailedPrecondition although the object exists: the caller reports the put failed, never wrong data).
//
// Thread-safety: MasterLocator is thread-safe (shared by every link of a process). A MasterLink is not (it owns a
// ZeroMQ socket): one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mc/common/status.hpp"
#include "mc/coord/leader.hpp"
#include "mc/net/rpc.hpp"

namespace mc::store {

// Where the master is (leader.hpp): a fixed endpoint, or the leader of a cluster in etcd.
using MasterAddress = LeaderAddress;
using MasterLocator = LeaderLocator;

class MasterLink {
 public:
  // Connects to the leader (waiting up to options.connect_timeout_ms for one to be elected).
  static Result<std::unique_ptr<MasterLink>> connect(std::shared_ptr<MasterLocator> locator,
                                                     rpc::ClientOptions options);

  template <typename Req>
  Result<typename Req::Reply> call(const Req& req, int timeout_ms = -1) {
    const int t = timeout_ms < 0 ? options_.default_timeout_ms : timeout_ms;
    follow();
    if (!conn_) {
      Status s = reconnect(t);
      if (!s.is_ok()) return s;
    }
    const uint64_t gen = generation_;
    Result<typename Req::Reply> r = conn_->call(req, t);
    if (r.is_ok() || !locator_->follows_etcd() || !retryable(r.status())) return r;
    // The leader may be changing: when another one takes over within the timeout, ask it once.
    if (!locator_->wait_change(gen, t) || !follow()) return r;
    if (!conn_) return r;
    return conn_->call(req, t);
  }

  // Reconnects when the leader changed since the last call; true when it did (and the connection is new).
  bool follow();
  // The master this link talks to now ("" before the first connection).
  const std::string& endpoint() const { return endpoint_; }
  // The leader's announced fast-path port and KV event endpoint (etcd), or 0 / "" (ask store.info).
  const LeaderInfo& leader() const { return leader_; }
  uint64_t generation() const { return generation_; }
  const MasterLocator& locator() const { return *locator_; }

 private:
  MasterLink(std::shared_ptr<MasterLocator> locator, rpc::ClientOptions options);
  static bool retryable(const Status& s) { return s.code() == Code::kUnavailable || s.code() == Code::kTimeout; }
  Status reconnect(int64_t wait_ms);

  std::shared_ptr<MasterLocator> locator_;
  rpc::ClientOptions options_;
  std::unique_ptr<rpc::RpcClient> conn_;
  std::string endpoint_;
  LeaderInfo leader_;
  uint64_t generation_ = 0;
};

}  // namespace mc::store
