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

LineRead read_line_bounded(std::istream& in, std::string& line, size_t max_bytes) {
  line.clear();
  std::streambuf* buf = in.rdbuf();
  if (buf == nullptr || !in.good()) {
    in.setstate(std::ios::failbit);
    return LineRead::kEnd;
  }
  bool any = false;
  for (;;) {
    const int c = buf->sgetc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(any ? std::ios::eofbit : std::ios::eofbit | std::ios::failbit);
      return any ? LineRead::kLine : LineRead::kEnd;
    }
    any = true;
    if (c == '\n') {
      buf->sbumpc();
      return LineRead::kLine;
    }
    if (line.size() == max_bytes) return LineRead::kTooLong;  // the rest stays unread
    line.push_back(static_cast<char>(c));
    buf->sbumpc();
  }
}

}  // namespace mc
