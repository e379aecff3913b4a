// A client's token-event endpoint for e2e tests that submit to the Conductor themselves: an RpcServer on
// tcp://127.0.0.1:0 recording, per request, the token events, request_done and request_error it receives, served
// on its own thread. Thread-safety: get() from any thread.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "mc/net/rpc.hpp"
#include "mc/proto/worker.hpp"

namespace mc::testkit {

struct Stream {
  int64_t tokens = 0;
  std::map<int64_t, uint32_t> values;  // token by index (index 0: the first token, from prefill)
  int64_t first_token_ns = 0;          // steady clock when index 0 arrived here (0: not yet)
  bool done = false;
  std::optional<proto::RequestError> error;
};

// The client's endpoint: records token events, request_done and request_error on its own thread.
class ClientEndpoint {
 public:
  // own_key: serve with this process's own key (with keys: a tenant's client never holds the cluster key).
  explicit ClientEndpoint(bool own_key = false) {
    rpc::ServerOptions o;
    o.service = "e2e-test-client";
    o.bind_endpoints = {"tcp://127.0.0.1:0"};
    o.serve_with_own_key = own_key;
    server_ = rpc::RpcServer::bind(o).value();
    server_->handle<proto::TokenEvent>([this](const proto::TokenEvent& e, const auto&) -> Result<proto::ClientAck> {
      std::lock_guard lock(mu_);
      Stream& st = streams_[e.request_id];
      ++st.tokens;
      if (st.values.size() < 65536) st.values[e.index] = e.token;
      if (e.index == 0 && st.first_token_ns == 0) {
        st.first_token_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
      }
      return proto::ClientAck{true};
    });
    server_->handle<proto::RequestDone>([this](const proto::RequestDone& d, const auto&) -> Result<proto::ClientAck> {
      std::lock_guard lock(mu_);
      streams_[d.request_id].done = true;
      return proto::ClientAck{true};
    });
    server_->handle<proto::RequestError>([this](const proto::RequestError& e, const auto&) -> Result<proto::ClientAck> {
      std::lock_guard lock(mu_);
      streams_[e.request_id].error = e;
      return proto::ClientAck{true};
    });
    thread_ = std::thread([this] { (void)server_->serve(); });
  }
  ~ClientEndpoint() {
    server_->stop();
    thread_.join();
  }
  ClientEndpoint(const ClientEndpoint&) = delete;
  ClientEndpoint& operator=(const ClientEndpoint&) = delete;
  std::string endpoint() const { return server_->endpoints().front(); }
  Stream get(const std::string& id) {
    std::lock_guard lock(mu_);
    return streams_[id];
  }

 private:
  std::unique_ptr<rpc::RpcServer> server_;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, Stream> streams_;
};

}  // namespace mc::testkit
