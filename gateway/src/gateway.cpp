#include "mc/gateway/gateway.hpp"

#include <httplib.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <sodium.h>

#include "mc/common/block_key.hpp"
#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/endpoint.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/http_pool.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"

namespace mc::gateway {

using nlohmann::json;

namespace {

int64_t mono_ns() { return RealClock::instance().now_ns(); }

// One event of a request, as the token-event server received it.
struct Event {
  enum class Kind : uint8_t { kToken, kDone, kError };
  Kind kind = Kind::kToken;
  size_t choice = 0;  // which of the request's n choices (cluster requests) it belongs to
  int64_t index = 0;
  uint32_t token = 0;
  std::vector<proto::TokenLogprob> logprobs;
  int64_t arrival_ns = 0;  // mono_ns() at receipt
  proto::RequestLedger ledger;
  uint16_t code = 0;
  std::string message;
};

// A request's inbox: the token-event thread pushes, the HTTP thread pops.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  std::vector<int64_t> next_index;  // per choice: token events below it are duplicates

  explicit Inbox(size_t choices) : next_index(choices, 0) {}

  void push(Event ev) {
    {
      std::lock_guard lock(mu);
      if (ev.choice >= next_index.size()) return;
      if (ev.kind == Event::Kind::kToken) {
        if (ev.index < next_index[ev.choice]) return;
        next_index[ev.choice] = ev.index + 1;
      }
      events.push_back(std::move(ev));
    }
    cv.notify_one();
  }
  // Waits up to `wait_ns` (or until `abort`) for events and takes them all.
  std::deque<Event> take(int64_t wait_ns, const std::atomic<bool>& abort) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::nanoseconds(wait_ns), [&] { return !events.empty() || abort.load(); });
    std::deque<Event> out;
    out.swap(events);
    return out;
  }
};

// RpcClients to the Conductor, one per concurrent caller (RpcClient is not thread-safe).
class ClientPool {
 public:
  explicit ClientPool(std::string endpoint) : endpoint_(std::move(endpoint)) {}

  template <typename Req>
  Result<typename Req::Reply> call(const Req& req, int timeout_ms) {
    std::unique_ptr<rpc::RpcClient> c;
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        c = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!c) {
      rpc::ClientOptions o;
      o.client_name = "mc-gateway";
      o.connect_timeout_ms = std::min(timeout_ms, 2'000);
      o.default_timeout_ms = timeout_ms;
      Result<std::unique_ptr<rpc::RpcClient>> made = rpc::RpcClient::connect(endpoint_, o);
      // The endpoint was checked at start, so a failure here is this process's (no descriptor left, EMFILE) or the
      // network's: the request could not be sent, which is 503, not the client's 400.
      if (!made.is_ok()) return Status(Code::kUnavailable, made.status().message());
      c = std::move(made).value();
    }
    Result<typename Req::Reply> reply = c->call(req, timeout_ms);
    // A client whose call failed on transport is dropped (its socket may hold a late reply).
    if (reply.is_ok() || (reply.status().code() != Code::kTimeout && reply.status().code() != Code::kUnavailable)) {
      std::lock_guard lock(mu_);
      free_.push_back(std::move(c));
    }
    return reply;
  }

 private:
  std::string endpoint_;
  std::mutex mu_;
  std::vector<std::unique_ptr<rpc::RpcClient>> free_;
};

// n hex digits from libsodium's generator (unpredictable, seeded by the kernel, no system call per id).
std::string random_hex(size_t n) {
  std::string bytes((n + 1) / 2, '\0');
  randombytes_buf(bytes.data(), bytes.size());
  std::string s;
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : bytes) {
    s.push_back(kHex[(static_cast<unsigned char>(c) >> 4) & 15]);
    s.push_back(kHex[static_cast<unsigned char>(c) & 15]);
  }
  s.resize(n);
  return s;
}

int64_t unix_s() { return unix_time_ms() / 1000; }

