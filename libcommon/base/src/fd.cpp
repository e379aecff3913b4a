#include "mc/common/fd.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mc {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status write_file_replacing(const std::string& path, std::string_view text, mode_t mode) {
  const std::string tmp = path + ".new";
  auto fail = [&](const std::string& what, int err) {
    (void)::unlink(tmp.c_str());
    return Status(Code::kIo, "cannot " + what + " " + path + ": " + std::strerror(err));
  };
  (void)::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return Status(Code::kIo, "cannot write " + tmp + ": " + std::strerror(errno));
  if (::fchmod(fd, mode) != 0) {
    const int err = errno;
    ::close(fd);
    return fail("set the mode of", err);
  }
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return fail("write", err);
    }
    at += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return fail("sync", err);
  }
  if (::close(fd) != 0) return fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename " + tmp + " to", errno);
  return Status::ok();
}

}  // namespace mc
