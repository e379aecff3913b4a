#include "tcp/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"

namespace mc::transfer::tcp {
namespace {

// SO_RCVTIMEO of a blocking socket; 0 waits forever.
void set_receive_timeout(int fd, int64_t timeout_ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout_ms % 1000) * 1000);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// "ADDR:PORT" of an accepted peer ("[v6]:PORT" for IPv6), "?" when unknown.
std::string format_peer(const sockaddr_storage& sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    std::string out(host);
    out.append(":").append(std::to_string(ntohs(in->sin_port)));
    return out;
  }
  if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    std::string out = "[";  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string
    out.append(host).append("]:").append(std::to_string(ntohs(in6->sin6_port)));
    return out;
  }
  return "?";
}

// The ADDR of format_peer, without its port: what the per-address cap counts by.
std::string format_address(const sockaddr_storage& sa) {
  const std::string peer = format_peer(sa);
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

// What a connection received beyond the bytes consumed so far: one recv takes a request's header, its aux (the
// grant, ~170 bytes) and whatever follows — the next pipelined headers, the start of a payload — so a request costs
// one system call rather than one per part. A payload's remainder is received straight into segment memory.
class ReadAhead {
 public:
  ReadAhead(int fd, const std::string& what) : fd_(fd), what_(what) {}
  // Copies the next n bytes to dst: from the buffer, then for n beyond it a recv into the buffer (small n) or
  // straight into dst (a payload). Errors as recv_all's (kUnavailable: closed/reset, kTimeout: idle).
  Status take(void* dst, size_t n) {
    auto* out = static_cast<char*>(dst);
    const size_t have = std::min(n, end_ - begin_);
    std::memcpy(out, buf_ + begin_, have);
    begin_ += have;
    out += have;
    n -= have;
    if (n == 0) return Status::ok();
    begin_ = end_ = 0;
    if (n >= sizeof buf_ / 2) return recv_all(fd_, out, n, what_);
    while (end_ < n) {
      const ssize_t k = ::recv(fd_, buf_ + end_, sizeof buf_ - end_, 0);
      if (k == 0) return Status(Code::kUnavailable, what_ + ": peer closed the connection");
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status(Code::kTimeout, what_ + ": no reply in time");
        return Status(Code::kUnavailable, what_ + ": recv: " + strerror(errno));
      }
      end_ += static_cast<size_t>(k);
    }
    std::memcpy(out, buf_, n);
    begin_ = n;
    return Status::ok();
  }

  // Drops the bytes received but not yet taken; returns how many.
  size_t drain_buffered() {
    const size_t n = end_ - begin_;
    begin_ = end_ = 0;
    return n;
  }

 private:
  int fd_;
  const std::string& what_;
  char buf_[16 << 10];
  size_t begin_ = 0, end_ = 0;
};

// The aux a request of `op` may carry: a grant token on reads and writes, a notification or an rdma handshake
// (tags, segment names, a grant: a few hundred bytes), nothing much on ping and describe, or on unknown ops.
uint32_t max_aux_bytes(WireOp op) {
  switch (op) {
    case WireOp::kRead:
    case WireOp::kWrite:
    case WireOp::kRawStream:
      return static_cast<uint32_t>(auth::kMaxGrantTokenBytes);
    case WireOp::kNotify:
    case WireOp::kRdmaConnect:
      return 64u << 10;
    default:
      return 4096;
  }
}

