// ZeroMQ request/reply RPC over the typed messages of protocol.hpp.
//
// Server: one ROUTER socket bound to one or more endpoints ("tcp://127.0.0.1:0" picks a free port;
// endpoints() returns the bound addresses). Handlers are registered per message type and run on the
// thread that calls poll_once()/serve(); a handler returns Result<Reply>, an error becomes an "error"
// reply. Malformed, oversized, unknown-type and wrong-version messages get an error reply when a
// header can be read, and are dropped with a warning otherwise; the server never crashes on input.
// A handler may also defer its reply (CallContext::defer) and answer later with reply_to(), and the
// server may push messages (id 0) to any connected client with push_to().
//
// Client: AsyncClient, one DEALER socket per endpoint, many calls in flight (pipelined), timeouts, a bound
// on calls in flight, reconnect after a timeout; used by the store client, the Conductor and the workers.
// RpcClient is its blocking facade for one endpoint. Late replies to abandoned calls are recognised by id
// and discarded.
//
// Transports: this ZeroMQ one, and the plain-TCP fast path of fast_rpc.hpp. Both use the header and the
// hello, version and error-reply rules of the "shared by both transports" functions below; an
// RpcServer's handlers can serve a fast::FastServer too (dispatch()).
//
// Thread-safety: neither class is thread-safe (ZeroMQ sockets are not); use one per thread. stop()
// is the exception: any thread may call it. A zmq::context_t is shared process-wide (context()).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/status.hpp"
#include "mc/net/auth.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/envelope.hpp"

// KV events (mc/proto/kv_events.hpp): the publisher and the subscriber below take and give them; a file that does
// includes that section itself, so the rest of the RPC layer's users do not compile it.
namespace mc::proto {
struct KvEvent;
}  // namespace mc::proto

namespace mc::rpc {

// The process-wide ZeroMQ context (created on first use; 2 I/O threads).
zmq::context_t& context();

// Wire-level message: header + raw body bytes.
struct Envelope {
  proto::Header header;
  std::string body;
};

struct CallContext {
  std::string peer;  // ROUTER identity of the caller (opaque bytes)
  uint64_t call_id = 0;
  std::string type;
  // The caller's roster identity (auth.hpp), proven by its key; nullptr when the process runs unauthenticated.
  // Points into the process key ring (lives as long as the process).
  const auth::Identity* caller = nullptr;
  // The caller's name for log lines: its identity, or "an unauthenticated peer".
  std::string caller_name() const { return caller != nullptr ? caller->describe() : "an unauthenticated peer"; }
  // Set by a handler that will answer later with RpcServer::reply_to(); its return value is then ignored.
  mutable bool deferred = false;
  void defer() const { deferred = true; }
};

struct ServerOptions {
  std::string service = "mc";               // named in hello replies and error messages
  std::vector<std::string> bind_endpoints;  // e.g. {"tcp://127.0.0.1:0"}
  int64_t max_message_bytes = proto::kMaxMessageBytes;
  // With a key ring (auth.hpp): serve with this identity's own key pair instead of the cluster's (a client's server
  // for token events, whose callers are told its public key), so that a tenant's client never holds the cluster key.
  bool serve_with_own_key = false;
};

class RpcServer {
 public:
  using RawHandler = std::function<Result<std::string>(const CallContext&, std::string_view body)>;

  // Binds every endpoint; fails with kUnavailable naming the endpoint and zmq's text. With the process key ring
  // (auth.hpp) the socket is a CURVE server (the cluster key, or the own one: serve_with_own_key): only roster keys
  // connect, and a message is handled only when its caller's role may call its type (auth::may_call); others get a
  // kPermissionDenied reply, logged (rate limited) with the caller and the reason. Without a key ring an endpoint
  // that is not loopback is refused unless allowed (auth::check_listen).
  static Result<std::unique_ptr<RpcServer>> bind(ServerOptions options);
  ~RpcServer();

  // Registers a typed handler for Req::kType. Registering a type twice replaces the handler.
  template <typename Req, typename Fn>
  void handle(Fn fn) {
    handlers_[Req::kType] = [fn = std::move(fn)](const CallContext& ctx, std::string_view body) -> Result<std::string> {
      static const std::string what = std::string("body of '") + Req::kType + "'";
      Result<Req> req = codec::unpack<Req>(body, what);
      if (!req.is_ok()) return req.status();
      Result<typename Req::Reply> reply = fn(req.value(), ctx);
      if (!reply.is_ok()) return reply.status();
      return codec::pack(reply.value());
    };
  }

