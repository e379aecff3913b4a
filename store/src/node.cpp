#include "mc/store/node.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/protocol.hpp"
#include "mc/common/report.hpp"
#include "mc/common/rpc.hpp"
#include "mc/common/units.hpp"
#include "mc/store/directory.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/shared_buffer.hpp"

namespace mc::store {

namespace {

constexpr uint64_t kDirectAlign = 4096;

std::string errno_text(int e) { return std::string(std::strerror(e)); }

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// DRAM segment: a memfd SharedBuffer (same-host peers of the transfer engine map it; nothing is left
// in /dev/shm, even after SIGKILL) or, with shm off, private anonymous memory (served over tcp only).
class DramSegment {
 public:
  static Result<std::unique_ptr<DramSegment>> create(uint64_t size, bool shared, const std::string& node_id) {
    auto s = std::unique_ptr<DramSegment>(new DramSegment());
    s->size_ = size;
    if (shared) {
      MC_ASSIGN_OR_RETURN(s->shared_, transfer::allocate_shared_buffer(size, "mc-store-" + node_id));
      s->base_ = static_cast<std::byte*>(s->shared_.data());
      return s;
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status(Code::kResourceExhausted, "cannot map " + std::to_string(size) + " bytes of DRAM for node " +
                                                  node_id + ": " + errno_text(errno));
    }
    s->base_ = static_cast<std::byte*>(p);
    s->private_ = true;
    return s;
  }
  ~DramSegment() {
    if (private_ && base_) munmap(base_, size_);
  }
  std::byte* base() { return base_; }
  uint64_t size() const { return size_; }

  // Commits every page now (MADV_POPULATE_WRITE, or one write per page where the kernel lacks it), so
  // puts never pay the first-touch page allocation and a node without the memory fails at start
  // instead of a writer taking SIGBUS on a full tmpfs later.
  Status prefault() {
    if (madvise(base_, size_, MADV_POPULATE_WRITE) == 0) return Status::ok();
    const int e = errno;
    if (e != EINVAL) {
      return Status(Code::kResourceExhausted, "cannot commit " + std::to_string(size_) +
                                                  " bytes of DRAM: " + errno_text(e) +
                                                  " (lower --dram-bytes, or --no-prefault to commit lazily)");
    }
    const long page = sysconf(_SC_PAGESIZE);
    for (uint64_t off = 0; off < size_; off += static_cast<uint64_t>(page)) {
      reinterpret_cast<volatile std::byte*>(base_)[off] = std::byte{0};
    }
    return Status::ok();
  }

 private:
  DramSegment() = default;
  transfer::SharedBuffer shared_;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  bool private_ = false;
};

// SSD segment: one file, O_DIRECT where allowed, aligned bounce buffer.
class SsdSegment {
 public:
  static Result<std::unique_ptr<SsdSegment>> create(const std::string& path, uint64_t size) {
    auto s = std::unique_ptr<SsdSegment>(new SsdSegment());
    s->path_ = path;
    s->size_ = size;
    s->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    s->direct_ = s->fd_ >= 0;
    if (s->fd_ < 0) s->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->fd_ < 0) return Status(Code::kIo, "cannot open SSD file " + path + ": " + errno_text(errno));
    if (ftruncate(s->fd_, static_cast<off_t>(size)) != 0) {
      return Status(Code::kIo,
                    "cannot size SSD file " + path + " to " + std::to_string(size) + " bytes: " + errno_text(errno));
    }
    return s;
  }
  ~SsdSegment() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
    std::free(bounce_);
  }
  bool direct() const { return direct_; }

