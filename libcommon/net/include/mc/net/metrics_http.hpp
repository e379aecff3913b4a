// The /metrics endpoint of every daemon (--metrics-listen ADDR:PORT, DESIGN.md §5): a small HTTP server that
// answers `GET /metrics` with a metrics::Registry in the Prometheus text exposition format 0.0.4
// (content type "text/plain; version=0.0.4"), for a Prometheus server to scrape.
//
//   auto exporter = metrics::HttpExporter::start(&registry, {.listen = "127.0.0.1:0", .service = "mc-decode"});
//   if (!exporter.is_ok()) return exporter.status();
//   (*exporter)->address();  // "127.0.0.1:41234": the bound address, port 0 resolved
//
// Answers: GET (and HEAD) /metrics -> 200; any other path -> 404; any other method -> 405 (Allow: GET, HEAD);
// a request body over max_request_body_bytes -> 413; a request line or header over 8 KiB -> 414/400 (the HTTP
// library's own limits). Bounded: `threads` worker threads; at most `max_queued_connections` accepted
// connections wait for one, beyond that the listener stops accepting (the kernel's backlog holds the rest);
// a connection silent for read_timeout_ms, or not draining a reply for write_timeout_ms, is closed; a
// keep-alive connection is closed after keep_alive_timeout_ms idle.
//
// The endpoint has no authentication: like an unauthenticated daemon's ports it listens on loopback only unless
// the process allows unauthenticated listens (--allow-unauthenticated, docs/SECURITY.md), and that holds also with
// --auth-dir, since the key ring does not protect it.
//
// The HTTP library (cpp-httplib) is private to mc_common: nothing of it is in this header.
// Thread-safety: start() and the destructor from one thread; address()/url() from any. The refresh callback
// runs on the exporter's threads, one call at a time, before each render; it must be safe to run there
// (update only registry metrics, or read state that is itself thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc/common/endpoint.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/status.hpp"

namespace mc::metrics {

// The content type of the Prometheus text exposition format 0.0.4.
inline constexpr const char* kPrometheusTextContentType = "text/plain; version=0.0.4";

// Parses a metrics listen address "ADDR:PORT": ADDR an IPv4 address ("127.0.0.1", "0.0.0.0"), an IPv6 address
// in brackets ("[::1]:9400") or a name ("localhost"); PORT 0-65535, 0 = any free port. No scheme (no
// "http://"). kInvalidArgument quoting the text and showing the form otherwise.
Result<Endpoint> parse_listen_address(std::string_view text);

// Whether the unauthenticated metrics endpoint of `service` may listen on `host`: loopback (127.0.0.0/8, ::1,
// localhost) always; any other address only when the process allows unauthenticated listens
// (auth::set_allow_unauthenticated, --allow-unauthenticated). kFailedPrecondition naming the service, the host
// and the remedies otherwise.
Status check_listen_address(std::string_view service, std::string_view host);

struct HttpExporterOptions {
  std::string listen;                    // "ADDR:PORT" (parse_listen_address); port 0 = any free port
  std::string service = "mc";            // names the daemon in errors and log lines ("mc-decode")
  size_t threads = 2;                    // worker threads answering requests, >= 1
  size_t max_queued_connections = 16;    // accepted connections waiting for a worker before accept pauses
  size_t max_request_body_bytes = 4096;  // a larger request body is refused with 413
  int64_t read_timeout_ms = 5000;        // a request not fully received in this time closes the connection (from
                                         // its first byte: headers and body, however slowly they trickle)
  int64_t write_timeout_ms = 5000;       // a reply the peer does not read in this time closes the connection
  int64_t keep_alive_timeout_ms = 5000;  // an idle keep-alive connection is closed after this
};

class HttpExporter {
 public:
  // Binds options.listen (after check_listen_address) and starts serving `registry` (not owned; must outlive the
  // exporter) on threads of its own; returns once it accepts connections. `refresh`, when set, runs before
  // each render (the same callback a daemon gives rpc::RpcServer::serve_stat). Errors: kInvalidArgument for a
  // malformed address, kFailedPrecondition for a non-loopback one that is not allowed, kUnavailable naming the
  // address when it cannot be bound (in use, or not an address of this host) and the remedy.
  static Result<std::unique_ptr<HttpExporter>> start(const Registry* registry, HttpExporterOptions options,
                                                     std::function<void()> refresh = nullptr);
  // Stops: closes the listener, finishes the requests in progress, joins the threads.
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // The bound address "HOST:PORT" (IPv6 bracketed), the port resolved when 0 was asked for: "127.0.0.1:41234".
  const std::string& address() const { return address_; }
  // "http://" + address(): the value of the ready line's metrics= field.
  std::string url() const { return "http://" + address_; }
  // Requests answered with 200 so far.
  uint64_t scrapes() const;

  class Impl;

 private:
  explicit HttpExporter(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// For a daemon: starts an exporter of `registry` on `listen` when it is not empty (else returns nullptr) and
// appends {"metrics", exporter->url()} to `ready_extra` (the extra fields of daemon::announce_ready), so the
// ready line says "metrics=http://127.0.0.1:41234". Errors as HttpExporter::start, with the flag named.
Result<std::unique_ptr<HttpExporter>> start_daemon_exporter(
    const std::string& listen, const std::string& service, const Registry* registry,
    std::vector<std::pair<std::string, std::string>>* ready_extra, std::function<void()> refresh = nullptr);

}  // namespace mc::metrics
