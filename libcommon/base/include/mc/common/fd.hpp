// Fd: sole owner of a POSIX file descriptor (socket, epoll set, pipe); closes it on destruction.
// Move-only; -1 means "none". Not thread-safe (a plain value).
// write_file_replacing: a file's whole new content, e.g. a key, without a moment where it is partial or readable by
// others.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  // Gives up ownership without closing.
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  // Closes the descriptor held (if any) and takes `fd`.
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Writes `text` to `path` with `mode` (0600 for a secret): into a new file beside it (PATH.new, O_EXCL | O_NOFOLLOW,
// created with `mode`, so never readable by others, not even empty), synced, then renamed over `path` (a reader of
// the old file, or a link planted at `path`, never sees the new content). kIo naming the path and strerror.
Status write_file_replacing(const std::string& path, std::string_view text, mode_t mode);

}  // namespace mc
