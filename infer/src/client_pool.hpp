// One connected rpc::RpcClient per peer endpoint, created on first use and dropped after a failed call (so
// the next call reconnects and a late reply to a timed-out call is never taken for the next one's). Used by
// mc-prefill (calls to mc-decode) and mc-decode (token events to clients).
// Thread-safety: none; use one pool per thread.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "mc/common/rpc.hpp"
#include "mc/common/status.hpp"

namespace mc::infer {

class ClientPool {
 public:
  ClientPool(std::string client_name, int timeout_ms) : client_name_(std::move(client_name)), timeout_ms_(timeout_ms) {}

  // Sends `req` to `endpoint` and waits up to timeout_ms for the reply (connecting within timeout_ms too).
  template <typename Req>
  Result<typename Req::Reply> call(const std::string& endpoint, const Req& req) {
    auto it = clients_.find(endpoint);
    if (it == clients_.end()) {
      rpc::ClientOptions o;
      o.client_name = client_name_;
      o.connect_timeout_ms = timeout_ms_;
      MC_ASSIGN_OR_RETURN(auto client, rpc::RpcClient::connect(endpoint, o));
      it = clients_.emplace(endpoint, std::move(client)).first;
    }
    auto reply = it->second->call(req, timeout_ms_);
    if (!reply.is_ok()) clients_.erase(it);
    return reply;
  }

 private:
  std::string client_name_;
  int timeout_ms_;
  std::map<std::string, std::unique_ptr<rpc::RpcClient>> clients_;
};

}  // namespace mc::infer
