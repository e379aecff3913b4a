// The rdma transport over rdma-core ibverbs (see rdma.hpp for the model). Compiled only when configure found
// infiniband/verbs.h and libibverbs. No device exists on the development machines: this file is compiled
// and reviewed there; its behaviour is covered by the `rdma`-labelled tests on hosts with a device.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "rdma/qp_attr.hpp"
#include "rdma/rdma.hpp"
#include "tcp/net.hpp"
#include "tcp/transport.hpp"

namespace mc::transfer::rdma {

bool built() { return true; }

namespace {

constexpr uint32_t kMaxSendWr = 256;    // work requests in flight per initiator QP (clamped to max_qp_wr)
constexpr int kCqDepth = 4096;          // completion queue entries per (segment, local device)
constexpr size_t kMaxTargetQps = 4096;  // target-side QPs per engine (handshakes beyond are refused)
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

int64_t now_ns() { return RealClock::instance().now_ns(); }
uint32_t mtu_bytes_of(ibv_mtu m) { return 128u << static_cast<int>(m); }

// RAII holders of ibverbs objects: each frees its handle with the matching ibv_* call (its return value is
// ignored: at teardown nothing can be done about a failure). Objects that depend on another one (a QP on its
// CQ and PD, an MR on its PD, a CQ on its context and completion channel) must be freed first: declare the
// holders in dependency order, or reset them explicitly where an object outlives its declaration scope.
struct ContextDeleter {
  void operator()(ibv_context* c) const { ibv_close_device(c); }
};
struct PdDeleter {
  void operator()(ibv_pd* pd) const { ibv_dealloc_pd(pd); }
};
struct CqDeleter {
  void operator()(ibv_cq* cq) const { ibv_destroy_cq(cq); }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* ch) const { ibv_destroy_comp_channel(ch); }
};
struct QpDeleter {
  void operator()(ibv_qp* qp) const { ibv_destroy_qp(qp); }
};
struct MrDeleter {
  void operator()(ibv_mr* mr) const { ibv_dereg_mr(mr); }
};
using ContextPtr = std::unique_ptr<ibv_context, ContextDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using QpPtr = std::unique_ptr<ibv_qp, QpDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;

// Members in dependency order: the CQ and the PD go before the context they were made on.
struct Device {
  std::string name;
  ContextPtr ctx;
  PdPtr pd;
  CqPtr idle_cq;  // CQ of target-side QPs: they post nothing, so it never fills
  uint8_t port = 0;
  ibv_port_attr port_attr{};
  ibv_device_attr attr{};
  uint32_t gid_index = 0;
  uint8_t gid[16] = {};
  bool ethernet = false;

