#include "mc/net/rpc.hpp"

#include <cstring>
#include <iterator>
#include <random>

#include "mc/common/build_id.hpp"
#include "mc/common/clock.hpp"
#include "mc/common/endpoint.hpp"
#include "mc/net/fast_rpc.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/kv_events.hpp"

namespace mc::rpc {
namespace {

std::string zmq_text(const zmq::error_t& e) { return std::string(e.what()); }

// A ZeroMQ routing id for a log line: libzmq's own ids are 5 binary bytes, shown in hex.
std::string printable_identity(const std::string& id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "0x";
  for (const char ch : id.substr(0, 16)) {
    out += kHex[static_cast<unsigned char>(ch) >> 4];
    out += kHex[static_cast<unsigned char>(ch) & 15];
  }
  return out;
}

const std::string kSameVersion = ": run the same mc version on both sides";
// Messages queued per peer before ZeroMQ stops reading it, and the ZMTP handshake deadline (RpcServer::bind).
constexpr int kServerRcvHwm = 1024;
constexpr int kHandshakeMs = 5000;
// Replies (messages) queued per peer and not yet taken by it, beyond which a reply to that peer is dropped
// (counted, logged) rather than queued or waited for: with the largest reply a page of store.ls (~64 KiB), a peer
// that never reads holds at most ~64 MiB of the server's memory. Legitimate clients wait for each reply
// (AsyncClient pipelines per endpoint, the ZeroMQ bench one call at a time): they never come near it.
constexpr int kServerSndHwm = 1024;
// After a reply to a peer is dropped, its requests are dropped unhandled for this long (then one is answered, which
// tells whether it reads again): a peer that does not read costs the loop no handler work. Peers remembered at most.
constexpr int64_t kUnreadBackoffMs = 200;
constexpr size_t kMaxUnreadPeers = 4096;

}  // namespace

// ------------------------------------------------------------------------------------------------
// Shared by both transports

Status version_mismatch(const proto::Header& header, std::string_view service) {
  return Status(Code::kProtocolMismatch, "message '" + header.type + "' is protocol v" + std::to_string(header.v) +
                                             " but " + std::string(service) + " speaks v" +
                                             std::to_string(proto::kProtocolVersion) + kSameVersion);
}

Status reply_version_mismatch(const proto::Header& header, std::string_view endpoint) {
  return Status(Code::kProtocolMismatch, std::string(endpoint) + " answered '" + header.type + "' in protocol v" +
                                             std::to_string(header.v) + ", this client speaks v" +
                                             std::to_string(proto::kProtocolVersion) + kSameVersion);
}

Result<proto::HelloReply> answer_hello(const proto::HelloRequest& hello, std::string_view service) {
  if (hello.protocol_version != proto::kProtocolVersion) {
    return Status(Code::kProtocolMismatch, "client '" + hello.client_name + "' speaks protocol v" +
                                               std::to_string(hello.protocol_version) + " but " + std::string(service) +
                                               " speaks v" + std::to_string(proto::kProtocolVersion) + kSameVersion);
  }
  return proto::HelloReply{proto::kProtocolVersion, std::string(service), build_id()};
}

Status check_hello_reply(const proto::HelloReply& reply, std::string_view endpoint) {
  if (reply.protocol_version == proto::kProtocolVersion) return Status::ok();
  return Status(Code::kProtocolMismatch, reply.service + " at " + std::string(endpoint) + " speaks protocol v" +
                                             std::to_string(reply.protocol_version) + ", this client v" +
                                             std::to_string(proto::kProtocolVersion) + kSameVersion);
}

Status make_curve_server(zmq::socket_t& socket, bool own_key, std::string_view service, const std::string& zap_domain) {
  const auth::Keyring* ring = auth::keyring();
  if (ring == nullptr) return Status::ok();
  const std::string& secret = own_key ? ring->self_keys().secret_z85 : ring->cluster_secret();
  if (secret.empty()) {
    return Status(Code::kFailedPrecondition, std::string(service) +
                                                 ": cannot serve with the cluster key: " + ring->dir() +
                                                 "/cluster.secret is not on this host (copy it to "
                                                 "daemons only, docs/SECURITY.md)");
  }
  try {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, secret);
    socket.set(zmq::sockopt::zap_domain, zap_domain);
  } catch (const zmq::error_t& e) {
    return Status(Code::kInternal, std::string(service) + ": cannot enable CURVE: " + e.what());
  }
  return Status::ok();
}