Status send_reply(int fd, WireOp op, const Status& st, const std::string& aux_ok, const char* data, uint64_t data_len,
                  uint32_t reserved2 = 0) {
  WireReply rep;
  rep.reserved2 = reserved2;
  rep.op = static_cast<uint8_t>(op);
  rep.code = static_cast<uint16_t>(st.code());
  const std::string& aux = st.is_ok() ? aux_ok : st.message();
  rep.aux_bytes = static_cast<uint32_t>(aux.size());
  rep.length = st.is_ok() ? data_len : 0;
  iovec iov[3];
  int n = 0;
  iov[n++] = {&rep, sizeof rep};
  if (!aux.empty()) iov[n++] = {const_cast<char*>(aux.data()), aux.size()};
  if (st.is_ok() && data_len > 0) iov[n++] = {const_cast<char*>(data), data_len};
  size_t idx = 0;
  while (idx < static_cast<size_t>(n)) {
    msghdr mh{};
    mh.msg_iov = iov + idx;
    mh.msg_iovlen = static_cast<size_t>(n) - idx;
    ssize_t k = ::sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return Status(Code::kUnavailable, std::string("reply: sendmsg: ") + strerror(errno));
    }
    auto left = static_cast<size_t>(k);
    while (idx < static_cast<size_t>(n) && left >= iov[idx].iov_len) {
      left -= iov[idx].iov_len;
      ++idx;
    }
    if (idx < static_cast<size_t>(n)) {
      iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + left;
      iov[idx].iov_len -= left;
    }
  }
  return Status::ok();
}

// Bytes of raw-stream buffers allocated at once in this process, and their bound: each stream has its own
// buffer of chunk x span bytes, as each stream of a raw-TCP program has (one shared buffer made the baseline's
// sources cache-hot across streams); a stream past the bound is refused.
// 256 MiB in all: the same-memory limit of `mc-xfer bench --baseline` lends a bench at most kMaxRawSpanBytes / 2
// (xfer_tool.cpp same_memory_spans), and the streams of the row before may still hold theirs. One peer address holds
// at most half of it (kMaxRawBufferBytesPerAddress): one bench's need, and one peer cannot take the rest.
std::atomic<uint64_t> raw_buffer_bytes{0};
constexpr uint64_t kMaxRawBufferBytes = 256ull << 20;
constexpr uint64_t kMaxRawBufferBytesPerAddress = kMaxRawBufferBytes / 2;
std::mutex raw_by_address_mu;
std::unordered_map<std::string, uint64_t> raw_by_address;  // raw-stream buffer bytes by peer address

// Reserves `chunk` bytes of the raw-stream budget for a peer at `address`; false when that would pass
// kMaxRawBufferBytes in all or kMaxRawBufferBytesPerAddress for the address.
bool reserve_raw_buffer(const std::string& address, uint64_t chunk) {
  std::lock_guard<std::mutex> lk(raw_by_address_mu);
  uint64_t& mine = raw_by_address[address];
  if (mine + chunk > kMaxRawBufferBytesPerAddress || raw_buffer_bytes.load() + chunk > kMaxRawBufferBytes) {
    if (mine == 0) raw_by_address.erase(address);
    return false;
  }
  mine += chunk;
  raw_buffer_bytes += chunk;
  return true;
}
void release_raw_buffer(const std::string& address, uint64_t chunk) {
  std::lock_guard<std::mutex> lk(raw_by_address_mu);
  raw_buffer_bytes -= chunk;
  if (auto it = raw_by_address.find(address); it != raw_by_address.end() && (it->second -= chunk) == 0) {
    raw_by_address.erase(it);
  }
}

// The data phase of a kRawStream (wire.hpp): sends (target_sends) or receives up to `length` bytes in `chunk`-sized
// send/recv calls from/into `buf` (the stream's own span x chunk bytes, reserved, written before the ok reply so
// that no first-touch page fault falls in the initiator's timed window, and so that sends do not all read the
// kernel's one zero page), the next chunk each call: the plain loop a raw-TCP program runs. Ends at `length`, at
// EOF or at an error (the initiator closing early is the normal end). Bytes already read ahead count as received.
void raw_stream(int fd, ReadAhead* in, bool target_sends, uint64_t chunk, std::vector<char>& buf, uint64_t length,
                const std::string& what) {
  const uint64_t span = buf.size() / chunk;
  uint64_t moved = 0, calls = 0;
  if (!target_sends) moved += in->drain_buffered();
  while (moved < length) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, length - moved));
    char* at = buf.data() + (calls++ % span) * chunk;
    const ssize_t k = target_sends ? ::send(fd, at, n, MSG_NOSIGNAL) : ::recv(fd, at, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    moved += static_cast<uint64_t>(k);
  }
  MC_LOG_DEBUG << what << ": raw stream of " << moved << " bytes (" << (target_sends ? "sent" : "received") << ")";
}

}  // namespace

