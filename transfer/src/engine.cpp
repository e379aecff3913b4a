#include "mc/transfer/engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "mc/common/location.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/net/auth.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/shared_buffer.hpp"
#include "mc/transfer/transport.hpp"
#include "notifier.hpp"
#include "rdma/rdma.hpp"
#include "shm/transport.hpp"
#include "tcp/net.hpp"
#include "tcp/server.hpp"
#include "tcp/transport.hpp"

namespace mc::transfer {
namespace {

std::string hex_addr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Peer refusals that another path cannot fix: fail the request at once, keep the path.
bool is_request_fault(Code c) {
  return c == Code::kOutOfRange || c == Code::kInvalidArgument || c == Code::kSegmentNotRegistered ||
         c == Code::kMessageTooLarge || c == Code::kNotFound || c == Code::kPermissionDenied;
}

// ------------------------------------------------------------------------------------------------
// Internal state
// ------------------------------------------------------------------------------------------------

struct LocalRegion {
  char* addr = nullptr;
  uint64_t length = 0;
  uint64_t segment_offset = 0;
  std::string location;
  std::optional<ShmBacking> shm;
  uint32_t region_count = 0;
};

struct Batch;
struct RemoteSeg;

struct SliceRec {
  Batch* batch = nullptr;
  uint32_t req = 0;
  uint64_t req_offset = 0;
  uint64_t length = 0;
  uint32_t attempts = 0;
  int path = -1;
  int last_failed_path = -1;
  int64_t post_ns = 0;
};

struct ReqState {
  TransferRequest req;
  std::shared_ptr<RemoteSeg> seg;
  TransferState state = TransferState::kPending;
  // Set when the request must stop (slice failed for good, deadline, cancel); final once nothing is in flight.
  TransferState abort_state = TransferState::kPending;
  Status status;
  uint64_t transferred = 0;
  uint32_t in_flight = 0;
  uint32_t queued = 0;
  uint32_t retried = 0;
  bool notifying = false;
  bool notified = false;  // the notification was acknowledged (or failed)
  std::vector<SliceRec> slices;
  std::vector<SliceTrace> trace;
  int64_t submit_ns = 0;
  int64_t deadline_ns = 0;
  int64_t final_ns = 0;
};

struct Batch {
  BatchId id = 0;
  std::vector<ReqState> reqs;
  size_t pending = 0;
};

struct RemoteSeg {
  SegmentHandle handle = 0;
  proto::SegmentDescriptor desc;
  std::string transport;
  // Shared: a probe (maintenance_loop, unlocked) keeps the transport it probes alive while close_segment, which takes
  // it out under mu_, lets it go.
  std::shared_ptr<TransportSegment> ts;
  std::unique_ptr<PathSelector> selector;
  bool slicing = true;
  uint64_t window = 0;
  uint64_t size_bytes = 0;  // end of the last region
  std::deque<SliceRec*> queue;
  uint64_t active_slices = 0;      // queued + in flight
  std::vector<Status> last_error;  // per path
};

thread_local const void* tl_pumping = nullptr;

// Stands in for a transport this engine cannot offer (rdma without a device or without ibverbs in the build):
// opening a segment over it fails with the reason, so "no transport reaches it" says why.
class UnavailableTransport final : public Transport {
 public:
  UnavailableTransport(std::string name, int rank, Status why)
      : name_(std::move(name)), rank_(rank), why_(std::move(why)) {}
  std::string_view name() const override { return name_; }
  int rank() const override { return rank_; }
  Result<std::unique_ptr<TransportSegment>> open(const proto::SegmentDescriptor&, SliceSink*) override { return why_; }

 private:
  std::string name_;
  int rank_;
  Status why_;
};

}  // namespace

class TransferEngine::Impl final : public SliceSink, public tcp::ServerHandler {
 public:
  explicit Impl(EngineOptions options)
      : options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : &RealClock::instance()),
        sender_(*clock_, options_.connect_timeout_ms, options_.idle_connection_ms) {}

  ~Impl() override { shutdown(); }

  Status start() {
    MC_RETURN_IF_ERROR(validate(options_.slicing));
    if (options_.max_attempts == 0) return Status(Code::kInvalidArgument, "max_attempts must be >= 1");
    if (options_.slice_timeout_ms <= 0 || options_.connect_timeout_ms <= 0 || options_.request_timeout_ms <= 0) {
      return Status(Code::kInvalidArgument, "timeouts (slice, connect, request) must be > 0 ms");
    }
    for (const auto& t : options_.transports) {
      if (t != "shm" && t != "tcp" && t != "rdma") {
        return Status(Code::kInvalidArgument, "unknown transport '" + t + "' (shm, rdma, tcp)");
      }
    }
    if (!options_.topology_file.empty()) {
      MC_ASSIGN_OR_RETURN(topology_, Topology::load(options_.topology_file));
    } else {
      auto t = Topology::discover();
      if (t.is_ok()) topology_ = std::move(t).value();
    }
    host_id_ = shm::local_host_id();
    if (!options_.directory) options_.directory = make_peer_directory();
    auto allowed = [&](std::string_view n) {
      return std::find(options_.transports.begin(), options_.transports.end(), n) != options_.transports.end();
    };
    if (allowed("shm")) transports_.push_back(shm::make_shm_transport(options_, host_id_));
    if (!options_.grant_key.empty() && options_.grant_key.size() != 32) {
      return Status(Code::kInvalidArgument,
                    "grant_key must be 32 bytes (DIR/grant.key), got " + std::to_string(options_.grant_key.size()));
    }
    if (allowed("rdma") && !options_.grant_key.empty()) {
      // An rkey lets its holder read and write the whole registered region with no server-side check; until
      // per-grant memory windows exist, a segment that enforces grants publishes none (docs/SECURITY.md).
      rdma_unavailable_ = Status(Code::kUnimplemented,
                                 "rdma is off while grants are enforced (per-grant memory windows are not "
                                 "implemented; docs/SECURITY.md \"RDMA\")");
      if (options_.transports.size() == 1)
        return Status(Code::kUnimplemented, "transport rdma: " + rdma_unavailable_.message());
      MC_LOG_INFO << rdma_unavailable_.message();
      transports_.push_back(std::make_unique<UnavailableTransport>("rdma", 10, rdma_unavailable_));
    } else if (allowed("rdma")) {
      auto dom = rdma::RdmaDomain::open(options_, topology_);
      if (dom.is_ok()) {
        rdma_ = std::move(dom).value();
        transports_.push_back(rdma_->make_transport(options_, topology_));
      } else {
        rdma_unavailable_ = dom.status();
        MC_LOG_DEBUG << "rdma transport unavailable: " << rdma_unavailable_.message();
        if (options_.transports.size() == 1) {
          // Asked for rdma alone: say so now rather than at the first open_segment.
          return Status(rdma_unavailable_.code() == Code::kUnimplemented ? Code::kUnimplemented : Code::kNoPath,
                        "transport rdma: " + rdma_unavailable_.message());
        }
        transports_.push_back(std::make_unique<UnavailableTransport>("rdma", 10, rdma_unavailable_));
      }
    }
    if (allowed("tcp")) transports_.push_back(tcp::make_tcp_transport(options_, topology_));
    if (!options_.listen.empty()) {
      // As every mc server: without a key ring, loopback only unless --allow-unauthenticated (docs/SECURITY.md).
      for (const auto& ep : options_.listen) {
        auto hp = parse_tcp_endpoint(ep);
        if (hp.is_ok()) MC_RETURN_IF_ERROR(auth::check_listen("transfer engine segment " + ep, hp->host));
      }
      tcp::ServerOptions so;
      so.listen = options_.listen;
      so.socket_buffer_bytes = options_.socket_buffer_bytes;
      so.max_op_bytes = options_.max_slice_bytes_served;
      so.max_connections = options_.max_connections_served;
      so.idle_timeout_ms = options_.idle_timeout_served_ms;
      MC_ASSIGN_OR_RETURN(server_, tcp::TcpServer::start(so, this));
      endpoints_ = publishable_endpoints(server_->endpoints());
      auto hp = parse_tcp_endpoint(endpoints_.front());
      if (hp.is_ok()) segment_name_ = hp->host_port();
    }
    maintenance_ = std::thread([this] { maintenance_loop(); });
    notifier_ = std::thread([this] { notifier_loop(); });
    return Status::ok();
  }

