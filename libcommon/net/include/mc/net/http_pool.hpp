// What every mc HTTP server shares (cpp-httplib: the metrics exporter, mc-gateway): a bounded worker pool, a
// listening socket no other process can share, and a server whose requests must arrive within a deadline. Include only
// where cpp-httplib is linked (PkgConfig::HTTPLIB). Thread-safety: BoundedPool is the server's task queue (the library
// calls it from its listener thread).
#pragma once

#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "mc/common/metrics.hpp"

namespace mc::http {

// A fixed set of worker threads and a bounded queue of accepted connections: when `max_queued` wait already,
// enqueue() (the listener thread) blocks until a worker takes one, so the listener stops accepting and the
// kernel's backlog holds further connections. An accepted connection is never dropped (its job owns the socket).
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t max_queued) : max_queued_(std::max<size_t>(1, max_queued)) {
    for (size_t i = 0; i < std::max<size_t>(1, threads); ++i) workers_.emplace_back([this] { run(); });
  }
  ~BoundedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock lock(mu_);
    space_.wait(lock, [&] { return jobs_.size() < max_queued_ || shutdown_; });
    jobs_.push_back(std::move(fn));
    work_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (shutdown_) return;
      shutdown_ = true;
    }
    work_.notify_all();
    space_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        work_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;  // shut down and drained: every accepted socket was served and closed
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        space_.notify_one();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable work_, space_;
  std::deque<std::function<void()>> jobs_;
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

// An httplib::Server that runs each connection's keep-alive loop itself (the library's is private to it), for two
// things cpp-httplib 0.11 (Debian 12) does not do:
// - A deadline for each request's bytes: the request line, headers and body must all arrive within
//   request_deadline_ms of its first byte. The library's read timeout bounds one recv(), so a client that sent a
//   header line every few seconds held a worker for as long as it liked, and a few hundred such clients every
//   worker (slowloris). Past the deadline the read fails, so the library answers 400 if it can and the
//   connection is closed.
// - client_gone(): whether the client of the request a handler serves has closed or reset its connection (the
//   library has no Request::is_connection_closed), so a handler that waits (a whole completion) can stop.
// - A cap on the connections one peer address holds at once (set_max_connections_per_address): a worker that takes
//   a connection beyond it answers 429 (OpenAI's error shape, "Connection: close") without reading a byte and
//   closes it, so one address cannot hold every worker, however it trickles (docs/SECURITY.md "Bounds per
//   connection"). Counted in the counter given (else one of its own) and logged with the address (the first ten,
//   then every 1,000th).
// The rest is the library's: one request at a time per connection, keep-alive up to its keep-alive count and
// timeout, its read and write timeouts per call. Thread-safety: as httplib::Server; the setters before listening.
class DeadlineServer : public httplib::Server {
 public:
  explicit DeadlineServer(int64_t request_deadline_ms) : request_deadline_ms_(request_deadline_ms) {}
  void set_request_deadline_ms(int64_t ms) { request_deadline_ms_ = ms; }
  // Connections served at once from one peer address (IPv4 or IPv6, port ignored); 0: no cap. `service` names the
  // server in the log line; `refused` (not owned, outliving the server; null: a counter of its own) counts the
  // connections refused because their address held the cap already.
  void set_max_connections_per_address(size_t n, std::string service, metrics::Counter* refused = nullptr) {
    max_per_address_ = n;
    service_ = std::move(service);
    refused_ = refused != nullptr ? refused : &own_refused_;
  }
  // On a handler's thread: true once the client of the request it serves has closed or reset the connection
  // (a peeked recv() of 0 bytes or an error; bytes of a next request count as still there). false elsewhere.
  static bool client_gone();
  // Connections closed because a request's bytes did not all arrive within the deadline.
  uint64_t deadline_closes() const { return deadline_closes_.load(std::memory_order_relaxed); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool serve_connection(socket_t sock);  // the keep-alive loop; closes sock
  // Takes one of the address's slots (false: it holds the cap already); release_address gives it back.
  bool take_address(const std::string& address);
  void release_address(const std::string& address);
  int64_t request_deadline_ms_;
  std::atomic<uint64_t> deadline_closes_{0};
  size_t max_per_address_ = 0;
  std::string service_ = "HTTP server";
  std::mutex address_mu_;
  std::unordered_map<std::string, size_t> per_address_;  // only addresses holding a connection
  metrics::Counter own_refused_;
  metrics::Counter* refused_ = &own_refused_;
};

// SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a second server given the same address
// would bind too and take half the connections instead of failing.
inline void no_shared_port(httplib::Server& server) {
  server.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

}  // namespace mc::http
