#include "mc/net/metrics_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "mc/common/log.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/http_pool.hpp"

namespace mc::metrics {
namespace {

const char* const kForm = "ADDR:PORT (127.0.0.1:9400, [::1]:9400, localhost:0; port 0 picks a free port)";

// The deadline server (a request's bytes within read_timeout_ms) with its listening socket exposed, to read back
// the bound address (port 0, "localhost").
class Server final : public http::DeadlineServer {
 public:
  Server() : http::DeadlineServer(0) {}
  int listening_socket() const { return svr_sock_.load(); }
};

// "HOST:PORT" of a bound socket; empty when getsockname fails.
std::string bound_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    return format_host_port(text, ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    return format_host_port(text, ntohs(a->sin6_port));
  }
  return {};
}

time_t whole_s(int64_t ms) { return static_cast<time_t>(ms / 1000); }
time_t rest_us(int64_t ms) { return static_cast<time_t>((ms % 1000) * 1000); }

}  // namespace

Result<Endpoint> parse_listen_address(std::string_view text) {
  if (text.find("://") != std::string_view::npos) {
    return Status(Code::kInvalidArgument,
                  "metrics listen address '" + std::string(text) + "': no scheme, want " + kForm);
  }
  Result<Endpoint> ep = parse_tcp_endpoint(text);
  if (!ep.is_ok()) {
    return Status(Code::kInvalidArgument,
                  "metrics listen address '" + std::string(text) + "': " + ep.status().message() + "; want " + kForm);
  }
  if (ep->host.empty()) {
    return Status(Code::kInvalidArgument,
                  "metrics listen address '" + std::string(text) + "': no address; want " + kForm);
  }
  return ep;
}

Status check_listen_address(std::string_view service, std::string_view host) {
  return auth::check_listen_plain(std::string(service) + " /metrics", host);
}

class HttpExporter::Impl {
 public:
  Impl(const Registry* registry, HttpExporterOptions options, std::function<void()> refresh)
      : registry_(registry), options_(std::move(options)), refresh_(std::move(refresh)) {}

