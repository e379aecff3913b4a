// The one RPC client: AsyncClient (pipelined, many endpoints) and RpcClient, its blocking one-endpoint facade.
// See rpc.hpp for the contract.
#include <algorithm>
#include <cstring>
#include <deque>
#include <iterator>
#include <thread>

#include "mc/common/endpoint.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"

namespace mc::rpc {

struct AsyncClient::Peer {
  zmq::socket_t socket;
  size_t in_flight = 0;
  bool stale = false;  // a call timed out: close the socket once nothing is in flight
  std::optional<proto::HelloReply> hello;
  std::deque<Envelope> pushed;
  // watch(): the PAIR end of the socket's ZeroMQ monitor (ZMQ_EVENT_DISCONNECTED), destroyed before `socket`.
  std::optional<zmq::socket_t> monitor;
};

namespace {
constexpr int64_t kWatchHelloTimeoutMs = 2'000;  // the hello of a socket watch() opens (or reopens)
}  // namespace

AsyncClient::AsyncClient(AsyncClientOptions options) : options_(std::move(options)) {}

AsyncClient::~AsyncClient() = default;

int64_t AsyncClient::now_ns() const {
  return options_.clock != nullptr ? options_.clock->now_ns() : RealClock::instance().now_ns();
}

size_t AsyncClient::in_flight(const std::string& endpoint) const {
  auto it = peers_.find(endpoint);
  return it == peers_.end() ? 0 : it->second->in_flight;
}

const proto::HelloReply* AsyncClient::server_hello(const std::string& endpoint) const {
  auto it = peers_.find(endpoint);
  if (it == peers_.end() || !it->second->hello) return nullptr;
  return &*it->second->hello;
}

namespace {
constexpr std::string_view kKeySeparator = " key=";
// (the address to connect to, the server's key or "") of an AsyncClient endpoint name (keyed_endpoint()).
std::pair<std::string, std::string> split_keyed(const std::string& endpoint) {
  const size_t at = endpoint.find(kKeySeparator);
  if (at == std::string::npos) return {endpoint, std::string()};
  return {endpoint.substr(0, at), endpoint.substr(at + kKeySeparator.size())};
}
}  // namespace

std::string keyed_endpoint(const std::string& endpoint, const std::string& public_z85) {
  if (public_z85.empty()) return endpoint;
  return endpoint + std::string(kKeySeparator) + public_z85;
}

Result<AsyncClient::Peer*> AsyncClient::open(const std::string& endpoint, int64_t hello_timeout_ms) {
  if (auto it = peers_.find(endpoint); it != peers_.end()) return it->second.get();
  hello_failures_.erase(endpoint);
  // One grammar for every endpoint (endpoint.hpp); ZeroMQ's own error for a bad one is less helpful.
  const auto [address, server_key] = split_keyed(endpoint);
  MC_RETURN_IF_ERROR(parse_endpoint(address).status().with_context("connecting to '" + endpoint + "'"));
  if (server_key.find(kKeySeparator) != std::string::npos) {
    return Status(Code::kInvalidArgument, "connecting to '" + endpoint + "': more than one key");
  }
  auto peer = std::make_unique<Peer>();
  try {
    peer->socket = zmq::socket_t(context(), zmq::socket_type::dealer);
    peer->socket.set(zmq::sockopt::linger, 0);
    peer->socket.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
    peer->socket.set(zmq::sockopt::sndhwm, 100000);
    peer->socket.set(zmq::sockopt::rcvhwm, 100000);
    MC_RETURN_IF_ERROR(make_curve_client(peer->socket, server_key).with_context("connecting to " + endpoint));
    // Watched: the monitor is attached before connect(), so that no loss of the first connection is missed.
    if (watched_.count(endpoint) != 0) attach_monitor(endpoint, *peer);
    peer->socket.connect(address);
  } catch (const zmq::error_t& e) {
    return Status(Code::kInvalidArgument, "cannot connect to '" + endpoint + "': " + e.what() +
                                              " (endpoints look like tcp://127.0.0.1:5555 or ipc:///tmp/x)");
  }
  Peer* raw = peer.get();
  peers_.emplace(endpoint, std::move(peer));
  // The hello goes first on the new socket, with the deadline of the call that opened it; the calls behind it
  // are not held back by it. An error reply to it (another protocol version) fails the endpoint.
  proto::HelloRequest hello{proto::kProtocolVersion, options_.client_name};
  send(*raw, endpoint, proto::HelloRequest::kType, codec::pack(hello), hello_timeout_ms,
       [this, endpoint](Result<std::string> body) {
         auto it = peers_.find(endpoint);
         if (it == peers_.end()) return;                                       // forgotten meanwhile
         if (!body.is_ok() && body.status().code() == Code::kTimeout) return;  // stale now: reopened when idle
         Result<proto::HelloReply> reply =
             body.is_ok() ? codec::unpack<proto::HelloReply>(body.value(), "hello reply from " + endpoint)
                          : Result<proto::HelloReply>(body.status());
         Status ok = reply.is_ok() ? check_hello_reply(reply.value(), endpoint) : reply.status();
         if (!ok.is_ok() && ok.code() != Code::kProtocolMismatch && ok.code() != Code::kMalformedMessage) {
           MC_LOG_WARN << "hello to " << endpoint << ": " << ok.message();
           return;
         }
         if (!ok.is_ok()) {
           MC_LOG_WARN << "closing the connection to " << endpoint << ": " << ok.message();
           hello_failures_[endpoint] = ok;
           return fail_endpoint(endpoint, ok);
         }
         it->second->hello = std::move(reply).value();
       });
  return raw;
}

void AsyncClient::send(Peer& peer, const std::string& endpoint, const std::string& type, const std::string& body,
                       int64_t timeout_ms, RawCallback cb) {
  if (static_cast<int64_t>(peer.in_flight) >= options_.max_in_flight_per_endpoint) {
    ready_.emplace_back(std::move(cb),
                        Status(Code::kResourceExhausted,
                               "cannot send '" + type + "' to " + endpoint + ": " + std::to_string(peer.in_flight) +
                                   " calls in flight (limit " + std::to_string(options_.max_in_flight_per_endpoint) +
                                   "): the peer is not keeping up"));
    return;
  }
  const uint64_t id = next_id_++;
  std::string head = codec::pack(proto::Header{proto::kProtocolVersion, type, id});
  Status sent = Status::ok();
  try {
    auto s1 = peer.socket.send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    auto s2 = s1 ? peer.socket.send(zmq::buffer(body), zmq::send_flags::dontwait) : s1;
    if (!s1 || !s2)
      sent = Status(Code::kUnavailable, "cannot send '" + type + "' to " + endpoint + ": send queue full");
  } catch (const zmq::error_t& e) {
    sent = Status(Code::kUnavailable, "cannot send '" + type + "' to " + endpoint + ": " + e.what());
  }
  if (!sent.is_ok()) {
    ready_.emplace_back(std::move(cb), std::move(sent));
    return;
  }
  ++counters_.sent;
  ++peer.in_flight;
  const int64_t deadline_ns = now_ns() + std::max<int64_t>(0, timeout_ms) * 1'000'000;
  pending_.emplace(id, Pending{endpoint, type, deadline_ns, timeout_ms, std::move(cb)});
  deadlines_.emplace(deadline_ns, id);
}

void AsyncClient::call_raw(const std::string& endpoint, const std::string& type, std::string body, int64_t timeout_ms,
                           RawCallback cb) {
  Result<Peer*> peer = open(endpoint, timeout_ms);
  if (!peer.is_ok()) {
    ready_.emplace_back(std::move(cb), peer.status());
    return;
  }
  send(*peer.value(), endpoint, type, body, timeout_ms, std::move(cb));
}

void AsyncClient::complete(uint64_t id, Result<std::string> result) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  deadlines_.erase({p.deadline_ns, id});
  if (auto peer = peers_.find(p.endpoint); peer != peers_.end() && peer->second->in_flight > 0) {
    --peer->second->in_flight;
  }
  ready_.emplace_back(std::move(p.cb), std::move(result));
}

