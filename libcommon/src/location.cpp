#include "mc/common/location.hpp"

#include <charconv>
#include <string>

namespace mc {

bool build_has_cuda() {
#if defined(MC_HAVE_CUDA) && MC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Status check_memory_location(std::string_view location) { return check_memory_location(location, build_has_cuda()); }

Status check_memory_location(std::string_view location, bool with_cuda) {
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
  if (kind == "cuda" && !with_cuda) {
    return Status(Code::kInvalidArgument, "memory location " + quoted +
                                              " is GPU memory, but this build of mc has no CUDA support: rebuild "
                                              "with CUDA (cmake -DMC_WITH_CUDA=on, with the CUDA toolkit installed) "
                                              "or use a host location (cpu:0)");
  }
  return Status::ok();
}

}  // namespace mc