Result<std::unique_ptr<TcpServer>> TcpServer::start(const ServerOptions& options, ServerHandler* handler) {
  if (options.max_connections == 0 || options.idle_timeout_ms <= 0) {
    return Status(Code::kInvalidArgument, "tcp server: max_connections (" + std::to_string(options.max_connections) +
                                              ") and idle_timeout_ms (" + std::to_string(options.idle_timeout_ms) +
                                              ") must be > 0");
  }
  std::unique_ptr<TcpServer> s(new TcpServer(options, handler));
  s->options_.max_connections = mc::limits::cap_to_fd_limit(options.max_connections);
  if (s->options_.max_connections < options.max_connections) {
    MC_LOG_INFO << "tcp server: connection cap lowered from " << options.max_connections << " to "
                << s->options_.max_connections << " to stay under the file-descriptor limit (ulimit -n)";
  }
  for (const auto& ep : options.listen) {
    MC_ASSIGN_OR_RETURN(Endpoint hp, parse_tcp_endpoint(ep));
    uint16_t port = 0;
    MC_ASSIGN_OR_RETURN(Fd fd, listen_on(hp, &port));
    s->listeners_.push_back(std::move(fd));
    s->endpoints_.push_back(Endpoint::tcp(hp.host, port).str());
  }
  s->stop_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->stop_fd_) return Status(Code::kIo, std::string("tcp server: eventfd: ") + strerror(errno));
  s->accept_thread_ = std::thread([p = s.get()] { p->accept_loop(); });
  return s;
}

TcpServer::~TcpServer() {
  stop_.store(true);
  uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof one);
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  reap(true);
}

void TcpServer::reap(bool all) {
  std::list<std::unique_ptr<Conn>> finished;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->done.load()) {
        if (auto a = per_address_.find((*it)->address); a != per_address_.end() && --a->second == 0) {
          per_address_.erase(a);
        }
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) {
    if (c->thread.joinable()) c->thread.join();
  }
}

