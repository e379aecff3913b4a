#include "mc/net/fast_rpc.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include <sodium.h>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/net/rpc.hpp"
#include "mc/net/socket.hpp"
#include "mc/proto/envelope.hpp"

namespace mc::rpc::fast {

namespace {

std::string errno_text(int e) { return std::string(std::strerror(e)); }

void put_u32(char* p, uint32_t v) {
  p[0] = static_cast<char>(v >> 24);
  p[1] = static_cast<char>(v >> 16);
  p[2] = static_cast<char>(v >> 8);
  p[3] = static_cast<char>(v);
}
uint32_t get_u32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

void set_options(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int flags = fcntl(fd, F_GETFL, 0);
  (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// getaddrinfo's list, freed with freeaddrinfo.
struct AddrInfoFree {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoFree>;

// Resolves host and port for a stream socket; the gai_strerror text on failure.
Result<AddrInfoList> resolve_stream(const std::string& host, uint16_t port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return Status(Code::kUnavailable, gai_strerror(rc));
  return AddrInfoList(res);
}

// A msgpack packer's sink appending to a std::string.
struct StringSink {
  std::string* out;
  void write(const char* data, size_t n) { out->append(data, n); }
};
}  // namespace

void append_frame(std::string& out, std::string_view type, uint64_t id, std::string_view body,
                  std::string_view type_suffix) {
  // proto::Header's map (the keys MC_MESSAGE writes), packed straight into `out` after a prefix
  // that is filled in once the header's length is known: no temporary buffer or string per frame.
  const size_t at = out.size();
  out.append(kPrefixBytes, '\0');
  StringSink sink{&out};
  msgpack::packer<StringSink> pk(sink);
  pk.pack_map(3);
  pk.pack(std::string_view("v"));
  pk.pack(proto::kProtocolVersion);
  pk.pack(std::string_view("type"));
  pk.pack_str(static_cast<uint32_t>(type.size() + type_suffix.size()));
  pk.pack_str_body(type.data(), static_cast<uint32_t>(type.size()));
  pk.pack_str_body(type_suffix.data(), static_cast<uint32_t>(type_suffix.size()));
  pk.pack(std::string_view("id"));
  pk.pack(id);
  put_u32(&out[at], static_cast<uint32_t>(out.size() - at - kPrefixBytes));
  put_u32(&out[at + 4], static_cast<uint32_t>(body.size()));
  out.append(body.data(), body.size());
}

// ------------------------------------------------------------------------------------------------
// Seal

namespace {
constexpr char kSealMagic[4] = {'M', 'C', 'S', '1'};

void nonce_of(uint64_t count, unsigned char nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES]) {
  std::memset(nonce, 0, crypto_aead_chacha20poly1305_IETF_NPUBBYTES);
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(count >> (8 * (7 - i)));
}

// key = BLAKE2b(label || client_nonce || server_nonce) keyed with the crypto_kx session key.
void mix(unsigned char out[32], const unsigned char kx[32], const char* label, std::string_view client_nonce,
         std::string_view server_nonce) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, kx, 32, 32);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(label), std::strlen(label));
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(client_nonce.data()), client_nonce.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(server_nonce.data()), server_nonce.size());
  crypto_generichash_final(&st, out, 32);
}

const unsigned char* bytes(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }
}  // namespace

Status Seal::derive(bool client_side, std::string_view own_pk, std::string_view own_sk, std::string_view peer_pk,
                    std::string_view client_nonce, std::string_view server_nonce) {
  unsigned char rx[32], tx[32];
  const int rc = client_side ? crypto_kx_client_session_keys(rx, tx, bytes(own_pk), bytes(own_sk), bytes(peer_pk))
                             : crypto_kx_server_session_keys(rx, tx, bytes(own_pk), bytes(own_sk), bytes(peer_pk));
  if (rc != 0) return Status(Code::kInvalidArgument, "the peer's public key is unusable (X25519 refused it)");
  // The client's tx is the server's rx: one label per direction, "c2s" and "s2c".
  mix(tx_, tx, client_side ? "mc c2s" : "mc s2c", client_nonce, server_nonce);
  mix(rx_, rx, client_side ? "mc s2c" : "mc c2s", client_nonce, server_nonce);
  sodium_memzero(rx, sizeof(rx));
  sodium_memzero(tx, sizeof(tx));
  return Status::ok();
}

void Seal::seal(std::string_view plain, std::string& out) {
  do {
    const size_t n = std::min(plain.size(), kMaxRecordBytes);
    const size_t at = out.size();
    out.resize(at + 4 + n + kSealTagBytes);
    put_u32(&out[at], static_cast<uint32_t>(n + kSealTagBytes));
    unsigned char nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    nonce_of(tx_count_++, nonce);
    unsigned long long written = 0;
    crypto_aead_chacha20poly1305_ietf_encrypt(reinterpret_cast<unsigned char*>(&out[at + 4]), &written, bytes(plain), n,
                                              nullptr, 0, nullptr, nonce, tx_);
    plain.remove_prefix(n);
  } while (!plain.empty());
}