  // Runs the handler registered for `type` on `body`, for a request that arrived by another transport
  // (fast::FastServer's Dispatch): the reply body, the handler's error, or kUnimplemented naming the
  // service and the type. `ctx` is the caller's (no peer); a handler that defers cannot answer this way
  // and gets kUnimplemented. Exceptions from the handler propagate (FastServer catches them).
  Result<std::string> dispatch(std::string_view type, std::string_view body, const CallContext& ctx) const;

  // Answers "stat" requests from `registry` (not owned; must outlive the server). `refresh`, when set, runs
  // first on the serving thread (a daemon copies counters kept elsewhere into the registry there).
  void serve_stat(const metrics::Registry* registry, std::function<void()> refresh = nullptr);

  // Waits up to timeout_ms for one message and handles it. Returns ok when idle or handled;
  // an error only when the socket itself failed (context terminated).
  Status poll_once(int timeout_ms);
  // Handles messages until stop() is called (any thread; takes effect within ~50 ms).
  Status serve();
  void stop() { stop_.store(true); }
  bool stopped() const { return stop_.load(); }

  // Sends a deferred reply (CallContext from a handler that called defer()).
  template <typename Reply>
  Status reply_to(const CallContext& ctx, const Reply& reply) {
    return send_raw(ctx.peer, ctx.type + ".reply", ctx.call_id, codec::pack(reply));
  }
  Status reply_error_to(const CallContext& ctx, const Status& status);
  // Pushes an unsolicited message (id 0) to a client identified by CallContext::peer.
  template <typename Msg>
  Status push_to(const std::string& peer, const Msg& msg) {
    return send_raw(peer, Msg::kType, 0, codec::pack(msg));
  }

  // The bound endpoints with port 0 resolved ("tcp://127.0.0.1:41234").
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  zmq::socket_t& socket() { return socket_; }

  struct Counters {
    uint64_t handled = 0, errors = 0, malformed = 0;
    uint64_t refused = 0;           // calls refused: the caller's role may not call the type, or no identity
    uint64_t replies_dropped = 0;   // replies (and pushes) dropped: the peer had kServerSndHwm unread (rpc.cpp)
    uint64_t requests_dropped = 0;  // requests of such a peer dropped unhandled for kUnreadBackoffMs (rpc.cpp)
  };
  const Counters& counters() const { return counters_; }

  // With a key ring: the identity of a message's caller from its ZeroMQ metadata ("User-Id", set by the ZAP
  // handler), or kPermissionDenied. nullptr without a key ring.
  Result<const auth::Identity*> caller_of(zmq::message_t& frame) const;
  // Refuses (logged, counted) a call `ctx.caller` may not make: kPermissionDenied naming it, the type and `why`.
  Status refuse(const CallContext& ctx, const std::string& why);

 private:
  explicit RpcServer(ServerOptions options);
  Status send_raw(const std::string& peer, const std::string& type, uint64_t id, const std::string& body);
  void handle_message(std::vector<zmq::message_t>& frames);