  Status write(uint64_t offset, const std::byte* data, uint64_t len) {
    if (!direct_) return full_io(true, offset, const_cast<std::byte*>(data), len);
    uint64_t start = offset / kDirectAlign * kDirectAlign;
    uint64_t end = (offset + len + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    MC_RETURN_IF_ERROR(ensure_bounce(end - start));
    // Read-modify-write of the partial edge blocks.
    if (start != offset || end != offset + len) MC_RETURN_IF_ERROR(full_io(false, start, bounce_, end - start));
    std::memcpy(bounce_ + (offset - start), data, len);
    return full_io(true, start, bounce_, end - start);
  }
  Status read(uint64_t offset, std::byte* out, uint64_t len) {
    if (!direct_) return full_io(false, offset, out, len);
    uint64_t start = offset / kDirectAlign * kDirectAlign;
    uint64_t end = (offset + len + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    MC_RETURN_IF_ERROR(ensure_bounce(end - start));
    MC_RETURN_IF_ERROR(full_io(false, start, bounce_, end - start));
    std::memcpy(out, bounce_ + (offset - start), len);
    return Status::ok();
  }

 private:
  SsdSegment() = default;
  Status ensure_bounce(uint64_t n) {
    if (n <= bounce_size_) return Status::ok();
    std::free(bounce_);
    bounce_ = nullptr;
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, n) != 0)
      return Status(Code::kResourceExhausted, "cannot allocate SSD bounce buffer");
    bounce_ = static_cast<std::byte*>(p);
    bounce_size_ = n;
    return Status::ok();
  }
  Status full_io(bool write, uint64_t offset, std::byte* buf, uint64_t len) {
    uint64_t done = 0;
    while (done < len) {
      ssize_t n = write ? pwrite(fd_, buf + done, len - done, static_cast<off_t>(offset + done))
                        : pread(fd_, buf + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return Status(Code::kIo, std::string(write ? "pwrite" : "pread") + " of " + path_ + " at " +
                                     std::to_string(offset + done) + ": " +
                                     (n == 0 ? "end of file" : errno_text(errno)));
      }
      done += static_cast<uint64_t>(n);
    }
    return Status::ok();
  }
  std::string path_;
  uint64_t size_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  std::byte* bounce_ = nullptr;
  uint64_t bounce_size_ = 0;
};

class Node {
 public:
  explicit Node(NodeOptions o) : opt_(std::move(o)) {}

  Status start() {
    if (opt_.host.empty()) opt_.host = mc::report::host_name();
    if (opt_.node_id.empty()) opt_.node_id = opt_.host + "-" + std::to_string(getpid());
    for (char c : opt_.node_id) {
      if (c == '/' || c == ' ')
        return Status(Code::kInvalidArgument, "--node-id '" + opt_.node_id + "' may not contain '/' or spaces");
    }
    if (opt_.dram_bytes == 0) return Status(Code::kInvalidArgument, "--dram-bytes must be positive");
    MC_ASSIGN_OR_RETURN(dram_, DramSegment::create(opt_.dram_bytes, opt_.shm, opt_.node_id));
    if (opt_.prefault) MC_RETURN_IF_ERROR(dram_->prefault());
    if (!opt_.ssd_dir.empty()) {
      if (opt_.ssd_bytes == 0) return Status(Code::kInvalidArgument, "--ssd-dir needs --ssd-bytes > 0");
      MC_ASSIGN_OR_RETURN(ssd_,
                          SsdSegment::create(opt_.ssd_dir + "/mc-store-" + opt_.node_id + ".ssd", opt_.ssd_bytes));
      MC_LOG_INFO << "SSD segment in " << opt_.ssd_dir
                  << (ssd_->direct() ? " (O_DIRECT)" : " (buffered: O_DIRECT refused)");
    }
    rpc::ServerOptions so;
    so.service = "mc-store node " + opt_.node_id;
    so.bind_endpoints = {opt_.listen};
    MC_ASSIGN_OR_RETURN(server_, rpc::RpcServer::bind(so));
    register_handlers();
    server_->serve_stat(&registry_, [this] { update_metrics(); });
    rpc::ClientOptions co;
    co.client_name = "mc-store node " + opt_.node_id;
    MC_ASSIGN_OR_RETURN(master_, rpc::RpcClient::connect(opt_.master, co));
    // The DRAM segment is served by the transfer engine; the master is its segment directory.
    transfer::EngineOptions eo;
    eo.listen = opt_.xfer_listen;
    eo.max_connections_served = opt_.xfer_max_connections;
    eo.idle_timeout_served_ms = opt_.xfer_idle_timeout_ms;
    if (eo.listen.empty()) return Status(Code::kInvalidArgument, "--xfer-listen needs at least one endpoint");
    MC_ASSIGN_OR_RETURN(directory_, MasterSegmentDirectory::connect(opt_.master, co.client_name + " directory", 2000));
    eo.directory = directory_;
    MC_ASSIGN_OR_RETURN(engine_, transfer::TransferEngine::create(eo));
    MC_ASSIGN_OR_RETURN(transfer::RegisteredRegion region, engine_->register_memory(dram_->base(), dram_->size()));
    dram_xfer_offset_ = region.segment_offset;
    MC_LOG_INFO << "DRAM segment " << dram_name() << " (" << dram_->size() << " bytes) served as transfer segment "
                << engine_->segment_name() << (region.shm_shareable ? " (shm + tcp)" : " (tcp only: --no-shm)");
    return mount();
  }

