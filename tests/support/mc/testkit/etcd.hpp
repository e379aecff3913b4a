// EtcdCluster: a real etcd (/usr/bin/etcd) of 1 or 3 members for tests, on free loopback ports (127.0.0.1 only), each
// member with its own data directory under a Scratch directory (kept when the test fails). Members are quick to elect
// (--heartbeat-interval 50 --election-timeout 500). start() waits, bounded, until every member answers a range
// through mc::etcd::Client; kill(i) SIGKILLs member i, restart(i) starts it again on the same ports and data
// (--initial-cluster-state existing). The destructor stops every member (SIGTERM, SIGKILL after 2 s), also when an
// assertion failed.
//
//   if (!testkit::EtcdCluster::installed()) GTEST_SKIP() << testkit::EtcdCluster::kNotInstalled;
//   testkit::EtcdCluster etcd(3);
//   ASSERT_TRUE(etcd.start()) << etcd.error();
//   etcd::Client c(etcd.options());
//
// Ports: each is found by binding port 0 and closing; a member that cannot bind (another process took the port in
// between) makes start() try again with new ports (3 attempts). Thread-safety: one thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mc/coord/etcd.hpp"
#include "mc/testkit/local_cluster.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::testkit {

// A free loopback TCP port (bound to port 0, then closed); 0 on failure.
inline uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

class EtcdCluster {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kNotInstalled = "etcd not installed: run tools/install-deps.sh";
  static bool installed() { return ::access(kBinary, X_OK) == 0; }

