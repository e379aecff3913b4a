#include "tcp/transport.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/proto/transfer.hpp"
#include "tcp/net.hpp"
#include "tcp/wire.hpp"

namespace mc::transfer::tcp {
namespace {

constexpr size_t kMaxIov = 64;
constexpr uint64_t kConnWindowBytes = 16ull << 20;  // bytes the engine keeps in flight per connection of a path
// Contiguous slices queued on one connection travel as one wire op of at most this many bytes: one request
// header, one reply, one large send/receive instead of one per slice (each slice still completes on its own,
// as soon as its last byte has landed). The cost per wire op (a header each way, a wakeup and two or three
// system calls on each side) is what held 64 KiB slices to a fraction of loopback TCP at 1-4 MiB blocks.
constexpr uint64_t kMaxWireOpBytes = 1ull << 20;

int64_t now_ns() { return RealClock::instance().now_ns(); }

// One wire op: one slice, or several contiguous ones (same op, adjacent local and remote bytes, one remote
// region) merged. op.local/remote_offset/length describe the whole; cookies/ends the slices in order.
struct Pending {
  SliceOp op;
  WireRequest hdr;
  std::vector<uint64_t> cookies;
  std::vector<uint64_t> ends;  // end of each slice, relative to op.local
  size_t done = 0;             // slices already completed (READ: as their bytes landed)
};

struct Conn {
  int path = 0;
  Fd fd;
  bool connecting = true;
  bool want_out = false;
  std::deque<Pending> to_send;    // assigned, not fully sent; front may be partly sent
  uint64_t sent_of_front = 0;     // bytes of front (header + payload) already sent
  std::deque<Pending> in_flight;  // fully sent, awaiting reply (replies come in order)
  WireReply rep{};
  size_t rep_got = 0;
  std::string aux;
  size_t aux_got = 0;
  uint64_t data_got = 0;
  bool in_data = false;
  uint64_t outstanding_bytes = 0;
  int64_t last_progress_ns = 0;
  int64_t last_used_ns = 0;
};

struct PathConns {
  Endpoint remote;
  std::string endpoint;
  std::string local;
  std::deque<SliceOp> queue;               // posted, not yet assigned (guarded by TcpSegment::mu_)
  std::list<std::unique_ptr<Conn>> conns;  // I/O thread only
};

// One I/O thread with its own epoll set and its own connections on every path of a segment: the segment
// (TcpSegment below) spreads posted slices over several workers, so receiving, sending and the kernel's
// copies run on several cores, as several raw TCP streams do.
class IoWorker {
 public:
  IoWorker(const EngineOptions& options, SliceSink* sink, const std::vector<PathSpec>& specs,
           std::deque<PathConns> paths, const std::vector<uint64_t>& region_ends, uint32_t conns_per_path)
      : options_(options),
        sink_(sink),
        specs_(specs),
        paths_(std::move(paths)),
        region_ends_(region_ends),
        conns_per_path_(std::max<uint32_t>(1, conns_per_path)) {}

  Status start() {
    epfd_.reset(epoll_create1(EPOLL_CLOEXEC));
    wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!epfd_ || !wake_) return Status(Code::kIo, std::string("tcp transport: epoll/eventfd: ") + strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
    thread_ = std::thread([this] { loop(); });
    return Status::ok();
  }

  ~IoWorker() {
    stop_.store(true);
    wake();
    if (thread_.joinable()) thread_.join();
  }

  void post(const SliceOp& op) {
    outstanding_bytes_.fetch_add(op.length);
    {
      std::lock_guard<std::mutex> lk(mu_);
      paths_[static_cast<size_t>(op.path)].queue.push_back(op);
    }
    if (!wake_pending_.exchange(true)) wake();
  }

  // Bytes posted to this worker and not completed yet (the segment gives new runs to the least loaded).
  uint64_t outstanding_bytes() const { return outstanding_bytes_.load(std::memory_order_relaxed); }