void AsyncClient::read_replies(const std::string& endpoint, Peer& peer) {
  // Bounded per poll so that one flooding peer cannot starve the others.
  for (int n = 0; n < 1024; ++n) {
    std::vector<zmq::message_t> frames;
    zmq::recv_result_t got;
    try {
      got = zmq::recv_multipart(peer.socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return;
      return fail_endpoint(endpoint, Status(Code::kUnavailable, "socket to " + endpoint + " failed: " + e.what()));
    }
    if (!got) return;
    if (frames.size() != 2) {
      ++counters_.malformed;
      if (log::nth_worth_logging(counters_.malformed)) {
        MC_LOG_WARN << "dropped a message from " << endpoint << " with " << frames.size() << " frames, expected 2 ("
                    << counters_.malformed << " malformed so far)";
      }
      continue;
    }
    Result<proto::Header> header =
        codec::unpack<proto::Header>(frames[0].to_string_view(), "header of a message from " + endpoint);
    if (!header.is_ok()) {
      ++counters_.malformed;
      if (log::nth_worth_logging(counters_.malformed)) {
        MC_LOG_WARN << "dropped a message: " << header.status().message() << " (" << counters_.malformed
                    << " malformed so far)";
      }
      continue;
    }
    if (header->id == 0) {
      if (static_cast<int64_t>(peer.pushed.size()) >= options_.max_queued_pushes) {
        MC_LOG_WARN << "dropped the oldest of " << peer.pushed.size() << " unread messages pushed by " << endpoint;
        peer.pushed.pop_front();
      }
      peer.pushed.push_back(Envelope{std::move(header).value(), frames[1].to_string()});
      continue;
    }
    if (pending_.find(header->id) == pending_.end()) {
      ++counters_.late_replies;  // to a call that timed out or was forgotten
      continue;
    }
    if (header->type == proto::kErrorType) {
      ++counters_.errors;
      Result<proto::ErrorReply> err =
          codec::unpack<proto::ErrorReply>(frames[1].to_string_view(), "error reply from " + endpoint);
      complete(header->id, err.is_ok() ? status_of(err.value()) : err.status());
    } else if (header->v != proto::kProtocolVersion) {
      complete(header->id, reply_version_mismatch(header.value(), endpoint));
    } else {
      ++counters_.replies;
      complete(header->id, frames[1].to_string());
    }
  }
}

void AsyncClient::fail_endpoint(const std::string& endpoint, const Status& status) {
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : pending_) {
    if (p.endpoint == endpoint) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // callbacks in the order the calls were made
  for (uint64_t id : ids) complete(id, status);
  peers_.erase(endpoint);
  watched_.erase(endpoint);  // forgotten, or its hello failed: not reopened
}

void AsyncClient::forget(const std::string& endpoint) {
  if (peers_.find(endpoint) == peers_.end()) return;
  fail_endpoint(endpoint, Status(Code::kCancelled, "the connection to " + endpoint + " was closed by this client"));
}

void AsyncClient::attach_monitor(const std::string& endpoint, Peer& peer) {
  // One inproc address per monitored socket; its name is this client's, never seen by a peer.
  const std::string address = "inproc://mc-rpc-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                              std::to_string(next_monitor_++);
  if (zmq_socket_monitor(peer.socket.handle(), address.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
    MC_LOG_WARN << "cannot watch the connection to " << endpoint << ": " << zmq_strerror(zmq_errno())
                << " (its loss is seen only by timeouts)";
    return;
  }
  try {
    zmq::socket_t pair(context(), zmq::socket_type::pair);
    pair.set(zmq::sockopt::linger, 0);
    pair.connect(address);
    peer.monitor = std::move(pair);
  } catch (const zmq::error_t& e) {
    MC_LOG_WARN << "cannot watch the connection to " << endpoint << ": " << e.what()
                << " (its loss is seen only by timeouts)";
  }
}

void AsyncClient::watch(const std::string& endpoint) {
  if (!watched_.insert(endpoint).second) return;
  auto it = peers_.find(endpoint);
  if (it != peers_.end()) {
    if (!it->second->monitor) attach_monitor(endpoint, *it->second);
    return;
  }
  Result<Peer*> opened = open(endpoint, kWatchHelloTimeoutMs);
  if (!opened.is_ok()) {
    MC_LOG_WARN << "cannot watch " << endpoint << ": " << opened.status().message();
    watched_.erase(endpoint);
  }
}

void AsyncClient::unwatch(const std::string& endpoint) {
  watched_.erase(endpoint);
  auto it = peers_.find(endpoint);
  if (it == peers_.end()) return;
  if (it->second->monitor) {
    (void)zmq_socket_monitor(it->second->socket.handle(), nullptr, 0);  // stops the monitor
    it->second->monitor.reset();
  }
  // Nobody watches it any more: the socket (and its reconnect attempts to a dead peer) goes once it is idle.
  if (it->second->in_flight == 0) {
    peers_.erase(it);
  } else {
    it->second->stale = true;
  }
}

std::vector<std::string> AsyncClient::take_disconnected() {
  read_monitors();
  std::vector<std::string> out;
  out.swap(disconnected_);
  return out;
}

void AsyncClient::read_monitors() {
  for (auto& [endpoint, peer] : peers_) {
    if (!peer->monitor) continue;
    // An event is two frames: 6 bytes (uint16 event, uint32 value) and the endpoint's address. Bounded per call.
    for (int n = 0; n < 64; ++n) {
      std::vector<zmq::message_t> frames;
      zmq::recv_result_t got;
      try {
        got = zmq::recv_multipart(*peer->monitor, std::back_inserter(frames), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        MC_LOG_WARN << "reading the connection monitor of " << endpoint << ": " << e.what();
        break;
      }
      if (!got) break;
      if (frames.empty() || frames[0].size() < sizeof(uint16_t)) continue;
      uint16_t event = 0;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      if (event != ZMQ_EVENT_DISCONNECTED || watched_.count(endpoint) == 0) continue;
      ++counters_.disconnects;
      if (std::find(disconnected_.begin(), disconnected_.end(), endpoint) == disconnected_.end()) {
        disconnected_.push_back(endpoint);
      }
    }
  }
}

void AsyncClient::expire() {
  const int64_t now = now_ns();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const uint64_t id = deadlines_.begin()->second;
    const Pending& p = pending_.at(id);
    ++counters_.timeouts;
    if (auto peer = peers_.find(p.endpoint); peer != peers_.end()) peer->second->stale = true;
    Status late(Code::kTimeout, "no reply to '" + p.type + "' from " + p.endpoint + " within " +
                                    std::to_string(p.timeout_ms) + " ms (is the server running and not overloaded?)");
    complete(id, std::move(late));
  }
}

void AsyncClient::close_idle_stale() {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (it->second->stale && it->second->in_flight == 0) {
      ++counters_.reconnects;
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  // A watched endpoint keeps a connection: its stale socket is replaced by a fresh one (with a fresh hello).
  for (const std::string& endpoint : watched_) {
    if (peers_.count(endpoint) == 0) (void)open(endpoint, kWatchHelloTimeoutMs);
  }
}

int AsyncClient::run_ready() {
  int ran = 0;
  // A callback may start calls that fail at once (into ready_); run those in a later round.
  std::vector<std::pair<RawCallback, Result<std::string>>> batch;
  batch.swap(ready_);
  for (auto& [cb, result] : batch) {
    if (cb) cb(std::move(result));
    ++ran;
  }
  return ran;
}

int AsyncClient::poll(int timeout_ms) { return poll_with({}, timeout_ms); }

int AsyncClient::poll_with(std::span<zmq::pollitem_t> extra, int timeout_ms) {
  if (!ready_.empty()) timeout_ms = 0;
  if (timeout_ms > 0 && !deadlines_.empty()) {
    const int64_t to_deadline_ms = (deadlines_.begin()->first - now_ns()) / 1'000'000 + 1;
    timeout_ms = static_cast<int>(std::clamp<int64_t>(to_deadline_ms, 0, timeout_ms));
  }
  std::vector<zmq::pollitem_t> items;
  std::vector<std::string> names;
  items.reserve(peers_.size() + extra.size());
  names.reserve(peers_.size());
  for (auto& [endpoint, peer] : peers_) {
    items.push_back({peer->socket.handle(), 0, ZMQ_POLLIN, 0});
    names.push_back(endpoint);
  }
  const size_t own = items.size();
  for (zmq::pollitem_t& item : extra) {
    item.revents = 0;
    items.push_back(item);
  }
  try {
    if (!items.empty()) {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(std::max(0, timeout_ms)));
    } else if (timeout_ms > 0 && ready_.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));  // nothing to wait on
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) MC_LOG_WARN << "polling RPC replies failed: " << e.what();
  }
  for (size_t i = 0; i < extra.size(); ++i) extra[i].revents = items[own + i].revents;
  for (size_t i = 0; i < own; ++i) {
    if (!(items[i].revents & ZMQ_POLLIN)) continue;
    auto it = peers_.find(names[i]);
    if (it != peers_.end()) read_replies(names[i], *it->second);
  }
  expire();
  close_idle_stale();
  read_monitors();
  return run_ready();
}

