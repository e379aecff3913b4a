#include "mc/replay/conductor_link.hpp"

#include <string>
#include <thread>
#include <unordered_map>

#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"

namespace mc::replay {

proto::ConductorSubmitRequest to_submit_request(const Submission& s, int64_t block_size_tokens) {
  proto::ConductorSubmitRequest req;
  req.request_id = s.request_id;
  req.input_tokens = static_cast<int64_t>(s.tokens.size());
  req.output_tokens = s.output_length_tokens;
  req.tokens = s.tokens;
  if (s.row) {
    req.hash_ids = s.row->hash_ids;
    req.lora_name = s.row->scope.lora_name;  // the row's adapter and salt (absent: the Conductor's default)
    req.lora_version = s.row->scope.lora_version;
    req.salt = s.row->scope.salt;
  }
  req.block_size_tokens = block_size_tokens;
  req.slo_ttft_ms = s.slo_ttft_ms;
  req.slo_tbt_ms = s.slo_tbt_ms;
  req.client_endpoint = s.client_endpoint;
  return req;
}

Admission to_admission(const proto::ConductorSubmitReply& r) {
  Admission a;
  a.accepted = r.accepted;
  a.prefill_instance = r.prefill_id;
  a.decode_instance = r.decode_id;
  if (r.accepted || r.predicted_ttft_ms > 0) a.predicted_ttft_ms = r.predicted_ttft_ms;
  if (r.accepted) a.predicted_tbt_ms = r.predicted_tbt_ms;
  if (r.accepted) {
    a.predicted_hit_tokens = r.hit_tokens;
    a.pool_prefix_tokens = r.pool_prefix_tokens;
    a.decision = r.hit_tokens > 0 ? "fetch" : "recompute";
  }
  if (!r.accepted) {
    a.reason = r.reject_reason;
    if (!r.reason.empty()) a.reason += (a.reason.empty() ? "" : ": ") + r.reason;
  }
  return a;
}

namespace {

std::optional<double> measured(double v) { return v < 0 ? std::nullopt : std::optional<double>(v); }

class RpcConductorLink final : public ConductorLink {
 public:
  RpcConductorLink(std::unique_ptr<rpc::RpcClient> client, ConductorLinkOptions options)
      : client_(std::move(client)), options_(std::move(options)) {}

  Result<Admission> submit(const Submission& submission) override {
    auto reply = client_->call(to_submit_request(submission, options_.block_size_tokens), options_.submit_timeout_ms);
    if (!reply.is_ok()) return reply.status();
    return to_admission(reply.value());
  }

 private:
  std::unique_ptr<rpc::RpcClient> client_;
  ConductorLinkOptions options_;
};

}  // namespace

Ledger to_ledger(const proto::RequestLedger& l) {
  Ledger g;
  g.prompt_tokens = l.prompt_tokens;
  g.hit_tokens_local = l.hit_tokens_local;
  g.hit_tokens_remote = l.hit_tokens_remote;
  g.hit_tokens_ssd = l.hit_tokens_ssd;
  g.avoided_prefill_tokens = l.hit_tokens;
  g.transfer_bytes = l.fetch_bytes + l.kv_sent_bytes;
  if (l.fetch_ms >= 0 || l.kv_tail_ms >= 0)
    g.transfer_ms = static_cast<double>(std::max<int64_t>(0, l.fetch_ms) + std::max<int64_t>(0, l.kv_tail_ms));
  g.queue_ms = measured(static_cast<double>(l.queue_ms));
  g.prefill_ms = measured(static_cast<double>(l.prefill_ms));
  if (!l.decision.empty()) g.decision = l.decision;
  return g;
}

DoneReport to_done_report(const proto::RequestDone& done) {
  DoneReport d;
  if (done.ledger.output_tokens > 0) d.output_tokens = done.ledger.output_tokens;
  d.ledger = to_ledger(done.ledger);
  return d;
}

namespace {

// The client endpoint: token_event / request_done / request_error from mc-decode.
class ClientEventSource final : public EventSource {
 public:
  explicit ClientEventSource(std::string bind) : bind_(std::move(bind)) {}
  ~ClientEventSource() override { stop(); }