  void add_counters(std::map<std::string, uint64_t>& out) const {
    out["tcp_wire_ops"] += wire_ops_.load(std::memory_order_relaxed);
    out["tcp_send_calls"] += send_calls_.load(std::memory_order_relaxed);
    out["tcp_recv_calls"] += recv_calls_.load(std::memory_order_relaxed);
    out["tcp_wakeups"] += wakeups_.load(std::memory_order_relaxed);
    out["tcp_bytes"] += bytes_.load(std::memory_order_relaxed);
    out["tcp_connections_opened"] += conns_opened_.load(std::memory_order_relaxed);
  }

 private:
  void wake() {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }

  std::string conn_name(const Conn& c) const { return "tcp path " + specs_[static_cast<size_t>(c.path)].label; }

  void complete(const SliceOp& op, Status st) { done_.push_back(Done{op.cookie, op.length, std::move(st)}); }
  // Completes slice i of p (the next one not completed).
  void complete_next(Pending& p, const Status& st) {
    const uint64_t begin = p.done == 0 ? 0 : p.ends[p.done - 1];
    done_.push_back(Done{p.cookies[p.done], p.ends[p.done] - begin, st});
    ++p.done;
  }
  // Completes the slices of p not yet completed.
  void complete_rest(Pending& p, const Status& st) {
    while (p.done < p.cookies.size()) complete_next(p, st);
  }
  // Index of the remote region holding segment offset `off` (slices never straddle regions).
  size_t region_of(uint64_t off) const {
    return static_cast<size_t>(std::upper_bound(region_ends_.begin(), region_ends_.end(), off) - region_ends_.begin());
  }
  // Slices of different requests under one grant (every request of a batch to one replica or reservation carries
  // the same token) may share a wire op; the target checks the merged range against it.
  static bool same_grant(const std::string* a, const std::string* b) {
    return a == b || (a != nullptr && b != nullptr && *a == *b);
  }
  // True when `op` may be appended to the not-yet-sent wire op `p`.
  bool can_merge(const Pending& p, const SliceOp& op) const {
    return p.op.op == op.op && same_grant(p.op.grant, op.grant) && p.op.local + p.op.length == op.local &&
           p.op.remote_offset + p.op.length == op.remote_offset && p.op.length + op.length <= kMaxWireOpBytes &&
           region_of(p.op.remote_offset) == region_of(op.remote_offset);
  }

  void flush_completions() {
    uint64_t finished = 0;
    for (auto& d : done_) finished += d.length;
    // Before the callbacks: the engine posts more from inside slice_done, and picks the least loaded worker.
    outstanding_bytes_.fetch_sub(finished);
    for (auto& d : done_) sink_->slice_done(d.cookie, d.status);
    done_.clear();
  }

  void set_out(Conn& c, bool want) {
    if (c.want_out == want) return;
    c.want_out = want;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    ev.data.ptr = &c;
    epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  }

  void fail_conn(Conn& c, const Status& why) {
    Status st = why.with_context(conn_name(c));
    MC_LOG_DEBUG << "closing connection: " << st.to_string();
    for (auto& p : c.in_flight) complete_rest(p, st);
    for (auto& p : c.to_send) complete_rest(p, st);
    c.in_flight.clear();
    c.to_send.clear();
    epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
    c.fd.reset();
  }

  Conn* open_conn(int path, Status* err) {
    PathConns& p = paths_[static_cast<size_t>(path)];
    bool in_progress = false;
    auto fd = start_connect(p.remote, p.local, &in_progress);
    if (!fd.is_ok()) {
      *err = fd.status();
      return nullptr;
    }
    tune_data_socket(fd.value().get(), options_.socket_buffer_bytes);
    auto c = std::make_unique<Conn>();
    c->path = path;
    c->fd = std::move(fd).value();
    c->connecting = in_progress;
    c->want_out = true;
    c->last_progress_ns = c->last_used_ns = now_ns();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.ptr = c.get();
    epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, c->fd.get(), &ev);
    Conn* raw = c.get();
    p.conns.push_back(std::move(c));
    conns_opened_.fetch_add(1, std::memory_order_relaxed);
    return raw;
  }