  // A wildcard listen address is published as this host's non-loopback addresses.
  std::vector<std::string> publishable_endpoints(const std::vector<std::string>& bound) const {
    std::vector<std::string> out;
    for (const auto& ep : bound) {
      auto hp = parse_tcp_endpoint(ep);
      if (!hp.is_ok()) continue;
      if (hp->host != "0.0.0.0" && hp->host != "::") {
        out.push_back(ep);
        continue;
      }
      for (const auto& d : topology_.devices()) {
        if (d.name == "lo") continue;
        for (const auto& a : d.addresses) {
          if ((hp->host == "0.0.0.0") == (a.find(':') == std::string::npos) && a.rfind("fe80", 0) != 0) {
            out.push_back(Endpoint::tcp(a, hp->port).str());
          }
        }
      }
    }
    if (out.empty()) out = bound;
    return out;
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    server_.reset();  // no more server callbacks
    cv_.notify_all();
    maint_cv_.notify_all();
    notify_cv_.notify_all();
    if (maintenance_.joinable()) maintenance_.join();
    if (notifier_.joinable()) notifier_.join();
    std::unique_lock<std::mutex> lk(mu_);
    for (auto& [id, b] : batches_) {
      for (auto& r : b->reqs) {
        if (r.state == TransferState::kPending) {
          abort_locked(r, TransferState::kFailed, Status(Code::kCancelled, "transfer engine shut down"));
          if (r.notifying) {
            r.notifying = false;
            finalize_locked(r);
          }
        }
      }
    }
    // Destroying transport segments fails whatever is in flight (callbacks into slice_done, so unlock).
    std::vector<std::shared_ptr<RemoteSeg>> segs;
    for (auto& [h, s] : segs_) segs.push_back(s);
    lk.unlock();
    for (auto& s : segs) s->ts.reset();
  }

  // ---------------------------------------------------------------------------------------------
  // Registration
  // ---------------------------------------------------------------------------------------------