void TcpServer::accept_loop() {
  std::vector<pollfd> pfds;
  for (auto& l : listeners_) pfds.push_back({l.get(), POLLIN, 0});
  pfds.push_back({stop_fd_.get(), POLLIN, 0});
  // A listener whose accept failed for lack of descriptors stays readable: it is left out of the poll set
  // (fd -1) until resume_ms, the pause doubling from 10 ms to 1 s while failures repeat.
  std::vector<int64_t> resume_ms(listeners_.size(), 0), backoff_ms(listeners_.size(), 0);
  while (!stop_.load()) {
    int64_t now = steady_ms();
    int wait_ms = 1000;
    for (size_t i = 0; i < listeners_.size(); ++i) {
      if (pfds[i].fd >= 0) continue;
      if (now >= resume_ms[i]) {
        pfds[i].fd = listeners_[i].get();
      } else {
        wait_ms = static_cast<int>(std::min<int64_t>(wait_ms, resume_ms[i] - now));
      }
    }
    int rc = ::poll(pfds.data(), pfds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) {
      MC_LOG_ERROR << "tcp server: poll: " << strerror(errno);
      return;
    }
    reap(false);
    now = steady_ms();
    cut_late(now);
    for (size_t i = 0; i + 1 < pfds.size(); ++i) {
      if (pfds[i].fd < 0 || !(pfds[i].revents & POLLIN)) continue;
      sockaddr_storage peer_addr{};
      socklen_t peer_len = sizeof peer_addr;
      int cfd = ::accept4(pfds[i].fd, reinterpret_cast<sockaddr*>(&peer_addr), &peer_len, SOCK_CLOEXEC);
      if (cfd < 0) {
        const int err = errno;
        if (err == EAGAIN || err == EINTR || err == ECONNABORTED) continue;
        const bool no_resources = err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
        if (no_resources) {
          backoff_ms[i] = backoff_ms[i] == 0 ? 10 : std::min<int64_t>(1000, backoff_ms[i] * 2);
          resume_ms[i] = now + backoff_ms[i];
          pfds[i].fd = -1;
        }
        if (accept_log_.allow(now)) {
          const uint64_t more = accept_log_.take_suppressed();
          MC_LOG_WARN << "tcp server " << endpoints_[i] << ": accept: " << strerror(err)
                      << (no_resources ? "; pausing accepts for " + std::to_string(backoff_ms[i]) +
                                             " ms (raise the descriptor limit, ulimit -n, or lower "
                                             "--xfer-max-connections)"
                                       : std::string())
                      << (more > 0 ? " (" + std::to_string(more) + " more failures in the last 10 s not logged)"
                                   : std::string());
        }
        continue;
      }
      backoff_ms[i] = 0;
      std::lock_guard<std::mutex> lk(mu_);
      std::string address = format_address(peer_addr);
      const auto open_at = per_address_.find(address);
      if (const size_t open = open_at == per_address_.end() ? 0 : open_at->second;
          open >= options_.max_connections_per_address) {
        conn_refused_++;
        if (refuse_log_.allow(now)) {
          const uint64_t more = refuse_log_.take_suppressed();
          MC_LOG_WARN << "tcp server " << endpoints_[i] << ": refusing connection from " << format_peer(peer_addr)
                      << ": " << open << " open from " << address << " (limit " << options_.max_connections_per_address
                      << " per address)"
                      << (more > 0 ? " (" + std::to_string(more) + " more refused in the last 10 s)" : std::string());
        }
        ::close(cfd);
        continue;
      }
      if (conns_.size() >= options_.max_connections) {
        conn_refused_++;
        if (refuse_log_.allow(now)) {
          const uint64_t more = refuse_log_.take_suppressed();
          MC_LOG_WARN << "tcp server " << endpoints_[i] << ": refusing connection: " << conns_.size()
                      << " connections open (limit " << options_.max_connections
                      << ", --xfer-max-connections; idle ones close after --xfer-idle-timeout-ms "
                      << options_.idle_timeout_ms << ")"
                      << (more > 0 ? " (" + std::to_string(more) + " more refused in the last 10 s)" : std::string());
        }
        ::close(cfd);
        continue;
      }
      accepted_++;
      tune_data_socket(cfd, options_.socket_buffer_bytes);
      // Every recv of this connection waits at most idle_timeout_ms (SO_RCVTIMEO): a connection silent that
      // long, between requests or inside one, is closed and gives its slot and thread back.
      set_receive_timeout(cfd, options_.idle_timeout_ms);
      auto c = std::make_unique<Conn>();
      c->fd.reset(cfd);
      c->peer = format_peer(peer_addr);
      c->deadline_ms.store(now + options_.idle_timeout_ms, std::memory_order_relaxed);
      ++per_address_[address];
      c->address = std::move(address);
      Conn* raw = c.get();
      conns_.push_back(std::move(c));
      raw->thread = std::thread([this, raw] { serve_connection(raw); });
    }
  }
}