  // Appends `op` to a wire op queued on a connection of `p` (not yet being sent) that it continues.
  bool merge_into_queued(PathConns& p, const SliceOp& op) {
    for (auto& c : p.conns) {
      if (!c->fd || c->to_send.empty() || (c->to_send.size() == 1 && c->sent_of_front != 0)) continue;
      Pending& back = c->to_send.back();
      if (!can_merge(back, op)) continue;
      back.op.length += op.length;
      back.hdr.length = back.op.length;
      back.cookies.push_back(op.cookie);
      back.ends.push_back(back.op.length);
      c->outstanding_bytes += op.length;
      c->last_used_ns = now_ns();
      return true;
    }
    return false;
  }

  // Moves posted slices to connections of their path.
  void assign() {
    std::vector<std::deque<SliceOp>> taken(paths_.size());
    {
      // Clear the wake flag before taking the queues: a post after the swap then always wakes the loop.
      std::lock_guard<std::mutex> lk(mu_);
      wake_pending_.store(false);
      for (size_t i = 0; i < paths_.size(); ++i) taken[i].swap(paths_[i].queue);
    }
    for (size_t i = 0; i < paths_.size(); ++i) {
      for (const SliceOp& op : taken[i]) {
        PathConns& p = paths_[i];
        if (merge_into_queued(p, op)) continue;
        Conn* best = nullptr;
        size_t live = 0;
        for (auto& c : p.conns) {
          if (!c->fd) continue;
          ++live;
          if (best == nullptr || c->outstanding_bytes < best->outstanding_bytes) best = c.get();
        }
        // Spread over the path's connections (the target serves each on its own thread): open another once
        // the least loaded one already carries a full wire op, up to this worker's share of the cap.
        if ((best == nullptr || best->outstanding_bytes >= kMaxWireOpBytes) && live < conns_per_path_) {
          Status err;
          Conn* c = open_conn(static_cast<int>(i), &err);
          if (c != nullptr) {
            best = c;
          } else if (best == nullptr) {
            complete(op, err.with_context("tcp path " + specs_[i].label));
            continue;
          }
        }
        if (best == nullptr) {
          complete(op, Status(Code::kInternal, "tcp path " + specs_[i].label + ": no connection"));
          continue;
        }
        Pending pend;
        pend.op = op;
        pend.hdr.op = static_cast<uint8_t>(op.op == Op::kRead ? WireOp::kRead : WireOp::kWrite);
        pend.hdr.offset = op.remote_offset;
        pend.hdr.length = op.length;
        // The grant travels as the op's aux (wire.hpp): the target checks it before any byte moves.
        pend.hdr.aux_bytes = op.grant == nullptr ? 0 : static_cast<uint32_t>(op.grant->size());
        pend.cookies.push_back(op.cookie);
        pend.ends.push_back(op.length);
        if (best->to_send.empty() && best->in_flight.empty()) best->last_progress_ns = now_ns();
        best->to_send.push_back(std::move(pend));
        best->outstanding_bytes += op.length;
        best->last_used_ns = now_ns();
      }
    }
  }