Result<std::string> AsyncClient::call_raw_sync(const std::string& endpoint, const std::string& type, std::string body,
                                               int64_t timeout_ms) {
  std::optional<Result<std::string>> result;
  call_raw(endpoint, type, std::move(body), timeout_ms, [&result](Result<std::string> r) { result = std::move(r); });
  // The call's own deadline ends the wait: expire() completes it with kTimeout.
  while (!result) {
    poll(static_cast<int>(std::min<int64_t>(std::max<int64_t>(timeout_ms, 1), 100)));
    if (!result && options_.abandon_wait && options_.abandon_wait()) {
      forget(endpoint);
      poll(0);
      if (!result) result = Status(Code::kCancelled, "'" + type + "' to " + endpoint + " abandoned: stopping now");
    }
  }
  return std::move(*result);
}

namespace {
// ZeroMQ reports neither a refused connection nor a failed CURVE handshake: name the causes it can be.
std::string auth_hint() {
  const auth::Keyring* ring = auth::keyring();
  if (ring == nullptr) {
    return " (is a server listening there? A cluster started with --auth-dir answers only callers with keys: give "
           "--auth-dir and --auth-name, docs/SECURITY.md)";
  }
  return " (is a server listening there? With keys it must run with --auth-dir of this cluster: its cluster key "
         "must be " +
         ring->dir() + "/cluster.pub, and a server without --auth-dir answers no caller with keys)";
}
}  // namespace