  Status mount() {
    // Publish the engine's descriptor first: the master refuses a cpu segment it cannot direct peers to.
    MC_RETURN_IF_ERROR(directory_->publish(engine_->local_descriptor()));
    proto::StoreMountRequest m;
    m.node_id = opt_.node_id;
    m.host = opt_.host;
    m.domain = opt_.domain;
    m.endpoint = server_->endpoints().at(0);
    m.segment = dram_name();
    m.medium = "cpu";
    m.capacity_bytes = dram_->size();
    m.xfer_segment = engine_->segment_name();
    m.xfer_base_offset_bytes = dram_xfer_offset_;
    MC_RETURN_IF_ERROR(master_->call(m).status());
    if (ssd_) {
      m.segment = ssd_name();
      m.medium = "disk";
      m.capacity_bytes = opt_.ssd_bytes;
      m.xfer_segment.clear();
      m.xfer_base_offset_bytes = 0;
      MC_RETURN_IF_ERROR(master_->call(m).status());
    }
    return Status::ok();
  }

  void unmount() {
    proto::StoreUnmountRequest u{opt_.node_id, dram_name()};
    (void)master_->call(u, 1000);
    if (ssd_) {
      u.segment = ssd_name();
      (void)master_->call(u, 1000);
    }
  }

  Status serve() {
    daemon::announce_ready("mc-store-node", server_->endpoints().at(0),
                           {{"node", opt_.node_id},
                            {"xfer_segment", engine_->segment_name()},
                            {"dram_bytes", std::to_string(dram_->size())},
                            {"ssd_bytes", std::to_string(ssd_ ? opt_.ssd_bytes : 0)}});
    int64_t next_hb = steady_ms() + opt_.heartbeat_ms;
    while (!daemon::stop_requested()) {
      MC_RETURN_IF_ERROR(server_->poll_once(20));
      if (steady_ms() >= next_hb) {
        heartbeat();
        next_hb = steady_ms() + (done_.empty() ? opt_.heartbeat_ms : 0);
      }
    }
    unmount();
    return Status::ok();
  }

 private:
  std::string dram_name() const { return opt_.node_id + "/dram"; }
  std::string ssd_name() const { return opt_.node_id + "/ssd"; }

  void heartbeat() {
    proto::StoreNodeHeartbeatRequest hb{opt_.node_id, done_};
    auto reply = master_->call(hb, std::max(500, opt_.heartbeat_ms));
    if (!reply.is_ok()) {
      if (reply.status().code() == Code::kNotFound) {
        MC_LOG_WARN << "master forgot node " << opt_.node_id << " (declared dead): mounting again, empty";
        done_.clear();
        Status s = mount();
        if (!s.is_ok()) MC_LOG_WARN << "re-mount failed: " << s.to_string();
      } else {
        MC_LOG_WARN << "heartbeat to " << opt_.master << " failed: " << reply.status().to_string();
      }
      return;
    }
    done_.clear();
    for (const auto& t : reply->tasks) {
      const bool ok = demote(t).is_ok();
      (ok ? demotions_ : demotion_failures_).inc();
      done_.push_back({t.task_id, ok});
    }
    usage_ = reply->segments;
  }

  // The node's `stat`: capacities, the master's view of usage (last heartbeat), the SSD RPCs and demotions
  // this node served, and its engine's tcp service of the DRAM segment.
  void update_metrics() {
    auto gauge = [&](const std::string& name, const std::string& help, uint64_t v) {
      registry_.gauge(name, help).set(static_cast<double>(v));
    };
    struct Tier {
      std::string medium, segment;
      uint64_t capacity_bytes;
    };
    const Tier tiers[] = {{"dram", dram_name(), dram_->size()}, {"ssd", ssd_name(), ssd_ ? opt_.ssd_bytes : 0}};
    for (const auto& [medium, name, capacity] : tiers) {
      const std::string prefix = "mc_store_node_" + medium;
      proto::StoreNodeSegmentUsage u;
      for (const auto& x : usage_) {
        if (x.segment == name) u = x;
      }
      gauge(prefix + "_capacity_bytes", medium + " contributed", capacity);
      gauge(prefix + "_used_bytes", medium + " allocated (master's view at the last heartbeat)", u.used_bytes);
      gauge(prefix + "_objects", medium + " replicas held (master's view at the last heartbeat)", u.objects);
      gauge(prefix + "_hits_total", "reads whose nearest replica was on this " + medium + " segment", u.hits);
    }
    transfer::export_served_metrics(engine_->stats(), registry_);
  }

  Status demote(const proto::StoreDemoteTask& t) {
    if (!ssd_ || t.src_segment != dram_name() || t.dst_segment != ssd_name() ||
        t.src_offset_bytes + t.size_bytes > dram_->size() || t.dst_offset_bytes + t.size_bytes > opt_.ssd_bytes) {
      MC_LOG_WARN << "demotion task " << t.task_id << " of '" << t.key << "' does not fit this node's segments";
      return Status(Code::kInvalidArgument, "bad demotion task");
    }
    Status s = ssd_->write(t.dst_offset_bytes, dram_->base() + t.src_offset_bytes, t.size_bytes);
    if (!s.is_ok()) MC_LOG_WARN << "demotion of '" << t.key << "' failed: " << s.to_string();
    return s;
  }