  std::string where() const { return "rdma device " + name + " port " + std::to_string(port); }
};

// Reads the port's GID table and picks the index (choose_gid_index: MC_RDMA_GID_INDEX, else a RoCE v2
// IPv4-mapped GID on Ethernet, the IB GID on InfiniBand).
Status choose_gid(Device& d) {
  std::vector<GidEntry> entries;
  for (int i = 0; i < d.port_attr.gid_tbl_len; ++i) {
    GidEntry e;
    e.index = static_cast<uint32_t>(i);
    ibv_gid_entry x{};
    if (int rc = ibv_query_gid_ex(d.ctx.get(), d.port, e.index, &x, 0); rc == 0) {
      e.type = x.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
               : x.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
                                                    : GidType::kIb;
      std::memcpy(e.raw, x.gid.raw, 16);
    } else if (rc == ENODATA) {
      continue;  // an empty slot
    } else {
      // No typed query (old kernel): the plain GID, typed by the link layer (RoCE then needs MC_RDMA_GID_INDEX).
      ibv_gid g{};
      if (ibv_query_gid(d.ctx.get(), d.port, i, &g) != 0) continue;
      e.type = d.ethernet ? GidType::kRoceV1 : GidType::kIb;
      std::memcpy(e.raw, g.raw, 16);
    }
    entries.push_back(e);
  }
  const char* env = std::getenv("MC_RDMA_GID_INDEX");
  MC_ASSIGN_OR_RETURN(d.gid_index, choose_gid_index(entries, d.ethernet, env == nullptr ? "" : env, d.where()));
  for (const auto& e : entries) {
    if (e.index == d.gid_index) std::memcpy(d.gid, e.raw, 16);
  }
  return Status::ok();
}

proto::RdmaQpInfo qp_info(const Device& d, const ibv_qp* qp, uint32_t psn, ibv_mtu mtu) {
  proto::RdmaQpInfo i;
  i.device = d.name;
  i.port = d.port;
  i.qp_num = qp->qp_num;
  i.psn = psn;
  i.lid = d.port_attr.lid;
  i.gid = gid_to_hex(d.gid);
  i.gid_index = d.gid_index;
  i.mtu_bytes = mtu_bytes_of(mtu);
  return i;
}

// OK while the device's port is ACTIVE; kLocalDeviceDown (the engine then quarantines every path of this
// local device and retries elsewhere) when it is not; kIo when the query fails.
Status local_port_state(const Device& d) {
  ibv_port_attr pa{};
  if (int rc = ibv_query_port(d.ctx.get(), d.port, &pa); rc != 0) {
    return Status(Code::kIo, d.where() + ": ibv_query_port: " + std::strerror(rc));
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    return Status(Code::kLocalDeviceDown, d.where() + " is " + ibv_port_state_str(pa.state) + ", not ACTIVE");
  }
  return Status::ok();
}

uint32_t random_psn() {
  static std::atomic<uint32_t> seed{static_cast<uint32_t>(std::random_device{}())};
  return (seed.fetch_add(0x9E3779B9u) * 2654435761u) & 0xFFFFFFu;
}

// An RC QP in INIT. `cap` in: the wanted depths (clamped to the device's max_qp_wr / max_sge); out: what the
// provider gave (ibv_create_qp updates it).
Result<QpPtr> create_qp(const Device& d, ibv_cq* cq, QpRole role, ibv_qp_cap& cap) {
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = std::min<uint32_t>(cap.max_send_wr, static_cast<uint32_t>(std::max(1, d.attr.max_qp_wr)));
  ia.cap.max_recv_wr = 1;  // no receive is ever posted (one-sided READ/WRITE only)
  ia.cap.max_send_sge = std::min<uint32_t>(cap.max_send_sge, static_cast<uint32_t>(std::max(1, d.attr.max_sge)));
  ia.cap.max_recv_sge = 1;
  QpPtr qp(ibv_create_qp(d.pd.get(), &ia));
  if (!qp) return Status(Code::kIo, d.where() + ": ibv_create_qp (RC): " + std::strerror(errno));
  cap = ia.cap;
  const QpTransition init = init_transition(d.port, role);
  ibv_qp_attr a = init.attr;
  if (int rc = ibv_modify_qp(qp.get(), &a, init.mask); rc != 0) {
    return Status(Code::kIo, d.where() + ": QP " + std::to_string(qp->qp_num) + " RESET -> INIT: " + std::strerror(rc));
  }
  return qp;
}

// INIT -> RTR -> RTS with the peer's values (GID/LID, QPN, PSN; validated by validate_peer_qp) and the
// negotiated MTU (enum) and READ depths.
Status connect_qp(const Device& d, ibv_qp* qp, const proto::RdmaQpInfo& peer, int path_mtu, uint32_t own_psn,
                  uint8_t max_dest_rd_atomic, uint8_t max_rd_atomic) {
  const std::string what = d.where() + ": QP " + std::to_string(qp->qp_num) + " (peer " + peer.device + " QP " +
                           std::to_string(peer.qp_num) + ")";
  auto rtr = rtr_transition(LocalPort{d.port, d.ethernet, d.gid_index}, peer, path_mtu, max_dest_rd_atomic);
  if (!rtr.is_ok()) return rtr.status().with_context(what);
  ibv_qp_attr a = rtr.value().attr;
  if (int rc = ibv_modify_qp(qp, &a, rtr.value().mask); rc != 0) {
    return Status(Code::kIo, what + " INIT -> RTR: " + std::strerror(rc));
  }
  const QpTransition rts = rts_transition(own_psn, max_rd_atomic);
  ibv_qp_attr b = rts.attr;
  if (int rc = ibv_modify_qp(qp, &b, rts.mask); rc != 0) {
    return Status(Code::kIo, what + " RTR -> RTS: " + std::strerror(rc));
  }
  return Status::ok();
}

// One registration chunk, registered with every device (mrs in device order; deregistered when it goes).
struct Chunk {
  char* reg_start = nullptr;  // the registration it belongs to
  char* addr = nullptr;
  uint64_t length = 0;
  std::vector<MrPtr> mrs;
};

class Domain;

// ------------------------------------------------------------------------------------------------
// Initiator side
// ------------------------------------------------------------------------------------------------

struct Qp {
  int path = 0;
  tcp::Fd control;  // the handshake's connection: the target keeps its QP while it is open
  QpPtr qp;         // declared after `control`: destroyed before that connection closes
  uint32_t max_outstanding = 1;
  uint32_t max_sge = 1;      // scatter/gather entries per work request (a slice spanning local MRs uses several)
  uint32_t outstanding = 0;  // posted work requests whose completion has not come back (or was given up)
  uint32_t abandoned = 0;    // of those, failed without a completion (the device never flushed them)
  bool broken = false;
  int64_t broken_ns = 0;
  Code fail_code = Code::kUnavailable;  // what its failed slices report: kLocalDeviceDown when our port went down
  int64_t last_progress_ns = 0;
  int64_t last_used_ns = 0;
};

struct RdmaPath {
  size_t local_dev = 0;     // index into Domain devices
  size_t remote_index = 0;  // index into the descriptor's rdma_devices
  std::string remote_device;
  std::deque<SliceOp> posted;   // guarded by RdmaSegment::mu_
  std::deque<SliceOp> waiting;  // CQ thread only: not yet given to a QP
  std::list<std::unique_ptr<Qp>> qps;
};

// One CQ per (segment, local device), shared by every QP of the segment on that device. `unpolled` counts the
// work requests posted to those QPs whose completion entry has not been polled yet; nothing is posted while
// it equals `capacity` (the CQ's real depth), so the CQ cannot overflow however many paths and QPs share it.
// Members in dependency order: the CQ goes before its completion channel.
struct DevCq {
  size_t dev = 0;
  CompChannelPtr channel;
  CqPtr cq;
  uint32_t capacity = 0;
  uint32_t unpolled = 0;
};

struct InFlight {
  SliceOp op;
  Qp* qp = nullptr;
};

class RdmaSegment final : public TransportSegment {
 public:
  RdmaSegment(Domain& domain, const EngineOptions& options, SliceSink* sink, proto::SegmentDescriptor desc)
      : domain_(domain), options_(options), sink_(sink), desc_(std::move(desc)) {}
  ~RdmaSegment() override;

  Status start(const std::vector<DevicePair>& pairs, std::unique_ptr<TransportSegment> tcp_fallback);

