#include "mc/net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mc::net {

Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status(Code::kNotFound, "cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

Result<Fd> listen_on(const Endpoint& hp, uint16_t* bound_port) {
  socklen_t len = 0;
  MC_ASSIGN_OR_RETURN(sockaddr_storage ss, resolve(hp.host, hp.port, &len));
  Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const std::string where = "listen on " + format_host_port(hp.host, hp.port);
  if (!fd) return Status(Code::kIo, where + ": socket: " + strerror(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return Status(Code::kIo, where + ": bind: " + strerror(errno) + " (address in use or not local?)");
  }
  if (::listen(fd.get(), 128) != 0) return Status(Code::kIo, where + ": listen: " + strerror(errno));
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &blen);
  *bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

void tune_data_socket(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

Result<Fd> start_connect(const Endpoint& remote, const std::string& local_address, bool* in_progress) {
  socklen_t len = 0;
  MC_ASSIGN_OR_RETURN(sockaddr_storage ss, resolve(remote.host, remote.port, &len));
  const std::string where = "connect to " + format_host_port(remote.host, remote.port) +
                            (local_address.empty() ? "" : " from " + local_address);
  Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Status(Code::kIo, where + ": socket: " + strerror(errno));
  if (!local_address.empty()) {
    socklen_t llen = 0;
    MC_ASSIGN_OR_RETURN(sockaddr_storage ls, resolve(local_address, 0, &llen));
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ls), llen) != 0) {
      // The address left this host (its interface was removed or reconfigured): a local-side failure.
      const int e = errno;
      return Status(e == EADDRNOTAVAIL || e == ENODEV ? Code::kLocalDeviceDown : Code::kUnavailable,
                    where + ": bind source: " + strerror(e));
    }
  }
  *in_progress = false;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    const int e = errno;
    // From a bound source address, an immediate ENETDOWN/ENETUNREACH means no route leaves through that
    // address's interface (it is down): a local-side failure. A remote-side failure shows up later.
    if (e != EINPROGRESS) {
      return Status(
          !local_address.empty() && (e == ENETDOWN || e == ENETUNREACH) ? Code::kLocalDeviceDown : Code::kUnavailable,
          where + ": " + strerror(e));
    }
    *in_progress = true;
  }
  return fd;
}

Result<Fd> connect_blocking(const Endpoint& remote, const std::string& local_address, int64_t timeout_ms,
                            int64_t io_timeout_ms) {
  bool in_progress = false;
  MC_ASSIGN_OR_RETURN(Fd fd, start_connect(remote, local_address, &in_progress));
  const std::string where = "connect to " + format_host_port(remote.host, remote.port);
  if (in_progress) {
    pollfd p{fd.get(), POLLOUT, 0};
    int rc = ::poll(&p, 1, static_cast<int>(timeout_ms));
    if (rc == 0) return Status(Code::kTimeout, where + ": no answer within " + std::to_string(timeout_ms) + " ms");
    if (rc < 0) return Status(Code::kIo, where + ": poll: " + strerror(errno));
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) return Status(Code::kUnavailable, where + ": " + strerror(err));
  }
  int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  timeval tv{static_cast<time_t>(io_timeout_ms / 1000), static_cast<suseconds_t>((io_timeout_ms % 1000) * 1000)};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

Status send_all(int fd, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status(Code::kTimeout, what + ": send timed out");
      return Status(Code::kUnavailable, what + ": send: " + strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::ok();
}

Status recv_all(int fd, void* data, size_t n, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k == 0) return Status(Code::kUnavailable, what + ": peer closed the connection");
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status(Code::kTimeout, what + ": no reply in time");
      return Status(Code::kUnavailable, what + ": recv: " + strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::ok();
}

bool idle_connection_broken(int fd) {
  char b;
  ssize_t k = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (k == 0) return true;                                              // FIN
  if (k > 0) return true;                                               // bytes nobody asked for
  return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);  // reset, ...
}

std::string peer_address(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
  }
  return host;
}

std::string peer_name(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace mc::net
