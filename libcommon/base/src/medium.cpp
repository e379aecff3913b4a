#include "mc/common/medium.hpp"

#include <string>

namespace mc {

std::string_view medium_name(Medium medium) {
  switch (medium) {
    case Medium::kGpu:
      return "gpu";
    case Medium::kCpu:
      return "cpu";
    case Medium::kDisk:
      return "disk";
  }
  return "unknown";
}

Result<Medium> parse_medium(std::string_view name) {
  if (name == "gpu") return Medium::kGpu;
  if (name == "cpu" || name == "dram") return Medium::kCpu;
  if (name == "disk" || name == "ssd") return Medium::kDisk;
  return Status(Code::kInvalidArgument,
                "unknown medium '" + std::string(name) + "': expected gpu, cpu (dram) or disk (ssd)");
}

}  // namespace mc