  const std::vector<PathSpec>& paths() const override { return specs_; }
  void post(const SliceOp& op) override {
    if (static_cast<size_t>(op.path) >= paths_.size()) {
      SliceOp t = op;
      t.path -= static_cast<int>(paths_.size());
      tcp_->post(t);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      paths_[static_cast<size_t>(op.path)].posted.push_back(op);
    }
    if (!wake_pending_.exchange(true)) wake();
  }
  Status probe(int path, int64_t timeout_ms) override;
  void evict_idle(int64_t idle_ms) override {
    idle_ms_.store(idle_ms);
    if (tcp_) tcp_->evict_idle(idle_ms);
  }

 private:
  void wake() {
    uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof one);
  }
  std::string path_name(size_t p) const { return "rdma path " + specs_[p].label; }
  void complete(const SliceOp& op, Status st) { done_.emplace_back(op.cookie, std::move(st)); }
  void flush_completions() {
    for (auto& [cookie, st] : done_) sink_->slice_done(cookie, st);
    done_.clear();
  }
  DevCq& cq_of(size_t dev) {
    for (auto& c : cqs_) {
      if (c.dev == dev) return c;
    }
    return cqs_.front();  // unreachable: start() made one per local device of a path
  }

  Result<Qp*> open_qp(size_t path);
  void break_qp(Qp& q, const std::string& why);
  Status post_one(RdmaPath& p, Qp& q, const SliceOp& op);
  void dispatch();
  void drain_cqs();
  void check_timers();
  void loop();

  Domain& domain_;
  const EngineOptions& options_;
  SliceSink* sink_;
  proto::SegmentDescriptor desc_;
  std::vector<PathSpec> specs_;  // rdma paths, then the tcp fallback's
  std::deque<RdmaPath> paths_;
  std::unique_ptr<TransportSegment> tcp_;
  std::vector<DevCq> cqs_;
  // By wr_id: a number of this segment's own, never reused, so a late completion of a work request whose slice
  // was already failed (and maybe retried under the same cookie) matches nothing instead of the retry.
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t next_wr_id_ = 1;
  std::mutex mu_;
  std::atomic<bool> wake_pending_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> idle_ms_;
  tcp::Fd wake_fd_;
  std::thread thread_;
  std::vector<std::pair<uint64_t, Status>> done_;
};

// ------------------------------------------------------------------------------------------------
// Domain
// ------------------------------------------------------------------------------------------------

class Domain final : public RdmaDomain {
 public:
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<std::string> names;
  uint64_t max_mr = UINT64_MAX;
  mutable std::shared_mutex mu;
  std::map<uintptr_t, Chunk> chunks;  // by chunk start
  std::shared_ptr<std::atomic<size_t>> target_qps = std::make_shared<std::atomic<size_t>>(0);
  // devs is declared first, so the chunks' MRs are deregistered before their devices' PDs go.

  const std::vector<std::string>& devices() const override { return names; }
  uint64_t max_region_bytes() const override { return max_mr; }

  Status register_memory(char* addr, uint64_t length, uint64_t chunk_bytes) override {
    std::vector<Chunk> made;  // deregistered on return unless moved into chunks
    for (auto [off, len] : split_registration(length, chunk_bytes, max_mr)) {
      Chunk c;
      c.reg_start = addr;
      c.addr = addr + off;
      c.length = len;
      for (auto& d : devs) {
        MrPtr m(ibv_reg_mr(d->pd.get(), c.addr, c.length, kAccess));
        if (!m) {
          const int err = errno;
          rlimit rl{};
          const uint64_t memlock =
              getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
          Status st(Code::kIo, "ibv_reg_mr on rdma device " + d->name + " for " + std::to_string(c.length) +
                                   " bytes at offset " + std::to_string(off) + " of a " + std::to_string(length) +
                                   "-byte registration: " + std::strerror(err) + reg_mr_remedy(err, memlock));
          return st;
        }
        c.mrs.push_back(std::move(m));
      }
      made.push_back(std::move(c));
    }
    std::unique_lock<std::shared_mutex> lk(mu);
    for (auto& c : made) chunks[reinterpret_cast<uintptr_t>(c.addr)] = std::move(c);
    return Status::ok();
  }

  void unregister_memory(char* addr) override {
    std::unique_lock<std::shared_mutex> lk(mu);
    for (auto it = chunks.lower_bound(reinterpret_cast<uintptr_t>(addr)); it != chunks.end();) {
      if (it->second.reg_start != addr) break;
      it = chunks.erase(it);  // deregisters its MRs
    }
  }