Status make_curve_client(zmq::socket_t& socket, const std::string& server_public_z85) {
  const auth::Keyring* ring = auth::keyring();
  if (ring == nullptr) return Status::ok();
  try {
    socket.set(zmq::sockopt::curve_serverkey, server_public_z85.empty() ? ring->cluster_public() : server_public_z85);
    socket.set(zmq::sockopt::curve_publickey, ring->self_keys().public_z85);
    socket.set(zmq::sockopt::curve_secretkey, ring->self_keys().secret_z85);
  } catch (const zmq::error_t& e) {
    return Status(Code::kInternal, std::string("cannot enable CURVE: ") + e.what());
  }
  return Status::ok();
}

std::string error_reply_body(const Status& status) {
  return codec::pack(proto::ErrorReply{static_cast<uint16_t>(status.code()), status.message()});
}

Status status_of(const proto::ErrorReply& reply) { return Status(static_cast<Code>(reply.code), reply.message); }

zmq::context_t& context() {
  static zmq::context_t ctx(2);
  return ctx;
}

// ------------------------------------------------------------------------------------------------
// RpcServer

RpcServer::RpcServer(ServerOptions options)
    : options_(std::move(options)), socket_(context(), zmq::socket_type::router) {}

RpcServer::~RpcServer() = default;

Result<std::unique_ptr<RpcServer>> RpcServer::bind(ServerOptions options) {
  if (options.bind_endpoints.empty()) {
    return Status(Code::kInvalidArgument, options.service + ": no endpoint to listen on (e.g. tcp://127.0.0.1:0)");
  }
  // One grammar for every endpoint (endpoint.hpp): ZeroMQ would take port 65537 as 1 and 99999 as a free one.
  for (const auto& ep : options.bind_endpoints) {
    Result<Endpoint> parsed = parse_endpoint(ep);
    MC_RETURN_IF_ERROR(parsed.status().with_context(options.service + ": cannot listen on '" + ep + "'"));
    if (parsed->kind == Endpoint::Kind::kTcp) MC_RETURN_IF_ERROR(auth::check_listen(options.service, parsed->host));
  }
  std::unique_ptr<RpcServer> server(new RpcServer(options));
  MC_RETURN_IF_ERROR(make_curve_server(server->socket_, options.serve_with_own_key, options.service));
  try {
    server->socket_.set(zmq::sockopt::linger, 0);
    // The bounds ZeroMQ offers (DESIGN.md §2 "Bounds"): a message over max_message_bytes closes its peer's
    // connection before it is buffered; at most kServerRcvHwm messages wait per peer, beyond which
    // ZeroMQ stops reading that peer (TCP flow control, nothing dropped); a connection that has not
    // completed the ZMTP handshake within kHandshakeMs is closed; at most kServerSndHwm replies wait per peer
    // (router_mandatory and ZMQ_DONTWAIT: a send to a peer at that mark fails at once, send_raw drops the reply and
    // counts it, the loop never waits on one peer). ZeroMQ has no cap on the number of peers.
    server->socket_.set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
    server->socket_.set(zmq::sockopt::router_mandatory, 1);
    server->socket_.set(zmq::sockopt::sndhwm, kServerSndHwm);
    server->socket_.set(zmq::sockopt::rcvhwm, kServerRcvHwm);
    server->socket_.set(zmq::sockopt::handshake_ivl, kHandshakeMs);
  } catch (const zmq::error_t& e) {
    return Status(Code::kInternal, options.service + ": setting socket options: " + zmq_text(e));
  }
  for (const auto& ep : options.bind_endpoints) {
    try {
      server->socket_.bind(ep);
      server->endpoints_.push_back(server->socket_.get(zmq::sockopt::last_endpoint));
    } catch (const zmq::error_t& e) {
      return Status(Code::kUnavailable, options.service + ": cannot listen on " + ep + ": " + zmq_text(e) +
                                            " (is the port in use? use port 0 to pick a free one)");
    }
  }
  RpcServer* self = server.get();
  server->handle<proto::HelloRequest>(
      [self](const proto::HelloRequest& req, const CallContext&) { return answer_hello(req, self->options_.service); });
  server->handle<proto::PingRequest>([](const proto::PingRequest&, const CallContext&) -> Result<proto::PingReply> {
    return proto::PingReply{unix_time_ms()};
  });
  return server;
}