  void do_send(Conn& c) {
    while (!c.to_send.empty()) {
      iovec iov[kMaxIov];
      size_t n = 0;
      uint64_t skip = c.sent_of_front;
      for (auto it = c.to_send.begin(); it != c.to_send.end() && n + 2 <= kMaxIov; ++it) {
        if (n + 3 > kMaxIov) break;
        char* h = reinterpret_cast<char*>(&it->hdr);
        uint64_t hlen = sizeof(WireRequest);
        if (skip < hlen) {
          iov[n++] = {h + skip, hlen - skip};
          skip = 0;
        } else {
          skip -= hlen;
        }
        if (it->hdr.aux_bytes > 0) {
          const uint64_t alen = it->hdr.aux_bytes;
          if (skip < alen) {
            iov[n++] = {const_cast<char*>(it->op.grant->data()) + skip, alen - skip};
            skip = 0;
          } else {
            skip -= alen;
          }
        }
        if (it->op.op == Op::kWrite) {
          iov[n++] = {it->op.local + skip, it->op.length - skip};
        }
        skip = 0;
      }
      msghdr mh{};
      mh.msg_iov = iov;
      mh.msg_iovlen = n;
      ssize_t k = ::sendmsg(c.fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
      send_calls_.fetch_add(1, std::memory_order_relaxed);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        fail_conn(c, Status(Code::kUnavailable, std::string("sendmsg: ") + strerror(errno)));
        return;
      }
      c.last_progress_ns = now_ns();
      bytes_.fetch_add(static_cast<uint64_t>(k), std::memory_order_relaxed);
      auto left = static_cast<uint64_t>(k) + c.sent_of_front;
      while (!c.to_send.empty()) {
        const Pending& f = c.to_send.front();
        uint64_t total = sizeof(WireRequest) + f.hdr.aux_bytes + (f.op.op == Op::kWrite ? f.op.length : 0);
        if (left < total) break;
        left -= total;
        wire_ops_.fetch_add(1, std::memory_order_relaxed);
        c.in_flight.push_back(std::move(c.to_send.front()));
        c.to_send.pop_front();
      }
      c.sent_of_front = left;
    }
    set_out(c, !c.to_send.empty());
  }

  // Finishes the front slice of c.in_flight.
  void finish_front(Conn& c, Status st) {
    Pending p = std::move(c.in_flight.front());
    c.in_flight.pop_front();
    c.outstanding_bytes -= std::min(c.outstanding_bytes, p.op.length);
    c.rep_got = 0;
    c.aux_got = 0;
    c.aux.clear();
    c.data_got = 0;
    c.in_data = false;
    complete_rest(p, st);
  }

  // READ: completes the slices of the front wire op whose bytes have all landed.
  void complete_landed(Conn& c) {
    Pending& f = c.in_flight.front();
    while (f.done < f.cookies.size() && f.ends[f.done] <= c.data_got) complete_next(f, Status::ok());
  }