  ServerOptions options_;
  zmq::socket_t socket_;
  std::vector<std::string> endpoints_;
  struct TypeHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // By message type, looked up by string_view (no string built per request).
  std::unordered_map<std::string, RawHandler, TypeHash, std::equal_to<>> handlers_;
  std::atomic<bool> stop_{false};
  Counters counters_;
  // Peers whose last reply was dropped for their unread backlog, and until when (steady ms) their requests are
  // dropped without running a handler (its reply could not be queued either); at most kMaxUnreadPeers entries.
  std::unordered_map<std::string, int64_t> unread_until_ms_;
};

// ---- The client: one asynchronous, pipelined core (AsyncClient) and its one-endpoint blocking facade ----

struct AsyncClientOptions {
  std::string client_name = "mc";  // sent in the hello to every endpoint
  // Calls awaiting a reply per endpoint; one more is failed at once with kResourceExhausted (a peer that does
  // not keep up must not grow this client's memory without bound).
  int64_t max_in_flight_per_endpoint = 65536;
  // Pushed messages (id 0) queued per endpoint until read; beyond this the oldest is dropped with a warning.
  int64_t max_queued_pushes = 65536;
  int64_t max_message_bytes = proto::kMaxMessageBytes;
  const Clock* clock = nullptr;  // deadlines; nullptr = RealClock. Not owned; must outlive the client.
  // call_sync() and connect() stop waiting once this returns true (asked at least every 100 ms while they wait):
  // the call fails with kCancelled and the endpoint's socket is closed (forget()). The default,
  // daemon::stop_now_requested, makes a second stop signal end a blocking call to a peer that is gone (the whole
  // cluster stopping) at once instead of at its timeout; it is false in a process that installed no stop signals.
  // Empty: never. Called on the client's thread.
  std::function<bool()> abandon_wait = &daemon::stop_now_requested;
};

// A client's own server (ServerOptions::serve_with_own_key) as AsyncClient names it: "ENDPOINT key=Z85", where Z85
// is the CURVE public key the server serves with; `endpoint` unchanged when public_z85 is empty (the cluster's key,
// or no keys). AsyncClient keeps one socket per such name, so a tenant that names another tenant's endpoint with its
// own key gets a socket of its own and never changes how that tenant's server is reached (docs/SECURITY.md, issue 51).
std::string keyed_endpoint(const std::string& endpoint, const std::string& public_z85);

// Request/reply to any number of endpoints over one DEALER socket each, many calls in flight at once.
//
// - Endpoints: tcp://HOST:PORT or ipc://PATH (endpoint.hpp), served with the cluster's key; or keyed_endpoint()'s
//   "ENDPOINT key=Z85" for a server that serves with a key of its own (a client's token-event server).
// - Pipelined: call() sends at once and returns; replies are matched by call id in any order.
// - Hello: the first call to an endpoint opens its socket and queues a hello ahead of it (not waited for).
//   A hello reply of another protocol version fails every call in flight to that endpoint with
//   kProtocolMismatch (naming the service, the endpoint and both versions) and closes the socket.
// - Timeouts: a call with no reply by its deadline fails with kTimeout naming the message type, the
//   endpoint and the timeout; a late reply is recognised by its id and dropped.
// - Bounded: at most max_in_flight_per_endpoint calls per endpoint (kResourceExhausted beyond).
// - Reconnect: after a timeout the endpoint's socket is closed once no call to it is left in flight, so
//   requests queued for a dead peer are dropped instead of reaching it when it restarts; the next call opens
//   a fresh socket (with a fresh hello). forget() closes it at once.
// - Errors the server replies with reach the callback with the server's code and message unchanged.
//
// Callbacks run only inside poll() (and call_sync()/connect(), which poll), never inside call() or forget(),
// so a callback may start new calls or forget endpoints. Callbacks of calls still in flight when the client is
// destroyed are dropped without running.
// Thread-safety: none (ZeroMQ sockets are not); one client per thread.
class AsyncClient {
 public:
  using RawCallback = std::function<void(Result<std::string>)>;

  explicit AsyncClient(AsyncClientOptions options = {});
  ~AsyncClient();
  AsyncClient(const AsyncClient&) = delete;
  AsyncClient& operator=(const AsyncClient&) = delete;

  // Sends `req` to `endpoint`; `cb` gets the decoded reply or the error within about timeout_ms.
  template <typename Req>
  void call(const std::string& endpoint, const Req& req, int64_t timeout_ms,
            std::function<void(Result<typename Req::Reply>)> cb) {
    call_raw(endpoint, Req::kType, codec::pack(req), timeout_ms,
             [cb = std::move(cb), endpoint](Result<std::string> body) {
               if (!body.is_ok()) return cb(body.status());
               cb(codec::unpack<typename Req::Reply>(body.value(),
                                                     "reply to '" + std::string(Req::kType) + "' from " + endpoint));
             });
  }
  void call_raw(const std::string& endpoint, const std::string& type, std::string body, int64_t timeout_ms,
                RawCallback cb);

  // Sends `req` and polls until its reply or its deadline; the callbacks of other calls that complete
  // meanwhile run too.
  template <typename Req>
  Result<typename Req::Reply> call_sync(const std::string& endpoint, const Req& req, int64_t timeout_ms) {
    Result<std::string> body = call_raw_sync(endpoint, Req::kType, codec::pack(req), timeout_ms);
    if (!body.is_ok()) return body.status();
    return codec::unpack<typename Req::Reply>(body.value(),
                                              "reply to '" + std::string(Req::kType) + "' from " + endpoint);
  }
  Result<std::string> call_raw_sync(const std::string& endpoint, const std::string& type, std::string body,
                                    int64_t timeout_ms);

  // Opens `endpoint` (if not open) and waits up to timeout_ms for its hello reply: kUnavailable when none
  // comes ("is the server running?"), kProtocolMismatch, or kInvalidArgument for an endpoint that is not
  // tcp://HOST:PORT or ipc://PATH.
  Status connect(const std::string& endpoint, int64_t timeout_ms);