void RpcServer::serve_stat(const metrics::Registry* registry, std::function<void()> refresh) {
  handle<proto::StatRequest>([this, registry, refresh = std::move(refresh)](
                                 const proto::StatRequest& req, const CallContext&) -> Result<proto::StatReply> {
    if (refresh) refresh();
    proto::StatReply reply;
    reply.service = options_.service;
    reply.metrics_json = registry->json();
    if (req.with_prometheus_text) reply.prometheus_text = registry->prometheus_text();
    return reply;
  });
}

Status RpcServer::send_raw(const std::string& peer, const std::string& type, uint64_t id, const std::string& body) {
  proto::Header h{proto::kProtocolVersion, type, id};
  std::string head = codec::pack(h);
  try {
    // Never blocks: with router_mandatory the first frame fails with EAGAIN when the peer has kServerSndHwm
    // messages waiting (it does not read them); once it is queued the others are too.
    if (!socket_.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      ++counters_.replies_dropped;
      const int64_t now = steady_ms();
      if (unread_until_ms_.size() >= kMaxUnreadPeers) {
        std::erase_if(unread_until_ms_, [now](const auto& e) { return e.second <= now; });
      }
      if (unread_until_ms_.size() < kMaxUnreadPeers) unread_until_ms_[peer] = now + kUnreadBackoffMs;
      const std::string who = printable_identity(peer);
      if (log::nth_worth_logging(counters_.replies_dropped)) {
        MC_LOG_WARN << options_.service << ": dropped '" << type << "' to peer " << who << ": it has " << kServerSndHwm
                    << " messages waiting that it does not read; its requests are dropped unanswered for "
                    << kUnreadBackoffMs << " ms (" << counters_.replies_dropped << " replies dropped so far)";
      }
      return Status(Code::kResourceExhausted, options_.service + ": dropped '" + type + "' to peer " + who + ": " +
                                                  std::to_string(kServerSndHwm) +
                                                  " messages wait unread for it (read the replies)");
    }
    socket_.send(zmq::buffer(head), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(body), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return Status(Code::kUnavailable, options_.service + ": cannot send '" + type + "' to a client: " + zmq_text(e) +
                                          (e.num() == EHOSTUNREACH ? " (the client has disconnected)" : ""));
  }
  return Status::ok();
}

Status RpcServer::reply_error_to(const CallContext& ctx, const Status& status) {
  return send_raw(ctx.peer, proto::kErrorType, ctx.call_id, error_reply_body(status));
}

Result<std::string> RpcServer::dispatch(std::string_view type, std::string_view body, const CallContext& ctx) const {
  auto it = handlers_.find(type);
  if (it == handlers_.end()) {
    return Status(Code::kUnimplemented, options_.service + " does not handle message type '" + std::string(type) + "'");
  }
  Result<std::string> reply = it->second(ctx, body);
  if (ctx.deferred) {
    return Status(Code::kUnimplemented, options_.service + ": the handler of '" + std::string(type) +
                                            "' defers its reply, which only the ZeroMQ transport carries");
  }
  return reply;
}

void RpcServer::handle_message(std::vector<zmq::message_t>& frames) {
  if (frames.empty()) return;
  CallContext ctx;
  ctx.peer = frames[0].to_string();
  if (!unread_until_ms_.empty()) {
    if (auto it = unread_until_ms_.find(ctx.peer); it != unread_until_ms_.end()) {
      if (steady_ms() < it->second) {
        ++counters_.requests_dropped;  // its reply could not be queued: no handler runs for it
        return;
      }
      unread_until_ms_.erase(it);
    }
  }
  if (frames.size() < 2) {
    ++counters_.malformed;
    if (log::nth_worth_logging(counters_.malformed)) {
      MC_LOG_WARN << options_.service << ": dropped a message with no header frame (" << counters_.malformed
                  << " malformed so far)";
    }
    return;
  }
  // A header is a few dozen bytes; the fast path's bound (4 KiB) holds here too, before anything is decoded.
  Result<proto::Header> header =
      frames[1].size() > fast::kMaxHeaderBytes
          ? Result<proto::Header>(
                Status(Code::kMalformedMessage, "message header of " + std::to_string(frames[1].size()) +
                                                    " bytes (limit " + std::to_string(fast::kMaxHeaderBytes) + ")"))
          : codec::unpack<proto::Header>(frames[1].to_string_view(), "message header");
  if (!header.is_ok()) {
    ++counters_.malformed;
    if (log::nth_worth_logging(counters_.malformed)) {
      MC_LOG_WARN << options_.service << ": dropped a message: " << header.status().message() << " ("
                  << counters_.malformed << " malformed so far)";
    }
    return;
  }
  ctx.call_id = header->id;
  ctx.type = header->type;
  auto reply_error = [&](Status s) {
    ++counters_.errors;
    Status sent = reply_error_to(ctx, s);
    if (!sent.is_ok() && sent.code() != Code::kResourceExhausted) MC_LOG_WARN << sent.message();
  };
  if (auth::keyring() != nullptr) {
    Result<const auth::Identity*> caller = caller_of(frames[1]);
    if (!caller.is_ok()) return reply_error(refuse(ctx, caller.status().message()));
    ctx.caller = caller.value();
    if (!auth::may_call(ctx.caller->role, ctx.type)) {
      return reply_error(refuse(ctx, "the " + std::string(auth::role_name(ctx.caller->role)) +
                                         " role may not call it (allowed: " + auth::allowed_roles(ctx.type) + ")"));
    }
  }
  if (header->v != proto::kProtocolVersion) {
    ++counters_.malformed;
    reply_error(version_mismatch(header.value(), options_.service));
    return;
  }
  if (frames.size() != 3) {
    ++counters_.malformed;
    reply_error(Status(Code::kMalformedMessage, "message '" + header->type + "' has " +
                                                    std::to_string(frames.size() - 1) + " frames, expected 2"));
    return;
  }
  auto it = handlers_.find(header->type);
  if (it == handlers_.end()) {
    ++counters_.malformed;
    reply_error(
        Status(Code::kUnimplemented, options_.service + " does not handle message type '" + header->type + "'"));
    return;
  }
  Result<std::string> reply = Status(Code::kInternal, "handler did not run");
  try {
    reply = it->second(ctx, frames[2].to_string_view());
  } catch (const std::exception& e) {
    reply = Status(Code::kInternal, options_.service + ": handler for '" + header->type + "' threw: " + e.what());
  }
  if (ctx.deferred) return;
  if (!reply.is_ok()) {
    if (reply.status().code() == Code::kMalformedMessage) ++counters_.malformed;
    reply_error(reply.status());
    return;
  }
  ++counters_.handled;
  Status sent = send_raw(ctx.peer, header->type + ".reply", ctx.call_id, reply.value());
  if (!sent.is_ok() && sent.code() != Code::kResourceExhausted) MC_LOG_WARN << sent.message();
}

Result<const auth::Identity*> RpcServer::caller_of(zmq::message_t& frame) const {
  const auth::Keyring* ring = auth::keyring();
  if (ring == nullptr) return static_cast<const auth::Identity*>(nullptr);
  const char* user = zmq_msg_gets(frame.handle(), "User-Id");
  const auth::Identity* id = user == nullptr ? nullptr : ring->find_by_name(user);
  if (id == nullptr) return Status(Code::kPermissionDenied, "the connection has no roster identity");
  return id;
}

Status RpcServer::refuse(const CallContext& ctx, const std::string& why) {
  ++counters_.refused;
  Status s(Code::kPermissionDenied,
           options_.service + " refused '" + ctx.type + "' from " + ctx.caller_name() + ": " + why);
  if (log::nth_worth_logging(counters_.refused)) {
    MC_LOG_WARN << s.message() << " (" << counters_.refused << " refused so far)";
  }
  return s;
}

Status RpcServer::poll_once(int timeout_ms) {
  try {
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
    if (!(items[0].revents & ZMQ_POLLIN)) return Status::ok();
    // Drain what is ready, bounded so that a flood cannot starve the caller's other work.
    for (int n = 0; n < 256; ++n) {
      std::vector<zmq::message_t> frames;
      auto got = zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait);
      if (!got) break;
      handle_message(frames);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return Status::ok();
    return Status(Code::kUnavailable, options_.service + ": socket failed: " + zmq_text(e));
  }
  return Status::ok();
}

Status RpcServer::serve() {
  while (!stop_.load()) {
    MC_RETURN_IF_ERROR(poll_once(50));
  }
  return Status::ok();
}

// ------------------------------------------------------------------------------------------------
// KV events

Result<std::unique_ptr<EventPublisher>> EventPublisher::bind(const std::string& endpoint, std::string topic) {
  MC_RETURN_IF_ERROR(parse_endpoint(endpoint).status().with_context("cannot publish KV events on '" + endpoint + "'"));
  std::unique_ptr<EventPublisher> pub(new EventPublisher());
  pub->socket_ = zmq::socket_t(context(), zmq::socket_type::pub);
  pub->topic_ = std::move(topic);
  std::random_device rd;
  while (pub->incarnation_ == 0) pub->incarnation_ = (uint64_t{rd()} << 32) | rd();
  if (Result<Endpoint> parsed = parse_endpoint(endpoint); parsed->kind == Endpoint::Kind::kTcp) {
    MC_RETURN_IF_ERROR(auth::check_listen("the KV event publisher", parsed->host));
  }
  MC_RETURN_IF_ERROR(make_curve_server(pub->socket_, false, "the KV event publisher", "events"));
  try {
    pub->socket_.set(zmq::sockopt::linger, 0);
    pub->socket_.set(zmq::sockopt::sndhwm, 1000000);
    pub->socket_.bind(endpoint);
    pub->endpoint_ = pub->socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status(Code::kUnavailable, "cannot publish KV events on " + endpoint + ": " + zmq_text(e));
  }
  return pub;
}

Status EventPublisher::publish(proto::KvEvent event) {
  event.event_id = ++last_event_id_;
  event.incarnation = incarnation_;
  if (event.ts_unix_ms == 0) event.ts_unix_ms = unix_time_ms();
  unsigned char seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<unsigned char>(event.event_id >> (8 * (7 - i)));
  std::string payload = codec::pack(event);
  try {
    socket_.send(zmq::buffer(topic_), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return Status(Code::kUnavailable, "cannot publish KV event on " + endpoint_ + ": " + zmq_text(e));
  }
  return Status::ok();
}

Result<std::unique_ptr<EventSubscriber>> EventSubscriber::connect(const std::string& endpoint, std::string topic) {
  MC_RETURN_IF_ERROR(
      parse_endpoint(endpoint).status().with_context("cannot subscribe to KV events at '" + endpoint + "'"));
  std::unique_ptr<EventSubscriber> sub(new EventSubscriber());
  sub->socket_ = zmq::socket_t(context(), zmq::socket_type::sub);
  sub->endpoint_ = endpoint;
  MC_RETURN_IF_ERROR(make_curve_client(sub->socket_));
  try {
    sub->socket_.set(zmq::sockopt::linger, 0);
    sub->socket_.set(zmq::sockopt::rcvhwm, 1000000);
    sub->socket_.set(zmq::sockopt::subscribe, topic);
    sub->socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Status(Code::kInvalidArgument, "cannot subscribe to KV events at " + endpoint + ": " + zmq_text(e));
  }
  return sub;
}

Result<proto::KvEvent> decode_kv_event(std::string_view id_frame, std::string_view payload, const std::string& from) {
  if (id_frame.size() != 8) {
    return Status(Code::kMalformedMessage, "KV event from " + from + " is not [topic, u64 id, payload]");
  }
  uint64_t id = 0;
  for (const char c : id_frame) id = (id << 8) | static_cast<unsigned char>(c);
  Result<proto::KvEvent> ev = codec::unpack<proto::KvEvent>(payload, "KV event from " + from);
  if (!ev.is_ok()) return ev.status();
  ev->event_id = id;
  return ev;
}

Result<std::optional<proto::KvEvent>> EventSubscriber::next(int timeout_ms) {
  try {
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
    if (!(items[0].revents & ZMQ_POLLIN)) return std::optional<proto::KvEvent>();
    std::vector<zmq::message_t> frames;
    auto got = zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait);
    if (!got) return std::optional<proto::KvEvent>();
    if (frames.size() != 3) {
      return Status(Code::kMalformedMessage, "KV event from " + endpoint_ + " is not [topic, u64 id, payload]");
    }
    Result<proto::KvEvent> ev = decode_kv_event(frames[1].to_string_view(), frames[2].to_string_view(), endpoint_);
    if (!ev.is_ok()) return ev.status();
    return std::optional<proto::KvEvent>(std::move(ev).value());
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<proto::KvEvent>();
    return Status(Code::kUnavailable, "KV event socket to " + endpoint_ + " failed: " + zmq_text(e));
  }
}

}  // namespace mc::rpc