  // Reads replies until the socket would block. Returns false when the connection failed.
  bool do_recv(Conn& c) {
    for (;;) {
      if (c.in_flight.empty()) {
        // No reply is expected: a readable socket here means EOF or a protocol violation.
        char b;
        ssize_t k = ::recv(c.fd.get(), &b, 1, MSG_DONTWAIT | MSG_PEEK);
        if (k == 0) {
          fail_conn(c, Status(Code::kUnavailable, "peer closed the connection"));
          return false;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
        if (k < 0) {
          fail_conn(c, Status(Code::kUnavailable, std::string("recv: ") + strerror(errno)));
          return false;
        }
        fail_conn(c, Status(Code::kMalformedMessage, "unexpected bytes from peer"));
        return false;
      }
      Pending& f = c.in_flight.front();
      ssize_t k;
      if (c.rep_got < sizeof(WireReply)) {
        k = ::recv(c.fd.get(), reinterpret_cast<char*>(&c.rep) + c.rep_got, sizeof(WireReply) - c.rep_got,
                   MSG_DONTWAIT);
      } else if (c.aux_got < c.rep.aux_bytes) {
        k = ::recv(c.fd.get(), c.aux.data() + c.aux_got, c.rep.aux_bytes - c.aux_got, MSG_DONTWAIT);
      } else {
        // READ data straight into local memory; the next reply header rides in the same readv.
        iovec iov[2];
        iov[0] = {f.op.local + c.data_got, f.op.length - c.data_got};
        iov[1] = {next_hdr_, sizeof(WireReply)};
        k = ::readv(c.fd.get(), iov, c.in_flight.size() > 1 ? 2 : 1);
      }
      recv_calls_.fetch_add(1, std::memory_order_relaxed);
      if (k == 0) {
        fail_conn(c, Status(Code::kUnavailable, "peer closed the connection"));
        return false;
      }
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        fail_conn(c, Status(Code::kUnavailable, std::string("recv: ") + strerror(errno)));
        return false;
      }
      c.last_progress_ns = now_ns();
      const auto got = static_cast<uint64_t>(k);
      bytes_.fetch_add(got, std::memory_order_relaxed);
      if (c.rep_got < sizeof(WireReply)) {
        c.rep_got += got;
        if (c.rep_got < sizeof(WireReply)) continue;
        if (!reply_header_valid(c.rep)) {
          fail_conn(c, Status(Code::kMalformedMessage, "bad reply header (magic or size)"));
          return false;
        }
        c.aux.assign(c.rep.aux_bytes, '\0');
      } else if (c.aux_got < c.rep.aux_bytes) {
        c.aux_got += got;
      } else {
        const uint64_t need = f.op.length - c.data_got;
        if (got <= need) {
          c.data_got += got;
          complete_landed(c);
        } else {
          c.data_got = f.op.length;
          const uint64_t extra = got - need;
          finish_front(c, Status::ok());
          std::memcpy(&c.rep, next_hdr_, extra);
          c.rep_got = extra;
          if (c.rep_got == sizeof(WireReply)) {
            if (!reply_header_valid(c.rep)) {
              fail_conn(c, Status(Code::kMalformedMessage, "bad reply header (magic or size)"));
              return false;
            }
            c.aux.assign(c.rep.aux_bytes, '\0');
          } else {
            continue;
          }
        }
      }
      if (c.in_flight.empty()) continue;
      Pending& cur = c.in_flight.front();
      if (c.rep_got < sizeof(WireReply) || c.aux_got < c.rep.aux_bytes) continue;
      if (c.rep.code != 0) {
        finish_front(
            c, Status(static_cast<Code>(c.rep.code), "peer refused " + std::string(op_name(cur.op.op)) + " at offset " +
                                                         std::to_string(cur.op.remote_offset) + ": " + c.aux));
        continue;
      }
      const bool is_read = cur.op.op == Op::kRead;
      if (is_read && c.rep.length != cur.op.length) {
        fail_conn(c, Status(Code::kMalformedMessage, "reply length " + std::to_string(c.rep.length) + " != requested " +
                                                         std::to_string(cur.op.length)));
        return false;
      }
      if (!is_read || c.data_got == cur.op.length)
        finish_front(c, Status::ok());
      else
        c.in_data = true;
    }
  }

