#include "mc/store/node.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/limits.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/report.hpp"
#include "mc/common/units.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/grant.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/store.hpp"
#include "mc/store/checksum.hpp"
#include "mc/store/directory.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/shared_buffer.hpp"

namespace mc::store {

namespace {

constexpr uint64_t kDirectAlign = 4096;

std::string errno_text(int e) { return std::string(std::strerror(e)); }

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
  const std::string& path() const { return path_; }
  // False once the file is no longer reachable under its path (the directory was removed or replaced).
  bool still_there() const {
    struct stat by_path {
    }, by_fd{};
    if (::stat(path_.c_str(), &by_path) != 0 || fstat(fd_, &by_fd) != 0) return false;
    return by_path.st_ino == by_fd.st_ino && by_path.st_dev == by_fd.st_dev;
  }

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
        // A full file system is kNoSpace (the master then stops demoting here), any other failure kIo.
        return Status(n < 0 && errno == ENOSPC ? Code::kNoSpace : Code::kIo,
                      std::string(write ? "pwrite" : "pread") + " of " + path_ + " at " +
                          std::to_string(offset + done) + ": " + (n == 0 ? "end of file" : errno_text(errno)));
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
      MC_RETURN_IF_ERROR(check_ssd_space());
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
    MC_ASSIGN_OR_RETURN(master_, connect_master(co));
    // The DRAM segment is served by the transfer engine; the master is its segment directory.
    transfer::EngineOptions eo;
    eo.listen = opt_.xfer_listen;
    eo.max_connections_served = opt_.xfer_max_connections;
    eo.idle_timeout_served_ms = opt_.xfer_idle_timeout_ms;
    // With the cluster's grant key, every read and write of this DRAM must carry the master's grant for it.
    if (const auth::Keyring* ring = auth::keyring(); ring != nullptr) eo.grant_key = ring->grant_key();
    if (eo.listen.empty()) return Status(Code::kInvalidArgument, "--xfer-listen needs at least one endpoint");
    MC_ASSIGN_OR_RETURN(directory_,
                        connect_segment_directory(locator_, MasterAddress{opt_.master, opt_.etcd, opt_.cluster_id},
                                                  co.client_name + " directory", 2000));
    eo.directory = directory_;
    MC_ASSIGN_OR_RETURN(engine_, transfer::TransferEngine::create(eo));
    MC_ASSIGN_OR_RETURN(transfer::RegisteredRegion region, engine_->register_memory(dram_->base(), dram_->size()));
    dram_xfer_offset_ = region.segment_offset;
    MC_LOG_INFO << "DRAM segment " << dram_name() << " (" << dram_->size() << " bytes) served as transfer segment "
                << engine_->segment_name() << (region.shm_shareable ? " (shm + tcp)" : " (tcp only: --no-shm)");
    // /metrics renders on the exporter's threads: the gauges of update_metrics() (which reads state of this
    // thread) are refreshed here, at start and after every heartbeat, not by the exporter.
    update_metrics();
    MC_ASSIGN_OR_RETURN(exporter_, metrics::start_daemon_exporter(opt_.metrics_listen, "mc-store node " + opt_.node_id,
                                                                  &registry_, &ready_extra_));
    return mount();
  }