Status AsyncClient::connect(const std::string& endpoint, int64_t timeout_ms) {
  MC_RETURN_IF_ERROR(open(endpoint, timeout_ms).status());
  const int64_t deadline_ns = now_ns() + timeout_ms * 1'000'000;
  while (server_hello(endpoint) == nullptr) {
    if (peers_.find(endpoint) == peers_.end()) {
      auto failed = hello_failures_.find(endpoint);
      if (failed != hello_failures_.end()) return failed->second;
      return Status(Code::kUnavailable,
                    "the connection to " + endpoint + " closed before its hello was answered" + auth_hint());
    }
    const int64_t left_ms = (deadline_ns - now_ns()) / 1'000'000;
    if (left_ms < 0) {
      forget(endpoint);
      return Status(Code::kUnavailable, "no answer from " + endpoint + " within " + std::to_string(timeout_ms) +
                                            " ms: is the server running and the address right?" + auth_hint());
    }
    poll(static_cast<int>(std::min<int64_t>(left_ms + 1, 100)));
    if (server_hello(endpoint) == nullptr && options_.abandon_wait && options_.abandon_wait()) {
      forget(endpoint);
      return Status(Code::kCancelled, "connecting to " + endpoint + " abandoned: stopping now");
    }
  }
  return Status::ok();
}