Status Seal::open(const char* data, size_t n, std::string& plain, const std::string& peer) {
  in_.append(data, n);
  size_t pos = 0;
  while (in_.size() - pos >= 4) {
    const uint32_t len = get_u32(&in_[pos]);
    if (len < kSealTagBytes || len > kMaxRecordBytes + kSealTagBytes) {
      return Status(Code::kDataLoss, "sealed record of " + std::to_string(len) + " bytes from " + peer + " (limit " +
                                         std::to_string(kMaxRecordBytes + kSealTagBytes) + ")");
    }
    if (in_.size() - pos - 4 < len) break;
    unsigned char nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    nonce_of(rx_count_++, nonce);
    const size_t at = plain.size();
    plain.resize(at + len - kSealTagBytes);
    unsigned long long got = 0;
    if (crypto_aead_chacha20poly1305_ietf_decrypt(reinterpret_cast<unsigned char*>(plain.data() + at), &got, nullptr,
                                                  bytes(std::string_view(in_).substr(pos + 4)), len, nullptr, 0, nonce,
                                                  rx_) != 0) {
      return Status(Code::kDataLoss, "a record from " + peer +
                                         " failed its authentication tag (wrong key, or bytes changed on the way)");
    }
    pos += 4 + len;
  }
  in_.erase(0, pos);
  return Status::ok();
}

// A buffer emptied after a large frame gives its memory back rather than keeping it for the connection's life.
constexpr size_t kKeepCapacityBytes = 1u << 20;

void FrameReader::feed(const char* data, size_t n) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    if (buf_.capacity() > kKeepCapacityBytes) {
      std::string().swap(buf_);
    } else {
      buf_.clear();
    }
    pos_ = 0;
  } else if (pos_ > (1u << 16) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(data, n);
}

uint64_t FrameReader::partial_frame_bytes() const {
  const size_t avail = buf_.size() - pos_;
  if (avail < kPrefixBytes) return 0;
  const char* p = buf_.data() + pos_;
  const uint64_t total = kPrefixBytes + uint64_t{get_u32(p)} + uint64_t{get_u32(p + 4)};
  return avail < total ? total : 0;
}

Result<std::optional<Frame>> FrameReader::next(const std::string& peer, uint64_t max_body_bytes) {
  const size_t avail = buf_.size() - pos_;
  if (avail < kPrefixBytes) return std::optional<Frame>();
  const char* p = buf_.data() + pos_;
  const uint32_t head_bytes = get_u32(p), body_bytes = get_u32(p + 4);
  if (head_bytes == 0 || head_bytes > kMaxHeaderBytes) {
    return Status(Code::kMalformedMessage, "frame from " + peer + " declares a " + std::to_string(head_bytes) +
                                               "-byte header (limit " + std::to_string(kMaxHeaderBytes) +
                                               "): not an mc RPC frame");
  }
  if (body_bytes > max_body_bytes) {
    return Status(Code::kMessageTooLarge, "frame from " + peer + " declares a " + std::to_string(body_bytes) +
                                              "-byte body (limit " + std::to_string(max_body_bytes) + " bytes)");
  }
  if (avail < kPrefixBytes + head_bytes + body_bytes) return std::optional<Frame>();
  Result<proto::Header> h =
      codec::unpack<proto::Header>(std::string_view(p + kPrefixBytes, head_bytes), "frame header");
  if (!h.is_ok()) return h.status().with_context("from " + peer);
  Frame f{std::move(h).value(), std::string(p + kPrefixBytes + head_bytes, body_bytes)};
  pos_ += kPrefixBytes + head_bytes + body_bytes;
  return std::optional<Frame>(std::move(f));
}

// ------------------------------------------------------------------------------------------------
// FastServer

Result<std::unique_ptr<FastServer>> FastServer::listen(const std::string& endpoint, std::string service,
                                                       Dispatch dispatch, const FastServerLimits& requested) {
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"max_frame_bytes", static_cast<int64_t>(requested.max_frame_bytes)},
        {"max_conn_buffer_bytes", static_cast<int64_t>(requested.max_conn_buffer_bytes)},
        {"max_buffer_bytes", static_cast<int64_t>(requested.max_buffer_bytes)},
        {"max_connections", static_cast<int64_t>(requested.max_connections)},
        {"idle_timeout_ms", requested.idle_timeout_ms},
        {"handshake_timeout_ms", requested.handshake_timeout_ms},
        {"request_timeout_ms", requested.request_timeout_ms},
        {"max_connections_per_address", static_cast<int64_t>(requested.max_connections_per_address)}}) {
    if (value <= 0) {
      return Status(Code::kInvalidArgument,
                    service + ": fast path limit " + name + " must be > 0 (got " + std::to_string(value) + ")");
    }
  }
  FastServerLimits lim = requested;
  lim.max_frame_bytes = std::min<uint64_t>(lim.max_frame_bytes, static_cast<uint64_t>(proto::kMaxMessageBytes));
  lim.max_connections = mc::limits::cap_to_fd_limit(requested.max_connections);
  if (lim.max_connections < requested.max_connections) {
    MC_LOG_INFO << service << ": fast path connection cap lowered from " << requested.max_connections << " to "
                << lim.max_connections << " to stay under the file-descriptor limit (ulimit -n) with "
                << mc::limits::kReservedFds << " to spare";
  }
  MC_ASSIGN_OR_RETURN(Endpoint ep, parse_endpoint(endpoint));
  if (!ep.is_tcp()) {
    return Status(Code::kInvalidArgument,
                  service + ": the fast path listens on tcp://HOST:PORT, not '" + endpoint + "'");
  }
  const std::string host = ep.host == "*" ? "0.0.0.0" : ep.host;
  MC_RETURN_IF_ERROR(auth::check_listen(service, ep.host));
  if (const auth::Keyring* ring = auth::keyring(); ring != nullptr && ring->cluster_secret().empty()) {
    return Status(Code::kFailedPrecondition,
                  service + ": cannot serve the fast path: " + ring->dir() + "/cluster.secret is not on this host");
  }
  Result<AddrInfoList> addrs = resolve_stream(host, ep.port, AI_PASSIVE);
  if (!addrs.is_ok()) {
    return Status(Code::kInvalidArgument, service + ": cannot resolve '" + host + "' (fast endpoint of " + endpoint +
                                              "): " + addrs.status().message());
  }
  std::unique_ptr<FastServer> s(new FastServer(std::move(service), std::move(dispatch), lim));
  int err = 0;
  for (addrinfo* a = addrs->get(); a != nullptr && !s->listen_fd_; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      err = errno;
      continue;
    }
    int one = 1;
    (void)setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 512) != 0) {
      err = errno;
      continue;
    }
    s->listen_fd_ = std::move(fd);
  }
  if (!s->listen_fd_) {
    return Status(Code::kUnavailable, s->service_ + ": cannot listen on " + format_host_port(host, ep.port) +
                                          " (fast endpoint of " + endpoint + "): " + errno_text(err));
  }
  set_options(s->listen_fd_.get());
  s->epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the listener
  if (!s->epoll_fd_ || ::epoll_ctl(s->epoll_fd_.get(), EPOLL_CTL_ADD, s->listen_fd_.get(), &ev) != 0) {
    return Status(Code::kUnavailable,
                  s->service_ + ": epoll for the fast endpoint " + endpoint + ": " + errno_text(errno));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(s->listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    s->port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  }
  return s;
}