  Result<std::string> start(EventSink* sink) override {
    rpc::ServerOptions o;
    o.service = "mc-trace-replay client";
    o.bind_endpoints = {bind_};
    o.serve_with_own_key = true;  // a tenant's client holds no cluster key (docs/SECURITY.md)
    auto server = rpc::RpcServer::bind(o);
    if (!server.is_ok())
      return server.status().with_context("binding the client endpoint for token events (--client-bind)");
    server_ = std::move(server).value();
    // A decode instance delivers at least once (it sends again what a partition made it miss the answer to): a
    // token event whose index already arrived is a duplicate. Served on one thread: no lock.
    server_->handle<proto::TokenEvent>([this, sink](const proto::TokenEvent& ev, const rpc::CallContext&) {
      int64_t& next = next_index_[ev.request_id];
      if (ev.index < next) return Result<proto::ClientAck>(proto::ClientAck{});
      next = ev.index + 1;
      const uint32_t token = ev.token;
      sink->on_tokens(ev.request_id, std::span<const uint32_t>(&token, 1));
      return Result<proto::ClientAck>(proto::ClientAck{});
    });
    server_->handle<proto::RequestDone>([this, sink](const proto::RequestDone& done, const rpc::CallContext&) {
      next_index_.erase(done.request_id);
      sink->on_done(done.request_id, to_done_report(done));
      return Result<proto::ClientAck>(proto::ClientAck{});
    });
    server_->handle<proto::RequestError>([this, sink](const proto::RequestError& err, const rpc::CallContext&) {
      next_index_.erase(err.request_id);
      std::string msg = err.message.empty() ? "request failed (no message)" : err.message;
      // The sender's count when it has one (a decode instance does; the Conductor, failing a request for a dead
      // instance, does not know it: the record counts the tokens that arrived).
      msg += " [" + std::string(code_name(static_cast<Code>(err.code)));
      if (err.output_tokens > 0) msg += ", " + std::to_string(err.output_tokens) + " tokens sent before the failure";
      msg += "]";
      sink->on_error(err.request_id, msg);
      return Result<proto::ClientAck>(proto::ClientAck{});
    });
    thread_ = std::thread([this] {
      Status st = server_->serve();
      if (!st.is_ok()) MC_LOG_ERROR << "replay: client endpoint stopped: " << st.to_string();
    });
    return server_->endpoints().front();
  }

  void stop() override {
    if (!server_) return;
    server_->stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }

 private:
  std::string bind_;
  std::unique_ptr<rpc::RpcServer> server_;
  std::thread thread_;
  std::unordered_map<std::string, int64_t> next_index_;  // request id -> the next token index expected
};

}  // namespace

std::unique_ptr<EventSource> make_client_event_source(std::string bind_endpoint) {
  return std::make_unique<ClientEventSource>(std::move(bind_endpoint));
}

Result<std::unique_ptr<ConductorLink>> connect_conductor(const ConductorLinkOptions& options) {
  rpc::ClientOptions co;
  co.client_name = "mc-trace-replay";
  co.connect_timeout_ms = options.connect_timeout_ms;
  co.default_timeout_ms = options.submit_timeout_ms;
  auto client = rpc::RpcClient::connect(options.endpoint, co);
  if (!client.is_ok()) {
    const Status& st = client.status();
    return Status(st.code(), "cannot reach the conductor: " + st.message() +
                                 " (start mc-conductor, or pass its endpoint with --conductor / MC_CONDUCTOR)");
  }
  return std::unique_ptr<ConductorLink>(std::make_unique<RpcConductorLink>(std::move(client).value(), options));
}

LinkFactory conductor_link_factory(ConductorLinkOptions options) {
  return [options]() { return connect_conductor(options); };
}

}  // namespace mc::replay
