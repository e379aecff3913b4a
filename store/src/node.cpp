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
#include "mc/common/protocol.hpp"
#include "mc/common/rpc.hpp"

namespace mc::store {

namespace {

constexpr uint64_t kDirectAlign = 4096;

std::string errno_text(int e) { return std::string(std::strerror(e)); }

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// DRAM segment: a MAP_SHARED mapping of a /dev/shm file (or anonymous memory without shm).
class DramSegment {
 public:
  static Result<std::unique_ptr<DramSegment>> create(const std::string& path, uint64_t size) {
    auto s = std::unique_ptr<DramSegment>(new DramSegment());
    s->size_ = size;
    int fd = -1;
    if (!path.empty()) {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) return Status(Code::kIo, "cannot create shared-memory file " + path + ": " + errno_text(errno));
      s->path_ = path;
      if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        int e = errno;
        ::close(fd);
        return Status(Code::kResourceExhausted, "cannot size " + path + " to " + std::to_string(size) + " bytes: " +
                                                    errno_text(e) + " (is /dev/shm large enough?)");
      }
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, fd >= 0 ? MAP_SHARED : (MAP_PRIVATE | MAP_ANONYMOUS), fd, 0);
    int e = errno;
    if (fd >= 0) ::close(fd);
    if (p == MAP_FAILED) return Status(Code::kResourceExhausted, "cannot map " + std::to_string(size) + " bytes: " + errno_text(e));
    s->base_ = static_cast<std::byte*>(p);
    return s;
  }
  ~DramSegment() {
    if (base_) munmap(base_, size_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  std::byte* base() { return base_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  DramSegment() = default;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
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
      return Status(Code::kIo, "cannot size SSD file " + path + " to " + std::to_string(size) + " bytes: " + errno_text(errno));
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
    if (posix_memalign(&p, kDirectAlign, n) != 0) return Status(Code::kResourceExhausted, "cannot allocate SSD bounce buffer");
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
    if (opt_.host.empty()) {
      char buf[256] = {};
      opt_.host = gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "localhost";
    }
    if (opt_.node_id.empty()) opt_.node_id = opt_.host + "-" + std::to_string(getpid());
    for (char c : opt_.node_id) {
      if (c == '/' || c == ' ') return Status(Code::kInvalidArgument, "--node-id '" + opt_.node_id + "' may not contain '/' or spaces");
    }
    if (opt_.dram_bytes == 0) return Status(Code::kInvalidArgument, "--dram-bytes must be positive");
    std::string shm_path = opt_.shm ? "/dev/shm/mc-store-" + opt_.node_id + "-" + std::to_string(getpid()) : "";
    MC_ASSIGN_OR_RETURN(dram_, DramSegment::create(shm_path, opt_.dram_bytes));
    if (!opt_.ssd_dir.empty()) {
      if (opt_.ssd_bytes == 0) return Status(Code::kInvalidArgument, "--ssd-dir needs --ssd-bytes > 0");
      MC_ASSIGN_OR_RETURN(ssd_, SsdSegment::create(opt_.ssd_dir + "/mc-store-" + opt_.node_id + ".ssd", opt_.ssd_bytes));
      MC_LOG_INFO << "SSD segment in " << opt_.ssd_dir << (ssd_->direct() ? " (O_DIRECT)" : " (buffered: O_DIRECT refused)");
    }
    rpc::ServerOptions so;
    so.service = "mc-store node " + opt_.node_id;
    so.bind_endpoints = {opt_.listen};
    MC_ASSIGN_OR_RETURN(server_, rpc::RpcServer::bind(so));
    register_handlers();
    rpc::ClientOptions co;
    co.client_name = "mc-store node " + opt_.node_id;
    MC_ASSIGN_OR_RETURN(master_, rpc::RpcClient::connect(opt_.master, co));
    return mount();
  }

  Status mount() {
    proto::StoreMountRequest m;
    m.node_id = opt_.node_id;
    m.host = opt_.host;
    m.domain = opt_.domain;
    m.endpoint = server_->endpoints().at(0);
    m.segment = dram_name();
    m.medium = "cpu";
    m.capacity_bytes = dram_->size();
    m.shm_path = dram_->path();
    MC_RETURN_IF_ERROR(master_->call(m).status());
    if (ssd_) {
      m.segment = ssd_name();
      m.medium = "disk";
      m.capacity_bytes = opt_.ssd_bytes;
      m.shm_path.clear();
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
                           {{"node", opt_.node_id}, {"dram_bytes", std::to_string(dram_->size())},
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
    for (const auto& t : reply->tasks) done_.push_back({t.task_id, demote(t).is_ok()});
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

  Status check_range(const std::string& segment, uint64_t offset, uint64_t len, bool& is_ssd) {
    uint64_t cap = 0;
    if (segment == dram_name()) {
      cap = dram_->size();
      is_ssd = false;
    } else if (ssd_ && segment == ssd_name()) {
      cap = opt_.ssd_bytes;
      is_ssd = true;
    } else {
      return Status(Code::kNotFound, "node " + opt_.node_id + " has no segment '" + segment + "'");
    }
    if (len > proto::kStoreMaxChunkBytes || offset > cap || len > cap - offset) {
      return Status(Code::kOutOfRange, "range [" + std::to_string(offset) + ", +" + std::to_string(len) + ") is outside segment '" +
                                           segment + "' of " + std::to_string(cap) + " bytes (or over the chunk limit)");
    }
    return Status::ok();
  }

  void register_handlers() {
    server_->handle<proto::StoreNodeWriteRequest>(
        [this](const proto::StoreNodeWriteRequest& req, const rpc::CallContext&) -> Result<proto::StoreAck> {
          bool is_ssd = false;
          MC_RETURN_IF_ERROR(check_range(req.segment, req.offset_bytes, req.data.size(), is_ssd));
          const auto* src = reinterpret_cast<const std::byte*>(req.data.data());
          if (is_ssd) {
            MC_RETURN_IF_ERROR(ssd_->write(req.offset_bytes, src, req.data.size()));
          } else {
            std::memcpy(dram_->base() + req.offset_bytes, src, req.data.size());
          }
          return proto::StoreAck{};
        });
    server_->handle<proto::StoreNodeReadRequest>(
        [this](const proto::StoreNodeReadRequest& req, const rpc::CallContext&) -> Result<proto::StoreNodeReadReply> {
          bool is_ssd = false;
          MC_RETURN_IF_ERROR(check_range(req.segment, req.offset_bytes, req.length_bytes, is_ssd));
          proto::StoreNodeReadReply reply;
          reply.data.resize(req.length_bytes);
          auto* dst = reinterpret_cast<std::byte*>(reply.data.data());
          if (is_ssd) {
            MC_RETURN_IF_ERROR(ssd_->read(req.offset_bytes, dst, req.length_bytes));
          } else {
            std::memcpy(dst, dram_->base() + req.offset_bytes, req.length_bytes);
          }
          return reply;
        });
  }

  NodeOptions opt_;
  std::unique_ptr<DramSegment> dram_;
  std::unique_ptr<SsdSegment> ssd_;
  std::unique_ptr<rpc::RpcServer> server_;
  std::unique_ptr<rpc::RpcClient> master_;
  std::vector<proto::StoreDemoteResult> done_;
};

}  // namespace

Status run_node(const NodeOptions& options) {
  daemon::install_stop_signals();
  Node node(options);
  MC_RETURN_IF_ERROR(node.start());
  return node.serve();
}

}  // namespace mc::store