bool FastServer::update_interest(Conn& c) {
  // A client that sends without reading its replies stops being read once max_conn_buffer_bytes of them
  // wait: its requests stay in the kernel's buffers (TCP flow control), the master's memory stays bounded.
  const bool backlog = backlogged(c);
  uint32_t want = (c.closing || backlog) ? 0u : static_cast<uint32_t>(EPOLLIN);
  // Writable again: replies to send, or requests left unanswered for the backlog to answer (wait_and_handle).
  if (c.out_pos < c.out.size() || (c.reader.head_complete() && !c.closing)) want |= EPOLLOUT;
  if (want == c.events) return true;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = &c;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    MC_LOG_WARN << service_ << ": epoll_ctl for " << c.peer << " failed: " << errno_text(errno) << "; closing it";
    return false;
  }
  c.events = want;
  return true;
}

void FastServer::close_conn(Conn* c) {
  release(*c);
  if (auto it = per_address_.find(c->address); it != per_address_.end() && --it->second == 0) per_address_.erase(it);
  conns_.erase(c);  // closes the socket, which also leaves the epoll set
  ++counters_.closed;
}

void FastServer::log_closing(const Status& why) {
  if (!frame_log_.allow(steady_ms())) return;
  const uint64_t more = frame_log_.take_suppressed();
  MC_LOG_WARN << service_ << ": closing a fast connection: " << why.message()
              << (more > 0 ? " (" + std::to_string(more) + " more closed for bad frames in the last 10 s)"
                           : std::string());
}

void FastServer::release(Conn& c) {
  buffered_bytes_ -= c.reserved;
  c.reserved = 0;
}

bool FastServer::admit(Conn& c) {
  const uint64_t want = c.reader.partial_frame_bytes();
  if (want == c.reserved) return true;
  release(c);
  if (want == 0) return true;
  // The frame's own size was checked by next() (max_frame_bytes); here its share of the total.
  if (buffered_bytes_ + want > limits_.max_buffer_bytes) {
    const Status refused(Code::kResourceExhausted, service_ + " is buffering " + std::to_string(buffered_bytes_) +
                                                       " bytes of partial requests (limit " +
                                                       std::to_string(limits_.max_buffer_bytes) +
                                                       ", --fast-buffer-bytes): refusing a " + std::to_string(want) +
                                                       "-byte frame from " + c.peer + "; retry, or use ZeroMQ");
    ++counters_.refused;
    log_closing(refused);
    append_frame(c.out, proto::kErrorType, 0, error_reply_body(refused));
    c.closing = true;
    return false;
  }
  c.reserved = want;
  buffered_bytes_ += want;
  c.reader.reserve(want);
  return true;
}

FastServer::Conn* FastServer::idlest(int64_t now) const {
  Conn* best = nullptr;
  for (const auto& [raw, c] : conns_) {
    if (now - c->last_active_ms < limits_.idle_timeout_ms || c->closing) continue;
    if (best == nullptr || c->last_active_ms < best->last_active_ms) best = raw;
  }
  return best;
}

std::string FastServer::past_deadline(const Conn& c, int64_t now) const {
  // Unread replies first (and requests left unanswered for them): the peer does not read, whatever else it sent.
  if ((c.out_pos < c.out.size() || c.reader.head_complete()) && c.sending_since_ms != 0 &&
      now - c.sending_since_ms >= limits_.idle_timeout_ms) {
    return std::to_string(c.out.size() - c.out_pos) + " bytes of replies unread for " +
           std::to_string(now - c.sending_since_ms) + " ms (--fast-idle-timeout-ms " +
           std::to_string(limits_.idle_timeout_ms) + ")";
  }
  if (!c.greeted && now - c.accepted_ms >= limits_.handshake_timeout_ms) {
    return "no request answered " + std::to_string(now - c.accepted_ms) + " ms after accept (handshake and first " +
           "request within " + std::to_string(limits_.handshake_timeout_ms) + " ms)";
  }
  if (c.partial_since_ms != 0 && now - c.partial_since_ms >= limits_.request_timeout_ms) {
    return "a request begun " + std::to_string(now - c.partial_since_ms) + " ms ago is not complete (limit " +
           std::to_string(limits_.request_timeout_ms) + " ms)";
  }
  return "";
}

