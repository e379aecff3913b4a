#include "mc/transfer/shared_buffer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace mc::transfer {
namespace {

struct LiveBuffer {
  uint64_t size_bytes;
  std::string path;
};

// Live shared buffers of this process, by start address (for register_memory's shm lookup).
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, LiveBuffer>& registry() {
  static std::map<uintptr_t, LiveBuffer> m;
  return m;
}

uint64_t page_round_up(uint64_t n) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

}  // namespace

SharedBuffer::~SharedBuffer() { reset(); }

SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept
    : data_(other.data_), size_bytes_(other.size_bytes_), fd_(other.fd_) {
  other.data_ = nullptr;
  other.size_bytes_ = 0;
  other.fd_ = -1;
}

SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_bytes_ = other.size_bytes_;
    fd_ = other.fd_;
    other.data_ = nullptr;
    other.size_bytes_ = 0;
    other.fd_ = -1;
  }
  return *this;
}

std::string SharedBuffer::path() const {
  if (fd_ < 0) return "";
  return "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd_);
}

void SharedBuffer::reset() {
  if (data_ != nullptr) {
    {
      std::lock_guard<std::mutex> lk(registry_mu());
      registry().erase(reinterpret_cast<uintptr_t>(data_));
    }
    munmap(data_, page_round_up(size_bytes_));
  }
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  size_bytes_ = 0;
  fd_ = -1;
}

Result<SharedBuffer> allocate_shared_buffer(uint64_t size_bytes, const std::string& name) {
  if (size_bytes == 0) return Status(Code::kInvalidArgument, "allocate_shared_buffer: size 0");
  const uint64_t mapped = page_round_up(size_bytes);
  if (mapped < size_bytes) {
    return Status(Code::kInvalidArgument, "allocate_shared_buffer: size " + std::to_string(size_bytes) + " overflows");
  }
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    return Status(Code::kIo, std::string("allocate_shared_buffer: memfd_create(") + name + "): " + strerror(errno));
  }
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    int e = errno;
    close(fd);
    return Status(Code::kResourceExhausted, "allocate_shared_buffer: ftruncate(" + std::to_string(mapped) +
                                                " bytes): " + strerror(e) + "; is /dev/shm or memory too small?");
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return Status(Code::kResourceExhausted,
                  "allocate_shared_buffer: mmap(" + std::to_string(mapped) + " bytes): " + strerror(e));
  }
  SharedBuffer b;
  b.data_ = p;
  b.size_bytes_ = size_bytes;
  b.fd_ = fd;
  {
    std::lock_guard<std::mutex> lk(registry_mu());
    registry()[reinterpret_cast<uintptr_t>(p)] = LiveBuffer{size_bytes, b.path()};
  }
  return b;
}

std::optional<ShmBacking> find_shared_backing(const void* addr, uint64_t length) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lk(registry_mu());
  auto& m = registry();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return std::nullopt;
  --it;
  const uint64_t off = a - it->first;
  if (off > it->second.size_bytes || length > it->second.size_bytes - off) return std::nullopt;
  return ShmBacking{it->second.path, off};
}

}  // namespace mc::transfer
