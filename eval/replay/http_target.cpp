#include "mc/replay/http_target.hpp"

#include <httplib.h>

#include <condition_variable>
#include <future>
#include <list>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/common/endpoint.hpp"
#include "mc/common/log.hpp"

namespace mc::replay {

namespace {

using nlohmann::json;

class Target final : public EventSource {
 public:
  Target(HttpTargetOptions o, std::string host, int port) : o_(std::move(o)), host_(std::move(host)), port_(port) {}
  ~Target() override { stop(); }

  Result<std::string> start(EventSink* sink) override {
    std::lock_guard lock(mu_);
    sink_ = sink;
    return o_.url;
  }

  void stop() override {
    std::list<Stream> streams;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      streams.swap(streams_);
    }
    for (Stream& s : streams) {
      if (s.thread.joinable()) s.thread.join();
    }
    std::lock_guard lock(mu_);
    sink_ = nullptr;
  }

  Result<Admission> submit(const Submission& sub) {
    json body = {
        {"model", o_.model},  {"prompt", sub.tokens}, {"max_tokens", std::max<int64_t>(1, sub.output_length_tokens)},
        {"ignore_eos", true}, {"stream", true},       {"stream_options", {{"include_usage", true}}}};
    json mc = json::object();
    if (sub.slo_ttft_ms > 0) mc["slo_ttft_ms"] = sub.slo_ttft_ms;
    if (sub.slo_tbt_ms > 0) mc["slo_tbt_ms"] = sub.slo_tbt_ms;
    if (sub.row != nullptr && !sub.row->scope.salt.empty()) mc["salt"] = sub.row->scope.salt;
    if (!mc.empty()) body["mc"] = mc;
    auto status = std::make_shared<std::promise<std::pair<int, std::string>>>();
    std::future<std::pair<int, std::string>> answered = status->get_future();
    {
      std::lock_guard lock(mu_);
      if (stopping_) return Status(Code::kCancelled, "replay: the HTTP target is stopping");
      reap_locked();
      streams_.emplace_back();
      Stream& s = streams_.back();
      s.thread = std::thread([this, &s, id = sub.request_id, text = body.dump(), status] {
        run(id, text, status);
        s.done.store(true);
      });
    }
    if (answered.wait_for(std::chrono::milliseconds(o_.submit_timeout_ms)) != std::future_status::ready) {
      return Status(Code::kTimeout, "POST " + o_.url + "/v1/completions for '" + sub.request_id +
                                        "': no status line within --submit-timeout-ms");
    }
    const auto [code, message] = answered.get();
    if (code < 0) return Status(Code::kUnavailable, message);
    Admission a;
    a.accepted = code == 200;
    if (!a.accepted) a.reason = message;
    return a;
  }

 private:
  struct Stream {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  // Joins the threads of streams that ended (caller holds mu_).
  void reap_locked() {
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (it->done.load()) {
        it->thread.join();
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
  }

  template <typename Fn>
  void to_sink(Fn&& fn) {
    std::lock_guard lock(sink_mu_);
    EventSink* sink = nullptr;
    {
      std::lock_guard l(mu_);
      sink = sink_;
    }
    if (sink != nullptr) fn(*sink);
  }

  // One request: POST, then the SSE stream into the sink. `status` gets (HTTP status, rejection reason) at the
  // status line, or (-1, why) when none came.
  void run(const std::string& id, const std::string& body,
           const std::shared_ptr<std::promise<std::pair<int, std::string>>>& status) {
    httplib::Client client(host_, port_);
    client.set_connection_timeout(std::chrono::milliseconds(o_.connect_timeout_ms));
    client.set_read_timeout(std::chrono::milliseconds(o_.read_timeout_ms));
    client.set_keep_alive(false);
    int http_status = 0;
    bool status_set = false, terminal = false;
    std::string buffer, error_body;
    DoneReport done;
    auto set_status = [&](int code, std::string why) {
      if (status_set) return;
      status_set = true;
      status->set_value({code, std::move(why)});
    };
    auto on_line = [&](const std::string& line) {
      if (line.rfind("data: ", 0) != 0) return;  // comments (": keep-alive"), blank lines
      const std::string data = line.substr(6);
      if (data == "[DONE]") {
        if (!terminal) to_sink([&](EventSink& s) { s.on_done(id, done); });
        terminal = true;
        return;
      }
      const json chunk = json::parse(data, nullptr, false);
      if (chunk.is_discarded()) return;
      if (chunk.contains("error")) {
        const std::string msg = chunk["error"].value("message", std::string("error event"));
        if (!terminal) to_sink([&](EventSink& s) { s.on_error(id, "stream error: " + msg); });
        terminal = true;
        return;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        const json& u = chunk["usage"];
        done.output_tokens = u.value("completion_tokens", int64_t{0});
        done.ledger.prompt_tokens = u.value("prompt_tokens", int64_t{0});
        if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
          done.ledger.avoided_prefill_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
        }
      }
      if (chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty()) {
        const json& c = chunk["choices"][0];
        if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
          const uint32_t token = static_cast<unsigned char>(c["text"].get<std::string>()[0]);
          to_sink([&](EventSink& s) { s.on_tokens(id, std::span<const uint32_t>(&token, 1)); });
        }
      }
    };
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    if (!o_.api_key.empty()) req.set_header("Authorization", "Bearer " + o_.api_key);
    req.response_handler = [&](const httplib::Response& res) {
      http_status = res.status;
      if (res.status == 200) set_status(200, "");
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (http_status != 200) {
        if (error_body.size() < 65536) error_body.append(data, n);
        return true;
      }
      buffer.append(data, n);
      size_t nl;
      while ((nl = buffer.find('\n')) != std::string::npos) {
        std::string line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        on_line(line);
      }
      return true;
    };
    httplib::Result res = client.send(req);
    if (!res) {
      const std::string why = "POST " + o_.url + "/v1/completions: " + httplib::to_string(res.error());
      set_status(-1, why + " (is mc-gateway running there?)");
      if (http_status == 200 && !terminal) to_sink([&](EventSink& s) { s.on_error(id, "stream broken: " + why); });
      return;
    }
    if (http_status != 200) {
      const json e = json::parse(error_body, nullptr, false);
      std::string reason = "http_" + std::to_string(http_status);
      if (!e.is_discarded() && e.contains("error") && e["error"].is_object()) {
        const json& err = e["error"];
        if (err.contains("code") && err["code"].is_string()) reason = err["code"].get<std::string>();
        reason += ": " + err.value("message", std::string());
      }
      set_status(http_status, reason);
      return;
    }
    if (!terminal) to_sink([&](EventSink& s) { s.on_error(id, "stream ended without [DONE]"); });
  }

