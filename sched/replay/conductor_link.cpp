#include "mc/replay/conductor_link.hpp"

#include "mc/common/rpc.hpp"

namespace mc::replay {

proto::ConductorSubmitRequest to_submit_request(const Submission& s, int64_t block_size_tokens) {
  proto::ConductorSubmitRequest req;
  req.request_id = s.request_id;
  req.input_tokens = static_cast<int64_t>(s.tokens.size());
  req.output_tokens = s.output_length_tokens;
  req.tokens = s.tokens;
  if (s.row) req.hash_ids = s.row->hash_ids;
  req.block_size_tokens = block_size_tokens;
  req.slo_ttft_ms = s.slo_ttft_ms;
  req.slo_tbt_ms = s.slo_tbt_ms;
  return req;
}

Admission to_admission(const proto::ConductorSubmitReply& r) {
  Admission a;
  a.accepted = r.accepted;
  a.prefill_instance = r.prefill_id;
  a.decode_instance = r.decode_id;
  if (r.accepted || r.predicted_ttft_ms > 0) a.predicted_ttft_ms = r.predicted_ttft_ms;
  if (r.accepted) {
    a.predicted_hit_tokens = r.hit_tokens;
    a.decision = r.hit_tokens > 0 ? "fetch" : "recompute";
  }
  if (!r.accepted) {
    a.reason = r.reject_reason;
    if (!r.reason.empty()) a.reason += (a.reason.empty() ? "" : ": ") + r.reason;
  }
  return a;
}

namespace {

std::optional<int64_t> measured(int64_t v) { return v < 0 ? std::nullopt : std::optional<int64_t>(v); }
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

  bool carries_events() const override { return true; }

  Status poll_events(EventSink& sink, int timeout_ms) override {
    int wait_ms = timeout_ms;
    while (true) {
      auto env = client_->recv_push(wait_ms);
      if (!env.is_ok()) return env.status();
      if (!env->has_value()) return Status::ok();
      wait_ms = 0;  // drain what is already there, then return
      const rpc::Envelope& e = **env;
      if (e.header.type != proto::ConductorEvent::kType) {
        MC_LOG_WARN << "replay: ignoring pushed '" << e.header.type << "' from " << options_.endpoint;
        continue;
      }
      auto ev = rpc::decode<proto::ConductorEvent>(e);
      if (!ev.is_ok()) {
        MC_LOG_WARN << "replay: " << ev.status().to_string();
        continue;
      }
      Status st = deliver_event(ev.value(), sink);
      if (!st.is_ok()) MC_LOG_WARN << "replay: " << st.to_string();
    }
  }

 private:
  std::unique_ptr<rpc::RpcClient> client_;
  ConductorLinkOptions options_;
};

}  // namespace

Ledger to_ledger(const proto::RequestLedger& l) {
  Ledger g;
  g.prompt_tokens = measured(l.prompt_tokens);
  g.hit_tokens_local = measured(l.hit_tokens_local);
  g.hit_tokens_remote = measured(l.hit_tokens_remote);
  g.hit_tokens_ssd = measured(l.hit_tokens_ssd);
  g.avoided_prefill_tokens = measured(l.avoided_prefill_tokens);
  g.transfer_bytes = measured(l.transfer_bytes);
  g.transfer_ms = measured(l.transfer_ms);
  g.queue_ms = measured(l.queue_ms);
  g.prefill_ms = measured(l.prefill_ms);
  if (!l.decision.empty()) g.decision = l.decision;
  g.predicted_ttft_ms = measured(l.predicted_ttft_ms);
  return g;
}

Status deliver_event(const proto::ConductorEvent& ev, EventSink& sink) {
  if (ev.kind == proto::kEventFirstToken) {
    sink.on_tokens(ev.request_id, std::max<int64_t>(1, static_cast<int64_t>(ev.tokens.size())));
  } else if (ev.kind == proto::kEventTokens) {
    sink.on_tokens(ev.request_id, static_cast<int64_t>(ev.tokens.size()));
  } else if (ev.kind == proto::kEventDone) {
    DoneReport d;
    if (ev.output_tokens > 0) d.output_tokens = ev.output_tokens;
    d.ledger = to_ledger(ev.ledger);
    sink.on_done(ev.request_id, d);
  } else if (ev.kind == proto::kEventFailed) {
    sink.on_error(ev.request_id, ev.message.empty() ? "failed (no message from the conductor)" : ev.message);
  } else {
    return Status(Code::kMalformedMessage,
                  "conductor.event for \"" + ev.request_id + "\" has unknown kind \"" + ev.kind + "\"");
  }
  return Status::ok();
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