  // Node data RPCs serve the SSD segment only: the engine cannot address a file. DRAM bytes go through
  // the transfer engine (segment xfer_segment), never through these RPCs.
  Status check_ssd_range(const std::string& segment, uint64_t offset, uint64_t len) {
    if (segment == dram_name()) {
      return Status(Code::kFailedPrecondition, "segment '" + segment +
                                                   "' is served through the transfer engine (segment " +
                                                   engine_->segment_name() + "), not through store.node RPCs");
    }
    if (!ssd_ || segment != ssd_name()) {
      return Status(Code::kNotFound, "node " + opt_.node_id + " has no segment '" + segment + "'");
    }
    const uint64_t cap = opt_.ssd_bytes;
    if (len > proto::kStoreMaxChunkBytes || offset > cap || len > cap - offset) {
      return Status(Code::kOutOfRange, "range [" + std::to_string(offset) + ", +" + std::to_string(len) +
                                           ") is outside segment '" + segment + "' of " + std::to_string(cap) +
                                           " bytes (or over the chunk limit)");
    }
    return Status::ok();
  }

  void register_handlers() {
    server_->handle<proto::StoreNodeWriteRequest>(
        [this](const proto::StoreNodeWriteRequest& req, const rpc::CallContext&) -> Result<proto::StoreAck> {
          MC_RETURN_IF_ERROR(check_ssd_range(req.segment, req.offset_bytes, req.data.size()));
          MC_RETURN_IF_ERROR(
              ssd_->write(req.offset_bytes, reinterpret_cast<const std::byte*>(req.data.data()), req.data.size()));
          ssd_writes_.inc();
          ssd_written_bytes_.inc(req.data.size());
          return proto::StoreAck{};
        });
    server_->handle<proto::StoreNodeReadRequest>(
        [this](const proto::StoreNodeReadRequest& req, const rpc::CallContext&) -> Result<proto::StoreNodeReadReply> {
          MC_RETURN_IF_ERROR(check_ssd_range(req.segment, req.offset_bytes, req.length_bytes));
          proto::StoreNodeReadReply reply;
          reply.data.resize(req.length_bytes);
          MC_RETURN_IF_ERROR(
              ssd_->read(req.offset_bytes, reinterpret_cast<std::byte*>(reply.data.data()), req.length_bytes));
          ssd_reads_.inc();
          ssd_read_bytes_.inc(req.length_bytes);
          return reply;
        });
  }

  NodeOptions opt_;
  std::unique_ptr<DramSegment> dram_;
  std::unique_ptr<SsdSegment> ssd_;
  std::unique_ptr<rpc::RpcServer> server_;
  std::unique_ptr<rpc::RpcClient> master_;
  std::shared_ptr<MasterSegmentDirectory> directory_;
  std::unique_ptr<transfer::TransferEngine> engine_;  // serves dram_; destroyed before it (declared after)
  uint64_t dram_xfer_offset_ = 0;
  std::vector<proto::StoreDemoteResult> done_;
  std::vector<proto::StoreNodeSegmentUsage> usage_;  // the master's view of our segments (last heartbeat)
  metrics::Registry registry_;                       // answered by `stat` (update_metrics first)
  metrics::Counter& ssd_reads_ = registry_.counter("mc_store_node_ssd_reads_total", "store.node.read RPCs served");
  metrics::Counter& ssd_writes_ = registry_.counter("mc_store_node_ssd_writes_total", "store.node.write RPCs served");
  metrics::Counter& ssd_read_bytes_ =
      registry_.counter("mc_store_node_ssd_read_bytes_total", "bytes read from the SSD segment by store.node.read");
  metrics::Counter& ssd_written_bytes_ =
      registry_.counter("mc_store_node_ssd_written_bytes_total", "bytes written by store.node.write");
  metrics::Counter& demotions_ =
      registry_.counter("mc_store_node_demotions_total", "DRAM -> SSD copies done for the master");
  metrics::Counter& demotion_failures_ =
      registry_.counter("mc_store_node_demotion_failures_total", "DRAM -> SSD copies that failed");
};

}  // namespace

Status run_node(const NodeOptions& options) {
  daemon::install_stop_signals();
  Node node(options);
  MC_RETURN_IF_ERROR(node.start());
  return node.serve();
}

}  // namespace mc::store