void TcpServer::cut_late(int64_t now) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& c : conns_) {
    int64_t deadline = c->deadline_ms.load(std::memory_order_relaxed);
    if (deadline == 0 || now < deadline || c->done.load()) continue;
    // Unless its thread began a new phase meanwhile: it then sees its recv or send fail and ends; reap() frees the
    // slot.
    if (!c->deadline_ms.compare_exchange_strong(deadline, 0)) continue;
    ::shutdown(c->fd.get(), SHUT_RDWR);
    conn_cut_++;
    if (cut_log_.allow(now)) {
      const uint64_t more = cut_log_.take_suppressed();
      MC_LOG_WARN << "tcp server " << (endpoints_.empty() ? std::string("?") : endpoints_.front())
                  << ": closed the connection from " << c->peer << ": a request awaited, received or answered for "
                  << options_.idle_timeout_ms + (now - deadline) << " ms (--xfer-idle-timeout-ms "
                  << options_.idle_timeout_ms << ", measured from its start)"
                  << (more > 0 ? " (" + std::to_string(more) + " more closed at a deadline in the last 10 s)"
                               : std::string());
    }
  }
}

void TcpServer::log_refusal(const std::string& peer, WireOp op, uint64_t offset, uint64_t length, const Status& why) {
  refused_++;
  std::lock_guard<std::mutex> lk(refusal_log_mu_);
  if (!refusal_log_.allow(steady_ms())) return;
  const uint64_t more = refusal_log_.take_suppressed();
  const char* what = op == WireOp::kRead        ? "read"
                     : op == WireOp::kWrite     ? "write"
                     : op == WireOp::kRawStream ? "raw stream"
                                                : "notification";
  MC_LOG_WARN << "tcp server " << (endpoints_.empty() ? std::string("?") : endpoints_.front()) << ": refused " << what
              << (op == WireOp::kNotify ? std::string()
                                        : " [" + std::to_string(offset) + ", +" + std::to_string(length) + ")")
              << " from " << peer << ": " << why.message()
              << (more > 0 ? " (" + std::to_string(more) + " more refused before it not logged)" : std::string());
}