  ~Impl() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Result<std::string> start() {
    MC_ASSIGN_OR_RETURN(Endpoint ep, parse_listen_address(options_.listen));
    MC_RETURN_IF_ERROR(check_listen_address(options_.service, ep.host));
    const std::string host = ep.host == "*" ? "0.0.0.0" : ep.host;

    const size_t threads = options_.threads;
    const size_t queued = options_.max_queued_connections;
    server_.new_task_queue = [threads, queued] { return new http::BoundedPool(threads, queued); };
    server_.set_read_timeout(whole_s(options_.read_timeout_ms), rest_us(options_.read_timeout_ms));
    server_.set_request_deadline_ms(options_.read_timeout_ms);
    server_.set_write_timeout(whole_s(options_.write_timeout_ms), rest_us(options_.write_timeout_ms));
    server_.set_keep_alive_timeout(std::max<time_t>(1, whole_s(options_.keep_alive_timeout_ms)));
    server_.set_payload_max_length(options_.max_request_body_bytes);

    // Only GET and HEAD, without a body; decided on the request line and headers, before any body is read.
    const size_t max_body = options_.max_request_body_bytes;
    server_.set_pre_routing_handler([max_body](const httplib::Request& req, httplib::Response& res) {
      using HR = httplib::Server::HandlerResponse;
      if (req.method != "GET" && req.method != "HEAD") {
        res.status = 405;
        res.set_header("Allow", "GET, HEAD");
        res.set_content("method " + req.method + " not allowed: this endpoint serves GET /metrics\n", "text/plain");
        return HR::Handled;
      }
      // The library reads no body of a GET: one declared is refused rather than left unread on the connection.
      const uint64_t declared = req.get_header_value<uint64_t>("Content-Length");
      if (declared > 0 || req.has_header("Transfer-Encoding")) {
        res.status = declared > max_body ? 413 : 400;
        res.set_content("GET /metrics takes no request body\n", "text/plain");
        return HR::Handled;
      }
      return HR::Unhandled;
    });
    // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a second daemon given the same
    // --metrics-listen would bind too and take half the scrapes instead of failing.
    http::no_shared_port(server_);
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::string text;
      {
        std::lock_guard lock(render_mu_);
        if (refresh_) refresh_();
        text = registry_->prometheus_text();
      }
      res.set_content(text, kPrometheusTextContentType);  // the library copies it (no std::string&& overload)
      scrapes_.fetch_add(1, std::memory_order_relaxed);
    });
    server_.set_error_handler([service = options_.service](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404)
        res.set_content(service + " serves only GET /metrics, not " + req.path + "\n", "text/plain");
    });
    server_.set_exception_handler(
        [service = options_.service](const httplib::Request&, httplib::Response& res, const std::exception_ptr& ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          MC_LOG_ERROR << service << ": rendering /metrics failed: " << what;
          res.status = 500;
          res.set_content("internal error\n", "text/plain");
        });

    errno = 0;
    const bool bound = ep.port == 0 ? server_.bind_to_any_port(host) > 0 : server_.bind_to_port(host, ep.port);
    if (!bound) {
      const int err = errno;
      return Status(Code::kUnavailable,
                    options_.service + ": cannot serve /metrics on " + format_host_port(ep.host, ep.port) +
                        (err != 0 ? std::string(" (") + std::strerror(err) + ")" : std::string()) +
                        ": the port is in use or the address is not one of this host's; give --metrics-listen another "
                        "ADDR:PORT (port 0 picks a free one)");
    }
    std::string address = bound_address(server_.listening_socket());
    if (address.empty()) address = format_host_port(ep.host, ep.port);

    thread_ = std::thread([this] {
      if (!server_.listen_after_bind()) MC_LOG_WARN << options_.service << ": /metrics listener stopped with an error";
      listener_done_.store(true);
    });
    // stop() only takes effect once the listener runs: wait for it, so the destructor never misses it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && !listener_done_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!server_.is_running()) {
      return Status(Code::kUnavailable, options_.service + ": the /metrics listener on " + address +
                                            " did not start; see the log above, then restart the daemon");
    }
    return address;
  }

  uint64_t scrapes() const { return scrapes_.load(std::memory_order_relaxed); }

 private:
  const Registry* registry_;
  HttpExporterOptions options_;
  std::function<void()> refresh_;
  std::mutex render_mu_;  // one refresh + render at a time
  std::atomic<uint64_t> scrapes_{0};
  std::atomic<bool> listener_done_{false};
  Server server_;
  std::thread thread_;
};

HttpExporter::HttpExporter(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

HttpExporter::~HttpExporter() = default;

uint64_t HttpExporter::scrapes() const { return impl_->scrapes(); }

Result<std::unique_ptr<HttpExporter>> HttpExporter::start(const Registry* registry, HttpExporterOptions options,
                                                          std::function<void()> refresh) {
  if (registry == nullptr)
    return Status(Code::kInvalidArgument, options.service + ": metrics exporter without a registry");
  if (options.threads == 0)
    return Status(Code::kInvalidArgument, options.service + ": metrics exporter needs >= 1 thread");
  auto impl = std::make_unique<Impl>(registry, std::move(options), std::move(refresh));
  MC_ASSIGN_OR_RETURN(std::string address, impl->start());
  return std::unique_ptr<HttpExporter>(new HttpExporter(std::move(impl), std::move(address)));
}

Result<std::unique_ptr<HttpExporter>> start_daemon_exporter(
    const std::string& listen, const std::string& service, const Registry* registry,
    std::vector<std::pair<std::string, std::string>>* ready_extra, std::function<void()> refresh) {
  if (listen.empty()) return std::unique_ptr<HttpExporter>();
  HttpExporterOptions o;
  o.listen = listen;
  o.service = service;
  Result<std::unique_ptr<HttpExporter>> exporter = HttpExporter::start(registry, o, std::move(refresh));
  if (!exporter.is_ok()) return exporter.status().with_context("--metrics-listen " + listen);
  MC_LOG_INFO << service << ": serving /metrics at " << (*exporter)->url() << "/metrics";
  if (ready_extra != nullptr) ready_extra->emplace_back("metrics", (*exporter)->url());
  return exporter;
}

}  // namespace mc::metrics