void FastServer::sweep(int64_t now) {
  if (now < next_sweep_ms_) return;
  next_sweep_ms_ = now + std::min<int64_t>(
                             {1000, limits_.idle_timeout_ms, limits_.handshake_timeout_ms, limits_.request_timeout_ms});
  std::vector<Conn*> stalled, cut;
  for (const auto& [raw, c] : conns_) {
    std::string why;
    if (!c->greeted || c->partial_since_ms != 0 || c->out_pos < c->out.size() || c->reader.head_complete()) {
      why = past_deadline(*c, now);
    }
    if (why.empty() && c->reader.buffered() > 0 && !c->reader.head_complete() &&
        now - c->last_active_ms >= limits_.idle_timeout_ms) {
      stalled.push_back(raw);
    } else if (!why.empty()) {
      cut.push_back(raw);
      ++counters_.cut;
      if (cut_log_.allow(now)) {
        const uint64_t more = cut_log_.take_suppressed();
        MC_LOG_WARN << service_ << ": closing the fast connection from " << c->peer << ": " << why
                    << (more > 0 ? " (" + std::to_string(more) + " more closed at a deadline in the last 10 s)"
                                 : std::string());
      }
    }
  }
  for (Conn* c : stalled) {
    MC_LOG_INFO << service_ << ": closing the fast connection from " << c->peer << ": stalled inside a frame for "
                << now - c->last_active_ms << " ms (--fast-idle-timeout-ms " << limits_.idle_timeout_ms << ")";
    ++counters_.evicted;
    close_conn(c);
  }
  for (Conn* c : cut) close_conn(c);
}

void FastServer::set_listener_interest(bool on) {
  if (listener_on_ == on) return;
  epoll_event ev{};
  ev.events = on ? static_cast<uint32_t>(EPOLLIN) : 0u;
  ev.data.ptr = nullptr;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev) == 0) listener_on_ = on;
}

void FastServer::accept_failed(int err, int64_t now) {
  ++counters_.accept_failures;
  const bool no_resources = err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
  if (no_resources) {
    // The listener stays readable while the backlog waits: polling it again at once would spin. Pause it,
    // and free a descriptor held by an idle connection if there is one.
    accept_backoff_ms_ = accept_backoff_ms_ == 0 ? 10 : std::min<int64_t>(1000, accept_backoff_ms_ * 2);
    accept_resume_ms_ = now + accept_backoff_ms_;
    set_listener_interest(false);
    if (Conn* c = idlest(now)) {
      ++counters_.evicted;
      close_conn(c);
    }
  }
  if (accept_log_.allow(now)) {
    const uint64_t more = accept_log_.take_suppressed();
    MC_LOG_WARN << service_ << ": accept on the fast endpoint failed: " << errno_text(err)
                << (no_resources ? "; pausing accepts for " + std::to_string(accept_backoff_ms_) +
                                       " ms (raise the descriptor limit, ulimit -n, or lower --fast-max-connections)"
                                 : std::string())
                << (more > 0 ? " (" + std::to_string(more) + " more failures in the last 10 s not logged)"
                             : std::string());
  }
}

void FastServer::accept_all(int64_t now) {
  for (int n = 0; n < 64; ++n) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    Fd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC));
    if (!fd) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        accept_failed(errno, now);
      }
      return;
    }
    accept_backoff_ms_ = 0;
    std::string address = net::peer_address(ss);
    const auto open_at = per_address_.find(address);
    if (const size_t open = open_at == per_address_.end() ? 0 : open_at->second;
        open >= limits_.max_connections_per_address) {
      ++counters_.address_rejected;
      if (reject_log_.allow(now)) {
        const uint64_t more = reject_log_.take_suppressed();
        MC_LOG_WARN << service_ << ": refusing a fast connection from " << net::peer_name(ss) << ": " << open
                    << " open from " << address << " (--fast-max-connections-per-address "
                    << limits_.max_connections_per_address << ")"
                    << (more > 0 ? " (" + std::to_string(more) + " more refused in the last 10 s)" : std::string());
      }
      continue;  // `fd` closes: the client sees the connection end and falls back to ZeroMQ
    }
    if (conns_.size() >= limits_.max_connections) {
      Conn* idle = idlest(now);
      if (idle == nullptr) {
        ++counters_.rejected;
        if (reject_log_.allow(now)) {
          const uint64_t more = reject_log_.take_suppressed();
          MC_LOG_WARN << service_ << ": refusing a fast connection from " << net::peer_name(ss) << ": " << conns_.size()
                      << " open, none idle for " << limits_.idle_timeout_ms << " ms (--fast-max-connections "
                      << limits_.max_connections << ")"
                      << (more > 0 ? " (" + std::to_string(more) + " more refused in the last 10 s)" : std::string());
        }
        continue;  // `fd` closes: the client sees the connection end and falls back to ZeroMQ
      }
      ++counters_.evicted;
      MC_LOG_DEBUG << service_ << ": closing the fast connection from " << idle->peer << " (idle "
                   << now - idle->last_active_ms << " ms) for a new one";
      close_conn(idle);
    }
    set_options(fd.get());
    auto c = std::make_unique<Conn>();
    c->fd = std::move(fd);
    c->peer = net::peer_name(ss);
    c->events = EPOLLIN;
    c->last_active_ms = c->accepted_ms = now;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c.get();
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c->fd.get(), &ev) != 0) {
      MC_LOG_WARN << service_ << ": cannot watch the connection from " << c->peer << ": " << errno_text(errno);
      continue;
    }
    Conn* raw = c.get();
    ++per_address_[address];
    c->address = std::move(address);
    conns_.emplace(raw, std::move(c));
    ++counters_.accepted;
  }
}