void TcpServer::serve_connection(Conn* conn) {
  const int fd = conn->fd.get();
  const std::string what = "tcp server connection";
  std::string aux;
  std::vector<std::shared_ptr<void>> leases;  // rdma queue pairs set up over this connection
  // The last grant token that verified on this connection and what it carries: an initiator sends the same
  // token with every wire op of a request, so the MAC is computed once per request and connection.
  std::string granted_token;
  auth::Grant granted;
  const bool grants = handler_->grants_required();
  auto in = std::make_unique<ReadAhead>(fd, what);  // 16 KiB: on the heap, not the connection thread's stack
  bool holds_rdma = false;                          // a queue pair lives as long as this connection: never idle-closed
  // The phase now under way must end within idle_timeout_ms of its start (cut_late shuts the socket down).
  auto phase = [&] {
    conn->deadline_ms.store(holds_rdma ? 0 : steady_ms() + options_.idle_timeout_ms, std::memory_order_relaxed);
  };
  while (!stop_.load()) {
    WireRequest req;
    if (!holds_rdma) phase();  // waiting for the next request: the connection's idle time, however it trickles
    if (Status got = in->take(&req, sizeof req); !got.is_ok()) {  // peer closed or reset: normal end
      if (got.code() == Code::kTimeout) {
        MC_LOG_DEBUG << what << ": closed after " << options_.idle_timeout_ms << " ms idle";
      }
      break;
    }
    const auto op = static_cast<WireOp>(req.op);
    if (Status bad = check_request_header(req); !bad.is_ok()) {
      errors_++;
      (void)send_reply(fd, bad.code() == Code::kProtocolMismatch ? WireOp::kPing : op, bad, "", nullptr, 0);
      break;
    }
    if (req.aux_bytes > max_aux_bytes(op)) {
      errors_++;  // checked before the aux buffer grows: a 32-byte header never commits megabytes
      (void)send_reply(fd, op,
                       Status(Code::kMessageTooLarge, "aux of " + std::to_string(req.aux_bytes) + " bytes on op " +
                                                          std::to_string(req.op) + " (at most " +
                                                          std::to_string(max_aux_bytes(op)) + ")"),
                       "", nullptr, 0);
      break;
    }
    if (!holds_rdma) phase();  // the aux, the payload and the reply, from the header
    aux.resize(req.aux_bytes);
    if (req.aux_bytes > 0 && !in->take(aux.data(), aux.size()).is_ok()) break;
    ops_++;
    Status sent;
    switch (op) {
      case WireOp::kRead:
      case WireOp::kWrite: {
        const bool oversized = req.length > options_.max_op_bytes;
        if (grants && !oversized) {  // the grant before the range: an ungranted peer learns nothing from it
          Status allowed = Status::ok();
          if (aux != granted_token || granted_token.empty()) {
            Result<auth::Grant> g = handler_->verify_grant(aux);
            if (g.is_ok()) {
              granted = std::move(g).value();
              granted_token = aux;
            } else {
              granted_token.clear();
              allowed = g.status();
            }
          }
          if (allowed.is_ok()) allowed = handler_->check_access(granted, op, req.offset, req.length);
          if (!allowed.is_ok()) {
            log_refusal(conn->peer, op, req.offset, req.length, allowed);
            errors_++;
            // A refused WRITE's payload (bounded by max_op_bytes above) is read and dropped, so the initiator
            // gets the reason rather than a reset while it still sends, and the connection stays usable.
            Status drained = Status::ok();
            if (op == WireOp::kWrite) {
              char sink[64 << 10];
              for (uint64_t left = req.length; left > 0 && drained.is_ok();) {
                const uint64_t n = std::min<uint64_t>(left, sizeof sink);
                drained = in->take(sink, n);
                left -= n;
              }
            }
            sent = drained.is_ok() ? send_reply(fd, op, allowed, "", nullptr, 0) : drained;
            break;
          }
        }
        Result<char*> mem =
            oversized ? Result<char*>(Status(Code::kOutOfRange,
                                             "single " + std::string(op == WireOp::kRead ? "read" : "write") + " of " +
                                                 std::to_string(req.length) + " bytes exceeds the limit of " +
                                                 std::to_string(options_.max_op_bytes) + " bytes per op"))
                      : handler_->resolve(req.offset, req.length);
        if (!mem.is_ok()) {
          errors_++;
          sent = send_reply(fd, op, mem.status(), "", nullptr, 0);
          if (op == WireOp::kWrite && req.length > 0) sent = Status(Code::kAborted, "payload not consumed");
          break;
        }
        if (op == WireOp::kRead) {
          reads_++;
          read_bytes_ += req.length;
          sent = send_reply(fd, op, Status::ok(), "", mem.value(), req.length);
        } else {
          sent = in->take(mem.value(), req.length);
          if (sent.is_ok()) {
            writes_++;
            written_bytes_ += req.length;
            sent = send_reply(fd, op, Status::ok(), "", nullptr, 0);
          }
        }
        if (!sent.is_ok()) errors_++;
        break;
      }
      case WireOp::kDescribe:
        sent = send_reply(fd, op, Status::ok(), handler_->describe(), nullptr, 0);
        break;
      case WireOp::kNotify: {
        Status st = handler_->notify(aux, conn->peer);
        if (!st.is_ok()) errors_++;
        if (st.code() == Code::kPermissionDenied) log_refusal(conn->peer, op, 0, 0, st);
        sent = send_reply(fd, op, st, "", nullptr, 0);
        break;
      }
      case WireOp::kPing:
        sent = send_reply(fd, op, Status::ok(), "", nullptr, 0);
        break;
      case WireOp::kRawStream: {
        Status st = Status::ok();
        const uint64_t span = std::max<uint64_t>(1, req.reserved2);
        if (req.offset == 0 || req.offset > kMaxRawChunkBytes ||
            (req.reserved != kRawTargetSends && req.reserved != kRawTargetReceives)) {
          st = Status(Code::kInvalidArgument, "raw stream: chunk of " + std::to_string(req.offset) + " bytes (1 to " +
                                                  std::to_string(kMaxRawChunkBytes) + ") or direction " +
                                                  std::to_string(req.reserved) + " out of range");
        } else if (span > kMaxRawSpanBytes / req.offset) {  // chunk x span <= kMaxRawSpanBytes, without overflow
          st = Status(Code::kInvalidArgument, "raw stream: span of " + std::to_string(span) + " chunks of " +
                                                  std::to_string(req.offset) + " bytes is above " +
                                                  std::to_string(kMaxRawSpanBytes) + " bytes");
        } else if (grants) {
          // As reads and writes: the MAC, then the segment, the op (the target sends: a read) and the expiry.
          Result<auth::Grant> g = handler_->verify_grant(aux);
          st = g.is_ok() ? handler_->check_access(*g, req.reserved == kRawTargetSends ? WireOp::kRead : WireOp::kWrite,
                                                  g->offset, 0)
                         : g.status();
          if (!st.is_ok()) log_refusal(conn->peer, op, 0, req.length, st);
        }
        const uint64_t buffer_bytes = st.is_ok() ? req.offset * span : 0;
        const bool reserved = st.is_ok() && reserve_raw_buffer(conn->address, buffer_bytes);
        if (st.is_ok() && !reserved) {
          st = Status(Code::kResourceExhausted,
                      "raw stream: " + std::to_string(raw_buffer_bytes.load()) +
                          " bytes of raw-stream buffers in use (at most " + std::to_string(kMaxRawBufferBytes) + ", " +
                          std::to_string(kMaxRawBufferBytesPerAddress) + " per peer address); retry later");
        }
        std::vector<char> buf;
        if (reserved) {
          try {
            buf.assign(buffer_bytes, 0x5a);
          } catch (const std::bad_alloc&) {
            st = Status(Code::kResourceExhausted,
                        "raw stream: cannot allocate " + std::to_string(buffer_bytes) + " bytes; retry later");
          }
        }
        if (!st.is_ok()) errors_++;
        // The ok reply echoes the span it serves (reserved2), so an initiator can tell it from an older target.
        sent = send_reply(fd, op, st, "", nullptr, 0, st.is_ok() ? static_cast<uint32_t>(span) : 0);
        if (sent.is_ok() && st.is_ok()) {
          conn->deadline_ms.store(0, std::memory_order_relaxed);  // as long as the initiator measures
          raw_stream(fd, in.get(), req.reserved == kRawTargetSends, req.offset, buf, req.length, what);
        }
        buf = std::vector<char>();
        if (reserved) release_raw_buffer(conn->address, buffer_bytes);
        sent = Status(Code::kAborted, "raw stream ended");  // the connection carried raw bytes: close it
        break;
      }
      case WireOp::kRdmaConnect: {
        auto r = handler_->rdma_connect(aux);
        if (!r.is_ok()) {
          errors_++;
          sent = send_reply(fd, op, r.status(), "", nullptr, 0);
          break;
        }
        leases.push_back(std::move(r.value().second));
        set_receive_timeout(fd, 0);  // the queue pair lives as long as this connection: never idle-closed
        holds_rdma = true;
        conn->deadline_ms.store(0, std::memory_order_relaxed);
        sent = send_reply(fd, op, Status::ok(), r.value().first, nullptr, 0);
        break;
      }
      default:
        errors_++;
        (void)send_reply(fd, op, Status(Code::kMalformedMessage, "unknown op " + std::to_string(req.op)), "", nullptr,
                         0);
        sent = Status(Code::kMalformedMessage, "unknown op");
        break;
    }
    if (!sent.is_ok()) break;
  }
  leases.clear();
  ::shutdown(fd, SHUT_RDWR);  // the fd itself is closed by reap() after join, so its number is never reused early
  conn->done.store(true);
}

}  // namespace mc::transfer::tcp
