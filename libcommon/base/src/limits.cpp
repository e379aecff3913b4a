#include "mc/common/limits.hpp"

#include <sys/resource.h>

#include <algorithm>

namespace mc::limits {

size_t cap_to_fd_limit(size_t wanted) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::max<size_t>(1, wanted);
  const auto soft = static_cast<size_t>(rl.rlim_cur);
  const size_t room = soft > kReservedFds ? soft - kReservedFds : 1;
  return std::max<size_t>(1, std::min(wanted, room));
}

}  // namespace mc::limits