  // Waits up to timeout_ms (0: not at all) for a reply on any endpoint, reads every reply that has arrived,
  // fails the calls past their deadline, and runs the callbacks of every completed call. Returns how many
  // callbacks ran. Never fails: socket errors fail the calls of that endpoint.
  int poll(int timeout_ms = 0);
  // poll(), waiting in the same zmq_poll also on the caller's `extra` sockets (their revents are set on return), so
  // that one thread serving an RpcServer, calls in flight and event subscriptions sleeps in one place and wakes at
  // the first message on any of them (the Conductor's loop). The wait ends early when a call's deadline comes.
  int poll_with(std::span<zmq::pollitem_t> extra, int timeout_ms);

  // The next pushed message (id 0) from `endpoint`, waiting up to timeout_ms; nullopt when none came.
  std::optional<Envelope> recv_push(const std::string& endpoint, int timeout_ms);

  // Closes the socket of `endpoint`; its calls in flight fail with kCancelled at the next poll().
  void forget(const std::string& endpoint);

  // Connection watch (DESIGN.md §10 "Worker faults"): keeps a connection to `endpoint` open (opening it now, with
  // a hello, and again whenever a stale socket is closed) and records when an established connection to it is
  // lost: the peer's process exited or was killed (its kernel closed the socket) or the link reset. A peer that
  // is merely slow or stopped (SIGSTOP) keeps its connection and is not reported. Lost connections are read with
  // take_disconnected(), each endpoint once a loss (ZeroMQ reconnects by itself; a restarted peer can be lost
  // again). unwatch() ends the watch and closes the socket once no call to it is in flight; forget() and a failed
  // hello (another protocol version) end it too. Bad endpoints: as
  // connect(), logged, not watched.
  void watch(const std::string& endpoint);
  void unwatch(const std::string& endpoint);
  // The watched endpoints whose connection was lost since the last call, in the order the losses were seen.
  std::vector<std::string> take_disconnected();

  size_t in_flight() const { return pending_.size(); }
  size_t in_flight(const std::string& endpoint) const;
  // The hello reply of `endpoint`, once received on its current socket; nullptr before.
  const proto::HelloReply* server_hello(const std::string& endpoint) const;

  struct Counters {
    uint64_t sent = 0, replies = 0, errors = 0, timeouts = 0, late_replies = 0, malformed = 0, reconnects = 0;
    uint64_t disconnects = 0;  // watched connections lost
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Peer;
  struct Pending {
    std::string endpoint, type;
    int64_t deadline_ns = 0, timeout_ms = 0;
    RawCallback cb;
  };

  Result<Peer*> open(const std::string& endpoint, int64_t hello_timeout_ms);
  void send(Peer& peer, const std::string& endpoint, const std::string& type, const std::string& body,
            int64_t timeout_ms, RawCallback cb);
  void complete(uint64_t id, Result<std::string> result);
  void read_replies(const std::string& endpoint, Peer& peer);
  void fail_endpoint(const std::string& endpoint, const Status& status);
  void expire();
  void close_idle_stale();
  void attach_monitor(const std::string& endpoint, Peer& peer);
  void read_monitors();
  int run_ready();
  int64_t now_ns() const;

  AsyncClientOptions options_;
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::set<std::pair<int64_t, uint64_t>> deadlines_;                // (deadline_ns, call id) of pending_
  std::vector<std::pair<RawCallback, Result<std::string>>> ready_;  // completed, callbacks not yet run
  std::unordered_map<std::string, Status> hello_failures_;          // why an endpoint's hello failed (connect())
  std::set<std::string> watched_;                                   // watch()
  std::vector<std::string> disconnected_;                           // take_disconnected()
  uint64_t next_monitor_ = 1;
  uint64_t next_id_ = 1;
  Counters counters_;
};

struct ClientOptions {
  std::string client_name = "mc";
  int connect_timeout_ms = 2000;  // hello handshake
  int default_timeout_ms = 5000;
  int64_t max_message_bytes = proto::kMaxMessageBytes;
  std::function<bool()> abandon_wait = &daemon::stop_now_requested;  // AsyncClientOptions::abandon_wait
};

// A blocking client of one endpoint: an AsyncClient used one call at a time. connect() performs the hello
// handshake and fails with kProtocolMismatch / kUnavailable naming the endpoint. call() blocks up to
// timeout_ms and returns kTimeout naming the endpoint and message type. Pushed messages are read with
// recv_push(). Thread-safety: none; one per thread.
class RpcClient {
 public:
  static Result<std::unique_ptr<RpcClient>> connect(const std::string& endpoint, ClientOptions options = {});
  ~RpcClient();

  template <typename Req>
  Result<typename Req::Reply> call(const Req& req, int timeout_ms = -1) {
    return client_.call_sync(endpoint_, req, timeout_ms < 0 ? options_.default_timeout_ms : timeout_ms);
  }