  Result<RegisteredRegion> register_memory(void* addr, uint64_t length, const std::string& location_in) {
    if (addr == nullptr) return Status(Code::kInvalidArgument, "register_memory: null address");
    if (length == 0) return Status(Code::kInvalidArgument, "register_memory: zero length at " + hex_addr(addr));
    const auto a = reinterpret_cast<uintptr_t>(addr);
    if (a + length < a) {
      return Status(Code::kInvalidArgument, "register_memory: " + hex_addr(addr) + " + " + std::to_string(length) +
                                                " bytes overflows the address space");
    }
    const std::string location = location_in.empty() ? options_.default_location : location_in;
    MC_RETURN_IF_ERROR(check_memory_location(location).with_context("register_memory"));
    std::unique_lock<std::shared_mutex> lk(regions_mu_);
    auto it = regions_.upper_bound(a);
    if (it != regions_.end() && it->first < a + length) {
      return Status(Code::kAlreadyExists, "register_memory: [" + hex_addr(addr) + ", +" + std::to_string(length) +
                                              ") overlaps the registration at " + hex_addr(it->second.addr));
    }
    if (it != regions_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.length > a) {
        return Status(Code::kAlreadyExists, "register_memory: " + hex_addr(addr) + " lies inside the registration at " +
                                                hex_addr(prev->second.addr));
      }
    }
    LocalRegion r;
    r.addr = static_cast<char*>(addr);
    r.length = length;
    r.segment_offset = next_segment_offset_;
    r.location = location;
    r.shm = find_shared_backing(addr, length);
    const uint64_t chunk = region_chunk_bytes(length);
    if (rdma_) {
      MC_RETURN_IF_ERROR(rdma_->register_memory(r.addr, length, chunk));
    }
    r.region_count = static_cast<uint32_t>(length / chunk + (length % chunk != 0 ? 1 : 0));
    // Keep segment offsets 4 KiB aligned so regions never share a page of offset space.
    next_segment_offset_ += (length + 4095) / 4096 * 4096;
    regions_[a] = r;
    by_offset_[r.segment_offset] = a;
    RegisteredRegion out{addr, length, r.segment_offset, location, r.shm.has_value(), r.region_count};
    lk.unlock();
    Status pub = options_.directory->publish(local_descriptor());
    if (!pub.is_ok()) MC_LOG_WARN << "publishing segment " << segment_name_ << ": " << pub.to_string();
    return out;
  }

  // Bytes per descriptor region of a registration of `length`: max_region_bytes, and no more than one RDMA
  // memory region may hold (the descriptor gives each region one rkey per device).
  uint64_t region_chunk_bytes(uint64_t length) const {
    uint64_t chunk = options_.max_region_bytes == 0 ? length : options_.max_region_bytes;
    if (rdma_) chunk = std::min(chunk, rdma_->max_region_bytes());
    return std::max<uint64_t>(chunk, 1);
  }

  Status unregister_memory(void* addr) {
    std::unique_lock<std::shared_mutex> lk(regions_mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == regions_.end()) {
      return Status(Code::kNotFound, "unregister_memory: no registration starts at " + hex_addr(addr));
    }
    if (rdma_) rdma_->unregister_memory(static_cast<char*>(addr));
    by_offset_.erase(it->second.segment_offset);
    regions_.erase(it);
    return Status::ok();
  }

  // The registration holding [p, p+len), or null. Caller holds regions_mu_.
  const LocalRegion* local_region_locked(const void* p, uint64_t len) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return nullptr;
    --it;
    const uint64_t off = a - it->first;
    if (off >= it->second.length || len > it->second.length - off) return nullptr;
    return &it->second;
  }

  Result<uint64_t> segment_offset(const void* addr) const {
    std::shared_lock<std::shared_mutex> lk(regions_mu_);
    const LocalRegion* r = local_region_locked(addr, 1);
    if (r == nullptr) {
      return Status(Code::kSegmentNotRegistered, "address " + hex_addr(addr) + " is not inside registered memory");
    }
    return r->segment_offset + static_cast<uint64_t>(static_cast<const char*>(addr) - r->addr);
  }

  proto::SegmentDescriptor local_descriptor() const {
    proto::SegmentDescriptor d;
    d.format_version = proto::kSegmentDescriptorVersion;
    d.name = segment_name_;
    d.host_id = host_id_;
    d.pid = static_cast<int32_t>(getpid());
    d.endpoints = endpoints_;
    d.topology_json = topology_.to_json(-1);
    if (rdma_) rdma_->describe_devices(d);
    std::shared_lock<std::shared_mutex> lk(regions_mu_);
    for (const auto& [off, a] : by_offset_) {
      const LocalRegion& r = regions_.at(a);
      const uint64_t chunk = region_chunk_bytes(r.length);
      for (uint64_t c = 0; c < r.length; c += chunk) {
        proto::RegionDescriptor rd;
        rd.segment_offset = r.segment_offset + c;
        rd.length_bytes = std::min(chunk, r.length - c);
        rd.location = r.location;
        if (r.shm) {
          rd.shm_path = r.shm->path;
          rd.shm_offset_bytes = r.shm->offset_bytes + c;
        }
        if (rdma_) rdma_->describe_region(r.addr + c, rd.length_bytes, rd);
        d.regions.push_back(std::move(rd));
      }
    }
    return d;
  }

  // tcp::ServerHandler
  Result<char*> resolve(uint64_t offset, uint64_t length) override {
    std::shared_lock<std::shared_mutex> lk(regions_mu_);
    auto it = by_offset_.upper_bound(offset);
    if (it != by_offset_.begin()) {
      --it;
      const LocalRegion& r = regions_.at(it->second);
      const uint64_t rel = offset - r.segment_offset;
      if (rel < r.length && length <= r.length - rel) return r.addr + rel;
    }
    return Status(Code::kOutOfRange, "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                         ") is not inside one registered region of segment " + segment_name_);
  }
  std::string describe() override { return codec::pack(local_descriptor()); }
  Result<std::pair<std::string, std::shared_ptr<void>>> rdma_connect(const std::string& packed) override {
    if (!rdma_) {
      return Status(Code::kNoPath, "segment " + segment_name_ + " serves no rdma: " +
                                       (rdma_unavailable_.is_ok() ? std::string("transport rdma not enabled")
                                                                  : rdma_unavailable_.message()));
    }
    return rdma_->accept(packed);
  }
  Status notify(const std::string& packed, const std::string& peer) override {
    if (grants_required()) {
      MC_ASSIGN_OR_RETURN(proto::TransferNotification n,
                          codec::unpack<proto::TransferNotification>(packed, "transfer notification from " + peer));
      MC_ASSIGN_OR_RETURN(auth::Grant g, verify_grant(n.grant));
      MC_RETURN_IF_ERROR(check_access(g, tcp::WireOp::kWrite, n.segment_offset, n.length_bytes));
      return inbox_.deliver(packed, g.id);
    }
    return inbox_.deliver(packed);
  }
  bool grants_required() const override { return !options_.grant_key.empty(); }
  Result<auth::Grant> verify_grant(std::string_view token) override {
    return auth::verify_grant(options_.grant_key, token);
  }
  Status check_access(const auth::Grant& grant, tcp::WireOp op, uint64_t offset, uint64_t length) override {
    const uint8_t gop = op == tcp::WireOp::kRead ? auth::kGrantRead : auth::kGrantWrite;
    MC_RETURN_IF_ERROR(auth::check_grant(grant, segment_name_, gop, offset, length, auth::unix_now_ms()));
    if (options_.grant_scope) {
      Status scoped = options_.grant_scope(grant, op == tcp::WireOp::kRead ? Op::kRead : Op::kWrite, offset, length);
      if (!scoped.is_ok()) {
        return Status(Code::kPermissionDenied, "grant refused: " + scoped.message() + " (" + grant.describe() + ")");
      }
    }
    return Status::ok();
  }

  // ---------------------------------------------------------------------------------------------
  // Segments
  // ---------------------------------------------------------------------------------------------

  Result<SegmentHandle> open_segment_by_name(const std::string& name) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = by_name_.find(name);
      if (it != by_name_.end()) return it->second;
    }
    MC_ASSIGN_OR_RETURN(proto::SegmentDescriptor d, options_.directory->lookup(name, options_.connect_timeout_ms));
    if (d.name.empty()) d.name = name;
    return open_segment(d, name);
  }

  Result<SegmentHandle> open_segment(const proto::SegmentDescriptor& d, const std::string& alias) {
    if (d.format_version != proto::kSegmentDescriptorVersion) {
      return Status(Code::kProtocolMismatch, "segment " + d.name + ": descriptor format version " +
                                                 std::to_string(d.format_version) + ", this engine reads " +
                                                 std::to_string(proto::kSegmentDescriptorVersion));
    }
    uint64_t end = 0;
    for (const auto& r : d.regions) {
      if (r.segment_offset < end || r.segment_offset + r.length_bytes < r.segment_offset) {
        return Status(Code::kMalformedMessage, "segment " + d.name + ": regions overlap or are not sorted");
      }
      end = r.segment_offset + r.length_bytes;
    }
    auto seg = std::make_shared<RemoteSeg>();
    seg->desc = d;
    seg->size_bytes = end;
    std::vector<Transport*> order;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& t : transports_) order.push_back(t.get());
    }
    std::stable_sort(order.begin(), order.end(), [](Transport* a, Transport* b) { return a->rank() < b->rank(); });
    std::string reasons;
    for (Transport* t : order) {
      auto ts = t->open(d, this);
      if (ts.is_ok()) {
        seg->ts = std::move(ts).value();
        seg->transport = std::string(t->name());
        break;
      }
      MC_LOG_DEBUG << "segment " << d.name << ": transport " << t->name() << " not usable: " << ts.status().message();
      reasons += (reasons.empty() ? "" : "; ") + std::string(t->name()) + ": " + ts.status().message();
    }
    if (!seg->ts) {
      return Status(Code::kNoPath, "segment " + d.name + ": no transport reaches it (" +
                                       (reasons.empty() ? std::string("none enabled") : reasons) + ")");
    }
    seg->selector = std::make_unique<PathSelector>(*clock_, options_.quarantine);
    for (const auto& p : seg->ts->paths()) {
      seg->selector->add_path(p.label == seg->transport ? p.label : seg->transport + " " + p.label, p.weight,
                              p.local_device, p.remote_device);
    }
    seg->last_error.resize(seg->ts->paths().size());
    seg->slicing = seg->ts->wants_slicing();
    seg->window = seg->ts->path_window_bytes();
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_name_.find(alias.empty() ? d.name : alias);
    if (it != by_name_.end()) return it->second;  // opened concurrently
    seg->handle = next_handle_++;
    segs_[seg->handle] = seg;
    by_name_[alias.empty() ? d.name : alias] = seg->handle;
    MC_LOG_DEBUG << "opened segment " << d.name << " over " << seg->transport << " with " << seg->ts->paths().size()
                 << " path(s)";
    return seg->handle;
  }

  Status close_segment(SegmentHandle h) {
    std::shared_ptr<RemoteSeg> seg;
    std::shared_ptr<TransportSegment> ts;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = segs_.find(h);
      if (it == segs_.end()) return Status(Code::kNotFound, "unknown segment handle " + std::to_string(h));
      if (it->second->active_slices > 0) {
        return Status(Code::kFailedPrecondition, "segment " + it->second->desc.name + " has " +
                                                     std::to_string(it->second->active_slices) + " slices in flight");
      }
      seg = it->second;
      segs_.erase(it);
      for (auto n = by_name_.begin(); n != by_name_.end();) {
        n = n->second == h ? by_name_.erase(n) : std::next(n);
      }
      ts = std::move(seg->ts);  // under mu_: the maintenance thread reads seg->ts under it
    }
    ts.reset();  // unlocked (destroying a transport may call back); a probe in flight holds its own reference
    return Status::ok();
  }

  Result<std::shared_ptr<RemoteSeg>> seg_of(SegmentHandle h) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = segs_.find(h);
    if (it == segs_.end()) return Status(Code::kNotFound, "unknown segment handle " + std::to_string(h));
    return it->second;
  }

  // ---------------------------------------------------------------------------------------------
  // Submission and completion
  // ---------------------------------------------------------------------------------------------

  Result<BatchId> submit(std::span<const TransferRequest> requests) {
    if (requests.empty()) return Status(Code::kInvalidArgument, "submit: empty batch");
    std::unique_lock<std::mutex> lk(mu_);
    if (stopped_) return Status(Code::kCancelled, "submit: transfer engine is shutting down");
    for (const auto& rq : requests) {
      if (segs_.find(rq.segment) == segs_.end()) {
        return Status(Code::kNotFound,
                      "submit: unknown segment handle " + std::to_string(rq.segment) + " (open_segment first)");
      }
    }
    auto batch = std::make_unique<Batch>();
    batch->id = next_batch_++;
    batch->reqs.resize(requests.size());
    const int64_t now = clock_->now_ns();
    for (size_t i = 0; i < requests.size(); ++i) {
      ReqState& r = batch->reqs[i];
      r.req = requests[i];
      r.seg = segs_.at(r.req.segment);
      r.submit_ns = now;
      r.deadline_ns = now + options_.request_timeout_ms * 1'000'000;
      batch->pending++;
      Status bad = check_request(r);
      if (!bad.is_ok()) {
        r.abort_state = TransferState::kFailed;
        r.status = std::move(bad);
        finalize_locked(r, batch.get());
        continue;
      }
      build_slices(r, batch.get(), static_cast<uint32_t>(i));
      if (r.slices.empty()) finalize_locked(r, batch.get());  // zero-length: complete at once
    }
    const BatchId id = batch->id;
    batches_[id] = std::move(batch);
    pump(lk);
    return id;
  }

  Status check_request(const ReqState& r) const {
    const TransferRequest& q = r.req;
    if (q.length == 0) return Status::ok();
    // Built only for an error: submit() checks every request, and small shm requests are cheap.
    const auto what_of = [&] {
      return std::string(op_name(q.op)) + " of " + std::to_string(q.length) + " bytes at offset " +
             std::to_string(q.remote_offset) + " of segment " + r.seg->desc.name;
    };
    if (q.remote_offset + q.length < q.remote_offset) {
      return Status(Code::kOutOfRange, what_of() + ": offset + length overflows 64 bits");
    }
    const auto la = reinterpret_cast<uintptr_t>(q.local_addr);
    if (q.local_addr == nullptr || la + q.length < la) {
      return Status(Code::kInvalidArgument, what_of() + ": bad local address " + hex_addr(q.local_addr));
    }
    {
      std::shared_lock<std::shared_mutex> rl(regions_mu_);
      if (local_region_locked(q.local_addr, q.length) == nullptr) {
        return Status(Code::kSegmentNotRegistered, what_of() + ": local memory [" + hex_addr(q.local_addr) + ", +" +
                                                       std::to_string(q.length) +
                                                       ") is not inside one registered region (register_memory first)");
      }
    }
    // Remote range must be covered by the segment's regions without gaps.
    uint64_t pos = q.remote_offset;
    const uint64_t end = q.remote_offset + q.length;
    for (const auto& reg : r.seg->desc.regions) {
      if (reg.segment_offset + reg.length_bytes <= pos) continue;
      if (reg.segment_offset > pos) break;
      pos = reg.segment_offset + reg.length_bytes;
      if (pos >= end) return Status::ok();
    }
    return Status(Code::kOutOfRange, what_of() + ": range [" + std::to_string(q.remote_offset) + ", " +
                                         std::to_string(end) + ") is outside the segment's registered memory (" +
                                         std::to_string(r.seg->size_bytes) + " bytes)");
  }

  // Cuts the request at remote region boundaries, then each piece by the slicing policy.
  void build_slices(ReqState& r, Batch* b, uint32_t index) {
    const TransferRequest& q = r.req;
    if (q.length == 0) return;
    RemoteSeg& seg = *r.seg;
    const uint64_t end = q.remote_offset + q.length;
    uint64_t total = 0;
    std::vector<std::pair<uint64_t, uint64_t>> pieces;  // (request offset, length)
    for (const auto& reg : seg.desc.regions) {
      const uint64_t rs = reg.segment_offset;
      const uint64_t re = rs + reg.length_bytes;
      if (re <= q.remote_offset || rs >= end) continue;
      const uint64_t s = std::max(rs, q.remote_offset);
      const uint64_t e = std::min(re, end);
      pieces.emplace_back(s - q.remote_offset, e - s);
      total += seg.slicing ? slice_count(e - s, options_.slicing) : 1;
    }
    r.slices.reserve(static_cast<size_t>(total));
    for (const auto& piece : pieces) {
      const uint64_t off = piece.first, len = piece.second;  // captured below: no structured binding
      auto add = [&](SliceRange sr) {
        SliceRec s;
        s.batch = b;
        s.req = index;
        s.req_offset = off + sr.offset;
        s.length = sr.length;
        r.slices.push_back(s);
      };
      if (seg.slicing)
        for_each_slice(len, options_.slicing, add);
      else
        add(SliceRange{0, len});
    }
    for (auto& s : r.slices) seg.queue.push_back(&s);
    r.queued = static_cast<uint32_t>(r.slices.size());
    seg.active_slices += r.slices.size();
  }

  struct Post {
    std::shared_ptr<RemoteSeg> seg;
    SliceOp op;
  };

  std::vector<Post> collect_locked() {
    std::vector<Post> out;
    const int64_t now = clock_->now_ns();
    for (auto& [h, segp] : segs_) {
      RemoteSeg& seg = *segp;
      if (!seg.ts) continue;
      while (!seg.queue.empty()) {
        SliceRec* s = seg.queue.front();
        ReqState& r = s->batch->reqs[s->req];
        const int path = seg.selector->pick(s->length, s->last_failed_path, seg.window);
        if (path < 0) break;
        seg.queue.pop_front();
        r.queued--;
        r.in_flight++;
        s->attempts++;
        s->path = path;
        s->post_ns = now;
        seg.selector->on_post(path, s->length);
        SliceOp op;
        op.op = r.req.op;
        op.local = static_cast<char*>(r.req.local_addr) + s->req_offset;
        op.remote_offset = r.req.remote_offset + s->req_offset;
        op.length = s->length;
        op.path = path;
        op.cookie = reinterpret_cast<uint64_t>(s);
        op.grant = r.req.grant.empty() ? nullptr : &r.req.grant;
        out.push_back(Post{segp, op});
      }
    }
    return out;
  }

  // Posts queued slices; called with lk held, returns with lk held. Re-entrant calls from completions
  // delivered inside post() (synchronous transports) are folded into the outer loop.
  void pump(std::unique_lock<std::mutex>& lk) {
    if (tl_pumping == this) return;
    tl_pumping = this;
    for (;;) {
      auto posts = collect_locked();
      if (posts.empty()) break;
      lk.unlock();
      for (auto& p : posts) p.seg->ts->post(p.op);
      lk.lock();
    }
    tl_pumping = nullptr;
  }

  void slice_done(uint64_t cookie, const Status& st) override {
    std::unique_lock<std::mutex> lk(mu_);
    auto* s = reinterpret_cast<SliceRec*>(cookie);
    Batch* b = s->batch;
    ReqState& r = b->reqs[s->req];
    RemoteSeg& seg = *r.seg;
    const bool ok = st.is_ok();
    const bool request_fault = !ok && is_request_fault(st.code());
    seg.selector->on_done(s->path, s->length, ok, !request_fault, st.code() == Code::kLocalDeviceDown);
    r.in_flight--;
    if (!ok) seg.last_error[static_cast<size_t>(s->path)] = st;
    const bool retry = !ok && !request_fault && s->attempts < options_.max_attempts &&
                       r.abort_state == TransferState::kPending && !stopped_;
    if (options_.trace_slices && !retry) {
      r.trace.push_back(SliceTrace{s->req_offset, s->length, seg.selector->path(s->path).label, s->attempts,
                                   clock_->now_ns() - s->post_ns, ok});
    }
    if (ok) {
      r.transferred += s->length;
      seg.active_slices--;
    } else if (retry) {
      if (s->attempts == 1) r.retried++;
      s->last_failed_path = s->path;
      seg.queue.push_front(s);
      r.queued++;
      MC_LOG_DEBUG << "slice at offset " << s->req_offset << " of a " << op_name(r.req.op) << " on "
                   << seg.selector->path(s->path).label << " failed (attempt " << s->attempts
                   << "), retrying: " << st.message();
    } else {
      seg.active_slices--;
      if (r.abort_state == TransferState::kPending) {
        const std::string what = std::string(op_name(r.req.op)) + " of " + std::to_string(r.req.length) +
                                 " bytes at offset " + std::to_string(r.req.remote_offset) + " of segment " +
                                 seg.desc.name;
        Status why = request_fault ? Status(st.code(), what + ": " + st.message())
                                   : Status(Code::kTransferFailed, what + ": slice at request offset " +
                                                                       std::to_string(s->req_offset) +
                                                                       " failed after " + std::to_string(s->attempts) +
                                                                       " attempt(s); last error: " + st.message());
        abort_locked(r, TransferState::kFailed, std::move(why));
      }
    }
    finalize_locked(r);
    pump(lk);  // waiters are woken by finalize_locked only when a request becomes final
  }

  // Stops a request: drops its queued slices; it becomes final when its in-flight slices return.
  void abort_locked(ReqState& r, TransferState state, Status why) {
    if (r.abort_state != TransferState::kPending || r.state != TransferState::kPending) return;
    r.abort_state = state;
    r.status = std::move(why);
    if (r.queued > 0) {
      auto& q = r.seg->queue;
      const size_t before = q.size();
      q.erase(std::remove_if(q.begin(), q.end(), [&](SliceRec* s) { return &s->batch->reqs[s->req] == &r; }), q.end());
      r.seg->active_slices -= before - q.size();
      r.queued = 0;
    }
    finalize_locked(r);
  }

  void finalize_locked(ReqState& r, Batch* b = nullptr) {
    if (r.state != TransferState::kPending || r.notifying || r.in_flight > 0 || r.queued > 0) return;
    if (b == nullptr) b = r.slices.empty() ? nullptr : r.slices.front().batch;
    if (r.abort_state == TransferState::kPending && r.transferred == r.req.length && !r.req.notify_tag.empty() &&
        !r.notified && !stopped_) {
      r.notifying = true;
      notify_jobs_.push_back(&r);
      notify_cv_.notify_one();
      return;
    }
    if (r.abort_state != TransferState::kPending) {
      r.state = r.abort_state;
    } else if (r.transferred == r.req.length) {
      r.state = TransferState::kCompleted;
    } else {
      r.state = TransferState::kFailed;
      r.status = Status(Code::kInternal, "request ended with " + std::to_string(r.transferred) + " of " +
                                             std::to_string(r.req.length) + " bytes");
    }
    r.final_ns = clock_->now_ns();
    if (b == nullptr) b = batch_of_locked(r);
    if (b != nullptr) b->pending--;
    cv_.notify_all();
  }

  Batch* batch_of_locked(const ReqState& r) {
    for (auto& [id, b] : batches_) {
      if (!b->reqs.empty() && &r >= &b->reqs.front() && &r <= &b->reqs.back()) return b.get();
    }
    return nullptr;
  }

  // ---------------------------------------------------------------------------------------------
  // Notifications (initiator side) and maintenance
  // ---------------------------------------------------------------------------------------------

  // Initiator side of notifications (notifier.hpp). This thread takes the queued requests in order, in runs of
  // at most NotificationSender::kMaxRun, and hands them to the sender (one persistent connection per target
  // endpoint). A request is queued here only once every slice was acknowledged by the target (its bytes
  // landed), so a notification never arrives before the bytes it announces, and per peer notifications
  // arrive in the order their requests completed.
  void notifier_loop() {
    const auto idle_check = std::chrono::milliseconds(std::clamp<int64_t>(options_.idle_connection_ms / 2, 10, 1000));
    for (;;) {
      std::vector<ReqState*> reqs;
      std::vector<OutgoingNotification> jobs;
      {
        std::unique_lock<std::mutex> lk(mu_);
        notify_cv_.wait_for(lk, idle_check, [&] { return stopped_ || !notify_jobs_.empty(); });
        if (notify_jobs_.empty()) {
          if (stopped_) break;
          lk.unlock();
          sender_.evict_idle();
          continue;
        }
        while (!notify_jobs_.empty() && jobs.size() < NotificationSender::kMaxRun) {
          ReqState* r = notify_jobs_.front();
          notify_jobs_.pop_front();
          reqs.push_back(r);
          jobs.push_back(
              OutgoingNotification{pack_notification(r->req, segment_name_), r->seg->desc.endpoints, Status::ok()});
        }
      }
      sender_.send(jobs);
      std::lock_guard<std::mutex> lk(mu_);
      for (size_t i = 0; i < jobs.size(); ++i) {
        ReqState* r = reqs[i];
        r->notifying = false;
        r->notified = true;
        if (!jobs[i].status.is_ok()) {
          notifications_failed_++;
          r->abort_state = TransferState::kFailed;
          r->status =
              Status(Code::kTransferFailed,
                     "all " + std::to_string(r->req.length) + " bytes landed but notification '" + r->req.notify_tag +
                         "' to segment " + r->seg->desc.name + " failed: " + jobs[i].status.message());
        } else {
          notifications_sent_++;
        }
        finalize_locked(*r);
      }
    }
    sender_.close_all();
  }

  void maintenance_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopped_) {
      maint_cv_.wait_for(lk, std::chrono::milliseconds(20));
      if (stopped_) break;
      const int64_t now = clock_->now_ns();
      // Deadlines.
      for (auto& [id, b] : batches_) {
        if (b->pending == 0) continue;
        for (auto& r : b->reqs) {
          if (r.state == TransferState::kPending && r.abort_state == TransferState::kPending && now > r.deadline_ns) {
            abort_locked(r, TransferState::kTimeout, timeout_status(r));
          }
        }
      }
      // Probes of quarantined paths whose backoff passed (only for segments with work or recent failures).
      std::vector<std::pair<std::shared_ptr<RemoteSeg>, int>> probes;
      std::vector<std::shared_ptr<TransportSegment>> probed;  // taken under mu_: close_segment may drop seg->ts
      for (auto& [h, seg] : segs_) {
        if (!seg->ts) continue;
        for (int p : seg->selector->due_for_probe()) {
          probes.emplace_back(seg, p);
          probed.push_back(seg->ts);
        }
      }
      if (!probes.empty()) {
        lk.unlock();
        std::vector<Status> results;
        for (size_t i = 0; i < probes.size(); ++i) {
          results.push_back(probed[i]->probe(probes[i].second, options_.connect_timeout_ms));
        }
        probed.clear();  // a transport closed meanwhile is destroyed here, unlocked (its destructor may call back)
        lk.lock();
        for (size_t i = 0; i < probes.size(); ++i) {
          auto& [seg, p] = probes[i];
          seg->selector->on_probe(p, results[i].is_ok());
          if (!results[i].is_ok()) seg->last_error[static_cast<size_t>(p)] = results[i];
          MC_LOG_DEBUG << "probe of " << seg->selector->path(p).label << ": " << results[i].to_string();
        }
      }
      // No path left: every path failed max_attempts times in a row (slices and probes) while work waits.
      for (auto& [h, seg] : segs_) {
        if (!seg->ts || seg->queue.empty() || !seg->selector->all_failed_at_least(options_.max_attempts)) continue;
        std::vector<ReqState*> victims;
        for (SliceRec* s : seg->queue) victims.push_back(&s->batch->reqs[s->req]);
        for (ReqState* r : victims) {
          if (r->state == TransferState::kPending && r->abort_state == TransferState::kPending) {
            abort_locked(*r, TransferState::kFailed, no_path_status(*r));
          }
        }
      }
      pump(lk);
    }
  }

  std::string paths_summary(const RemoteSeg& seg) const {
    std::string paths;
    for (size_t i = 0; i < seg.selector->size(); ++i) {
      const PathState& p = seg.selector->path(static_cast<int>(i));
      paths += (paths.empty() ? "" : "; ") + p.label + " " + health_name(p.health);
      if (!seg.last_error[i].is_ok()) paths += " (last error: " + seg.last_error[i].message() + ")";
    }
    return paths;
  }

  Status no_path_status(const ReqState& r) const {
    return Status(Code::kNoPath, std::string(op_name(r.req.op)) + " of " + std::to_string(r.req.length) +
                                     " bytes at offset " + std::to_string(r.req.remote_offset) + " of segment " +
                                     r.seg->desc.name + ": no path left after " +
                                     std::to_string(options_.max_attempts) + " failures on each (" +
                                     std::to_string(r.transferred) + " bytes landed); paths: " + paths_summary(*r.seg));
  }

  Status timeout_status(const ReqState& r) const {
    return Status(Code::kTimeout,
                  std::string(op_name(r.req.op)) + " of " + std::to_string(r.req.length) + " bytes at offset " +
                      std::to_string(r.req.remote_offset) + " of segment " + r.seg->desc.name + ": not done within " +
                      std::to_string(options_.request_timeout_ms) + " ms (" + std::to_string(r.transferred) +
                      " bytes landed); paths: " + paths_summary(*r.seg));
  }

  // ---------------------------------------------------------------------------------------------
  // Status
  // ---------------------------------------------------------------------------------------------

  RequestStatus request_status_locked(const ReqState& r) const {
    RequestStatus s;
    s.state = r.state;
    s.transferred_bytes = r.transferred;
    s.status = r.state == TransferState::kPending ? Status::ok() : r.status;
    s.slice_count = static_cast<uint32_t>(r.slices.size());
    s.retried_slices = r.retried;
    s.latency_ns = r.state == TransferState::kPending ? 0 : r.final_ns - r.submit_ns;
    s.slices = r.trace;
    std::sort(s.slices.begin(), s.slices.end(),
              [](const SliceTrace& a, const SliceTrace& b) { return a.request_offset < b.request_offset; });
    return s;
  }

  BatchStatus batch_status_locked(const Batch& b) const {
    BatchStatus out;
    out.state = b.pending == 0 ? TransferState::kCompleted : TransferState::kPending;
    for (const auto& r : b.reqs) {
      out.requests.push_back(request_status_locked(r));
      out.transferred_bytes += r.transferred;
      if (b.pending == 0 && r.state != TransferState::kCompleted && out.state == TransferState::kCompleted) {
        out.state = r.state;
        out.status = r.status;
      }
    }
    return out;
  }

  Result<const Batch*> batch_locked(BatchId id) const {
    auto it = batches_.find(id);
    if (it == batches_.end()) return Status(Code::kNotFound, "unknown batch id " + std::to_string(id));
    return static_cast<const Batch*>(it->second.get());
  }

  Result<BatchStatus> wait(BatchId id, int64_t timeout_ms, std::optional<size_t> index, RequestStatus* req_out) {
    std::unique_lock<std::mutex> lk(mu_);
    MC_ASSIGN_OR_RETURN(const Batch* b, batch_locked(id));
    if (index && *index >= b->reqs.size()) {
      return Status(Code::kOutOfRange, "batch " + std::to_string(id) + " has " + std::to_string(b->reqs.size()) +
                                           " requests, no index " + std::to_string(*index));
    }
    auto done = [&] { return index ? b->reqs[*index].state != TransferState::kPending : b->pending == 0; };
    if (timeout_ms > 0) cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), done);
    if (req_out != nullptr) *req_out = request_status_locked(b->reqs[*index]);
    if (index) return BatchStatus{};
    return batch_status_locked(*b);
  }

  Status free_batch(BatchId id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) return Status(Code::kNotFound, "unknown batch id " + std::to_string(id));
    if (it->second->pending > 0) {
      return Status(Code::kFailedPrecondition, "batch " + std::to_string(id) + " still has " +
                                                   std::to_string(it->second->pending) + " pending request(s)");
    }
    batches_.erase(it);
    return Status::ok();
  }

  // Stops the pending requests of a batch (transfer_sync's deadline).
  void cancel_batch(BatchId id, const Status& why) {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) return;
    for (auto& r : it->second->reqs) {
      if (r.state == TransferState::kPending) abort_locked(r, TransferState::kTimeout, why);
    }
  }

  EngineOptions options_;
  const Clock* clock_;
  Topology topology_;
  // Declared before the server and the transports so that it is destroyed after them (they use its devices).
  std::unique_ptr<rdma::RdmaDomain> rdma_;
  Status rdma_unavailable_;  // why rdma_ is null when "rdma" is an allowed transport
  std::string host_id_;
  std::string segment_name_;
  std::vector<std::string> endpoints_;
  std::unique_ptr<tcp::TcpServer> server_;

  mutable std::shared_mutex regions_mu_;
  std::map<uintptr_t, LocalRegion> regions_;  // by address
  std::map<uint64_t, uintptr_t> by_offset_;   // segment offset -> address
  uint64_t next_segment_offset_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // a request became final
  std::condition_variable maint_cv_;  // wakes the maintenance thread (shutdown)
  bool stopped_ = false;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::map<SegmentHandle, std::shared_ptr<RemoteSeg>> segs_;
  std::map<std::string, SegmentHandle> by_name_;
  SegmentHandle next_handle_ = 1;
  std::map<BatchId, std::unique_ptr<Batch>> batches_;
  BatchId next_batch_ = 1;
  std::deque<ReqState*> notify_jobs_;
  std::condition_variable notify_cv_;
  NotificationSender sender_;  // notifier thread only (its counters: any thread)
  std::atomic<uint64_t> notifications_sent_{0}, notifications_failed_{0};
  std::thread maintenance_;
  std::thread notifier_;

  NotificationInbox inbox_;  // target side: what the server received
};