  // The chunk holding [p, p+len) whole, or null. Caller holds mu.
  const Chunk* chunk_locked(const char* p, uint64_t len) const {
    auto it = chunks.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == chunks.begin()) return nullptr;
    --it;
    const Chunk& c = it->second;
    const auto rel = static_cast<uint64_t>(p - c.addr);
    if (rel >= c.length || len > c.length - rel) return nullptr;
    return &c;
  }

  // Scatter/gather entries for local [p, p+len) on device `dev` (several when it crosses chunks).
  Status local_sges(char* p, uint64_t len, size_t dev, std::vector<ibv_sge>& out) const {
    std::shared_lock<std::shared_mutex> lk(mu);
    out.clear();
    while (len > 0) {
      const Chunk* c = chunk_locked(p, 1);
      if (c == nullptr) {
        return Status(Code::kSegmentNotRegistered,
                      "local memory at offset of this slice is not registered with rdma "
                      "device " +
                          names[dev]);
      }
      const uint64_t n = std::min(len, c->length - static_cast<uint64_t>(p - c->addr));
      out.push_back(ibv_sge{reinterpret_cast<uintptr_t>(p), static_cast<uint32_t>(n), c->mrs[dev]->lkey});
      p += n;
      len -= n;
    }
    return Status::ok();
  }

  void describe_devices(proto::SegmentDescriptor& d) const override {
    for (auto& dev : devs) {
      d.rdma_devices.push_back(dev->name);
      d.rdma_gids.push_back(gid_to_hex(dev->gid));
      d.rdma_lids.push_back(dev->port_attr.lid);
    }
  }

  void describe_region(const char* addr, uint64_t length, proto::RegionDescriptor& r) const override {
    std::shared_lock<std::shared_mutex> lk(mu);
    const Chunk* c = chunk_locked(addr, length);
    if (c == nullptr) {
      MC_LOG_WARN << "rdma: descriptor region of " << length << " bytes is not inside one registered memory region";
      return;
    }
    r.rdma_addr = reinterpret_cast<uintptr_t>(addr);
    r.rdma_rkeys.clear();
    for (const MrPtr& m : c->mrs) r.rdma_rkeys.push_back(m->rkey);
  }

  Result<std::pair<std::string, std::shared_ptr<void>>> accept(const std::string& packed) override {
    MC_ASSIGN_OR_RETURN(proto::RdmaConnectRequest req,
                        codec::unpack<proto::RdmaConnectRequest>(packed, "rdma connect request"));
    Device* d = nullptr;
    std::string have;
    for (auto& x : devs) {
      if (x->name == req.target_device) d = x.get();
      have += (have.empty() ? "" : ", ") + x->name;
    }
    if (d == nullptr) {
      return Status(Code::kNotFound, "segment " + req.segment + " has no rdma device '" + req.target_device +
                                         "' (it has: " + have + ")");
    }
    const std::string what = d->where() + ": rdma connect from " + req.initiator.device + " for segment " + req.segment;
    MC_RETURN_IF_ERROR(validate_peer_qp(req.initiator, d->ethernet, what));
    const int mtu = negotiate_mtu(static_cast<int>(d->port_attr.active_mtu), req.initiator.mtu_bytes);
    if (mtu == 0) return Status(Code::kInvalidArgument, what + ": no common MTU");
    // Counted before the QP exists (and given back by the lease, or at once when refused), so concurrent
    // handshakes cannot pass the cap together.
    if (target_qps->fetch_add(1) >= kMaxTargetQps) {
      target_qps->fetch_sub(1);
      return Status(Code::kResourceExhausted, d->where() + ": " + std::to_string(kMaxTargetQps) +
                                                  " queue pairs already serve peers; close idle initiators");
    }
    ibv_qp_cap cap{};
    cap.max_send_wr = 1;
    cap.max_send_sge = 1;
    auto made = create_qp(*d, d->idle_cq.get(), QpRole::kTarget, cap);
    if (!made.is_ok()) {
      target_qps->fetch_sub(1);
      return made.status();
    }
    ibv_qp* qp = made.value().get();
    // The lease owns the QP from here on: it is destroyed (and counted off) when the lease goes.
    std::shared_ptr<void> lease(made.value().release(), [counter = target_qps](void* q) {
      QpDeleter()(static_cast<ibv_qp*>(q));
      counter->fetch_sub(1);
    });
    const uint32_t psn = random_psn();
    // READs the initiator may keep in flight against this QP: what it offers, bounded by this device.
    const uint8_t rd = negotiate_rd_atomic(req.max_rd_atomic, d->attr.max_qp_rd_atom);
    MC_RETURN_IF_ERROR(connect_qp(*d, qp, req.initiator, mtu, psn, rd, 1));
    proto::RdmaConnectReply rep;
    rep.target = qp_info(*d, qp, psn, static_cast<ibv_mtu>(mtu));
    rep.max_rd_atomic = rd;
    MC_LOG_DEBUG << d->where() << ": QP " << qp->qp_num << " serves " << req.initiator.device << " QP "
                 << req.initiator.qp_num << " (MTU " << mtu_bytes_of(static_cast<ibv_mtu>(mtu)) << ", "
                 << static_cast<int>(rd) << " READs in flight)";
    return std::make_pair(codec::pack(rep), std::move(lease));
  }

  std::unique_ptr<Transport> make_transport(const EngineOptions& options, const Topology& topology) override;
};

// ------------------------------------------------------------------------------------------------
// RdmaSegment
// ------------------------------------------------------------------------------------------------

