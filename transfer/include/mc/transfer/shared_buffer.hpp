// Memory that a same-host peer can map: the shm transport's requirement on served segments.
//
// A process that serves a segment (storage node, decode instance, mc-xfer serve) allocates the memory it
// registers with allocate_shared_buffer(). The buffer is an anonymous memfd mapped MAP_SHARED; peers on the
// same host open it through /proc/<pid>/fd/<fd> and mmap it, so a transfer is one memcpy. A memfd has no
// name in /dev/shm, so nothing is left behind when the process dies, even by SIGKILL.
// Memory registered that does not come from a SharedBuffer is still served over tcp (and rdma).
//
// Thread-safety: SharedBuffer is a move-only owner; find_shared_backing() may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mc/common/status.hpp"

namespace mc::transfer {

class SharedBuffer {
 public:
  SharedBuffer() = default;
  ~SharedBuffer();
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return size_bytes_; }
  int fd() const { return fd_; }
  // The path a same-host peer opens: "/proc/<pid>/fd/<fd>".
  std::string path() const;

 private:
  friend Result<SharedBuffer> allocate_shared_buffer(uint64_t size_bytes, const std::string& name);
  void reset();
  void* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  int fd_ = -1;
};

// Allocates size_bytes (> 0, rounded up to the page size internally; size() reports what was asked)
// of zero-filled, page-aligned shared memory. Pages are committed lazily by the kernel.
// Errors: kInvalidArgument for 0; kResourceExhausted/kIo with strerror of memfd_create/ftruncate/mmap.
Result<SharedBuffer> allocate_shared_buffer(uint64_t size_bytes, const std::string& name = "mc-xfer");

// Which shared buffer backs [addr, addr+length)? Returns its path and the offset of addr inside it,
// or nullopt when the range is not wholly inside one live SharedBuffer of this process.
struct ShmBacking {
  std::string path;
  uint64_t offset_bytes = 0;
};
std::optional<ShmBacking> find_shared_backing(const void* addr, uint64_t length);

}  // namespace mc::transfer
