#include "mc/common/input_file.hpp"

#include <cerrno>
#include <cstring>

namespace mc {

Result<std::ifstream> open_input_file(const std::string& path, std::string_view what, std::string_view remedy) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string msg =
        "cannot open " + std::string(what) + " '" + path + "': " + (err != 0 ? std::strerror(err) : "cannot be read");
    if (!remedy.empty()) msg += " (" + std::string(remedy) + ")";
    return Status(Code::kInvalidArgument, msg);
  }
  return in;
}

}  // namespace mc