Status RdmaSegment::start(const std::vector<DevicePair>& pairs, std::unique_ptr<TransportSegment> tcp_fallback) {
  idle_ms_.store(options_.idle_connection_ms);
  for (const auto& pr : pairs) {
    RdmaPath p;
    for (size_t i = 0; i < domain_.names.size(); ++i) {
      if (domain_.names[i] == pr.local_device) p.local_dev = i;
    }
    p.remote_index = pr.remote_index;
    p.remote_device = desc_.rdma_devices[pr.remote_index];
    PathSpec s;
    s.label = pr.local_device + "->" + p.remote_device;
    s.local_device = pr.local_device;
    s.remote_device = p.remote_device;
    s.weight = pr.weight;
    specs_.push_back(std::move(s));
    bool have = false;
    for (auto& c : cqs_) have = have || c.dev == p.local_dev;
    if (!have) {
      const Device& d = *domain_.devs[p.local_dev];
      DevCq c;  // its CQ and channel are destroyed on an early return
      c.dev = p.local_dev;
      c.channel.reset(ibv_create_comp_channel(d.ctx.get()));
      if (!c.channel) return Status(Code::kIo, d.where() + ": ibv_create_comp_channel: " + std::strerror(errno));
      c.cq.reset(ibv_create_cq(d.ctx.get(), std::min(kCqDepth, d.attr.max_cqe), nullptr, c.channel.get(), 0));
      if (!c.cq) return Status(Code::kIo, d.where() + ": ibv_create_cq: " + std::strerror(errno));
      c.capacity = static_cast<uint32_t>(std::max(1, c.cq->cqe));
      // Non-blocking: the loop reads events only after poll() says so, and drains until EAGAIN.
      const int fl = fcntl(c.channel->fd, F_GETFL);
      if (fl < 0 || fcntl(c.channel->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        return Status(Code::kIo, d.where() + ": completion channel O_NONBLOCK: " + std::strerror(errno));
      }
      if (int rc = ibv_req_notify_cq(c.cq.get(), 0); rc != 0) {
        return Status(Code::kIo, d.where() + ": ibv_req_notify_cq: " + std::strerror(rc));
      }
      cqs_.push_back(std::move(c));
    }
    paths_.push_back(std::move(p));
  }
  if (tcp_fallback) {
    tcp_ = std::move(tcp_fallback);
    for (PathSpec s : tcp_->paths()) {
      s.label = "tcp-fallback " + s.label;
      s.weight *= kTcpFallbackWeight;
      specs_.push_back(std::move(s));
    }
  }
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) return Status(Code::kIo, std::string("rdma transport: eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
  return Status::ok();
}

RdmaSegment::~RdmaSegment() {
  stop_.store(true);
  if (wake_fd_) wake();
  if (thread_.joinable()) thread_.join();
  tcp_.reset();
  for (auto& p : paths_) p.qps.clear();  // QPs before their CQs
  cqs_.clear();
}

Result<Qp*> RdmaSegment::open_qp(size_t path) {
  RdmaPath& p = paths_[path];
  const Device& d = *domain_.devs[p.local_dev];
  const std::string what = path_name(path);
  if (desc_.endpoints.empty()) return Status(Code::kNoPath, what + ": segment publishes no control endpoint");
  auto q = std::make_unique<Qp>();
  q->path = static_cast<int>(path);
  ibv_qp_cap cap{};
  cap.max_send_wr = kMaxSendWr;
  cap.max_send_sge = 4;
  MC_ASSIGN_OR_RETURN(q->qp, create_qp(d, cq_of(p.local_dev).cq.get(), QpRole::kInitiator, cap));
  q->max_outstanding = std::max<uint32_t>(1, cap.max_send_wr);
  q->max_sge = std::max<uint32_t>(1, cap.max_send_sge);
  const uint32_t psn = random_psn();
  proto::RdmaConnectRequest req;
  req.segment = desc_.name;
  req.target_device = p.remote_device;
  req.initiator = qp_info(d, q->qp.get(), psn, d.port_attr.active_mtu);
  req.max_rd_atomic = static_cast<uint32_t>(std::max(1, d.attr.max_qp_init_rd_atom));
  Status last(Code::kNoPath, "no endpoint");
  for (const auto& ep : desc_.endpoints) {
    auto hp = parse_tcp_endpoint(ep);
    if (!hp.is_ok()) continue;
    auto fd = tcp::connect_blocking(hp.value(), "", options_.connect_timeout_ms, options_.connect_timeout_ms);
    if (!fd.is_ok()) {
      last = fd.status();
      continue;
    }
    auto rep = tcp::control_exchange(fd.value().get(), tcp::WireOp::kRdmaConnect, codec::pack(req),
                                     "peer " + format_host_port(hp->host, hp->port));
    if (!rep.is_ok()) {
      last = rep.status();
      continue;
    }
    MC_ASSIGN_OR_RETURN(proto::RdmaConnectReply r,
                        codec::unpack<proto::RdmaConnectReply>(rep.value(), what + " reply"));
    MC_RETURN_IF_ERROR(validate_peer_qp(r.target, d.ethernet, what + " reply"));
    if (r.target.device != p.remote_device) {
      return Status(Code::kMalformedMessage,
                    what + ": asked for a QP on " + p.remote_device + ", the peer made one on " + r.target.device);
    }
    const int mtu = negotiate_mtu(static_cast<int>(d.port_attr.active_mtu), r.target.mtu_bytes);
    if (mtu == 0)
      return Status(Code::kMalformedMessage, what + ": peer answered MTU " + std::to_string(r.target.mtu_bytes));
    // The initiator reads at most what both devices allow in flight; as a responder it serves nothing.
    MC_RETURN_IF_ERROR(
        connect_qp(d, q->qp.get(), r.target, mtu, psn, 1, negotiate_rd_atomic(req.max_rd_atomic, r.max_rd_atomic)));
    q->control = std::move(fd).value();
    q->last_progress_ns = q->last_used_ns = now_ns();
    Qp* raw = q.get();
    p.qps.push_back(std::move(q));
    MC_LOG_DEBUG << what << ": QP " << raw->qp->qp_num << " connected to " << r.target.device << " QP "
                 << r.target.qp_num;
    return raw;
  }
  return last.with_context(what + ": queue-pair handshake");
}

// Moves the QP to the error state: its outstanding work requests come back flushed (each fails its slice).
void RdmaSegment::break_qp(Qp& q, const std::string& why) {
  if (q.broken) return;
  q.broken = true;
  q.broken_ns = now_ns();
  if (Status port = local_port_state(*domain_.devs[paths_[static_cast<size_t>(q.path)].local_dev]);
      port.code() == Code::kLocalDeviceDown) {
    q.fail_code = Code::kLocalDeviceDown;
  }
  MC_LOG_DEBUG << path_name(static_cast<size_t>(q.path)) << ": QP " << q.qp->qp_num << " broken: " << why;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(q.qp.get(), &a, IBV_QP_STATE); rc != 0) {
    MC_LOG_WARN << path_name(static_cast<size_t>(q.path)) << ": QP " << q.qp->qp_num
                << " -> ERR: " << std::strerror(rc);
  }
}

Status RdmaSegment::post_one(RdmaPath& p, Qp& q, const SliceOp& op) {
  const std::string what = path_name(static_cast<size_t>(q.path)) + ": QP " + std::to_string(q.qp->qp_num);
  // The remote region holding the slice (the engine never lets a slice straddle two).
  auto it = std::upper_bound(desc_.regions.begin(), desc_.regions.end(), op.remote_offset,
                             [](uint64_t off, const proto::RegionDescriptor& r) { return off < r.segment_offset; });
  if (it == desc_.regions.begin()) return Status(Code::kOutOfRange, what + ": offset outside the segment");
  const proto::RegionDescriptor& reg = *std::prev(it);
  const uint64_t rel = op.remote_offset - reg.segment_offset;
  if (rel >= reg.length_bytes || op.length > reg.length_bytes - rel) {
    return Status(Code::kOutOfRange, what + ": slice at offset " + std::to_string(op.remote_offset) +
                                         " crosses a region boundary of segment " + desc_.name);
  }
  if (reg.rdma_addr == 0 || p.remote_index >= reg.rdma_rkeys.size()) {
    return Status(Code::kNoPath, what + ": region at offset " + std::to_string(reg.segment_offset) + " of segment " +
                                     desc_.name + " is not registered with rdma device " + p.remote_device);
  }
  const Device& d = *domain_.devs[p.local_dev];
  if (op.length > d.port_attr.max_msg_sz) {
    return Status(Code::kInvalidArgument, what + ": slice of " + std::to_string(op.length) +
                                              " bytes exceeds the port's max_msg_sz " +
                                              std::to_string(d.port_attr.max_msg_sz) + " (use a smaller --slice)");
  }
  std::vector<ibv_sge> sges;
  MC_RETURN_IF_ERROR(domain_.local_sges(op.local, op.length, p.local_dev, sges));
  if (sges.size() > q.max_sge) {
    return Status(Code::kInvalidArgument, what + ": the slice's local bytes span " + std::to_string(sges.size()) +
                                              " memory regions, the QP takes " + std::to_string(q.max_sge) +
                                              " per work request (use a smaller --slice or larger regions)");
  }
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  const uint64_t wr_id = next_wr_id_++;
  wr.wr_id = wr_id;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  wr.opcode = op.op == Op::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reg.rdma_addr + rel;
  wr.wr.rdma.rkey = reg.rdma_rkeys[p.remote_index];
  // One WR per call: on failure `bad` is this WR and nothing was posted, so the caller fails the slice once.
  if (int rc = ibv_post_send(q.qp.get(), &wr, &bad); rc != 0) {
    break_qp(q, std::string("ibv_post_send: ") + std::strerror(rc));
    return Status(Code::kUnavailable, what + ": ibv_post_send: " + std::strerror(rc));
  }
  if (q.outstanding == 0) q.last_progress_ns = now_ns();
  q.outstanding++;
  q.last_used_ns = now_ns();
  cq_of(p.local_dev).unpolled++;
  in_flight_[wr_id] = InFlight{op, &q};
  return Status::ok();
}

void RdmaSegment::dispatch() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    wake_pending_.store(false);
    for (auto& p : paths_) {
      while (!p.posted.empty()) {
        p.waiting.push_back(p.posted.front());
        p.posted.pop_front();
      }
    }
  }
  for (size_t i = 0; i < paths_.size(); ++i) {
    RdmaPath& p = paths_[i];
    const DevCq& cq = cq_of(p.local_dev);
    while (!p.waiting.empty() && cq.unpolled < cq.capacity) {  // a full CQ waits for completions
      Qp* best = nullptr;
      size_t live = 0;
      for (auto& q : p.qps) {
        if (q->broken) continue;
        ++live;
        if (q->outstanding < q->max_outstanding && (best == nullptr || q->outstanding < best->outstanding)) {
          best = q.get();
        }
      }
      if (best == nullptr && live < std::max<uint32_t>(1, options_.connections_per_path)) {
        auto q = open_qp(i);
        if (!q.is_ok()) {
          // The path does not work now: fail what waits on it (the engine retries elsewhere, quarantines it).
          for (const SliceOp& op : p.waiting) complete(op, q.status());
          p.waiting.clear();
          break;
        }
        best = q.value();
      }
      if (best == nullptr) break;  // every QP is full: wait for completions
      const SliceOp op = p.waiting.front();
      p.waiting.pop_front();
      Status st = post_one(p, *best, op);
      if (!st.is_ok()) complete(op, std::move(st));
    }
  }
}

