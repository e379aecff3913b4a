#include "mc/common/location.hpp"

#include <charconv>
#include <string>

namespace mc {

Status check_memory_location(std::string_view location) {
  const std::string quoted = "'" + std::string(location) + "'";
  const size_t colon = location.find(':');
  const std::string_view kind = location.substr(0, colon);
  const std::string_view index = colon == std::string_view::npos ? std::string_view() : location.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), value);
  const bool index_ok = !index.empty() && ec == std::errc() && end == index.data() + index.size();
  if ((kind != "cpu" && kind != "cuda") || !index_ok) {
    return Status(Code::kInvalidArgument,
                  "memory location " + quoted + " is not cpu:N (host memory of NUMA node N) or cuda:N (GPU N)");
  }
  if (kind == "cuda") {
    return Status(Code::kInvalidArgument,
                  "memory location " + quoted +
                      " is GPU memory, which mc cannot register yet: it has no GPU memory backend (a CUDA toolkit "
                      "on the build machine adds none), and serving host memory under a GPU name would mislead "
                      "path selection; use a host location (cpu:0)");
  }
  return Status::ok();
}

}  // namespace mc