std::string sse(const json& doc) {
  return "data: " + doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

class Gateway {
 public:
  Gateway(GatewayOptions options, Tokenizer tokenizer, std::unordered_map<std::string, std::string> api_keys)
      : o_(std::move(options)), tok_(std::move(tokenizer)), pool_(o_.conductor), api_keys_(std::move(api_keys)) {
    if (sodium_init() < 0) MC_LOG_ERROR << "mc-gateway: libsodium failed to initialise (request ids)";
    if (o_.served_model_name.empty()) o_.served_model_name = tok_.model();
    for (const std::string& a : o_.adapters) {
      const size_t at = a.find('@');
      adapters_[a.substr(0, at)] = at == std::string::npos ? "" : a.substr(at + 1);
    }
    auto& m = metrics_;
    requests_ = &m.counter("mc_gateway_requests_total", "generation requests received (completions and chat)");
    completed_ = &m.counter("mc_gateway_completed_total", "generation requests answered in full");
    rejected_ = &m.counter("mc_gateway_rejected_total", "requests the Conductor rejected early (429)");
    unavailable_ = &m.counter("mc_gateway_unavailable_total", "requests answered 503 (no conductor, instance or slot)");
    bad_ = &m.counter("mc_gateway_bad_requests_total", "requests answered 4xx other than 429");
    failed_ = &m.counter("mc_gateway_failed_total", "accepted requests that ended with an error or a timeout");
    cancels_ = &m.counter("mc_gateway_cancels_total", "conductor.cancel sent (stop, end of sequence, disconnect)");
    disconnects_ = &m.counter("mc_gateway_client_disconnects_total",
                              "requests whose client went away before the answer was complete (streamed or not)");
    prompt_tokens_ = &m.counter("mc_gateway_prompt_tokens_total", "prompt tokens of accepted requests");
    completion_tokens_ = &m.counter("mc_gateway_completion_tokens_total", "tokens sent to clients");
    cached_tokens_ = &m.counter("mc_gateway_cached_tokens_total", "prompt tokens the KV cache served");
    active_ = &m.gauge("mc_gateway_active_requests", "generation requests in flight");
    const auto b = metrics::latency_buckets_s();
    ttft_ = &m.histogram("mc_gateway_ttft_seconds", b, "receipt of the request -> first token written to the client");
    tbt_ = &m.histogram("mc_gateway_tbt_seconds", b, "gaps between tokens written to the client");
    e2e_ = &m.histogram("mc_gateway_e2e_seconds", b, "receipt of the request -> last byte of the answer");
    // The gateway's own time is judged against 1 ms (DESIGN.md §15): finer buckets around it than the latency ones.
    const std::vector<double> fine = {1e-5, 2.5e-5, 5e-5, 1e-4,   2e-4, 3e-4, 4e-4, 5e-4, 6e-4, 7e-4,
                                      8e-4, 9e-4,   1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 1e-2, 0.1,  1};
    submit_overhead_ = &m.histogram("mc_gateway_submit_overhead_seconds", fine,
                                    "gateway time before conductor.submit: receipt of the body -> submit sent");
    token_overhead_ = &m.histogram("mc_gateway_token_overhead_seconds", fine,
                                   "gateway time of a token: token_event received -> its bytes written");
    submit_latency_ = &m.histogram("mc_gateway_submit_seconds", b, "conductor.submit round trip (until accepted)");
    unauthorized_ = &m.counter("mc_gateway_unauthorized_total",
                               "requests refused 401: no or an unknown API key (--api-keys), or no tenant header");
    address_refused_ = &m.counter("mc_gateway_address_refused_connections_total",
                                  "connections refused 429 at once: their client address held "
                                  "--max-connections-per-address already");
    tenant_limited_ = &m.counter("mc_gateway_tenant_limited_total",
                                 "requests refused 429: their tenant had --max-requests-per-tenant in flight");
    const bool tenants = !api_keys_.empty() || !o_.tenant_header.empty();
    per_tenant_cap_ = o_.max_requests_per_tenant >= 0 ? o_.max_requests_per_tenant
                      : tenants                       ? std::max<int64_t>(1, o_.max_requests / 2)
                                                      : 0;
    per_address_cap_ = o_.max_connections_per_address >= 0 ? o_.max_connections_per_address
                       : !api_keys_.empty() ? std::max<int64_t>(1, static_cast<int64_t>(o_.max_connections) / 4)
                                            : 0;
    // Each user tenant's blocks are keyed in a namespace of its own inside the gateway's: with keys the Conductor
    // admits only "tenant/<the gateway's tenant>/..." from it (docs/SECURITY.md "Cache isolation").
    const auto ring = auth::process_keyring();
    salt_base_ = ring != nullptr && ring->self().role == auth::Role::kClient ? "tenant/" + ring->self().tenant
                                                                             : std::string("gateway");
  }

  Status start() {
    MC_ASSIGN_OR_RETURN(Endpoint http, parse_tcp_endpoint(o_.listen));
    MC_RETURN_IF_ERROR(auth::check_listen_plain("mc-gateway", http.host));
    // The token-event endpoint.
    rpc::ServerOptions so;
    so.service = "mc-gateway client";
    so.bind_endpoints = {o_.client_bind};
    so.serve_with_own_key = true;  // a tenant's client holds no cluster key (docs/SECURITY.md)
    Result<std::unique_ptr<rpc::RpcServer>> server = rpc::RpcServer::bind(so);
    if (!server.is_ok()) return server.status().with_context("binding the token-event endpoint (--client-bind)");
    events_ = std::move(server).value();
    client_endpoint_ = events_->endpoints().front();
    register_event_handlers();
    cancel_thread_ = std::thread([this] { cancel_loop(); });
    events_thread_ = std::thread([this] {
      Status st = events_->serve();
      if (!st.is_ok()) MC_LOG_ERROR << "mc-gateway: token-event endpoint stopped: " << st.to_string();
    });
    // HTTP.
    // --max-connections workers; when as many accepted connections wait again, the listener stops accepting and the
    // kernel's backlog holds the rest (http_pool.hpp).
    http_.new_task_queue = [n = o_.max_connections] { return new http::BoundedPool(n, n); };
    http::no_shared_port(http_);
    http_.set_payload_max_length(o_.max_body_bytes);
    http_.set_read_timeout(std::chrono::milliseconds(o_.read_timeout_ms));
    http_.set_request_deadline_ms(o_.read_timeout_ms);  // headers and body, from the first byte (slowloris)
    http_.set_write_timeout(std::chrono::seconds(10));
    http_.set_keep_alive_timeout(o_.keep_alive_timeout_s);
    http_.set_keep_alive_max_count(10'000);
    http_.set_tcp_nodelay(true);
    http_.set_max_connections_per_address(static_cast<size_t>(per_address_cap_), "mc-gateway", address_refused_);
    register_routes();
    const std::string host = http.host == "*" ? "0.0.0.0" : http.host;
    int port = http.port;
    if (port == 0) {
      port = http_.bind_to_any_port(host);
    } else if (!http_.bind_to_port(host, port)) {
      port = -1;
    }
    if (port <= 0) {
      stop_cancels();
      stop_events();
      return Status(Code::kUnavailable, "mc-gateway: cannot listen on " + o_.listen +
                                            " (address in use or not local?): pick another --listen");
    }
    url_ = "http://" + format_host_port(host, static_cast<uint16_t>(port));
    http_thread_ = std::thread([this] {
      http_.listen_after_bind();
      http_done_.store(true);
    });
    return Status::ok();
  }

  const std::string& url() const { return url_; }
  const std::string& served_model_name() const { return o_.served_model_name; }
  std::string tokenizer_kind() const { return tok_.kind(); }
  const metrics::Registry& registry() const { return metrics_; }

  // Drain (see gateway.hpp): stop accepting, let requests finish for drain_timeout_s, then end the rest.
  void drain() {
    const int64_t in_flight = static_cast<int64_t>(active_->value());
    MC_LOG_INFO << "mc-gateway: draining: no new connections; " << in_flight << " requests in flight get up to "
                << o_.drain_timeout_s << " s";
    draining_.store(true);
    http_.stop();
    const int64_t deadline = mono_ns() + o_.drain_timeout_s * 1'000'000'000;
    while (!http_done_.load() && mono_ns() < deadline && active_->value() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (active_->value() > 0) {
      MC_LOG_WARN << "mc-gateway: drain timeout: cancelling " << active_->value() << " requests still in flight";
    }
    abort_.store(true);
    {
      std::lock_guard lock(inbox_mu_);
      for (auto& [id, entry] : inboxes_) entry.first->cv.notify_all();
    }
    if (http_thread_.joinable()) http_thread_.join();
    stop_cancels();
    stop_events();
  }

  ~Gateway() {
    if (http_thread_.joinable()) {
      abort_.store(true);
      http_.stop();
      http_thread_.join();
    }
    stop_cancels();
    stop_events();
  }

 private:
  // A request in flight: its inbox, the request and the clock of its answer.
  // One of a request's n choices: a cluster request of its own.
  struct Choice {
    std::string id;  // the cluster request id
    std::unique_ptr<AnswerBuilder> answer;
    std::unique_ptr<LogprobsBuilder> logprobs;  // null: not asked
    std::string text;                           // a whole response's text so far
    bool ended = false;                         // the cluster finished or failed it, or it was cancelled
    bool submitted = false;                     // accepted by the Conductor
    bool final_sent = false;                    // a stream's chunk with its finish_reason was written
    int64_t cached_tokens = 0;
  };
  // A request in flight: its inbox, the request, its choices and the clock of its answer.
  struct Flight {
    std::string id;         // the first choice's cluster request id (logs)
    std::string object_id;  // "cmpl-…" / "chatcmpl-…"
    GenerationRequest req;
    std::shared_ptr<Inbox> inbox;
    std::vector<Choice> choices;
    int64_t received_ns = 0;
    int64_t last_token_ns = 0;
    int64_t deadline_ns = 0;
    bool first_sent = false;  // the stream's opening (status line, headers, first chunk) was written
    bool released = false;    // finish_flight ran
    std::string tenant;       // the user tenant charged for its slots ("": none)
    Usage usage;
    bool all_finished() const {
      return std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.answer->finished(); });
    }
    bool all_ended() const {
      return std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.ended; });
    }
    int64_t completion_tokens() const {
      int64_t n = 0;
      for (const Choice& c : choices) n += c.answer->completion_tokens();
      return n;
    }
  };

  void stop_events() {
    if (events_) events_->stop();
    if (events_thread_.joinable()) events_thread_.join();
  }

  void register_event_handlers() {
    events_->handle<proto::TokenEvent>([this](const proto::TokenEvent& ev, const rpc::CallContext&) {
      Event e;
      e.kind = Event::Kind::kToken;
      e.index = ev.index;
      e.token = ev.token;
      if (ev.logprobs.size() <= static_cast<size_t>(proto::kMaxTopLogprobs) + 1) e.logprobs = ev.logprobs;
      e.arrival_ns = mono_ns();
      deliver(ev.request_id, std::move(e));
      return Result<proto::ClientAck>(proto::ClientAck{});
    });
    events_->handle<proto::RequestDone>([this](const proto::RequestDone& done, const rpc::CallContext&) {
      Event e;
      e.kind = Event::Kind::kDone;
      e.ledger = done.ledger;
      e.arrival_ns = mono_ns();
      deliver(done.request_id, std::move(e));
      return Result<proto::ClientAck>(proto::ClientAck{});
    });
    events_->handle<proto::RequestError>([this](const proto::RequestError& err, const rpc::CallContext&) {
      Event e;
      e.kind = Event::Kind::kError;
      e.code = err.code;
      e.message = err.message;
      e.arrival_ns = mono_ns();
      deliver(err.request_id, std::move(e));
      return Result<proto::ClientAck>(proto::ClientAck{});
    });
  }

  void deliver(const std::string& id, Event e) {
    std::shared_ptr<Inbox> inbox;
    {
      std::lock_guard lock(inbox_mu_);
      auto it = inboxes_.find(id);
      if (it == inboxes_.end()) return;  // finished, cancelled or not ours: nothing waits for it
      inbox = it->second.first;
      e.choice = it->second.second;
    }
    inbox->push(std::move(e));
  }

  // ---- HTTP ----
  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
    res.set_content(error_document(e).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  // The user tenant of a request (--api-keys or --tenant-header); "" when the gateway has neither (one namespace for
  // all). nullopt: refused, *why says so.
  std::optional<std::string> user_tenant(const httplib::Request& rq, std::string* why) const {
    if (!api_keys_.empty()) {
      const std::string auth = rq.get_header_value("Authorization");
      constexpr std::string_view kBearer = "Bearer ";
      if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) {
        *why = "no API key: send 'Authorization: Bearer KEY' with a key the operator gave you (mc-gateway --api-keys)";
        return std::nullopt;
      }
      auto it = api_keys_.find(auth.substr(kBearer.size()));
      if (it == api_keys_.end()) {
        *why = "unknown API key (mc-gateway --api-keys lists the keys it takes)";
        return std::nullopt;
      }
      return it->second;
    }
    if (!o_.tenant_header.empty()) {
      if (rq.get_header_value_count(o_.tenant_header) > 1) {
        // A proxy that appends the header instead of replacing it would let the client name a tenant first.
        *why = "the header '" + o_.tenant_header + "' comes more than once (the proxy in front must replace it)";
        return std::nullopt;
      }
      const std::string t = rq.get_header_value(o_.tenant_header);
      if (!auth::valid_name(t)) {
        *why = "the header '" + o_.tenant_header +
               "' must name the request's tenant ([A-Za-z0-9_.-]{1,64}; set by the " +
               "proxy in front of mc-gateway, --tenant-header)";
        return std::nullopt;
      }
      return t;
    }
    return std::string();
  }
  static bool needs_tenant(const std::string& path) {
    return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
  }

  void register_routes() {
    // Authentication first (--api-keys / --tenant-header): 401 in OpenAI's shape, counted and logged (rate limited)
    // with the peer's address; /health and /metrics stay open.
    if (!api_keys_.empty() || !o_.tenant_header.empty()) {
      http_.set_pre_routing_handler([this](const httplib::Request& rq, httplib::Response& rs) {
        if (!needs_tenant(rq.path)) return httplib::Server::HandlerResponse::Unhandled;
        std::string why;
        if (user_tenant(rq, &why)) return httplib::Server::HandlerResponse::Unhandled;
        unauthorized_->inc();
        if (log::nth_worth_logging(unauthorized_->value())) {
          MC_LOG_WARN << "mc-gateway: refused " << rq.method << " " << rq.path << " from " << rq.remote_addr << ":"
                      << rq.remote_port << ": " << why << " (" << unauthorized_->value() << " refused)";
        }
        ApiError e;
        e.http_status = 401;
        e.code = "invalid_api_key";
        e.message = why;
        rs.status = 401;
        if (!api_keys_.empty()) rs.set_header("WWW-Authenticate", "Bearer");
        send_error(rs, e);
        return httplib::Server::HandlerResponse::Handled;
      });
    }
    http_.Post("/v1/completions",
               [this](const httplib::Request& rq, httplib::Response& rs) { generate(rq, rs, /*chat=*/false); });
    http_.Post("/v1/chat/completions",
               [this](const httplib::Request& rq, httplib::Response& rs) { generate(rq, rs, /*chat=*/true); });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& rs) { models(rs); });
    http_.Get(R"(/v1/models/(.+))",
              [this](const httplib::Request& rq, httplib::Response& rs) { model(rq.matches[1].str(), rs); });
    http_.Post("/tokenize", [this](const httplib::Request& rq, httplib::Response& rs) { tokenize(rq, rs); });
    http_.Post("/detokenize", [this](const httplib::Request& rq, httplib::Response& rs) { detokenize(rq, rs); });
    http_.Get("/health", [this](const httplib::Request&, httplib::Response& rs) { health(rs); });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& rs) {
      rs.set_content(metrics_.prometheus_text(), "text/plain; version=0.0.4");
    });
    // Unrouted paths, wrong methods and the library's own errors (413, 400) in OpenAI's error shape.
    http_.set_error_handler([](const httplib::Request& rq, httplib::Response& rs) {
      if (!rs.body.empty()) return;  // a route's own error document (called for every status >= 400)
      ApiError e;
      // A known path asked with another method: 405 with the method it takes (Allow), not "no route".
      static const std::map<std::string, std::string> kMethod = {
          {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
          {"/tokenize", "POST"},       {"/detokenize", "POST"},
          {"/v1/models", "GET"},       {"/health", "GET"},
          {"/metrics", "GET"}};
      const auto known = kMethod.find(rq.path);
      const std::string allow = known != kMethod.end()                 ? known->second
                                : rq.path.rfind("/v1/models/", 0) == 0 ? "GET"
                                                                       : "";
      if (rs.status == 404 && !allow.empty() && rq.method != allow) {
        rs.status = 405;
        rs.set_header("Allow", allow);
        e.message = rq.method + " is not served on this path: send " + allow;
        e.code = "method_not_allowed";
      }
      e.http_status = rs.status;
      if (rs.status == 405) {
        // set above
      } else if (rs.status == 404) {
        e.message =
            "no route " + rq.method + " " + rq.path +
            " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/ID, POST /tokenize, "
            "POST /detokenize, GET /health, GET /metrics)";
        e.code = "not_found";
      } else if (rs.status == 413) {
        e.message = "the request body is larger than --max-body-bytes";
      } else {
        e.message = "HTTP " + std::to_string(rs.status);
      }
      if (rs.status >= 500) e.type = "server_error";
      send_error(rs, e);
    });
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& rs, std::exception_ptr) {
      ApiError e;
      e.http_status = 500;
      e.type = "server_error";
      e.message = "internal error in mc-gateway";
      send_error(rs, e);
    });
  }

  // The Conductor's status document, at most 1 s old; null when it cannot be had.
  json conductor_status() {
    std::lock_guard lock(status_mu_);
    const int64_t now = mono_ns();
    if (now - status_at_ns_ < 1'000'000'000) return status_;
    Result<proto::ConductorStatusReply> r = pool_.call(proto::ConductorStatusRequest{true}, 2'000);
    status_at_ns_ = now;
    status_ = r.is_ok() ? json::parse(r->status_json, nullptr, false) : json();
    if (status_.is_discarded()) status_ = json();
    status_error_ = r.is_ok() ? "" : r.status().message();
    return status_;
  }

  static std::pair<int, int> live_instances(const json& status) {
    int prefill = 0, decode = 0;
    if (!status.is_object() || !status.contains("instances")) return {0, 0};
    for (const json& i : status["instances"]) {
      (i.value("role", "") == "prefill" ? prefill : decode) += 1;
    }
    return {prefill, decode};
  }

  void health(httplib::Response& rs) {
    const json st = conductor_status();
    const auto [prefill, decode] = live_instances(st);
    // The cluster's shape, not its addresses: the client port is reachable by anyone the gateway serves.
    json doc = {{"status", "ok"}, {"prefill_instances", prefill}, {"decode_instances", decode}};
    if (draining_.load()) {
      doc["status"] = "draining";
    } else if (st.is_null()) {
      doc["status"] = "scheduler unreachable";
      MC_LOG_DEBUG << "mc-gateway: /health: the Conductor at " << o_.conductor << ": " << status_error_;
    } else if (prefill == 0 || decode == 0) {
      doc["status"] = "no live prefill or decode instance";
    }
    rs.status = doc["status"] == "ok" ? 200 : 503;
    rs.set_content(doc.dump(), "application/json");
  }

  // The served model and its adapters, as /v1/models lists them.
  json model_objects() const {
    const int64_t created = 0;
    json data = json::array();
    data.push_back({{"id", o_.served_model_name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "mc"},
                    {"root", tok_.model()},
                    {"parent", nullptr},
                    {"max_model_len", tok_.max_context_tokens()}});
    for (const auto& [name, version] : adapters_) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "mc"},
                      {"root", o_.served_model_name},
                      {"parent", o_.served_model_name},
                      {"max_model_len", tok_.max_context_tokens()},
                      {"lora_version", version}});
    }
    return data;
  }

  void models(httplib::Response& rs) {
    rs.set_content(
        json{{"object", "list"}, {"data", model_objects()}}.dump(-1, ' ', false, json::error_handler_t::replace),
        "application/json");
  }

  void model(const std::string& id, httplib::Response& rs) {
    for (const json& m : model_objects()) {
      if (m["id"] == id)
        return rs.set_content(m.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    }
    ApiError e;
    e.http_status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = "model '" + (id.size() > 256 ? id.substr(0, 256) + "..." : id) +
                "' does not exist here (GET /v1/models lists the served model" +
                (adapters_.empty() ? "" : " and its adapters") + ")";
    refuse(rs, e);
  }

  // The served model's name or one of its adapters ("" or absent: the served model). false: refused into rs.
  bool known_model(const json& body, httplib::Response& rs) {
    if (!body.contains("model") || body["model"].is_null()) return true;
    if (body["model"].is_string()) {
      const std::string m = body["model"].get<std::string>();
      if (m == o_.served_model_name || adapters_.count(m) != 0) return true;
    }
    ApiError e;
    e.http_status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = "'model' names no model served here (GET /v1/models)";
    refuse(rs, e);
    return false;
  }

  // POST /tokenize, shaped like vLLM's: {prompt, add_special_tokens (true)} or {messages, add_generation_prompt
  // (true), add_special_tokens (false)} -> {count, max_model_len, tokens}; with return_token_strs, token_strs.
  void tokenize(const httplib::Request& rq, httplib::Response& rs) {
    ApiError err;
    Result<json> parsed = parse_body(rq.body, tok_, &err);
    if (!parsed.is_ok()) return refuse(rs, err);
    const json& body = parsed.value();
    auto bad = [&](const std::string& param, const std::string& message) {
      ApiError e;
      e.param = param;
      e.message = message;
      refuse(rs, e);
    };
    if (!body.is_object()) return bad("", "the request body must be a JSON object");
    for (const auto& [key, value] : body.items()) {
      static const std::set<std::string> kKnown = {"model",
                                                   "prompt",
                                                   "messages",
                                                   "add_special_tokens",
                                                   "add_generation_prompt",
                                                   "return_token_strs",
                                                   "chat_template_kwargs"};
      if (kKnown.count(key) == 0) return bad(key, "unrecognized argument '" + key + "' of /tokenize");
    }
    if (!known_model(body, rs)) return;
    for (const char* f : {"add_special_tokens", "add_generation_prompt", "return_token_strs"}) {
      if (body.contains(f) && !body[f].is_boolean()) return bad(f, std::string("'") + f + "' must be a boolean");
    }
    std::vector<uint32_t> ids;
    if (body.contains("messages")) {
      if (body.contains("prompt")) return bad("prompt", "send 'prompt' or 'messages', not both");
      // The same checks and template as a chat completion: with the defaults, its prompt is what a chat request
      // prefills (however long: /tokenize counts, it does not bound).
      Result<std::vector<uint32_t>> chat = chat_prompt_tokens(body, tok_, body.value("add_generation_prompt", true),
                                                              body.value("add_special_tokens", false), &err);
      if (!chat.is_ok()) return refuse(rs, err);
      ids = std::move(chat).value();
    } else {
      if (!body.contains("prompt") || !body["prompt"].is_string()) return bad("prompt", "'prompt' must be a string");
      ids = tok_.encode(body["prompt"].get<std::string>(), body.value("add_special_tokens", true));
    }
    json doc = {{"count", ids.size()}, {"max_model_len", tok_.max_context_tokens()}, {"tokens", ids}};
    if (body.value("return_token_strs", false)) {
      json strs = json::array();
      for (uint32_t id : ids) strs.push_back(tok_.decode(std::span<const uint32_t>(&id, 1)));
      doc["token_strs"] = strs;
    }
    rs.set_content(doc.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  // POST /detokenize, shaped like vLLM's: {tokens: [ids]} -> {prompt: text}.
  void detokenize(const httplib::Request& rq, httplib::Response& rs) {
    ApiError err;
    Result<json> parsed = parse_body(rq.body, tok_, &err);
    if (!parsed.is_ok()) return refuse(rs, err);
    const json& body = parsed.value();
    ApiError e;
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
      e.param = "tokens";
      e.message = "'tokens' is required: an array of token ids";
      return refuse(rs, e);
    }
    for (const auto& [key, value] : body.items()) {
      if (key != "model" && key != "tokens") {
        e.param = key;
        e.message = "unrecognized argument '" + key + "' of /detokenize";
        return refuse(rs, e);
      }
    }
    if (!known_model(body, rs)) return;
    std::vector<uint32_t> ids;
    for (const json& v : body["tokens"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok_.vocab_size()) {
        e.param = "tokens";
        e.message = "'tokens' must hold token ids in [0, " + std::to_string(tok_.vocab_size()) + ")";
        return refuse(rs, e);
      }
      ids.push_back(static_cast<uint32_t>(v.get<int64_t>()));
    }
    rs.set_content(json{{"prompt", tok_.decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                   "application/json");
  }

  // 4xx other than 429 and 503s are counted here.
  void refuse(httplib::Response& rs, const ApiError& e) {
    (e.http_status == 503 ? unavailable_ : e.http_status == 429 ? rejected_ : bad_)->inc();
    send_error(rs, e);
  }

  void generate(const httplib::Request& rq, httplib::Response& rs, bool chat) {
    const int64_t received = mono_ns();
    requests_->inc();
    ApiError err;
    if (draining_.load()) {
      err.http_status = 503;
      err.type = "server_error";
      err.message = "mc-gateway is draining (SIGTERM): send the request to another gateway";
      return refuse(rs, err);
    }
    Result<json> body = parse_body(rq.body, tok_, &err);
    if (!body.is_ok()) return refuse(rs, err);
    Result<GenerationRequest> parsed = parse_generation(body.value(), chat, tok_, o_.limits, &err);
    if (!parsed.is_ok()) return refuse(rs, err);
    auto f = std::make_shared<Flight>();
    f->req = std::move(parsed).value();
    f->received_ns = received;
    f->deadline_ns = received + o_.request_timeout_ms * 1'000'000;
    RequestKeyScope scope;
    if (f->req.model != o_.served_model_name) {
      auto it = adapters_.find(f->req.model);
      if (it == adapters_.end()) {
        err.http_status = 404;
        err.param = "model";
        err.code = "model_not_found";
        err.message = "model '" + f->req.model + "' does not exist here (GET /v1/models lists " + o_.served_model_name +
                      (adapters_.empty() ? "" : " and its adapters") + ")";
        return refuse(rs, err);
      }
      scope.lora_name = it->first;
      scope.lora_version = it->second;
    }
    // The user's tenant (--api-keys, --tenant-header): its slots and its KV namespace.
    std::string why;
    const std::string tenant = user_tenant(rq, &why).value_or(std::string());
    // Slots: one per choice (each is a cluster request); first the tenant's, then the gateway's.
    const int64_t n = f->req.n;
    if (!take_tenant_slots(tenant, n)) {
      tenant_limited_->inc();
      if (log::nth_worth_logging(tenant_limited_->value())) {
        MC_LOG_WARN << "mc-gateway: refused a request of tenant '" << tenant << "' from " << rq.remote_addr << ":"
                    << rq.remote_port << ": it has " << per_tenant_cap_
                    << " requests in flight already (--max-requests-per-tenant; " << tenant_limited_->value()
                    << " refused)";
      }
      err.http_status = 429;
      err.type = "rate_limit_exceeded";
      err.code = "too_many_requests";
      err.message = "your tenant has " + std::to_string(per_tenant_cap_) +
                    " requests in flight, the most one tenant may have here: retry when one ends";
      err.retry_after_s = 1;
      return send_error(rs, err);  // counted in mc_gateway_tenant_limited_total, not as the Conductor's 429
    }
    f->tenant = tenant;
    if (active_count_.fetch_add(n) + n > o_.max_requests) {
      release_tenant_slots(tenant, n);
      active_count_.fetch_sub(n);
      err.http_status = 503;
      err.type = "server_error";
      err.message =
          "mc-gateway has " + std::to_string(o_.max_requests) + " requests in flight (--max-requests): retry shortly";
      return refuse(rs, err);
    }
    active_->add(static_cast<double>(n));
    // Ids no other client can guess (docs/SECURITY.md "Request ids"): 96 random bits each.
    const std::string base = "gw-" + random_hex(24);
    f->id = base;
    f->object_id = (chat ? "chatcmpl-" : "cmpl-") + base;
    f->inbox = std::make_shared<Inbox>(static_cast<size_t>(n));
    // Seeds: as given (choice i: seed + i, so one seed gives the same n texts), else drawn per request when sampling.
    uint64_t seed = f->req.sampling.seed;
    if (!f->req.seed_given) seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    f->choices.resize(static_cast<size_t>(n));
    {
      std::lock_guard lock(inbox_mu_);
      for (int64_t i = 0; i < n; ++i) {
        Choice& c = f->choices[static_cast<size_t>(i)];
        c.id = n == 1 ? base : base + "-" + std::to_string(i);
        c.answer = std::make_unique<AnswerBuilder>(tok_, f->req);
        if (f->req.logprobs) c.logprobs = std::make_unique<LogprobsBuilder>(tok_, chat);
        inboxes_[c.id] = {f->inbox, static_cast<size_t>(i)};
      }
    }
    proto::ConductorSubmitRequest sub;
    sub.input_tokens = static_cast<int64_t>(f->req.prompt_tokens.size());
    sub.output_tokens = f->req.max_tokens;
    sub.tokens = f->req.prompt_tokens;
    sub.slo_ttft_ms = f->req.slo_ttft_ms > 0 ? f->req.slo_ttft_ms : o_.slo_ttft_ms;
    sub.slo_tbt_ms = f->req.slo_tbt_ms > 0 ? f->req.slo_tbt_ms : o_.slo_tbt_ms;
    sub.client_endpoint = client_endpoint_;
    sub.lora_name = scope.lora_name;
    sub.lora_version = scope.lora_version;
    // The user's tenant namespace, with the request's own salt inside it.
    sub.salt =
        tenant.empty() ? f->req.salt : salt_base_ + "/" + tenant + (f->req.salt.empty() ? "" : "/" + f->req.salt);
    sub.sampling = f->req.sampling;
    for (int64_t i = 0; i < n; ++i) {
      Choice& c = f->choices[static_cast<size_t>(i)];
      sub.request_id = c.id;
      sub.sampling.seed = seed + static_cast<uint64_t>(i);
      const int64_t sent = mono_ns();
      if (i == 0) submit_overhead_->observe(static_cast<double>(sent - received) * 1e-9);
      Result<proto::ConductorSubmitReply> reply = pool_.call(sub, static_cast<int>(o_.submit_timeout_ms));
      submit_latency_->observe(static_cast<double>(mono_ns() - sent) * 1e-9);
      if (!reply.is_ok() || !reply->accepted) {
        // The choices already accepted are ended in the cluster: the request is answered as one.
        for (Choice& other : f->choices) {
          if (other.submitted) cancel(other);
        }
        finish_flight(*f);
        return refuse(rs, submit_error(*f, reply));
      }
      c.submitted = true;
    }
    f->usage.prompt_tokens = sub.input_tokens;
    prompt_tokens_->inc(static_cast<uint64_t>(sub.input_tokens));
    if (f->req.stream) {
      stream(f, rs);
    } else {
      whole(f, rs);
    }
  }

  ApiError submit_error(const Flight& f, const Result<proto::ConductorSubmitReply>& reply) {
    ApiError e;
    if (!reply.is_ok()) {
      const Status& st = reply.status();
      if (st.code() == Code::kInvalidArgument) {
        e.http_status = 400;
        e.message = "the Conductor refused the request: " + st.message();
      } else if (st.code() == Code::kPermissionDenied) {
        e.http_status = 403;
        e.type = "permission_error";
        e.message = "the Conductor refused the request: " + st.message();
      } else {
        e.http_status = 503;
        e.type = "server_error";
        e.code = "scheduler_unavailable";
        MC_LOG_DEBUG << "request '" << f.id << "': the Conductor at " << o_.conductor
                     << " did not take it: " << st.message();
        e.message = "the scheduler did not take the request (unreachable or too slow to answer); retry later";
      }
      return e;
    }
    const proto::ConductorSubmitReply& r = *reply;
    // The client reads a fixed text per reason; the Conductor's explanation names instances and where the prefix
    // was found, so it stays in the Conductor's decision log and this log at debug level.
    MC_LOG_DEBUG << "request '" << f.id << "' rejected by the Conductor (" << r.reject_reason << "): " << r.reason;
    return rejection_error(r.reject_reason, r.reason, r.predicted_ttft_ms,
                           f.req.slo_ttft_ms > 0 ? f.req.slo_ttft_ms : o_.slo_ttft_ms);
  }

  // The request left the gateway's books (its inbox entries unregistered, its slots freed). Idempotent per flight.
  void finish_flight(Flight& f) {
    {
      std::lock_guard lock(inbox_mu_);
      if (f.released) return;
      f.released = true;
      for (const Choice& c : f.choices) inboxes_.erase(c.id);
    }
    active_count_.fetch_sub(static_cast<int64_t>(f.choices.size()));
    active_->add(-static_cast<double>(f.choices.size()));
    release_tenant_slots(f.tenant, static_cast<int64_t>(f.choices.size()));
  }

  // n of the tenant's --max-requests-per-tenant slots (true; always without a cap or a tenant), or none (false).
  bool take_tenant_slots(const std::string& tenant, int64_t n) {
    if (per_tenant_cap_ <= 0 || tenant.empty()) return true;
    std::lock_guard lock(tenant_mu_);
    int64_t& held = tenant_active_[tenant];
    if (held + n > per_tenant_cap_) {
      if (held == 0) tenant_active_.erase(tenant);
      return false;
    }
    held += n;
    return true;
  }
  void release_tenant_slots(const std::string& tenant, int64_t n) {
    if (per_tenant_cap_ <= 0 || tenant.empty()) return;
    std::lock_guard lock(tenant_mu_);
    auto it = tenant_active_.find(tenant);
    if (it == tenant_active_.end()) return;
    it->second -= n;
    if (it->second <= 0) tenant_active_.erase(it);
  }

  // Ends a choice in the cluster (stop, EOS, disconnect, timeout, drain) without waiting: the cancel thread
  // sends conductor.cancel, so the client's last bytes never wait for that round trip. Once per choice.
  void cancel(Choice& c) {
    if (c.ended) return;
    c.ended = true;
    if (!c.submitted) return;
    cancels_->inc();
    {
      std::lock_guard lock(cancel_mu_);
      cancel_queue_.push_back(c.id);
    }
    cancel_cv_.notify_one();
  }
  void cancel_all(Flight& f) {
    for (Choice& c : f.choices) cancel(c);
  }

  void cancel_loop() {
    std::unique_lock lock(cancel_mu_);
    for (;;) {
      cancel_cv_.wait(lock, [&] { return !cancel_queue_.empty() || cancel_stop_; });
      if (cancel_queue_.empty()) return;
      const std::string id = std::move(cancel_queue_.front());
      cancel_queue_.pop_front();
      lock.unlock();
      Result<proto::ConductorCancelReply> r = pool_.call(proto::ConductorCancelRequest{id}, 2'000);
      if (!r.is_ok()) MC_LOG_DEBUG << "mc-gateway: cancel of '" << id << "': " << r.status().message();
      lock.lock();
    }
  }

  // Sends the cancels still queued (a bounded wait), then ends the cancel thread.
  void stop_cancels() {
    {
      std::lock_guard lock(cancel_mu_);
      cancel_stop_ = true;
    }
    cancel_cv_.notify_all();
    if (cancel_thread_.joinable()) cancel_thread_.join();
  }

  // What an event does to its choice's answer. Returns the text to send; sets *error for a failure event.
  std::string apply(Flight& f, const Event& ev, std::optional<ApiError>* error) {
    Choice& c = f.choices.at(ev.choice);
    AnswerBuilder& answer = *c.answer;
    switch (ev.kind) {
      case Event::Kind::kToken: {
        if (answer.finished()) return {};
        if (c.logprobs) c.logprobs->add(ev.token, ev.logprobs);
        std::string text = answer.on_token(ev.token);
        if (answer.finished()) cancel(c);  // a stop string or end of sequence: the rest is not wanted
        return text;
      }
      case Event::Kind::kDone: {
        c.ended = true;
        c.cached_tokens = ev.ledger.hit_tokens;
        if (ev.choice == 0) {
          f.usage.cached_tokens = ev.ledger.hit_tokens;
          cached_tokens_->inc(static_cast<uint64_t>(std::max<int64_t>(0, ev.ledger.hit_tokens)));
        }
        return answer.on_done();
      }
      case Event::Kind::kError: {
        c.ended = true;
        if (answer.finished()) return {};  // our own cancel's echo
        ApiError e;
        e.http_status = 500;
        e.type = "server_error";
        e.code = std::string(code_name(static_cast<Code>(ev.code)));
        // A fixed text: the cluster's own (the instance lost, its endpoint, the placement a re-dispatch tried) is the
        // operator's, in the Conductor's log and here at debug level.
        MC_LOG_DEBUG << "request '" << c.id << "' failed in the cluster (" << e.code << "): " << ev.message;
        e.message = "the request failed in the cluster (" + e.code + ") after it was accepted; retry it";
        *error = e;
        return {};
      }
    }
    return {};
  }

  void observe_token_written(Flight& f, int64_t arrival_ns, bool produced) {
    const int64_t now = mono_ns();
    if (produced) {
      token_overhead_->observe(static_cast<double>(now - arrival_ns) * 1e-9);
      if (f.last_token_ns == 0) {
        ttft_->observe(static_cast<double>(now - f.received_ns) * 1e-9);
      } else {
        tbt_->observe(static_cast<double>(now - f.last_token_ns) * 1e-9);
      }
      f.last_token_ns = now;
    }
  }

  void whole(const std::shared_ptr<Flight>& f, httplib::Response& rs) {
    std::optional<ApiError> error;
    // Until every choice is finished (stop, end of sequence, max_tokens) and the cluster is done with it, or a failure.
    while (!(f->all_finished() && f->all_ended()) && !error) {
      if (abort_.load() || mono_ns() > f->deadline_ns) break;
      if (http::DeadlineServer::client_gone()) {
        // Nobody will read the answer: end the request in the cluster (its KV freed, a queued prefill dropped),
        // as a stream's disconnect does.
        disconnects_->inc();
        cancel_all(*f);
        finish_flight(*f);
        ApiError e;  // for a client that only half-closed; one that left reads nothing
        e.http_status = 499;
        e.type = "client_closed";
        e.message = "the client closed its connection before the answer was complete; the request was cancelled";
        return send_error(rs, e);
      }
      for (const Event& ev : f->inbox->take(o_.heartbeat_ms * 1'000'000, abort_)) {
        const int64_t before = f->completion_tokens();
        f->choices.at(ev.choice).text += apply(*f, ev, &error);
        observe_token_written(*f, ev.arrival_ns, f->completion_tokens() > before);
        if (error) break;
      }
    }
    if (!f->all_finished() || error) cancel_all(*f);
    finish_flight(*f);
    if (!f->all_finished() && !error) {
      failed_->inc();
      ApiError e;
      e.http_status = abort_.load() ? 503 : 504;
      e.type = "server_error";
      e.message = abort_.load() ? "mc-gateway shut down before the answer was complete"
                                : "the answer was not complete within --request-timeout-ms (" +
                                      std::to_string(o_.request_timeout_ms) + " ms); the request was cancelled";
      return send_error(rs, e);
    }
    if (error) {
      failed_->inc();
      return send_error(rs, *error);
    }
    completed_->inc();
    f->usage.completion_tokens = f->completion_tokens();
    completion_tokens_->inc(static_cast<uint64_t>(f->usage.completion_tokens));
    e2e_->observe(static_cast<double>(mono_ns() - f->received_ns) * 1e-9);
    std::vector<ChoiceResult> results;
    for (const Choice& c : f->choices) {
      results.push_back(
          {f->req.echo_text + c.text, c.answer->finish_reason(), c.logprobs ? c.logprobs->document() : json(nullptr)});
    }
    rs.set_content(completion_document(f->req.chat, f->object_id, unix_s(), f->req.model, results, f->usage)
                       .dump(-1, ' ', false, json::error_handler_t::replace),
                   "application/json");
  }

  void stream(const std::shared_ptr<Flight>& f, httplib::Response& rs) {
    auto done = std::make_shared<bool>(false);
    rs.set_header("Cache-Control", "no-cache");
    rs.set_header("X-Accel-Buffering", "no");
    const int64_t created = unix_s();
    rs.set_chunked_content_provider(
        "text/event-stream",
        [this, f, done, created](size_t, httplib::DataSink& sink) -> bool {
          auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
          if (*done) {
            sink.done();
            return true;
          }
          const bool chat = f->req.chat;
          if (!f->first_sent) {
            // The status line and headers go out now (the client learns it was accepted), with each choice's chat role
            // chunk or echoed prompt, or a comment for a completion.
            f->first_sent = true;
            std::string opening;
            for (size_t i = 0; i < f->choices.size(); ++i) {
              if (chat) {
                opening += sse(
                    chunk_document(true, f->object_id, created, f->req.model, "", "", true, static_cast<int64_t>(i)));
              } else if (f->req.echo) {
                opening += sse(chunk_document(false, f->object_id, created, f->req.model, f->req.echo_text, "", false,
                                              static_cast<int64_t>(i)));
              }
            }
            if (opening.empty()) opening = ": accepted\n\n";
            return write(opening);
          }
          std::optional<ApiError> error;
          std::deque<Event> events = f->inbox->take(o_.heartbeat_ms * 1'000'000, abort_);
          if (events.empty()) {
            if (abort_.load() || mono_ns() > f->deadline_ns) {
              ApiError e;
              e.http_status = 504;
              e.type = "server_error";
              e.message = abort_.load() ? "mc-gateway shut down before the answer was complete"
                                        : "the answer was not complete within --request-timeout-ms";
              error = e;
            } else {
              // Keep-alive comment: a client that went away is found at this write (or the next).
              return write(": keep-alive\n\n");
            }
          }
          // Every event that arrived goes out in one write (one chunk, one syscall): under load a burst of tokens
          // does not queue behind one write each. A choice's last chunk carries its finish_reason ("stop" or
          // "length"), with or without text.
          std::string batch;
          std::vector<std::pair<int64_t, bool>> taken;  // (arrival, produced a token) per event
          for (const Event& ev : events) {
            Choice& c = f->choices.at(ev.choice);
            const int64_t before = c.answer->completion_tokens();
            const std::string text = apply(*f, ev, &error);
            const bool finishing = c.answer->finished() && !c.final_sent;
            json lp = c.logprobs ? c.logprobs->take() : json(nullptr);
            if (!text.empty() || finishing || !lp.is_null()) {
              const std::string reason = finishing ? c.answer->finish_reason() : "";
              if (finishing) c.final_sent = true;
              batch += sse(chunk_document(chat, f->object_id, created, f->req.model, text, reason, false,
                                          static_cast<int64_t>(ev.choice), lp));
            }
            taken.emplace_back(ev.arrival_ns, c.answer->completion_tokens() > before);
            if (error) break;
          }
          if (!batch.empty() && !write(batch)) return false;
          for (const auto& [arrival_ns, produced] : taken) observe_token_written(*f, arrival_ns, produced);
          if (!error && !f->all_finished()) return true;
          if (error) {
            failed_->inc();
            cancel_all(*f);
            if (!write(sse(error_document(*error)))) return false;
          } else {
            completed_->inc();
            f->usage.completion_tokens = f->completion_tokens();
            completion_tokens_->inc(static_cast<uint64_t>(f->usage.completion_tokens));
            if (f->req.include_usage &&
                !write(sse(usage_chunk_document(chat, f->object_id, created, f->req.model, f->usage))))
              return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          e2e_->observe(static_cast<double>(mono_ns() - f->received_ns) * 1e-9);
          *done = true;
          sink.done();
          return true;
        },
        [this, f](bool success) {
          // The response ended: normally (answered), or the client went away / a write failed.
          if (!success && !f->all_ended()) disconnects_->inc();
          cancel_all(*f);  // no-op for choices the cluster already ended
          finish_flight(*f);
        });
  }

  GatewayOptions o_;
  Tokenizer tok_;
  ClientPool pool_;
  std::unordered_map<std::string, std::string> api_keys_;  // --api-keys: KEY -> tenant
  std::string salt_base_;                                  // user tenants' namespaces live under it
  std::map<std::string, std::string> adapters_;            // name -> version
  metrics::Registry metrics_;
  metrics::Counter *requests_, *completed_, *rejected_, *unavailable_, *bad_, *failed_, *cancels_, *disconnects_,
      *prompt_tokens_, *completion_tokens_, *cached_tokens_, *unauthorized_, *address_refused_, *tenant_limited_;
  metrics::Gauge* active_;
  metrics::Histogram *ttft_, *tbt_, *e2e_, *submit_overhead_, *token_overhead_, *submit_latency_;
  std::atomic<int64_t> active_count_{0};
  int64_t per_tenant_cap_ = 0;   // --max-requests-per-tenant resolved (0: none)
  int64_t per_address_cap_ = 0;  // --max-connections-per-address resolved (0: none)
  std::mutex tenant_mu_;
  std::unordered_map<std::string, int64_t> tenant_active_;  // tenants with requests in flight -> their slots

  std::unique_ptr<rpc::RpcServer> events_;
  std::thread events_thread_;
  std::mutex cancel_mu_;
  std::condition_variable cancel_cv_;
  std::deque<std::string> cancel_queue_;
  bool cancel_stop_ = false;
  std::thread cancel_thread_;
  std::string client_endpoint_;
  std::mutex inbox_mu_;
  std::map<std::string, std::pair<std::shared_ptr<Inbox>, size_t>> inboxes_;  // cluster request id -> (inbox, choice)

  http::DeadlineServer http_{0};  // --read-timeout-ms for a request's bytes, set in start()
  std::thread http_thread_;
  std::atomic<bool> http_done_{false};
  std::string url_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> abort_{false};

  std::mutex status_mu_;
  int64_t status_at_ns_ = -(int64_t{1} << 62);
  json status_;
  std::string status_error_;
};

}  // namespace

Status validate(const GatewayOptions& o) {
  MC_RETURN_IF_ERROR(parse_tcp_endpoint(o.listen).status().with_context("--listen"));
  if (o.max_connections < 1) return Status(Code::kInvalidArgument, "--max-connections must be >= 1");
  if (o.max_requests < 1) return Status(Code::kInvalidArgument, "--max-requests must be >= 1");
  if (o.max_connections_per_address < -1) {
    return Status(Code::kInvalidArgument, "--max-connections-per-address must be >= 0");
  }
  if (o.max_requests_per_tenant < -1) return Status(Code::kInvalidArgument, "--max-requests-per-tenant must be >= 0");
  if (o.heartbeat_ms < 10) return Status(Code::kInvalidArgument, "--heartbeat-ms must be >= 10");
  for (const std::string& a : o.adapters) {
    if (a.empty() || a.front() == '@') {
      return Status(Code::kInvalidArgument, "--adapter '" + a + "': give NAME or NAME@VERSION");
    }
  }
  if (!o.api_keys_file.empty() && !o.tenant_header.empty()) {
    return Status(Code::kInvalidArgument, "--api-keys and --tenant-header: give one (keys name their tenants)");
  }
  if (!o.tenant_header.empty() && !std::all_of(o.tenant_header.begin(), o.tenant_header.end(),
                                               [](char c) { return std::isalnum(c) || c == '-'; })) {
    return Status(Code::kInvalidArgument,
                  "--tenant-header '" + o.tenant_header + "': an HTTP header name ([A-Za-z0-9-])");
  }
  return Status::ok();
}

Result<std::unordered_map<std::string, std::string>> load_api_keys(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status(Code::kNotFound, "--api-keys " + path + ": " + std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return Status(Code::kInvalidArgument,
                  "--api-keys " + path + ": open to other users (mode " + mode + "): chmod 600 it");
  }
  constexpr off_t kMaxFileBytes = 16 << 20;
  if (st.st_size > kMaxFileBytes) {
    return Status(Code::kInvalidArgument, "--api-keys " + path + ": larger than 16 MiB");
  }
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "--api-keys " + path + ": cannot be read");
  std::unordered_map<std::string, std::string> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = "--api-keys " + path + " line " + std::to_string(n);
    std::istringstream words(line);
    std::string key, tenant, extra;
    if (!(words >> key) || key[0] == '#') continue;
    if (!(words >> tenant) || (words >> extra)) {
      return Status(Code::kInvalidArgument, where + ": expected 'KEY TENANT'");
    }
    const bool printable = std::all_of(key.begin(), key.end(), [](char c) { return c > 0x20 && c < 0x7f; });
    if (key.size() < 16 || key.size() > 256 || !printable) {
      return Status(Code::kInvalidArgument,
                    where + ": a key is 16 to 256 printable ASCII characters (e.g. " + "`openssl rand -hex 24`)");
    }
    if (!auth::valid_name(tenant)) {
      return Status(Code::kInvalidArgument, where + ": tenant '" + tenant + "' is not [A-Za-z0-9_.-]{1,64}");
    }
    if (!keys.emplace(key, tenant).second) return Status(Code::kInvalidArgument, where + ": the key comes twice");
  }
  if (keys.empty()) return Status(Code::kInvalidArgument, "--api-keys " + path + ": no keys");
  return keys;
}

Status run_gateway(const GatewayOptions& options) {
  MC_RETURN_IF_ERROR(validate(options));
  std::unordered_map<std::string, std::string> api_keys;
  if (!options.api_keys_file.empty()) {
    MC_ASSIGN_OR_RETURN(api_keys, load_api_keys(options.api_keys_file));
    MC_LOG_INFO << "mc-gateway: " << api_keys.size() << " API keys; each tenant's KV blocks in a namespace of its own";
  } else if (options.tenant_header.empty()) {
    MC_LOG_WARN << "mc-gateway: no --api-keys nor --tenant-header: every client shares one KV namespace, so a prompt "
                   "prefix one client sent makes another's faster and shows in its cached_tokens "
                   "(docs/SECURITY.md \"Cache isolation\")";
  }
  // The model's tokenizer and chat template, read and parsed once (a real tokenizer.json is megabytes).
  Result<Tokenizer> loaded = Tokenizer::for_model(options.model);
  if (!loaded.is_ok()) return loaded.status().with_context("--model");
  Tokenizer tok = std::move(loaded).value();
  Gateway gw(options, std::move(tok), std::move(api_keys));
  MC_RETURN_IF_ERROR(gw.start());
  // /metrics is on the HTTP port; --metrics-listen adds the exporter every daemon has, on a port of its own.
  std::vector<std::pair<std::string, std::string>> extra;
  MC_ASSIGN_OR_RETURN(std::unique_ptr<metrics::HttpExporter> exporter,
                      metrics::start_daemon_exporter(options.metrics_listen, "mc-gateway", &gw.registry(), &extra));
  if (extra.empty()) extra.emplace_back("metrics", gw.url());
  extra.emplace_back("conductor", options.conductor);
  extra.emplace_back("model", gw.served_model_name());
  extra.emplace_back("tokenizer", gw.tokenizer_kind());
  daemon::announce_ready("mc-gateway", gw.url(), extra);
  while (!daemon::stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  gw.drain();
  MC_LOG_INFO << "mc-gateway: stopped";
  return Status::ok();
}

}  // namespace mc::gateway