// ------------------------------------------------------------------------------------------------
// TransferEngine: forwards to Impl
// ------------------------------------------------------------------------------------------------

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(EngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  MC_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() { impl_->shutdown(); }

const std::string& TransferEngine::segment_name() const { return impl_->segment_name_; }
const std::vector<std::string>& TransferEngine::endpoints() const { return impl_->endpoints_; }
const Topology& TransferEngine::topology() const { return impl_->topology_; }
const EngineOptions& TransferEngine::options() const { return impl_->options_; }

Result<RegisteredRegion> TransferEngine::register_memory(void* addr, uint64_t length, const std::string& location) {
  return impl_->register_memory(addr, length, location);
}
Status TransferEngine::unregister_memory(void* addr) { return impl_->unregister_memory(addr); }
Result<uint64_t> TransferEngine::segment_offset(const void* addr) const { return impl_->segment_offset(addr); }
proto::SegmentDescriptor TransferEngine::local_descriptor() const { return impl_->local_descriptor(); }

Result<SegmentHandle> TransferEngine::open_segment(const std::string& name) {
  return impl_->open_segment_by_name(name);
}
Result<SegmentHandle> TransferEngine::open_segment(const proto::SegmentDescriptor& descriptor) {
  return impl_->open_segment(descriptor, descriptor.name);
}
Status TransferEngine::close_segment(SegmentHandle segment) { return impl_->close_segment(segment); }
Result<proto::SegmentDescriptor> TransferEngine::segment_descriptor(SegmentHandle segment) const {
  MC_ASSIGN_OR_RETURN(auto seg, impl_->seg_of(segment));
  return seg->desc;
}
Result<std::string> TransferEngine::segment_transport(SegmentHandle segment) const {
  MC_ASSIGN_OR_RETURN(auto seg, impl_->seg_of(segment));
  return seg->transport;
}
Result<std::vector<PathStats>> TransferEngine::path_stats(SegmentHandle segment) const {
  MC_ASSIGN_OR_RETURN(auto seg, impl_->seg_of(segment));
  std::lock_guard<std::mutex> lk(impl_->mu_);
  std::vector<PathStats> out;
  for (const auto& p : seg->selector->paths()) out.push_back(PathStats{seg->transport, p});
  return out;
}

Result<BatchId> TransferEngine::submit(std::span<const TransferRequest> requests) { return impl_->submit(requests); }
Result<BatchStatus> TransferEngine::poll(BatchId batch) const {
  std::lock_guard<std::mutex> lk(impl_->mu_);
  MC_ASSIGN_OR_RETURN(const auto* b, impl_->batch_locked(batch));
  return impl_->batch_status_locked(*b);
}
Result<BatchStatus> TransferEngine::wait(BatchId batch, int64_t timeout_ms) {
  return impl_->wait(batch, timeout_ms, std::nullopt, nullptr);
}
Result<RequestStatus> TransferEngine::poll_request(BatchId batch, size_t index) const {
  return const_cast<TransferEngine*>(this)->wait_request(batch, index, 0);
}
Result<RequestStatus> TransferEngine::wait_request(BatchId batch, size_t index, int64_t timeout_ms) {
  RequestStatus out;
  auto r = impl_->wait(batch, timeout_ms, index, &out);
  if (!r.is_ok()) return r.status();
  return out;
}
Status TransferEngine::free_batch(BatchId batch) { return impl_->free_batch(batch); }

RequestStatus TransferEngine::transfer_sync(const TransferRequest& request, int64_t timeout_ms) {
  RequestStatus out;
  auto id = submit(std::span<const TransferRequest>(&request, 1));
  if (!id.is_ok()) {
    out.state = TransferState::kFailed;
    out.status = id.status();
    return out;
  }
  auto st = wait_request(id.value(), 0, timeout_ms);
  if (st.is_ok() && st->state == TransferState::kPending) {
    impl_->cancel_batch(
        id.value(), Status(Code::kTimeout, std::string(op_name(request.op)) + " of " + std::to_string(request.length) +
                                               " bytes: not done within " + std::to_string(timeout_ms) + " ms"));
    st = wait_request(id.value(), 0, impl_->options_.slice_timeout_ms * 2 + 1000);
  }
  if (!st.is_ok()) {
    out.state = TransferState::kFailed;
    out.status = st.status();
    return out;
  }
  out = std::move(st).value();
  if (is_final(out.state)) (void)free_batch(id.value());
  return out;
}

void TransferEngine::set_notification_handler(std::function<void(const Notification&)> handler) {
  impl_->inbox_.set_handler(std::move(handler));
}
std::vector<Notification> TransferEngine::take_notifications(size_t max_count) { return impl_->inbox_.take(max_count); }
Result<Notification> TransferEngine::wait_notification(int64_t timeout_ms) { return impl_->inbox_.wait(timeout_ms); }

void export_served_metrics(const EngineStats& s, metrics::Registry& registry) {
  auto set = [&](const char* name, const char* help, uint64_t v) { registry.counter(name, help).set(v); };
  set("mc_xfer_served_reads_total", "reads of this segment served over tcp", s.served_reads);
  set("mc_xfer_served_writes_total", "writes into this segment served over tcp", s.served_writes);
  set("mc_xfer_served_read_bytes_total", "bytes read from this segment over tcp", s.served_read_bytes);
  set("mc_xfer_served_written_bytes_total", "bytes written into this segment over tcp", s.served_written_bytes);
  set("mc_xfer_served_errors_total", "ops refused or broken off (bad range, oversized, peer gone)", s.served_errors);
  set("mc_xfer_served_refused_total", "reads, writes and notifications refused for want of a valid grant",
      s.served_refused);
  set("mc_xfer_connections_accepted_total", "tcp connections accepted", s.connections_accepted);
  set("mc_xfer_conn_refused_total", "tcp connections closed at accept (connection cap, or cap per peer address)",
      s.connections_refused);
  set("mc_xfer_conn_cut_total", "tcp connections closed at a deadline (idle, or a request or reply too slow)",
      s.connections_cut);
  set("mc_xfer_notifications_received_total", "completion notifications received", s.notifications_received);
}

EngineStats TransferEngine::stats() const {
  EngineStats s;
  const Impl& m = *impl_;
  s.notifications_sent = m.notifications_sent_.load();
  s.notifications_failed = m.notifications_failed_.load();
  s.notify_connections_opened = m.sender_.connections_opened();
  s.notify_connections_broken = m.sender_.connections_broken();
  s.notifications_received = m.inbox_.received();
  s.connections_accepted = m.server_ ? m.server_->connections_accepted() : 0;
  if (m.server_) {
    s.served_reads = m.server_->reads_served();
    s.served_writes = m.server_->writes_served();
    s.served_read_bytes = m.server_->read_bytes_served();
    s.served_written_bytes = m.server_->written_bytes_served();
    s.served_errors = m.server_->errors_served();
    s.served_refused = m.server_->refused_served();
    s.connections_refused = m.server_->connections_refused();
    s.connections_cut = m.server_->connections_cut();
  }
  // Under mu_: a segment still listed has not been closed (close_segment drops its transport after unlisting).
  std::lock_guard<std::mutex> lk(m.mu_);
  for (const auto& [h, seg] : m.segs_) {
    if (seg->ts) seg->ts->add_counters(s.transport_counters);
  }
  return s;
}

Status TransferEngine::add_transport(std::unique_ptr<Transport> transport) {
  if (!transport) return Status(Code::kInvalidArgument, "add_transport: null transport");
  std::lock_guard<std::mutex> lk(impl_->mu_);
  impl_->transports_.push_back(std::move(transport));
  return Status::ok();
}

}  // namespace mc::transfer