void FastServer::answer(Conn& c, const Frame& f) {
  auto error = [&](const Status& s) {
    ++counters_.errors;
    append_frame(c.out, proto::kErrorType, f.header.id, error_reply_body(s));
  };
  if (f.header.v != proto::kProtocolVersion) {
    ++counters_.malformed;
    return error(version_mismatch(f.header, service_));
  }
  if (f.header.type == proto::HelloRequest::kType) {
    Result<proto::HelloRequest> hello = codec::unpack<proto::HelloRequest>(f.body, "body of 'hello'");
    if (!hello.is_ok()) return error(hello.status());
    Result<proto::HelloReply> reply = answer_hello(hello.value(), service_);
    if (!reply.is_ok()) return error(reply.status());
    append_frame(c.out, f.header.type, f.header.id, codec::pack(reply.value()), ".reply");
    return;
  }
  if (c.caller != nullptr && !auth::may_call(c.caller->role, f.header.type)) {
    ++counters_.denied;
    const Status denied(Code::kPermissionDenied,
                        service_ + " refused '" + f.header.type + "' from " + c.caller->describe() + " at " + c.peer +
                            ": the " + std::string(auth::role_name(c.caller->role)) +
                            " role may not call it (allowed: " + auth::allowed_roles(f.header.type) + ")");
    if (log::nth_worth_logging(counters_.denied)) {
      MC_LOG_WARN << denied.message() << " (" << counters_.denied << " refused so far)";
    }
    return error(denied);
  }
  Result<std::string> reply = Status(Code::kInternal, "handler did not run");
  try {
    reply = dispatch_(f.header.type, f.body, c.caller);
  } catch (const std::exception& e) {
    reply = Status(Code::kInternal, service_ + ": handler for '" + f.header.type + "' threw: " + e.what());
  }
  if (!reply.is_ok()) {
    if (reply.status().code() == Code::kMalformedMessage) ++counters_.malformed;
    return error(reply.status());
  }
  ++counters_.handled;
  append_frame(c.out, f.header.type, f.header.id, reply.value(), ".reply");
}

bool FastServer::on_readable(Conn& c) {
  char buf[64 * 1024];
  c.last_active_ms = steady_ms();
  // Whatever way this returns, a request (or sealed record, or handshake) left incomplete keeps the time it began.
  // (Whole requests in the reader, left for the backlog (answer_frames), are not partial: they wait for the peer.)
  struct Partial {
    Conn& c;
    ~Partial() {
      const bool partial = (c.reader.buffered() > 0 && !c.reader.head_complete()) ||
                           (c.seal ? c.seal->pending_bytes() > 0 : !c.handshake.empty());
      if (!partial) {
        c.partial_since_ms = 0;
      } else if (c.partial_since_ms == 0) {
        c.partial_since_ms = c.last_active_ms;
      }
    }
  } partial{c};
  // Bounded: a client flooding one connection cannot starve the others.
  for (int round = 0; round < 16; ++round) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n == 0) return false;  // peer closed
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      MC_LOG_DEBUG << service_ << ": fast connection from " << c.peer << " failed: " << errno_text(errno);
      return false;
    }
    if (auth::keyring() != nullptr) {
      size_t used = 0;
      if (!c.seal) {
        used = std::min(static_cast<size_t>(n), Seal::kClientHelloBytes - c.handshake.size());
        if (!on_handshake(c, buf, used)) return false;
      }
      if (c.seal && static_cast<size_t>(n) > used) {
        std::string plain;
        Status opened = c.seal->open(buf + used, static_cast<size_t>(n) - used, plain, c.peer);
        if (!opened.is_ok()) {
          refuse_conn(c, opened.message());
          return false;
        }
        c.reader.feed(plain.data(), plain.size());
      }
    } else {
      c.reader.feed(buf, static_cast<size_t>(n));
    }
    if (!answer_frames(c)) return true;
    if (!admit(c)) return true;
    if (backlogged(c)) break;  // the rest waits in the kernel until the peer reads its replies
    if (static_cast<size_t>(n) < sizeof(buf)) break;
  }
  return true;
}

bool FastServer::backlogged(const Conn& c) const { return c.out.size() - c.out_pos > limits_.max_conn_buffer_bytes; }

