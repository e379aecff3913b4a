// What every mc HTTP server shares (cpp-httplib: the metrics exporter, mc-gateway): a bounded worker pool and a
// listening socket no other process can share. Include only where cpp-httplib is linked (PkgConfig::HTTPLIB).
// Thread-safety: BoundedPool is the server's task queue (the library calls it from its listener thread).
#pragma once

#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

// SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a second server given the same address
// would bind too and take half the connections instead of failing.
inline void no_shared_port(httplib::Server& server) {
  server.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

}  // namespace mc::http
