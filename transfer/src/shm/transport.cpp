#include "shm/transport.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "mc/common/report.hpp"
#include "mc/proto/transfer.hpp"

namespace mc::transfer::shm {
namespace {

// Fixed worker threads that run memcpy chunks; the submitting thread copies one chunk itself.
class CopyPool {
 public:
  explicit CopyPool(uint32_t threads) {
    for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~CopyPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t threads() const { return workers_.size(); }

  void copy(char* dst, const char* src, uint64_t n, uint64_t parallel_min_bytes) {
    if (workers_.empty() || n < parallel_min_bytes) {
      std::memcpy(dst, src, n);
      return;
    }
    const uint64_t parts = workers_.size() + 1;
    uint64_t chunk = (n + parts - 1) / parts;
    chunk = (chunk + 4095) / 4096 * 4096;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (uint64_t off = 0; off < n; off += chunk) ranges.emplace_back(off, std::min(chunk, n - off));
    // The completion state is shared with the tasks, so a worker finishing its last touch of it after the
    // caller has returned never touches freed memory.
    struct Done {
      std::mutex mu;
      std::condition_variable cv;
      size_t left;
    };
    auto done = std::make_shared<Done>();
    done->left = ranges.size() - 1;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (size_t i = 1; i < ranges.size(); ++i) {
        const uint64_t off = ranges[i].first, len = ranges[i].second;  // captured: no structured binding
        tasks_.push_back([dst, src, off, len, done] {
          std::memcpy(dst + off, src + off, len);
          std::lock_guard<std::mutex> dl(done->mu);
          if (--done->left == 0) done->cv.notify_all();
        });
      }
    }
    cv_.notify_all();
    std::memcpy(dst, src, ranges[0].second);
    std::unique_lock<std::mutex> dl(done->mu);
    done->cv.wait(dl, [&] { return done->left == 0; });
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !tasks_.empty(); });
        if (stop_ && tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; an older kernel answers EINVAL and the copy faults pages in itself
#endif

// A peer's shared-memory file mapped here. Its page tables are built ahead of the copies (a copy that faults in
// one 4 KiB page at a time ran at a few percent of memcpy): all at once when it is small, else one chunk at a
// time before the first copy that touches it. Populating a large mapping at open held this process's mmap lock
// for seconds on a loaded host (a decode instance's 2 GB KV buffer: every other thread that allocated stalled
// with it, heartbeats included) and committed memory the peer never uses.
struct Mapping {
  static constexpr uint64_t kPopulateAtOpenBytes = 64ull << 20;
  static constexpr uint64_t kChunkBytes = 16ull << 20;
  void* base = nullptr;
  uint64_t size = 0;
  std::unique_ptr<std::atomic<bool>[]> populated;  // per kChunkBytes chunk; null when populated at open
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
  // Builds the page tables of [offset, offset + length) not built yet. Thread-safe (two threads may populate
  // the same chunk once each: harmless).
  void populate(uint64_t offset, uint64_t length) {
    if (!populated || length == 0) return;
    for (uint64_t c = offset / kChunkBytes; c <= (offset + length - 1) / kChunkBytes; ++c) {
      if (populated[c].load(std::memory_order_acquire)) continue;
      const uint64_t start = c * kChunkBytes;
      (void)madvise(static_cast<char*>(base) + start, std::min(kChunkBytes, size - start), MADV_POPULATE_WRITE);
      populated[c].store(true, std::memory_order_release);
    }
  }
};

struct MappedRegion {
  uint64_t segment_offset;
  uint64_t length;
  char* ptr;
  Mapping* mapping;
  uint64_t mapping_offset;  // of ptr in mapping
};

class ShmSegment final : public TransportSegment {
 public:
  ShmSegment(SliceSink* sink, CopyPool* pool, uint64_t parallel_min_bytes)
      : sink_(sink), pool_(pool), parallel_min_bytes_(parallel_min_bytes) {
    specs_.push_back(PathSpec{"shm", "", "", 1.0});
  }
  const std::vector<PathSpec>& paths() const override { return specs_; }
  bool wants_slicing() const override { return false; }
  Status probe(int, int64_t) override { return Status::ok(); }

  void post(const SliceOp& op) override {
    auto it = std::upper_bound(regions_.begin(), regions_.end(), op.remote_offset,
                               [](uint64_t off, const MappedRegion& r) { return off < r.segment_offset; });
    if (it == regions_.begin()) {
      sink_->slice_done(op.cookie, Status(Code::kOutOfRange, "shm: offset " + std::to_string(op.remote_offset) +
                                                                 " is before the first region"));
      return;
    }
    --it;
    const uint64_t rel = op.remote_offset - it->segment_offset;
    if (rel > it->length || op.length > it->length - rel) {
      sink_->slice_done(op.cookie,
                        Status(Code::kOutOfRange, "shm: range [" + std::to_string(op.remote_offset) + ", +" +
                                                      std::to_string(op.length) + ") is not inside one region"));
      return;
    }
    char* remote = it->ptr + rel;
    it->mapping->populate(it->mapping_offset + rel, op.length);
    if (op.op == Op::kRead) {
      pool_->copy(op.local, remote, op.length, parallel_min_bytes_);
    } else {
      pool_->copy(remote, op.local, op.length, parallel_min_bytes_);
    }
    sink_->slice_done(op.cookie, Status::ok());
  }

  std::map<std::string, std::shared_ptr<Mapping>> mappings_;
  std::vector<MappedRegion> regions_;

 private:
  SliceSink* sink_;
  CopyPool* pool_;
  uint64_t parallel_min_bytes_;
  std::vector<PathSpec> specs_;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(const EngineOptions& options, std::string host_id)
      : options_(options), host_id_(std::move(host_id)), pool_(options.shm_threads) {}
  std::string_view name() const override { return "shm"; }
  int rank() const override { return 0; }

  Result<std::unique_ptr<TransportSegment>> open(const proto::SegmentDescriptor& desc, SliceSink* sink) override {
    if (desc.host_id != host_id_) {
      return Status(Code::kNoPath, "shm: segment " + desc.name + " is on another host (" + desc.host_id + ")");
    }
    if (desc.regions.empty()) return Status(Code::kNoPath, "shm: segment " + desc.name + " has no regions");
    auto seg = std::make_unique<ShmSegment>(sink, &pool_, options_.shm_parallel_min_bytes);
    for (const auto& r : desc.regions) {
      if (r.shm_path.empty()) {
        return Status(Code::kNoPath, "shm: region at offset " + std::to_string(r.segment_offset) + " of segment " +
                                         desc.name +
                                         " is not in shared memory (allocate it with allocate_shared_buffer)");
      }
      auto& m = seg->mappings_[r.shm_path];
      if (!m) {
        int fd = ::open(r.shm_path.c_str(), O_RDWR | O_CLOEXEC);
        if (fd < 0) {
          return Status(Code::kNoPath,
                        "shm: cannot open " + r.shm_path + " of segment " + desc.name + ": " + strerror(errno));
        }
        struct stat st {};
        fstat(fd, &st);
        auto mp = std::make_shared<Mapping>();
        mp->size = static_cast<uint64_t>(st.st_size);
        // Page tables built now when small, else chunk by chunk before the first copy (Mapping).
        const bool small = mp->size <= Mapping::kPopulateAtOpenBytes;
        void* p = mp->size == 0
                      ? MAP_FAILED
                      : mmap(nullptr, mp->size, PROT_READ | PROT_WRITE, MAP_SHARED | (small ? MAP_POPULATE : 0), fd, 0);
        if (p != MAP_FAILED && !small) {
          const uint64_t chunks = (mp->size + Mapping::kChunkBytes - 1) / Mapping::kChunkBytes;
          mp->populated = std::make_unique<std::atomic<bool>[]>(chunks);
          for (uint64_t c = 0; c < chunks; ++c) mp->populated[c].store(false, std::memory_order_relaxed);
        }
        int e = errno;
        ::close(fd);
        if (p == MAP_FAILED) {
          return Status(Code::kNoPath,
                        "shm: cannot map " + r.shm_path + " (" + std::to_string(mp->size) + " bytes): " + strerror(e));
        }
        mp->base = p;
        m = std::move(mp);
      }
      if (r.shm_offset_bytes > m->size || r.length_bytes > m->size - r.shm_offset_bytes) {
        return Status(Code::kNoPath, "shm: region at offset " + std::to_string(r.segment_offset) +
                                         " extends past the end of " + r.shm_path);
      }
      seg->regions_.push_back({r.segment_offset, r.length_bytes, static_cast<char*>(m->base) + r.shm_offset_bytes,
                               m.get(), r.shm_offset_bytes});
    }
    std::sort(seg->regions_.begin(), seg->regions_.end(),
              [](const MappedRegion& a, const MappedRegion& b) { return a.segment_offset < b.segment_offset; });
    return std::unique_ptr<TransportSegment>(std::move(seg));
  }

 private:
  const EngineOptions& options_;
  std::string host_id_;
  CopyPool pool_;
};

}  // namespace

std::string local_host_id() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  // The network namespace: two namespaces of one machine are two hosts (the cluster launcher of issue 20
  // makes each host a namespace), so their peers talk tcp over their links, never shm. "net:[4026531840]".
  std::error_code ec;
  const std::string net = std::filesystem::read_symlink("/proc/self/ns/net", ec).string();
  return boot + "/" + mc::report::host_name() + "/" + (ec ? std::string("net:?") : net);
}

std::unique_ptr<Transport> make_shm_transport(const EngineOptions& options, std::string local_host_id) {
  return std::make_unique<ShmTransport>(options, std::move(local_host_id));
}

}  // namespace mc::transfer::shm