bool FastServer::answer_frames(Conn& c) {
  // Complete frames are answered until max_conn_buffer_bytes of replies wait unsent: the rest stay in the reader
  // (answered once the peer reads, wait_and_handle), so a pipelined burst never queues more than about that.
  while (!backlogged(c)) {
    Result<std::optional<Frame>> f = c.reader.next(c.peer, limits_.max_frame_bytes);
    if (!f.is_ok()) {
      if (f.status().code() == Code::kMessageTooLarge) {
        ++counters_.refused;
      } else {
        ++counters_.malformed;
      }
      log_closing(f.status());
      append_frame(c.out, proto::kErrorType, 0, error_reply_body(f.status()));
      c.closing = true;
      return false;
    }
    if (!f->has_value()) break;
    answer(c, **f);
    c.greeted = true;
  }
  return true;
}

void FastServer::refuse_conn(Conn& c, const std::string& why) {
  ++counters_.unauthenticated;
  if (log::nth_worth_logging(counters_.unauthenticated)) {
    MC_LOG_WARN << service_ << ": refused the fast connection from " << c.peer << ": " << why << " ("
                << counters_.unauthenticated << " refused so far)";
  }
}

bool FastServer::on_handshake(Conn& c, const char* data, size_t n) {
  c.handshake.append(data, n);
  if (c.handshake.size() >= 4 && std::memcmp(c.handshake.data(), kSealMagic, 4) != 0) {
    refuse_conn(c, "it did not start the authenticated handshake (this cluster runs with --auth-dir)");
    return false;
  }
  if (c.handshake.size() < Seal::kClientHelloBytes) return true;
  const auth::Keyring* ring = auth::keyring();
  const std::string_view client_pk = std::string_view(c.handshake).substr(4, 32);
  char z85[41] = {};
  zmq_z85_encode(z85, bytes(client_pk), 32);
  c.caller = ring->find_by_key(z85);
  if (c.caller == nullptr) {
    refuse_conn(c, std::string("key ") + z85 + " is not in the roster of " + ring->dir());
    return false;
  }
  std::string server_nonce(32, '\0');
  randombytes_buf(server_nonce.data(), server_nonce.size());
  Result<std::string> pk = auth::decode_key(ring->cluster_public(), "cluster.pub");
  Result<std::string> sk = auth::decode_key(ring->cluster_secret(), "cluster.secret");
  auto seal = std::make_unique<Seal>();
  Status derived = !pk.is_ok()   ? pk.status()
                   : !sk.is_ok() ? sk.status()
                                 : seal->derive(false, pk.value(), sk.value(), client_pk,
                                                std::string_view(c.handshake).substr(36, 32), server_nonce);
  if (!derived.is_ok()) {
    refuse_conn(c, derived.message());
    return false;
  }
  c.seal = std::move(seal);
  c.out.append(kSealMagic, 4);
  c.out.append(server_nonce);
  c.sealed_to = c.out.size();
  std::string().swap(c.handshake);
  return true;
}

bool FastServer::flush(Conn& c) {
  if (c.sending_since_ms == 0) c.sending_since_ms = steady_ms();  // replies begin to wait now
  if (c.seal && c.out.size() > c.sealed_to) {
    const std::string plain = c.out.substr(c.sealed_to);
    c.out.resize(c.sealed_to);
    c.seal->seal(plain, c.out);
    c.sealed_to = c.out.size();
  }
  while (c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      MC_LOG_DEBUG << service_ << ": cannot answer " << c.peer << ": " << errno_text(errno);
      return false;
    }
    c.out_pos += static_cast<size_t>(n);
    c.sending_since_ms = steady_ms();
  }
  if (c.out.capacity() > kKeepCapacityBytes) {
    std::string().swap(c.out);
  } else {
    c.out.clear();
  }
  c.out_pos = 0;
  c.sealed_to = 0;
  if (!c.reader.head_complete()) c.sending_since_ms = 0;  // else requests still wait for the peer to read
  return !c.closing;
}

Status FastServer::watch(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &watched_tag_;
  if (watched_fd_ >= 0 || ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    return Status(Code::kInternal, service_ + ": cannot watch fd " + std::to_string(fd) +
                                       " with the fast path's epoll set: " +
                                       (watched_fd_ >= 0 ? std::string("one is watched already") : errno_text(errno)));
  }
  watched_fd_ = fd;
  return Status::ok();
}