void RdmaSegment::drain_cqs() {
  ibv_wc wcs[64];
  for (auto& c : cqs_) {
    for (;;) {
      const int n = ibv_poll_cq(c.cq.get(), 64, wcs);
      if (n < 0) {
        MC_LOG_ERROR << "rdma device " << domain_.names[c.dev] << ": ibv_poll_cq failed (" << n << ")";
        break;
      }
      for (int i = 0; i < n; ++i) {
        if (c.unpolled > 0) c.unpolled--;
        auto it = in_flight_.find(wcs[i].wr_id);
        if (it == in_flight_.end()) continue;  // its slice was given up already (check_timers)
        InFlight f = it->second;
        in_flight_.erase(it);
        Qp& q = *f.qp;
        q.outstanding--;
        q.last_progress_ns = now_ns();
        if (wcs[i].status == IBV_WC_SUCCESS) {
          complete(f.op, Status::ok());
          continue;
        }
        const std::string why = std::string(ibv_wc_status_str(wcs[i].status)) + " (status " +
                                std::to_string(static_cast<int>(wcs[i].status)) + ", vendor error " +
                                std::to_string(wcs[i].vendor_err) + ")";
        const bool flushed = wcs[i].status == IBV_WC_WR_FLUSH_ERR;
        break_qp(q, why);  // first, so that fail_code says whether our own port went down
        complete(f.op,
                 Status(q.fail_code, path_name(static_cast<size_t>(q.path)) + ": QP " + std::to_string(q.qp->qp_num) +
                                         ": " + std::string(op_name(f.op.op)) + " completion: " + why +
                                         (flushed ? " after an earlier failure on this QP" : "") +
                                         (q.fail_code == Code::kLocalDeviceDown ? " (local port down)" : "")));
      }
      if (n < 64) break;
    }
  }
}