  void check_timers() {
    const int64_t now = now_ns();
    for (auto& p : paths_) {
      for (auto it = p.conns.begin(); it != p.conns.end();) {
        Conn& c = **it;
        const bool busy = !c.to_send.empty() || !c.in_flight.empty();
        if (c.fd && busy && now - c.last_progress_ns > options_.slice_timeout_ms * 1'000'000) {
          fail_conn(c, Status(Code::kTimeout, "no progress for " + std::to_string(options_.slice_timeout_ms) +
                                                  " ms (link down or peer stalled)"));
        }
        if (c.fd && !busy && now - c.last_used_ns > options_.idle_connection_ms * 1'000'000) {
          epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
          c.fd.reset();
        }
        if (!c.fd) {
          it = p.conns.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void loop() {
    epoll_event evs[64];
    int64_t last_timer = now_ns();
    while (!stop_.load()) {
      int n = epoll_wait(epfd_.get(), evs, 64, 50);
      if (n > 0) wakeups_.fetch_add(1, std::memory_order_relaxed);
      if (n < 0 && errno != EINTR) {
        MC_LOG_ERROR << "tcp transport: epoll_wait: " << strerror(errno);
        break;
      }
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.ptr == nullptr) {
          uint64_t v;
          (void)!::read(wake_.get(), &v, sizeof v);
          continue;
        }
        Conn& c = *static_cast<Conn*>(evs[i].data.ptr);
        if (!c.fd) continue;
        if (c.connecting) {
          if (!(evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) continue;
          int err = 0;
          socklen_t el = sizeof err;
          getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &el);
          if (err != 0) {
            fail_conn(c, Status(Code::kUnavailable, std::string("connect: ") + strerror(err)));
            continue;
          }
          c.connecting = false;
          c.last_progress_ns = now_ns();
        }
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
          if (!do_recv(c)) continue;
        }
        if (c.fd && (evs[i].events & EPOLLOUT)) do_send(c);
      }
      assign();
      for (auto& p : paths_) {
        for (auto& c : p.conns) {
          if (c->fd && !c->connecting && !c->to_send.empty()) do_send(*c);
        }
      }
      const int64_t now = now_ns();
      if (now - last_timer > 20'000'000) {
        last_timer = now;
        check_timers();
      } else {
        for (auto& p : paths_) {
          p.conns.remove_if([](const std::unique_ptr<Conn>& c) { return !c->fd; });
        }
      }
      flush_completions();
    }
    // Shutting down: everything still queued or in flight fails.
    assign();
    for (auto& p : paths_) {
      for (auto& c : p.conns) {
        if (c->fd) fail_conn(*c, Status(Code::kCancelled, "transfer engine shutting down"));
      }
      p.conns.clear();
    }
    flush_completions();
  }

  struct Done {
    uint64_t cookie;
    uint64_t length;
    Status status;
  };

  const EngineOptions& options_;
  SliceSink* sink_;
  const std::vector<PathSpec>& specs_;        // the segment's
  std::deque<PathConns> paths_;               // this worker's queue and connections per path
  const std::vector<uint64_t>& region_ends_;  // end offsets of the segment's regions, sorted (the segment's)
  const uint32_t conns_per_path_;
  std::mutex mu_;
  std::atomic<bool> wake_pending_{false};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> outstanding_bytes_{0};
  std::atomic<uint64_t> wire_ops_{0}, send_calls_{0}, recv_calls_{0}, wakeups_{0}, bytes_{0}, conns_opened_{0};
  Fd epfd_;
  Fd wake_;
  std::thread thread_;
  std::vector<Done> done_;
  char next_hdr_[sizeof(WireReply)];
};

// The tcp side of one opened segment: its paths, and io_threads workers that each own connections on every
// path. Contiguous slices of a request posted in a row stay on one worker (so they merge into wire ops of up to
// kMaxWireOpBytes); a new run goes to the worker with the fewest bytes outstanding.
class TcpSegment final : public TransportSegment {
 public:
  TcpSegment(const EngineOptions& options, SliceSink* sink, std::vector<PathSpec> specs,
             const std::deque<PathConns>& paths, std::vector<uint64_t> region_ends)
      : options_(options), specs_(std::move(specs)), region_ends_(std::move(region_ends)), runs_(specs_.size()) {
    const uint32_t per_path = std::max<uint32_t>(1, options.connections_per_path);
    const uint32_t n =
        std::clamp<uint32_t>(options.tcp_io_threads == 0 ? per_path : options.tcp_io_threads, 1, per_path);
    for (const auto& p : paths) endpoints_.emplace_back(p.endpoint, p.local);
    for (uint32_t w = 0; w < n; ++w) {
      // Connections per path split over the workers: together they open connections_per_path at most.
      const uint32_t conns = per_path / n + (w < per_path % n ? 1 : 0);
      std::deque<PathConns> own;
      for (const auto& p : paths) {
        PathConns pc;
        pc.remote = p.remote;
        pc.endpoint = p.endpoint;
        pc.local = p.local;
        own.push_back(std::move(pc));
      }
      workers_.push_back(std::make_unique<IoWorker>(options, sink, specs_, std::move(own), region_ends_, conns));
    }
  }

  Status start() {
    for (auto& w : workers_) MC_RETURN_IF_ERROR(w->start());
    return Status::ok();
  }

  const std::vector<PathSpec>& paths() const override { return specs_; }
  uint64_t path_window_bytes() const override {
    return static_cast<uint64_t>(std::max<uint32_t>(1, options_.connections_per_path)) * kConnWindowBytes;
  }

