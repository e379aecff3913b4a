#include "mc/common/fd.hpp"

#include <unistd.h>

namespace mc {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

}  // namespace mc
