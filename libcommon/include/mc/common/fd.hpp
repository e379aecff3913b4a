// Fd: sole owner of a POSIX file descriptor (socket, epoll set, pipe); closes it on destruction.
// Move-only; -1 means "none". Not thread-safe (a plain value).
#pragma once

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

}  // namespace mc