bool FastServer::wait_and_handle(int timeout_ms) {
  if (!listener_on_) {
    const int64_t left = accept_resume_ms_ - steady_ms();
    if (left <= 0) {
      set_listener_interest(true);
    } else {
      timeout_ms = static_cast<int>(std::min<int64_t>(timeout_ms, left));
    }
  }
  epoll_event evs[kMaxEvents];
  const int n = ::epoll_wait(epoll_fd_.get(), evs, kMaxEvents, timeout_ms);
  const int64_t now = steady_ms();
  if (n <= 0) {  // idle, or EINTR
    sweep(now);
    return false;
  }
  bool accept = false, watched = false;
  // Connections are closed after the loop: a later event of this batch may name one.
  Conn* dead[kMaxEvents];
  int n_dead = 0;
  // First every ready connection's requests, then (before_reply_) their replies.
  Conn* ready[kMaxEvents];
  bool alive[kMaxEvents];
  bool read[kMaxEvents];
  int n_ready = 0;
  bool answered = false;
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.ptr == &watched_tag_) {
      watched = true;
      continue;
    }
    auto* c = static_cast<Conn*>(evs[i].data.ptr);
    if (c == nullptr) {
      accept = true;
      continue;
    }
    const uint32_t ev = evs[i].events;
    bool ok = true, was_read = false;
    if (ev & EPOLLIN) {
      ok = on_readable(*c);
      was_read = answered = true;
    } else if (ev & (EPOLLERR | EPOLLHUP)) {
      ok = false;
    } else if ((ev & EPOLLOUT) && c->reader.head_complete() && !c->closing) {
      // Requests left unanswered for the backlog (answer_frames): the peer reads again, answer them now. What
      // waits in `out` was answered (and made durable, before_reply_) in an earlier call: it may go first.
      ok = flush(*c);
      if (ok && !backlogged(*c)) {
        (void)answer_frames(*c);
        was_read = answered = true;
      }
    }
    ready[n_ready] = c;
    alive[n_ready] = ok;
    read[n_ready++] = was_read;
  }
  if (answered && before_reply_ && !before_reply_()) {
    for (int i = 0; i < n_ready; ++i) {
      if (read[i]) alive[i] = false;  // replies of a batch that could not be made durable: never sent
    }
  }
  for (int i = 0; i < n_ready; ++i) {
    Conn* c = ready[i];
    bool ok = alive[i];
    if (ok) ok = flush(*c);
    if (ok) ok = update_interest(*c);
    if (!ok) dead[n_dead++] = c;
  }
  for (int i = 0; i < n_dead; ++i) close_conn(dead[i]);
  sweep(now);
  if (accept && listener_on_) accept_all(now);
  return watched;
}

// ------------------------------------------------------------------------------------------------
// FastClient

Result<std::unique_ptr<FastClient>> FastClient::connect(const Endpoint& endpoint, const std::string& client_name,
                                                        int timeout_ms) {
  std::unique_ptr<FastClient> c(new FastClient(endpoint.str() + " (fast)"));
  if (!endpoint.is_tcp())
    return Status(Code::kInvalidArgument, "the fast path connects over tcp, not to " + c->endpoint_);
  Result<AddrInfoList> addrs = resolve_stream(endpoint.host, endpoint.port, 0);
  if (!addrs.is_ok()) return addrs.status().with_context("cannot resolve " + c->endpoint_);
  int err = 0;
  const int64_t deadline = steady_ms() + std::max(1, timeout_ms);
  for (addrinfo* a = addrs->get(); a != nullptr && !c->fd_; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      err = errno;
      continue;
    }
    set_options(fd.get());
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      err = errno;
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int left = static_cast<int>(std::max<int64_t>(0, deadline - steady_ms()));
    int so_error = ETIMEDOUT;
    if (::poll(&p, 1, left) == 1) {
      socklen_t len = sizeof(so_error);
      (void)getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    }
    if (so_error != 0) {
      err = so_error;
      continue;
    }
    c->fd_ = std::move(fd);
  }
  if (!c->fd_) return Status(Code::kUnavailable, "cannot connect to " + c->endpoint_ + ": " + errno_text(err));
  if (auth::keyring() != nullptr) MC_RETURN_IF_ERROR(c->handshake(deadline));
  proto::HelloRequest hello{proto::kProtocolVersion, client_name};
  MC_ASSIGN_OR_RETURN(proto::HelloReply reply, c->call(hello, timeout_ms));
  MC_RETURN_IF_ERROR(check_hello_reply(reply, c->endpoint_));
  return c;
}

Status FastClient::handshake(int64_t deadline_ms) {
  const auth::Keyring* ring = auth::keyring();
  MC_ASSIGN_OR_RETURN(std::string own_pk, auth::decode_key(ring->self_keys().public_z85, "own public key"));
  MC_ASSIGN_OR_RETURN(std::string own_sk, auth::decode_key(ring->self_keys().secret_z85, "own secret key"));
  MC_ASSIGN_OR_RETURN(std::string server_pk, auth::decode_key(ring->cluster_public(), "cluster.pub"));
  std::string client_nonce(32, '\0');
  randombytes_buf(client_nonce.data(), client_nonce.size());
  out_.append(kSealMagic, 4);
  out_.append(own_pk);
  out_.append(client_nonce);
  std::string got;
  while (got.size() < Seal::kServerHelloBytes) {
    MC_RETURN_IF_ERROR(write_some());
    const int64_t left = deadline_ms - steady_ms();
    if (left <= 0) return fail(Status(Code::kTimeout, "no authenticated handshake from " + endpoint_));
    pollfd p{fd_.get(), static_cast<short>(POLLIN | (wants_write() ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[Seal::kServerHelloBytes];
    const ssize_t n = ::recv(fd_.get(), buf, Seal::kServerHelloBytes - got.size(), 0);
    if (n == 0) {
      return fail(Status(Code::kPermissionDenied, endpoint_ + " closed the connection at the handshake: is this "
                                                              "key in its roster (--auth-dir, --auth-name)?"));
    }
    if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return fail(Status(Code::kUnavailable, "cannot read from " + endpoint_ + ": " + errno_text(errno)));
    }
    if (n > 0) got.append(buf, static_cast<size_t>(n));
  }
  if (std::memcmp(got.data(), kSealMagic, 4) != 0) {
    return fail(Status(Code::kPermissionDenied, endpoint_ + " does not speak the authenticated handshake"));
  }
  seal_ = std::make_unique<Seal>();
  MC_RETURN_IF_ERROR(seal_->derive(true, own_pk, own_sk, server_pk, client_nonce, std::string_view(got).substr(4)));
  sodium_memzero(own_sk.data(), own_sk.size());
  return Status::ok();
}

Status FastClient::fail(Status s) {
  fd_.reset();
  return s;
}

Status FastClient::write_some() {
  while (out_pos_ < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return fail(Status(Code::kUnavailable, "cannot send to " + endpoint_ + ": " + errno_text(errno)));
    }
    out_pos_ += static_cast<size_t>(n);
  }
  out_.clear();
  out_pos_ = 0;
  return Status::ok();
}

Result<bool> FastClient::read_some() {
  char buf[64 * 1024];
  bool got = false;
  while (true) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    if (n == 0) return fail(Status(Code::kUnavailable, endpoint_ + " closed the connection (master stopped?)"));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return got;
      return fail(Status(Code::kUnavailable, "cannot read from " + endpoint_ + ": " + errno_text(errno)));
    }
    if (seal_) {
      std::string plain;
      Status opened = seal_->open(buf, static_cast<size_t>(n), plain, endpoint_);
      if (!opened.is_ok()) return fail(opened);
      reader_.feed(plain.data(), plain.size());
    } else {
      reader_.feed(buf, static_cast<size_t>(n));
    }
    got = true;
    if (static_cast<size_t>(n) < sizeof(buf)) return got;
  }
}