  // --ssd-bytes must fit the free space of --ssd-dir: the SSD file is sparse, so a tier larger than the file
  // system would only fail later, demotion by demotion (refused here; DESIGN.md §8 disks).
  // The master at start: asked every 2 s (each try's connect bounded by the rest of the wait) until
  // master_wait_ms has passed; then kUnavailable naming it and the last reason.
  Result<std::unique_ptr<MasterLink>> connect_master(rpc::ClientOptions co) {
    MasterAddress address{opt_.master, opt_.etcd, opt_.cluster_id};
    MC_ASSIGN_OR_RETURN(locator_, MasterLocator::create(address));
    const int64_t deadline = steady_ms() + std::max<int64_t>(0, opt_.master_wait_ms);
    Status last;
    for (int attempt = 0;; ++attempt) {
      const int64_t left = deadline - steady_ms();
      co.connect_timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 100, 2000));
      Result<std::unique_ptr<MasterLink>> c = MasterLink::connect(locator_, co);
      if (c.is_ok() || c.status().code() == Code::kInvalidArgument || c.status().code() == Code::kProtocolMismatch) {
        return c;
      }
      last = c.status();
      if (attempt == 0)
        MC_LOG_WARN << "store master " << locator_->describe() << " does not answer yet (" << last.message()
                    << "); trying for " << opt_.master_wait_ms << " ms";
      if (steady_ms() >= deadline) break;
    }
    return Status(Code::kUnavailable, "store master " + locator_->describe() + " did not answer within " +
                                          std::to_string(opt_.master_wait_ms) + " ms: " + last.message() +
                                          " (is mc-store master running there? --master-wait-ms waits longer)");
  }

  Status check_ssd_space() const {
    struct statvfs fs {};
    if (statvfs(opt_.ssd_dir.c_str(), &fs) != 0) {
      return Status(Code::kInvalidArgument, "--ssd-dir " + opt_.ssd_dir + ": " + errno_text(errno));
    }
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_frsize);
    if (opt_.ssd_bytes > free_bytes) {
      return Status(Code::kInvalidArgument, "--ssd-bytes " + std::to_string(opt_.ssd_bytes) +
                                                " exceeds the free space of --ssd-dir " + opt_.ssd_dir + " (" +
                                                std::to_string(free_bytes) +
                                                " bytes free): lower --ssd-bytes or free space there");
    }
    return Status::ok();
  }

  // restore: the master restarted; mount the segments as restoring and re-report their objects.
  Status mount(bool restore = false) {
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
    m.restore = restore;
    MC_RETURN_IF_ERROR(master_->call(m).status());
    if (ssd_) {
      m.segment = ssd_name();
      m.medium = "disk";
      m.capacity_bytes = opt_.ssd_bytes;
      m.xfer_segment.clear();
      m.xfer_base_offset_bytes = 0;
      MC_RETURN_IF_ERROR(master_->call(m).status());
    }
    // The master's incarnation: told "unknown node" later, the node compares it to learn whether the
    // master restarted (re-report) or declared it dead (start empty).
    auto info = master_->call(proto::StoreInfoRequest{opt_.node_id});
    if (info.is_ok()) master_epoch_ = info->epoch;
    if (restore) return report_all();
    return Status::ok();
  }

  // Re-reports every segment's objects in pages (store.node_report); forgets the ones the master refuses.
  Status report_all() {
    std::vector<std::string> names = {dram_name()};
    if (ssd_) names.push_back(ssd_name());
    uint64_t accepted = 0, refused = 0;
    for (const std::string& name : names) {
      auto& table = tables_[name];
      std::vector<proto::StoreNodeObject> all;
      all.reserve(table.size());
      for (const auto& [offset, o] : table) all.push_back(o);
      for (size_t at = 0; at < all.size() || at == 0; at += proto::kStoreMaxBatch) {
        proto::StoreNodeReportRequest req;
        req.node_id = opt_.node_id;
        req.segment = name;
        const size_t end = std::min<size_t>(all.size(), at + proto::kStoreMaxBatch);
        req.objects.assign(all.begin() + static_cast<std::ptrdiff_t>(std::min(at, all.size())),
                           all.begin() + static_cast<std::ptrdiff_t>(end));
        req.first = at == 0;
        req.last = end >= all.size();
        auto reply = master_->call(req);
        if (!reply.is_ok()) return reply.status().with_context("re-reporting " + name + " to " + master_->endpoint());
        accepted += reply->accepted;
        refused += reply->refused_offsets.size();
        for (uint64_t off : reply->refused_offsets) table.erase(off);
        if (req.last) break;
      }
    }
    MC_LOG_INFO << "node " << opt_.node_id << " re-reported its objects: " << accepted << " kept, " << refused
                << " refused";
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
    std::vector<std::pair<std::string, std::string>> extra = {{"node", opt_.node_id},
                                                              {"xfer_segment", engine_->segment_name()},
                                                              {"dram_bytes", std::to_string(dram_->size())},
                                                              {"ssd_bytes", std::to_string(ssd_ ? opt_.ssd_bytes : 0)}};
    extra.insert(extra.end(), ready_extra_.begin(), ready_extra_.end());
    daemon::announce_ready("mc-store-node", server_->endpoints().at(0), extra);
    int64_t next_hb = steady_ms() + opt_.heartbeat_ms;
    uint64_t leader_generation = locator_->generation();
    while (!daemon::stop_requested()) {
      MC_RETURN_IF_ERROR(server_->poll_once(20));
      // A new leader (etcd) offers this node's segments for new puts only once the node heartbeats to it: at once.
      if (locator_->generation() != leader_generation) {
        leader_generation = locator_->generation();
        next_hb = steady_ms();
      }
      if (steady_ms() >= next_hb) {
        const bool more = heartbeat();
        update_metrics();
        next_hb = steady_ms() + (more ? 0 : opt_.heartbeat_ms);
      }
    }
    drain();
    unmount();
    return Status::ok();
  }

  // The graceful drain (store.node_drain; master_core.hpp "Drain"): the master marks this node's segments
  // draining and hands out copy tasks for the objects only here; the node copies each to its target through
  // its transfer engine and reports it, heartbeating and serving SSD reads meanwhile, until the master has
  // nothing more, --drain-timeout-s has passed, or a second stop signal came. Then the caller unmounts.
  void drain() {
    if (opt_.drain_timeout_s <= 0) {
      MC_LOG_INFO << "node " << opt_.node_id << " stopping without a drain (--drain-timeout-s 0): unmounting";
      return;
    }
    const int64_t start = steady_ms();
    const int64_t deadline = start + opt_.drain_timeout_s * 1000;
    MC_LOG_INFO << "node " << opt_.node_id << " draining: the master moves its objects to other nodes (at most "
                << opt_.drain_timeout_s << " s; a second SIGTERM unmounts at once)";
    std::vector<proto::StoreDrainResult> done;
    int64_t next_hb = steady_ms() + opt_.heartbeat_ms;
    uint64_t moved = 0, failed = 0, master_moved = 0, master_dropped = 0;
    std::string gave_up;
    int call_ms = 1000;          // a drain call's timeout: 1 s, doubled up to 5 s while the master does not answer
    bool master_silent = false;  // the last drain call timed out
    while (true) {
      if (daemon::stop_now_requested()) {
        gave_up = "a second stop signal";
        break;
      }
      if (steady_ms() >= deadline) {
        gave_up = "--drain-timeout-s " + std::to_string(opt_.drain_timeout_s) + " passed";
        break;
      }
      (void)server_->poll_once(0);  // SSD reads of readers that still use our replicas
      if (steady_ms() >= next_hb) {
        // The master must not declare the node dead while it drains; a node the master forgot stops draining.
        if (!heartbeat(false)) {
          gave_up = "the master does not know this node (declared dead)";
          break;
        }
        next_hb = steady_ms() + opt_.heartbeat_ms;
      }
      proto::StoreNodeDrainRequest req{opt_.node_id, done, false};
      const int64_t left_ms = deadline - steady_ms();
      // 1 s for the first call, so that a second stop signal is seen within about a second when the master is gone
      // (the whole cluster stopping); doubled on each timeout up to 5 s, so that a slow master (a page of results
      // committed to etcd) is still waited for. Retried until --drain-timeout-s or a second stop signal.
      auto reply = master_->call(req, static_cast<int>(std::clamp<int64_t>(left_ms, 100, call_ms)));
      if (!reply.is_ok()) {
        if (reply.status().code() == Code::kNotFound) {
          gave_up = "the master does not know this node (" + reply.status().message() + ")";
          done.clear();
          break;
        }
        master_silent = reply.status().code() == Code::kTimeout;
        if (master_silent) call_ms = std::min(5000, call_ms * 2);
        MC_LOG_WARN << "drain call to " << master_->endpoint() << " failed: " << reply.status().to_string()
                    << " (asking again)";
        (void)server_->poll_once(100);
        continue;
      }
      call_ms = 1000;
      master_silent = false;
      done.clear();
      master_moved = reply->moved_objects;
      master_dropped = reply->dropped_objects;
      if (reply->tasks.empty() && !reply->more) {
        MC_LOG_INFO << "node " << opt_.node_id << " drained in " << steady_ms() - start << " ms: " << master_moved
                    << " objects moved, " << master_dropped << " dropped (no room on any other node, or corrupt)";
        drain_moved_.inc(static_cast<double>(moved));
        drain_dropped_.inc(static_cast<double>(master_dropped));
        return;
      }
      for (const proto::StoreDrainTask& t : reply->tasks) {
        if (daemon::stop_now_requested() || steady_ms() >= deadline) break;  // unreported tasks are abandoned
        Status s = drain_copy(t);
        if (s.is_ok()) {
          ++moved;
        } else {
          ++failed;
          MC_LOG_WARN << "drain copy of '" << t.key << "' failed: " << s.to_string();
        }
        std::string message = s.is_ok() ? "" : s.message().substr(0, proto::kStoreMaxDrainMessageBytes);
        done.push_back({t.key, t.put_id, s.is_ok(), static_cast<uint16_t>(s.code()), std::move(message)});
        if (steady_ms() >= next_hb) {
          if (!heartbeat(false)) break;
          next_hb = steady_ms() + opt_.heartbeat_ms;
        }
      }
      if (reply->tasks.empty()) (void)server_->poll_once(50);  // copies in flight elsewhere: ask again shortly
    }
    // Gave up: report what was copied (those objects survive), and learn what is lost with the unmount.
    uint64_t remaining = 0;
    // (Not to a master that did not answer the last call: stopping is not delayed by another timeout.)
    if (!master_silent && gave_up.rfind("the master does not know", 0) != 0) {
      proto::StoreNodeDrainRequest req{opt_.node_id, done, true};
      auto reply = master_->call(req, 1000);
      if (reply.is_ok()) {
        remaining = reply->remaining_objects;
        master_moved = reply->moved_objects;
        master_dropped = reply->dropped_objects;
      }
    }
    drain_moved_.inc(static_cast<double>(moved));
    drain_dropped_.inc(static_cast<double>(master_dropped + remaining));
    MC_LOG_WARN << "node " << opt_.node_id << " stops draining after " << steady_ms() - start << " ms (" << gave_up
                << "): " << master_moved << " objects moved, " << master_dropped << " dropped, " << remaining
                << " not moved (lost with the unmount), " << failed << " copies failed";
  }

  // One drain task: the source bytes (DRAM: this node's memory; SSD: its file, staged), checked against the
  // object's checksum, written to the target replica through the transfer engine with the master's grant.
  Status drain_copy(const proto::StoreDrainTask& t) {
    const std::string what = "drain copy of '" + t.key + "'";
    if (t.size_bytes == 0 || t.target.size_bytes != t.size_bytes || t.target.xfer_segment.empty()) {
      return Status(Code::kInvalidArgument,
                    what + ": bad task (size " + std::to_string(t.size_bytes) + ", target " + t.target.segment + ")");
    }
    std::vector<std::byte> staged;
    const std::byte* src = nullptr;
    if (t.src_segment == dram_name()) {
      if (t.src_offset_bytes > dram_->size() || t.size_bytes > dram_->size() - t.src_offset_bytes) {
        return Status(Code::kInvalidArgument, what + ": source range is outside " + dram_name());
      }
      src = dram_->base() + t.src_offset_bytes;
    } else if (ssd_ && t.src_segment == ssd_name()) {
      if (t.src_offset_bytes > opt_.ssd_bytes || t.size_bytes > opt_.ssd_bytes - t.src_offset_bytes) {
        return Status(Code::kInvalidArgument, what + ": source range is outside " + ssd_name());
      }
      staged.resize(t.size_bytes);
      MC_RETURN_IF_ERROR(ssd_->read(t.src_offset_bytes, staged.data(), t.size_bytes).with_context(what));
      src = staged.data();
    } else {
      return Status(Code::kNotFound, what + ": node " + opt_.node_id + " has no segment '" + t.src_segment + "'");
    }
    if (object_checksum({src, t.size_bytes}) != t.checksum) {
      return Status(Code::kDataLoss, what + ": the bytes on " + t.src_segment + " fail the object's checksum");
    }
    auto seg = engine_->open_segment(t.target.xfer_segment);
    if (!seg.is_ok()) return seg.status().with_context(what + " to node " + t.target.node_id);
    // The engine sends from registered memory: the DRAM is; an SSD object's staging buffer is for this copy.
    const bool stage = !staged.empty();
    if (stage) {
      auto reg = engine_->register_memory(staged.data(), staged.size());
      if (!reg.is_ok()) return reg.status().with_context(what + ": staging buffer");
    }
    transfer::TransferRequest req{
        transfer::Op::kWrite, const_cast<std::byte*>(src), seg.value(), t.target.xfer_offset_bytes, t.size_bytes, "",
        t.target.grant};
    transfer::RequestStatus st = engine_->transfer_sync(req, 10000);
    if (stage) (void)engine_->unregister_memory(staged.data());
    if (st.state != transfer::TransferState::kCompleted) {
      Status s = st.status.is_ok() ? Status(Code::kUnavailable, transfer::state_name(st.state)) : st.status;
      return s.with_context(what + " to " + t.target.segment + " on node " + t.target.node_id);
    }
    return Status::ok();
  }

 private:
  std::string dram_name() const { return opt_.node_id + "/dram"; }
  std::string ssd_name() const { return opt_.node_id + "/ssd"; }

  // Returns true when the master has more for the node at once (queued table changes, demotion results).
  // Not rejoin (draining): returns false only when the master does not know the node (then it does not mount
  // again), true otherwise.
  bool heartbeat(bool rejoin_if_unknown = true) {
    check_ssd();
    proto::StoreNodeHeartbeatRequest hb{opt_.node_id, done_};
    auto reply = master_->call(hb, std::max(500, opt_.heartbeat_ms));
    if (!reply.is_ok()) {
      if (reply.status().code() == Code::kNotFound) {
        if (!rejoin_if_unknown) return false;
        rejoin();
      } else {
        MC_LOG_WARN << "heartbeat to " << master_->endpoint() << " failed: " << reply.status().to_string();
      }
      return !rejoin_if_unknown;
    }
    done_.clear();
    for (const proto::StoreNodeObjectChange& c : reply->changes) {
      auto& table = tables_[c.segment];
      if (c.present) {
        table[c.offset_bytes] = proto::StoreNodeObject{c.key, c.offset_bytes, c.size_bytes, c.checksum};
      } else {
        table.erase(c.offset_bytes);
      }
    }
    if (reply->report) {
      Status s = report_all();
      if (!s.is_ok()) MC_LOG_WARN << "re-report failed (asked again next heartbeat): " << s.to_string();
    }
    for (const auto& t : reply->tasks) {
      Status s = demote(t);
      (s.is_ok() ? demotions_ : demotion_failures_).inc();
      done_.push_back({t.task_id, s.is_ok(), static_cast<uint16_t>(s.code()), s.is_ok() ? "" : s.message()});
    }
    usage_ = reply->segments;
    return !rejoin_if_unknown || reply->more || !done_.empty();
  }

  // The master does not know this node: it restarted (another epoch: mount restoring and re-report the
  // objects) or declared the node dead after its grace period (mount empty).
  void rejoin() {
    done_.clear();
    auto info = master_->call(proto::StoreInfoRequest{opt_.node_id});
    const bool restarted = info.is_ok() && master_epoch_ != 0 && info->epoch != master_epoch_;
    size_t held = 0;
    for (const auto& [name, table] : tables_) held += table.size();
    if (restarted && held > 0) {
      MC_LOG_WARN << "master " << master_->endpoint() << " restarted: mounting again and re-reporting " << held
                  << " objects";
    } else if (restarted) {
      MC_LOG_WARN << "master " << master_->endpoint()
                  << " restarted and this node's table holds no object (none committed here, or none reported by a "
                     "heartbeat reply yet): mounting again, empty";
    } else {
      MC_LOG_WARN << "master forgot node " << opt_.node_id << " (declared dead): mounting again, empty";
      tables_.clear();
    }
    Status s = mount(restarted && held > 0);
    if (!s.is_ok()) MC_LOG_WARN << "re-mount failed: " << s.to_string();
  }

  // A vanished SSD directory (or file) is detected here: the tier is unmounted at the master (its objects
  // leave the metadata) and the node goes on with DRAM only.
  void check_ssd() {
    if (!ssd_ || ssd_->still_there()) return;
    MC_LOG_ERROR << "SSD file " << ssd_->path() << " is gone (was --ssd-dir " << opt_.ssd_dir
                 << " removed?): unmounting the SSD tier; its " << tables_[ssd_name()].size()
                 << " objects leave the pool";
    proto::StoreUnmountRequest u{opt_.node_id, ssd_name()};
    Status s = master_->call(u, 1000).status();
    if (!s.is_ok()) MC_LOG_WARN << "unmount of " << ssd_name() << " failed: " << s.to_string();
    tables_.erase(ssd_name());
    ssd_.reset();
    ssd_lost_ = true;
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
      registry_.counter(prefix + "_hits_total", "reads whose nearest replica was on this " + medium + " segment")
          .set(u.hits);
    }
    size_t known = 0;
    for (const auto& [name, table] : tables_) known += table.size();
    gauge("mc_store_node_objects_known",
          "objects in the node's table (re-reported after a suspect spell or a "
          "master restart)",
          known);
    gauge("mc_store_node_ssd_read_only", "1 once a demotion hit ENOSPC or EIO", ssd_read_only_ ? 1 : 0);
    gauge("mc_store_node_ssd_lost", "1 once the SSD file vanished (tier unmounted)", ssd_lost_ ? 1 : 0);
    transfer::export_served_metrics(engine_->stats(), registry_);
  }

  Status demote(const proto::StoreDemoteTask& t) {
    if (!ssd_ || t.src_segment != dram_name() || t.dst_segment != ssd_name() ||
        t.src_offset_bytes + t.size_bytes > dram_->size() || t.dst_offset_bytes + t.size_bytes > opt_.ssd_bytes) {
      MC_LOG_WARN << "demotion task " << t.task_id << " of '" << t.key << "' does not fit this node's segments";
      return Status(Code::kInvalidArgument, "bad demotion task");
    }
    const std::byte* src = dram_->base() + t.src_offset_bytes;
    if (object_checksum({src, t.size_bytes}) != t.checksum) {
      MC_LOG_WARN << "demotion of '" << t.key << "': its DRAM bytes fail the checksum; not copied";
      return Status(Code::kDataLoss, "DRAM replica of '" + t.key + "' fails its checksum");
    }
    Status s = ssd_->write(t.dst_offset_bytes, src, t.size_bytes);
    if (!s.is_ok()) {
      MC_LOG_WARN << "demotion of '" << t.key << "' failed: " << s.to_string()
                  << (ssd_read_only_ ? "" : " (the master makes the SSD tier read-only)");
      ssd_read_only_ = ssd_read_only_ || s.code() == Code::kNoSpace || s.code() == Code::kIo;
    }
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

  // With the cluster's grant key, an SSD read or write must carry the master's grant for exactly those bytes (as the
  // DRAM's transfer segment does): kPermissionDenied naming the reason otherwise, counted and logged with the caller.
  Status check_ssd_grant(const std::string& grant, const std::string& segment, uint8_t op, uint64_t offset,
                         uint64_t len, const rpc::CallContext& ctx) {
    const auth::Keyring* ring = auth::keyring();
    if (ring == nullptr || ring->grant_key().empty()) return Status::ok();
    Result<auth::Grant> g = auth::verify_grant(ring->grant_key(), grant);
    Status st = g.is_ok() ? auth::check_grant(g.value(), segment, op, offset, len, auth::unix_now_ms()) : g.status();
    if (st.is_ok()) return st;
    ssd_refused_.inc();
    std::lock_guard<std::mutex> lk(refusal_log_mu_);
    if (refusal_log_.allow(RealClock::instance().now_ms())) {
      const uint64_t more = refusal_log_.take_suppressed();
      MC_LOG_WARN << "node " << opt_.node_id << ": refused " << ctx.type << " [" << offset << ", +" << len << ") of "
                  << segment << " from " << (ctx.caller != nullptr ? ctx.caller->describe() : std::string("?")) << ": "
                  << st.message()
                  << (more > 0 ? " (" + std::to_string(more) + " more refused before it not logged)" : std::string());
    }
    return st;
  }

  void register_handlers() {
    server_->handle<proto::StoreNodeWriteRequest>(
        [this](const proto::StoreNodeWriteRequest& req, const rpc::CallContext& ctx) -> Result<proto::StoreAck> {
          MC_RETURN_IF_ERROR(check_ssd_range(req.segment, req.offset_bytes, req.data.size()));
          MC_RETURN_IF_ERROR(
              check_ssd_grant(req.grant, req.segment, auth::kGrantWrite, req.offset_bytes, req.data.size(), ctx));
          MC_RETURN_IF_ERROR(
              ssd_->write(req.offset_bytes, reinterpret_cast<const std::byte*>(req.data.data()), req.data.size()));
          ssd_writes_.inc();
          ssd_written_bytes_.inc(req.data.size());
          return proto::StoreAck{};
        });
    server_->handle<proto::StoreNodeReadRequest>(
        [this](const proto::StoreNodeReadRequest& req,
               const rpc::CallContext& ctx) -> Result<proto::StoreNodeReadReply> {
          MC_RETURN_IF_ERROR(check_ssd_range(req.segment, req.offset_bytes, req.length_bytes));
          MC_RETURN_IF_ERROR(
              check_ssd_grant(req.grant, req.segment, auth::kGrantRead, req.offset_bytes, req.length_bytes, ctx));
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
  std::shared_ptr<MasterLocator> locator_;
  std::unique_ptr<MasterLink> master_;
  std::shared_ptr<transfer::SegmentDirectory> directory_;
  std::unique_ptr<transfer::TransferEngine> engine_;  // serves dram_; destroyed before it (declared after)
  uint64_t dram_xfer_offset_ = 0;
  std::vector<proto::StoreDemoteResult> done_;
  std::vector<proto::StoreNodeSegmentUsage> usage_;  // the master's view of our segments (last heartbeat)
  // The node's objects per segment, offset -> (key, size, checksum): the master's changes, applied in order.
  std::map<std::string, std::map<uint64_t, proto::StoreNodeObject>> tables_;
  uint64_t master_epoch_ = 0;  // store.info epoch of the master mounted at
  bool ssd_read_only_ = false;
  bool ssd_lost_ = false;
  metrics::Registry registry_;  // answered by `stat` (update_metrics first)
  metrics::Counter& ssd_reads_ = registry_.counter("mc_store_node_ssd_reads_total", "store.node.read RPCs served");
  metrics::Counter& ssd_refused_ =
      registry_.counter("mc_store_node_ssd_refused_total", "store.node.read/write refused for want of a valid grant");
  std::mutex refusal_log_mu_;
  limits::BurstBudget refusal_log_{20, 60000};  // 20 lines a minute, then a count
  metrics::Counter& ssd_writes_ = registry_.counter("mc_store_node_ssd_writes_total", "store.node.write RPCs served");
  metrics::Counter& ssd_read_bytes_ =
      registry_.counter("mc_store_node_ssd_read_bytes_total", "bytes read from the SSD segment by store.node.read");
  metrics::Counter& ssd_written_bytes_ =
      registry_.counter("mc_store_node_ssd_written_bytes_total", "bytes written by store.node.write");
  metrics::Counter& demotions_ =
      registry_.counter("mc_store_node_demotions_total", "DRAM -> SSD copies done for the master");
  metrics::Counter& demotion_failures_ =
      registry_.counter("mc_store_node_demotion_failures_total", "DRAM -> SSD copies that failed");
  metrics::Counter& drain_moved_ =
      registry_.counter("mc_store_node_drain_moved_total", "objects this node copied to other nodes while draining");
  metrics::Counter& drain_dropped_ = registry_.counter(
      "mc_store_node_drain_dropped_total", "objects of this node its drain could not move (no room, corrupt, timeout)");
  std::vector<std::pair<std::string, std::string>> ready_extra_;  // metrics=... for the ready line
  std::unique_ptr<metrics::HttpExporter> exporter_;               // /metrics; destroyed before registry_
};

}  // namespace

Status run_node(const NodeOptions& options) {
  daemon::install_stop_signals();
  Node node(options);
  MC_RETURN_IF_ERROR(node.start());
  return node.serve();
}

}  // namespace mc::store