void RdmaSegment::check_timers() {
  const int64_t now = now_ns();
  const int64_t stall_ns = options_.slice_timeout_ms * 1'000'000;
  const int64_t idle_ns = idle_ms_.load() * 1'000'000;
  for (size_t i = 0; i < paths_.size(); ++i) {
    for (auto it = paths_[i].qps.begin(); it != paths_[i].qps.end();) {
      Qp& q = **it;
      if (!q.broken && q.outstanding > 0 && now - q.last_progress_ns > stall_ns) {
        break_qp(q, "no completion for " + std::to_string(options_.slice_timeout_ms) + " ms (link down or peer gone)");
      }
      if (q.broken && q.outstanding > 0 && now - q.broken_ns > 2 * stall_ns) {
        // The device never flushed: give the slices back as failed rather than hang the request.
        MC_LOG_WARN << path_name(i) << ": QP " << q.qp->qp_num << ": " << q.outstanding
                    << " work requests not flushed; failing them";
        for (auto f = in_flight_.begin(); f != in_flight_.end();) {
          if (f->second.qp == &q) {
            complete(f->second.op, Status(q.fail_code, path_name(i) + ": QP " + std::to_string(q.qp->qp_num) +
                                                           " broken and its work request never flushed"));
            f = in_flight_.erase(f);
          } else {
            ++f;
          }
        }
        q.abandoned = q.outstanding;
        q.outstanding = 0;
      }
      const bool idle = !q.broken && q.outstanding == 0 && now - q.last_used_ns > idle_ns;
      if ((q.broken && q.outstanding == 0) || idle) {
        // Destroying the QP discards the completions it never produced: give their CQ room back.
        DevCq& cq = cq_of(paths_[i].local_dev);
        cq.unpolled -= std::min(cq.unpolled, q.abandoned);
        it = paths_[i].qps.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void RdmaSegment::loop() {
  int64_t last_timer = now_ns();
  std::vector<pollfd> fds;
  fds.push_back({wake_fd_.get(), POLLIN, 0});
  for (auto& c : cqs_) fds.push_back({c.channel->fd, POLLIN, 0});
  while (!stop_.load()) {
    const bool busy = !in_flight_.empty();
    int n = ::poll(fds.data(), fds.size(), busy ? 5 : 20);
    if (n < 0 && errno != EINTR) {
      MC_LOG_ERROR << "rdma transport: poll: " << std::strerror(errno);
      break;
    }
    if (n > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      (void)!::read(wake_fd_.get(), &v, sizeof v);
    }
    for (size_t i = 0; n > 0 && i < cqs_.size(); ++i) {
      if (!(fds[i + 1].revents & POLLIN)) continue;
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      unsigned events = 0;
      while (ibv_get_cq_event(cqs_[i].channel.get(), &cq, &ctx) == 0) ++events;  // non-blocking: ends at EAGAIN
      if (events > 0) {
        ibv_ack_cq_events(cqs_[i].cq.get(), events);
        if (int rc = ibv_req_notify_cq(cqs_[i].cq.get(), 0); rc != 0) {
          MC_LOG_WARN << "rdma device " << domain_.names[cqs_[i].dev] << ": ibv_req_notify_cq: " << std::strerror(rc)
                      << " (completions are still polled every few ms)";
        }
      }
    }
    drain_cqs();  // also after re-arming, so no completion that raced the notification is left behind
    dispatch();
    const int64_t now = now_ns();
    if (now - last_timer > 20'000'000) {
      last_timer = now;
      check_timers();
    }
    flush_completions();
  }
  // Shutting down: stop every QP, collect the flushes (bounded), fail the rest.
  for (auto& p : paths_) {
    for (auto& q : p.qps) break_qp(*q, "transfer engine shutting down");
  }
  const int64_t deadline = now_ns() + options_.slice_timeout_ms * 1'000'000;
  while (!in_flight_.empty() && now_ns() < deadline) {
    drain_cqs();
    flush_completions();
    if (!in_flight_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const Status cancelled(Code::kCancelled, "transfer engine shutting down");
  for (auto& [cookie, f] : in_flight_) complete(f.op, cancelled);
  in_flight_.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& p : paths_) {
      for (auto& op : p.posted) complete(op, cancelled);
      p.posted.clear();
    }
  }
  for (auto& p : paths_) {
    for (auto& op : p.waiting) complete(op, cancelled);
    p.waiting.clear();
  }
  flush_completions();
}

Status RdmaSegment::probe(int path, int64_t timeout_ms) {
  if (static_cast<size_t>(path) >= paths_.size())
    return tcp_->probe(path - static_cast<int>(paths_.size()), timeout_ms);
  const RdmaPath& p = paths_[static_cast<size_t>(path)];
  MC_RETURN_IF_ERROR(local_port_state(*domain_.devs[p.local_dev]));
  Status last(Code::kNoPath, path_name(static_cast<size_t>(path)) + ": segment publishes no control endpoint");
  for (const auto& ep : desc_.endpoints) {
    auto r = tcp::control_call(ep, "", tcp::WireOp::kPing, "", timeout_ms);
    if (r.is_ok()) return Status::ok();
    last = r.status();
  }
  return last;
}

// ------------------------------------------------------------------------------------------------
// Transport
// ------------------------------------------------------------------------------------------------

class RdmaTransport final : public Transport {
 public:
  RdmaTransport(Domain& domain, const EngineOptions& options, const Topology& topology)
      : domain_(domain), options_(options), topology_(topology), tcp_(tcp::make_tcp_transport(options, topology)) {}
  std::string_view name() const override { return "rdma"; }
  int rank() const override { return 10; }

  Result<std::unique_ptr<TransportSegment>> open(const proto::SegmentDescriptor& desc, SliceSink* sink) override {
    if (desc.rdma_devices.empty()) {
      return Status(Code::kNoPath, "segment " + desc.name + " publishes no rdma device");
    }
    if (desc.rdma_gids.size() != desc.rdma_devices.size()) {
      return Status(Code::kMalformedMessage, "segment " + desc.name + ": " + std::to_string(desc.rdma_devices.size()) +
                                                 " rdma devices but " + std::to_string(desc.rdma_gids.size()) +
                                                 " GIDs");
    }
    Topology remote_topo;
    if (!desc.topology_json.empty()) {
      auto t = Topology::parse_json(desc.topology_json, "topology of segment " + desc.name);
      if (t.is_ok()) remote_topo = std::move(t).value();
    }
    const std::string remote_location = desc.regions.empty() ? "cpu:0" : desc.regions.front().location;
    auto pairs = plan_paths(topology_, domain_.names, options_.default_location, remote_topo, desc.rdma_devices,
                            remote_location);
    if (pairs.empty()) return Status(Code::kNoPath, "segment " + desc.name + ": no (local, remote) rdma device pair");
    std::unique_ptr<TransportSegment> fallback;
    if (!desc.endpoints.empty()) {
      auto t = tcp_->open(desc, sink);
      if (t.is_ok()) fallback = std::move(t).value();
    }
    auto seg = std::make_unique<RdmaSegment>(domain_, options_, sink, desc);
    MC_RETURN_IF_ERROR(seg->start(pairs, std::move(fallback)));
    return std::unique_ptr<TransportSegment>(std::move(seg));
  }

 private:
  Domain& domain_;
  const EngineOptions& options_;
  const Topology& topology_;
  std::unique_ptr<Transport> tcp_;
};

std::unique_ptr<Transport> Domain::make_transport(const EngineOptions& options, const Topology& topology) {
  return std::make_unique<RdmaTransport>(*this, options, topology);
}

}  // namespace

Result<std::unique_ptr<RdmaDomain>> RdmaDomain::open(const EngineOptions& options, const Topology& topology) {
  (void)options;
  (void)topology;
  // Fork safety: registered pages must not become copy-on-write in a forked child (the NIC would keep the
  // child's copy). Kernels from 5.13 on make that safe themselves (IBV_FORK_UNNEEDED); on older ones ask
  // ibverbs for MADV_DONTFORK on every registration (ibv_fork_init(3); it fails with EINVAL once memory is
  // registered, e.g. by a second engine in this process, which already made the same call).
  if (ibv_is_fork_initialized() == IBV_FORK_DISABLED) {
    if (int rc = ibv_fork_init(); rc != 0) {
      MC_LOG_WARN << "rdma: ibv_fork_init: " << std::strerror(rc)
                  << " (a fork() while memory is registered may corrupt it on this kernel; set RDMAV_FORK_SAFE=1)";
    }
  }
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return Status(Code::kNoPath, no_device_message(true, errno));
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> guard(list, ibv_free_device_list);
  if (n == 0) return Status(Code::kNoPath, no_device_message(false, 0));
  auto dom = std::make_unique<Domain>();
  std::string skipped;
  for (int i = 0; i < n; ++i) {
    auto d = std::make_unique<Device>();
    d->name = ibv_get_device_name(list[i]);
    d->ctx.reset(ibv_open_device(list[i]));
    if (!d->ctx) {
      skipped += "; " + d->name + ": ibv_open_device: " + std::strerror(errno);
      continue;
    }
    if (int rc = ibv_query_device(d->ctx.get(), &d->attr); rc != 0) {
      skipped += "; " + d->name + ": ibv_query_device: " + std::strerror(rc);
      continue;
    }
    for (uint8_t port = 1; port <= d->attr.phys_port_cnt && d->port == 0; ++port) {
      ibv_port_attr pa{};
      if (ibv_query_port(d->ctx.get(), port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
        d->port = port;
        d->port_attr = pa;
      }
    }
    if (d->port == 0) {
      skipped += "; " + d->name + ": no ACTIVE port";
      continue;
    }
    d->ethernet = d->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    if (Status st = choose_gid(*d); !st.is_ok()) {
      skipped += "; " + st.message();
      continue;
    }
    d->pd.reset(ibv_alloc_pd(d->ctx.get()));
    if (!d->pd) {
      skipped += "; " + d->where() + ": ibv_alloc_pd: " + std::strerror(errno);
      continue;
    }
    d->idle_cq.reset(ibv_create_cq(d->ctx.get(), 1, nullptr, nullptr, 0));
    if (!d->idle_cq) {
      skipped += "; " + d->where() + ": ibv_create_cq: " + std::strerror(errno);
      continue;
    }
    dom->max_mr = std::min<uint64_t>(dom->max_mr, d->attr.max_mr_size);
    dom->names.push_back(d->name);
    dom->devs.push_back(std::move(d));
  }
  if (dom->devs.empty()) {
    return Status(Code::kNoPath, "no usable RDMA device among " + std::to_string(n) + skipped);
  }
  if (!skipped.empty()) MC_LOG_WARN << "rdma: skipped devices" << skipped;
  return std::unique_ptr<RdmaDomain>(std::move(dom));
}

}  // namespace mc::transfer::rdma