  void post(const SliceOp& op) override {
    IoWorker* w = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      Run& run = runs_[static_cast<size_t>(op.path)];
      if (run.worker != nullptr && run.op == op.op && run.local_end == op.local && run.remote_end == op.remote_offset &&
          run.bytes + op.length <= kMaxWireOpBytes) {
        w = run.worker;
        run.bytes += op.length;
      } else {
        for (auto& cand : workers_) {
          if (w == nullptr || cand->outstanding_bytes() < w->outstanding_bytes()) w = cand.get();
        }
        run.worker = w;
        run.op = op.op;
        run.bytes = op.length;
      }
      run.local_end = op.local + op.length;
      run.remote_end = op.remote_offset + op.length;
    }
    w->post(op);
  }

  Status probe(int path, int64_t timeout_ms) override {
    const auto& [endpoint, local] = endpoints_[static_cast<size_t>(path)];
    auto r = control_call(endpoint, local, WireOp::kPing, "", timeout_ms);
    return r.is_ok() ? Status::ok() : r.status();
  }

  void add_counters(std::map<std::string, uint64_t>& out) const override {
    for (const auto& w : workers_) w->add_counters(out);
  }

 private:
  // The last slice posted on a path: where it ended and which worker took it.
  struct Run {
    IoWorker* worker = nullptr;
    Op op = Op::kRead;
    const char* local_end = nullptr;
    uint64_t remote_end = 0;
    uint64_t bytes = 0;
  };

  const EngineOptions& options_;
  std::vector<PathSpec> specs_;
  std::vector<uint64_t> region_ends_;
  std::vector<std::pair<std::string, std::string>> endpoints_;  // per path: remote endpoint, local address
  std::mutex mu_;
  std::vector<Run> runs_;  // per path
  // Declared last: destroyed first, so their threads stop before the members they read go away.
  std::vector<std::unique_ptr<IoWorker>> workers_;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(const EngineOptions& options, const Topology& topology) : options_(options), topology_(topology) {}
  std::string_view name() const override { return "tcp"; }
  int rank() const override { return 20; }

  Result<std::unique_ptr<TransportSegment>> open(const proto::SegmentDescriptor& desc, SliceSink* sink) override {
    if (desc.endpoints.empty()) {
      return Status(Code::kNoPath, "segment " + desc.name + " publishes no tcp endpoint");
    }
    std::vector<std::string> locals = options_.local_addresses;
    if (locals.empty()) locals.push_back("");
    Topology remote_topo;
    if (!desc.topology_json.empty()) {
      auto t = Topology::parse_json(desc.topology_json, "topology of segment " + desc.name);
      if (t.is_ok()) remote_topo = std::move(t).value();
    }
    const std::string location = desc.regions.empty() ? "cpu:0" : desc.regions.front().location;
    std::vector<PathSpec> specs;
    std::deque<PathConns> paths;
    for (const auto& local : locals) {
      for (const auto& ep : desc.endpoints) {
        MC_ASSIGN_OR_RETURN(Endpoint hp, parse_tcp_endpoint(ep));
        PathSpec s;
        s.local_device = local.empty() ? "" : topology_.device_of_address(local);
        s.remote_device = remote_topo.device_of_address(hp.host);
        s.weight =
            topology_.weight(options_.default_location, s.local_device) * remote_topo.weight(location, s.remote_device);
        s.label = (local.empty() ? std::string("*") : local) + "->" + format_host_port(hp.host, hp.port);
        specs.push_back(std::move(s));
        PathConns pc;
        pc.remote = hp;
        pc.endpoint = ep;
        pc.local = local;
        paths.push_back(std::move(pc));
      }
    }
    std::vector<uint64_t> region_ends;
    for (const auto& r : desc.regions) region_ends.push_back(r.segment_offset + r.length_bytes);
    std::sort(region_ends.begin(), region_ends.end());
    auto seg = std::make_unique<TcpSegment>(options_, sink, std::move(specs), paths, std::move(region_ends));
    MC_RETURN_IF_ERROR(seg->start());
    return std::unique_ptr<TransportSegment>(std::move(seg));
  }

 private:
  const EngineOptions& options_;
  const Topology& topology_;
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(const EngineOptions& options, const Topology& topology) {
  return std::make_unique<TcpTransport>(options, topology);
}

}  // namespace mc::transfer::tcp