  HttpTargetOptions o_;
  std::string host_;
  int port_;
  std::mutex mu_;
  std::mutex sink_mu_;  // one sink call at a time per target is not required, but keeps event order per request
  EventSink* sink_ = nullptr;
  bool stopping_ = false;
  std::list<Stream> streams_;
};

class Link final : public ConductorLink {
 public:
  explicit Link(Target* target) : target_(target) {}
  Result<Admission> submit(const Submission& submission) override { return target_->submit(submission); }

 private:
  Target* target_;
};

}  // namespace

Result<HttpTarget> make_http_target(const HttpTargetOptions& options) {
  const std::string prefix = "http://";
  if (options.url.rfind(prefix, 0) != 0) {
    return Status(Code::kInvalidArgument, "--target '" + options.url + "': give http://HOST:PORT (mc-gateway's URL)");
  }
  std::string hostport = options.url.substr(prefix.size());
  while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  Result<Endpoint> ep = parse_tcp_endpoint(hostport);
  if (!ep.is_ok() || ep->port == 0) {
    return Status(Code::kInvalidArgument, "--target '" + options.url + "': give http://HOST:PORT (mc-gateway's URL)");
  }
  HttpTargetOptions o = options;
  o.url = prefix + hostport;
  httplib::Client probe(ep->host, ep->port);
  probe.set_connection_timeout(std::chrono::milliseconds(o.connect_timeout_ms));
  probe.set_read_timeout(std::chrono::milliseconds(o.connect_timeout_ms));
  httplib::Headers auth;
  if (!o.api_key.empty()) auth.emplace("Authorization", "Bearer " + o.api_key);
  httplib::Result models = probe.Get("/v1/models", auth);
  if (!models || models->status != 200) {
    return Status(Code::kUnavailable,
                  "cannot reach mc-gateway at " + o.url + " (GET /v1/models: " +
                      (models ? "HTTP " + std::to_string(models->status) : httplib::to_string(models.error())) +
                      (models && models->status == 401 ? "): give its API key with --api-key (MC_API_KEY)"
                                                       : "): start it (examples/local-cluster.sh --gateway) or fix "
                                                         "--target"));
  }
  if (o.model.empty()) {
    const json m = json::parse(models->body, nullptr, false);
    if (m.is_discarded() || !m.contains("data") || !m["data"].is_array() || m["data"].empty()) {
      return Status(Code::kUnavailable, "mc-gateway at " + o.url + " lists no model (GET /v1/models)");
    }
    o.model = m["data"][0].value("id", std::string());
  }
  auto target = std::make_unique<Target>(o, ep->host, ep->port);
  Target* raw = target.get();
  HttpTarget out;
  out.links = [raw]() -> Result<std::unique_ptr<ConductorLink>> {
    return std::unique_ptr<ConductorLink>(std::make_unique<Link>(raw));
  };
  out.events = std::move(target);
  return out;
}

}  // namespace mc::replay