Result<uint64_t> FastClient::send(std::string_view type, std::string_view body, bool write_now) {
  if (!fd_) return Status(Code::kUnavailable, "connection to " + endpoint_ + " is closed after an earlier failure");
  if (body.size() > static_cast<uint64_t>(proto::kMaxMessageBytes)) {
    return Status(Code::kMessageTooLarge, "'" + std::string(type) + "' to " + endpoint_ + " is " +
                                              std::to_string(body.size()) + " bytes (limit " +
                                              std::to_string(proto::kMaxMessageBytes) + ")");
  }
  const uint64_t id = next_id_++;
  if (seal_) {
    plain_.clear();
    append_frame(plain_, type, id, body);
    seal_->seal(plain_, out_);
  } else {
    append_frame(out_, type, id, body);
  }
  if (write_now) MC_RETURN_IF_ERROR(write_some());
  return id;
}

Result<std::optional<FastClient::Reply>> FastClient::try_recv() {
  if (!fd_) return Status(Code::kUnavailable, "connection to " + endpoint_ + " is closed after an earlier failure");
  MC_RETURN_IF_ERROR(write_some());
  for (int pass = 0; pass < 2; ++pass) {
    Result<std::optional<Frame>> f = reader_.next(endpoint_, static_cast<uint64_t>(proto::kMaxMessageBytes));
    if (!f.is_ok()) return fail(f.status());
    if (f->has_value()) {
      Frame& fr = **f;
      Reply r;
      r.id = fr.header.id;
      if (fr.header.type == proto::kErrorType) {
        Result<proto::ErrorReply> err = codec::unpack<proto::ErrorReply>(fr.body, reply_what_);
        if (!err.is_ok()) return fail(err.status());
        r.status = status_of(err.value());
        if (r.id == 0) return fail(r.status.with_context(endpoint_ + " closed the connection"));
      } else if (fr.header.v != proto::kProtocolVersion) {
        r.status = reply_version_mismatch(fr.header, endpoint_);
      } else {
        r.body = std::move(fr.body);
      }
      return std::optional<Reply>(std::move(r));
    }
    if (pass == 0) MC_RETURN_IF_ERROR(read_some().status());
  }
  return std::optional<Reply>();
}

Result<std::optional<FastClient::Reply>> FastClient::recv(int timeout_ms) {
  const int64_t deadline = steady_ms() + std::max(0, timeout_ms);
  while (true) {
    MC_ASSIGN_OR_RETURN(std::optional<Reply> r, try_recv());
    if (r.has_value()) return r;
    const int64_t left = deadline - steady_ms();
    if (left <= 0) return std::optional<Reply>();
    pollfd p{fd_.get(), static_cast<short>(POLLIN | (wants_write() ? POLLOUT : 0)), 0};
    int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc < 0 && errno != EINTR)
      return fail(Status(Code::kUnavailable, "poll on " + endpoint_ + ": " + errno_text(errno)));
  }
}

Result<std::string> FastClient::call_raw(std::string_view type, std::string_view body, int timeout_ms,
                                         const OtherReply& other) {
  MC_ASSIGN_OR_RETURN(uint64_t id, send(type, body));
  const int64_t deadline = steady_ms() + std::max(0, timeout_ms);
  while (true) {
    MC_ASSIGN_OR_RETURN(std::optional<Reply> r, recv(static_cast<int>(std::max<int64_t>(0, deadline - steady_ms()))));
    if (!r.has_value()) break;
    if (r->id != id) {  // a reply to an earlier send(): the caller's, or an abandoned call's
      if (other) other(*r);
      continue;
    }
    if (!r->status.is_ok()) return r->status;
    return std::move(r->body);
  }
  // A request not fully written leaves the stream mid-frame: the connection cannot be used again.
  if (wants_write()) {
    return fail(Status(Code::kTimeout, "'" + std::string(type) + "' to " + endpoint_ + " not sent within " +
                                           std::to_string(timeout_ms) + " ms"));
  }
  return Status(Code::kTimeout, "no reply to '" + std::string(type) + "' from " + endpoint_ + " within " +
                                    std::to_string(timeout_ms) + " ms (is the master running and not overloaded?)");
}

}  // namespace mc::rpc::fast