  explicit EtcdCluster(int members = 1, const std::string& tag = "etcd")
      : scratch_(tag + "_" + std::to_string(counter()++)), members_(static_cast<size_t>(members)) {}
  ~EtcdCluster() {
    for (auto& m : members_) {
      if (m.child) m.child->stop(2000);
    }
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits (up to timeout_ms) until each one answers a range. False with error() on failure.
  bool start(int64_t timeout_ms = 30'000) {
    token_ = "mc-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++);
    for (int attempt = 0; attempt < 3; ++attempt) {
      for (size_t i = 0; i < members_.size(); ++i) {
        members_[i].client_port = free_loopback_port();
        members_[i].peer_port = free_loopback_port();
        members_[i].data_dir = scratch_.path("m" + std::to_string(i) + ".etcd." + std::to_string(attempt));
      }
      for (size_t i = 0; i < members_.size(); ++i) launch(i, "new");
      if (wait_all(timeout_ms)) return true;
      for (auto& m : members_) {
        if (m.child) m.child->kill_hard();
        m.child.reset();
      }
      if (!bind_failed()) return false;  // a real failure: error_ says what; a port race: new ports
    }
    return false;
  }

  // Before start(): client URLs over TLS with the certificates of `dir` (AUTH_DIR/etcd from mc-auth init:
  // server.pem/.key, ca.pem) and --client-cert-auth; options() then carries the client files of `dir`.
  void use_tls(const std::string& dir) { tls_dir_ = dir; }

  // "127.0.0.1:P,127.0.0.1:Q,..." (client URLs without the scheme).
  std::string endpoints() const {
    std::string out;
    for (const auto& m : members_) out += (out.empty() ? "" : ",") + endpoint(m);
    return out;
  }
  std::string endpoint(size_t i) const { return endpoint(members_[i]); }
  etcd::Options options(int64_t timeout_ms = 2000) const {
    etcd::Options o;
    for (const auto& m : members_) o.endpoints.push_back(endpoint(m));
    o.timeout_ms = timeout_ms;
    if (!tls_dir_.empty()) o.tls = etcd::tls_files_in(tls_dir_);
    return o;
  }
  size_t size() const { return members_.size(); }
  const std::string& error() const { return error_; }

  // SIGKILL member i (a crash: its socket closes, its data stays).
  void kill(size_t i) {
    if (members_[i].child) members_[i].child->kill_hard();
  }
  // Starts member i again on the same ports and data directory; waits (bounded) until it answers a range.
  bool restart(size_t i, int64_t timeout_ms = 20'000) {
    kill(i);
    launch(i, "existing");
    return wait_member(i, timeout_ms);
  }
  // Starts every member again (after all were killed: none answers alone without a quorum) and waits until each one
  // answers a range.
  bool restart_all(int64_t timeout_ms = 30'000) {
    for (size_t i = 0; i < members_.size(); ++i) {
      kill(i);
      launch(i, "existing");
    }
    return wait_all(timeout_ms);
  }
  // The tail of member i's log (for failure messages).
  std::string log_tail(size_t i, size_t bytes = 3000) const {
    std::string log = slurp(scratch_.path("m" + std::to_string(i) + ".log"));
    return log.size() > bytes ? log.substr(log.size() - bytes) : log;
  }

 private:
  struct Member {
    uint16_t client_port = 0, peer_port = 0;
    std::string data_dir;
    std::unique_ptr<Child> child;
  };

  static std::atomic<int>& counter() {
    static std::atomic<int> n{0};
    return n;
  }
  static std::string endpoint(const Member& m) { return "127.0.0.1:" + std::to_string(m.client_port); }

  void launch(size_t i, const std::string& state) {
    std::string cluster;
    for (size_t j = 0; j < members_.size(); ++j) {
      cluster += (j == 0 ? "" : ",") + name(j) + "=http://127.0.0.1:" + std::to_string(members_[j].peer_port);
    }
    const Member& m = members_[i];
    const std::string client = (tls_dir_.empty() ? "http://" : "https://") + endpoint(m);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> argv = {kBinary,
                                     "--name",
                                     name(i),
                                     "--data-dir",
                                     m.data_dir,
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     cluster,
                                     "--initial-cluster-state",
                                     state,
                                     "--initial-cluster-token",
                                     token_,
                                     "--heartbeat-interval",
                                     "50",
                                     "--election-timeout",
                                     "500",
                                     "--quota-backend-bytes",
                                     std::to_string(int64_t{256} << 20),
                                     "--logger",
                                     "zap",
                                     "--log-level",
                                     "warn"};
    if (!tls_dir_.empty()) {
      for (const char* a : {"--cert-file", "server.pem", "--key-file", "server.key", "--trusted-ca-file", "ca.pem"}) {
        argv.push_back(a[0] == '-' ? std::string(a) : tls_dir_ + "/" + a);
      }
      argv.push_back("--client-cert-auth");
    }
    ChildOptions o;
    o.stdin_path = "/dev/null";
    o.stdout_path = scratch_.path(name(i) + ".out");
    o.stderr_path = scratch_.path(name(i) + ".log");
    o.stop_grace_ms = 2000;
    members_[i].child = std::make_unique<Child>(argv, o);
  }
  static std::string name(size_t i) { return "m" + std::to_string(i); }

  bool wait_member(size_t i, int64_t timeout_ms) {
    etcd::Options o;
    o.endpoints = {endpoint(members_[i])};
    o.timeout_ms = 1000;
    if (!tls_dir_.empty()) o.tls = etcd::tls_files_in(tls_dir_);
    etcd::Client c(o);
    bool exited = false;
    Status last;
    const bool up = wait_until(
        [&] {
          if (!members_[i].child || !members_[i].child->running()) return exited = true;
          auto r = c.range("mc-etcd-cluster-probe");
          last = r.status();
          return r.is_ok();
        },
        timeout_ms, 50);
    if (up && !exited) return true;
    error_ =
        "etcd member " + name(i) + " (" + endpoint(members_[i]) + ") " +
        (exited ? "exited" : "did not answer within " + std::to_string(timeout_ms) + " ms (" + last.to_string() + ")") +
        "; its log:\n" + log_tail(i);
    return false;
  }
  bool wait_all(int64_t timeout_ms) {
    const int64_t end = mono_ms() + timeout_ms;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!wait_member(i, std::max<int64_t>(end - mono_ms(), 1))) return false;
    }
    return true;
  }
  bool bind_failed() const { return error_.find("address already in use") != std::string::npos; }

  Scratch scratch_;
  std::string tls_dir_;
  std::vector<Member> members_;
  std::string token_;
  std::string error_;
};

}  // namespace mc::testkit