std::optional<Envelope> AsyncClient::recv_push(const std::string& endpoint, int timeout_ms) {
  const int64_t deadline_ns = now_ns() + std::max(0, timeout_ms) * int64_t{1'000'000};
  while (true) {
    auto it = peers_.find(endpoint);
    if (it == peers_.end()) return std::nullopt;
    if (!it->second->pushed.empty()) {
      Envelope env = std::move(it->second->pushed.front());
      it->second->pushed.pop_front();
      return env;
    }
    const int64_t left_ns = deadline_ns - now_ns();
    if (left_ns < 0) return std::nullopt;
    poll(static_cast<int>(std::min<int64_t>(left_ns / 1'000'000, 100)));
  }
}

// ------------------------------------------------------------------------------------------------
// RpcClient

RpcClient::RpcClient(std::string endpoint, ClientOptions options)
    : endpoint_(std::move(endpoint)), options_(options), client_([&options] {
        AsyncClientOptions o;
        o.client_name = options.client_name;
        o.max_message_bytes = options.max_message_bytes;
        o.abandon_wait = options.abandon_wait;
        return o;
      }()) {}

RpcClient::~RpcClient() = default;

Result<std::unique_ptr<RpcClient>> RpcClient::connect(const std::string& endpoint, ClientOptions options) {
  std::unique_ptr<RpcClient> client(new RpcClient(endpoint, options));
  MC_RETURN_IF_ERROR(client->client_.connect(endpoint, options.connect_timeout_ms));
  client->hello_ = *client->client_.server_hello(endpoint);
  return client;
}

Result<std::string> RpcClient::call_raw(const std::string& type, const std::string& body, int timeout_ms) {
  return client_.call_raw_sync(endpoint_, type, body, timeout_ms < 0 ? options_.default_timeout_ms : timeout_ms);
}

Result<std::optional<Envelope>> RpcClient::recv_push(int timeout_ms) {
  return client_.recv_push(endpoint_, timeout_ms);
}

}  // namespace mc::rpc