  // Sends a request and returns the raw reply body, or the error the server sent (code and message kept).
  Result<std::string> call_raw(const std::string& type, const std::string& body, int timeout_ms = -1);

  // Next pushed message (id 0), waiting up to timeout_ms; nullopt on timeout.
  Result<std::optional<Envelope>> recv_push(int timeout_ms);

  const std::string& endpoint() const { return endpoint_; }
  const proto::HelloReply& server_hello() const { return hello_; }

 private:
  RpcClient(std::string endpoint, ClientOptions options);

  std::string endpoint_;
  ClientOptions options_;
  AsyncClient client_;
  proto::HelloReply hello_;
};

// Decodes a body received as a push or raw reply.
template <typename T>
Result<T> decode(const Envelope& env) {
  return codec::unpack<T>(env.body, "pushed '" + env.header.type + "'");
}

// ---- Shared by both transports (this ZeroMQ one and fast_rpc.hpp's plain TCP) ----

// kProtocolMismatch for a request whose header is another protocol version, naming its type and `service`.
Status version_mismatch(const proto::Header& header, std::string_view service);
// kProtocolMismatch for a reply from `endpoint` whose header is another protocol version.
Status reply_version_mismatch(const proto::Header& header, std::string_view endpoint);
// A server's answer to "hello": its protocol version, `service` and build id; kProtocolMismatch naming
// the client and both versions when the client speaks another version.
Result<proto::HelloReply> answer_hello(const proto::HelloRequest& hello, std::string_view service);
// A client's check of the hello reply from `endpoint`: kProtocolMismatch naming the service, the endpoint
// and both versions.
Status check_hello_reply(const proto::HelloReply& reply, std::string_view endpoint);
// With the process key ring: makes `socket` a CURVE server (the cluster key pair, or this identity's own with
// `own_key`) that asks the ZAP handler about every client key; kFailedPrecondition naming `service` when this host
// lacks DIR/cluster.secret. Without a key ring: nothing. Call before bind().
// `zap_domain` "events" (the KV event publishers) admits daemons and admins only: a tenant sees no other tenant's keys.
Status make_curve_server(zmq::socket_t& socket, bool own_key, std::string_view service,
                         const std::string& zap_domain = "mc");
// With the process key ring: makes `socket` a CURVE client with this identity's key pair, expecting the server key
// `server_public_z85` (empty: the cluster's). Without a key ring: nothing. Call before connect().
Status make_curve_client(zmq::socket_t& socket, const std::string& server_public_z85 = {});
// The body of an "error" reply carrying `status` (its code and message).
std::string error_reply_body(const Status& status);
// The Status an "error" reply carries: the server's code and message, unchanged.
Status status_of(const proto::ErrorReply& reply);

// ---- KV events: PUB/SUB with three frames [topic, big-endian u64 event_id, msgpack KvEvent] ----

class EventPublisher {
 public:
  static Result<std::unique_ptr<EventPublisher>> bind(const std::string& endpoint, std::string topic = "kv");
  // Assigns the next event_id (starting at 1) and this publisher's incarnation, and publishes. Not thread-safe.
  Status publish(proto::KvEvent event);
  uint64_t last_event_id() const { return last_event_id_; }
  // Random and non-zero, drawn at bind: subscribers tell a restarted publisher by it (KvEvent::incarnation).
  uint64_t incarnation() const { return incarnation_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  EventPublisher() = default;
  zmq::socket_t socket_;
  std::string topic_;
  std::string endpoint_;
  uint64_t last_event_id_ = 0;
  uint64_t incarnation_ = 0;
};

// Decodes the last two frames of a published KV event (see protocol.hpp, "KV events"): `id_frame`, the
// event id as big-endian u64 (exactly 8 bytes), and `payload`, the msgpack KvEvent; the frame's id replaces
// the payload's event_id. kMalformedMessage naming `from` otherwise. Pure; any thread.
Result<proto::KvEvent> decode_kv_event(std::string_view id_frame, std::string_view payload, const std::string& from);

class EventSubscriber {
 public:
  static Result<std::unique_ptr<EventSubscriber>> connect(const std::string& endpoint, std::string topic = "kv");
  // Next event within timeout_ms, nullopt on timeout; a malformed event is an error (caller may go on).
  Result<std::optional<proto::KvEvent>> next(int timeout_ms);
  // The SUB socket, for a caller's own zmq_poll (AsyncClient::poll_with); read it only through next().
  zmq::socket_t& socket() { return socket_; }

 private:
  EventSubscriber() = default;
  zmq::socket_t socket_;
  std::string endpoint_;
};

}  // namespace mc::rpc
