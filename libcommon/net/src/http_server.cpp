// DeadlineServer: each connection's keep-alive loop, with a deadline for a request's bytes and the client's
// socket known to the handler's thread (mc/net/http_pool.hpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/net/http_pool.hpp"

namespace mc::http {
namespace {

thread_local int t_client_socket = -1;  // the connection the current thread serves (-1: none)

// Waits at most timeout_ms (clamped to >= 0) for `events`: > 0 ready, 0 timed out, < 0 error.
int wait_for(int sock, short events, int64_t timeout_ms) {
  pollfd p{sock, events, 0};
  const int ms = static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, INT_MAX));
  int rc;
  do {
    rc = ::poll(&p, 1, ms);
  } while (rc < 0 && errno == EINTR);
  return rc;
}

// The peer has neither closed nor reset the connection (bytes waiting, or nothing to read yet).
bool still_connected(int sock) {
  if (wait_for(sock, POLLIN, 0) == 0) return true;
  char b;
  const ssize_t n = ::recv(sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

void ip_and_port(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  port = -1;
  if (a.ss_family == AF_INET) {
    const auto* v = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v->sin_addr, buf, sizeof buf);
    port = ntohs(v->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v->sin6_addr, buf, sizeof buf);
    port = ntohs(v->sin6_port);
  }
  ip = buf;
}

// The library's socket stream, with a read buffer (its line reader reads a byte at a time) and the deadline.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int sock, int64_t read_ms, int64_t write_ms) : sock_(sock), read_ms_(read_ms), write_ms_(write_ms) {}

  void start_request(int64_t deadline_ms) {
    deadline_at_ms_ = deadline_ms > 0 ? steady_ms() + deadline_ms : INT64_MAX;
    expired_ = false;
  }
  bool expired() const { return expired_; }
  bool buffered() const { return off_ < size_; }

  bool is_readable() const override { return buffered() || wait_for(sock_, POLLIN, budget_ms()) > 0; }
  bool is_writable() const override { return wait_for(sock_, POLLOUT, write_ms_) > 0 && still_connected(sock_); }

  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      const int64_t budget = budget_ms();
      if (budget <= 0 || wait_for(sock_, POLLIN, budget) <= 0) {
        if (steady_ms() >= deadline_at_ms_) expired_ = true;
        return -1;
      }
      if (size >= sizeof buf_) return recv_into(ptr, size);
      const ssize_t n = recv_into(buf_, sizeof buf_);
      if (n <= 0) return n;
      off_ = 0;
      size_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, size_ - off_);
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) != 0) a.ss_family = AF_UNSPEC;
    ip_and_port(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) != 0) a.ss_family = AF_UNSPEC;
    ip_and_port(a, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // What one wait may take: the read timeout, cut short by the request's deadline.
  int64_t budget_ms() const {
    return deadline_at_ms_ == INT64_MAX ? read_ms_ : std::min(read_ms_, deadline_at_ms_ - steady_ms());
  }
  ssize_t recv_into(char* p, size_t n) {
    ssize_t k;
    do {
      k = ::recv(sock_, p, n, 0);
    } while (k < 0 && errno == EINTR);
    return k;
  }

  const int sock_;
  const int64_t read_ms_, write_ms_;
  int64_t deadline_at_ms_ = INT64_MAX;
  bool expired_ = false;
  char buf_[4096];
  size_t off_ = 0, size_ = 0;
};

}  // namespace

bool DeadlineServer::client_gone() { return t_client_socket >= 0 && !still_connected(t_client_socket); }

bool DeadlineServer::take_address(const std::string& address) {
  std::lock_guard lock(address_mu_);
  size_t& held = per_address_[address];
  if (held >= max_per_address_) return false;
  ++held;
  return true;
}

void DeadlineServer::release_address(const std::string& address) {
  std::lock_guard lock(address_mu_);
  auto it = per_address_.find(address);
  if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
}

bool DeadlineServer::process_and_close_socket(socket_t sock) {
  std::string address;
  if (max_per_address_ > 0) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    int port = -1;
    if (::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip_and_port(a, address, port);
    if (!address.empty() && !take_address(address)) {
      refused_->inc();
      const uint64_t n = refused_->value();
      if (log::nth_worth_logging(n)) {
        MC_LOG_WARN << service_ << ": refused a connection from " << address << ": it holds " << max_per_address_
                    << " already (the cap per address; " << n << " refused)";
      }
      // Best effort, never blocking: the client sees why before the close.
      const std::string body = R"({"error":{"message":"too many connections from your address (at most )" +
                               std::to_string(max_per_address_) +
                               R"(): reuse or close some","type":"rate_limit_exceeded","param":null,)"
                               R"("code":"too_many_connections"}})";
      const std::string reply = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
      (void)!::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      return false;
    }
  }
  const bool ret = serve_connection(sock);
  if (!address.empty()) release_address(address);
  return ret;
}

bool DeadlineServer::serve_connection(socket_t sock) {
  DeadlineStream strm(sock, static_cast<int64_t>(read_timeout_sec_) * 1000 + read_timeout_usec_ / 1000,
                      static_cast<int64_t>(write_timeout_sec_) * 1000 + write_timeout_usec_ / 1000);
  t_client_socket = sock;
  bool ret = false;
  for (size_t count = keep_alive_max_count_; count > 0 && svr_sock_ != INVALID_SOCKET; --count) {
    // The next request's first byte, within the keep-alive timeout; the server's stop() ends the wait.
    bool readable = strm.buffered();
    const int64_t idle_until = steady_ms() + static_cast<int64_t>(keep_alive_timeout_sec_) * 1000;
    while (!readable && svr_sock_ != INVALID_SOCKET && steady_ms() < idle_until) {
      const int rc = wait_for(sock, POLLIN, 50);
      if (rc < 0) break;
      readable = rc > 0;
    }
    if (!readable) break;
    strm.start_request(request_deadline_ms_);
    bool connection_closed = false;
    ret = process_request(strm, count == 1, connection_closed, nullptr);
    if (strm.expired()) {
      deadline_closes_.fetch_add(1, std::memory_order_relaxed);
      ret = false;
    }
    if (!ret || connection_closed) break;
  }
  t_client_socket = -1;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace mc::http
