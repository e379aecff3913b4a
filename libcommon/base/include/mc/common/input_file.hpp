// Opening a file the user named as input (a trace, a records file, a config, a decision log). A file
// that cannot be opened is the caller's mistake, like a bad flag: kInvalidArgument, so every tool exits
// 2 for it (cli::exit_code), with one message shape: "cannot open <what> '<path>': <strerror> (<remedy>)".
// Thread-safety: any thread.
#pragma once

#include <cstddef>
#include <fstream>
#include <istream>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

// The open stream (binary mode), or kInvalidArgument naming `what`, the path, errno's text and, when
// not empty, the remedy.
Result<std::ifstream> open_input_file(const std::string& path, std::string_view what, std::string_view remedy = {});

// The longest line a line-oriented input (trace, records, decision log) may have: 16 MiB. A Mooncake trace row
// of a 1 M-token prompt at 16 tokens per block (65,536 hash ids) is under 1 MiB; a file with no newline (say,
// /dev/zero) never makes a reader hold more than this.
inline constexpr size_t kMaxInputLineBytes = size_t{16} << 20;

enum class LineRead { kLine, kEnd, kTooLong };
// std::getline with a bound: reads up to '\n' (not kept) into `line`. kEnd at the end of the input with
// nothing read; kTooLong when the line has more than max_bytes bytes: `line` holds its first max_bytes and
// the rest of the line is left unread (a caller that goes on skips it: in.ignore(max, '\n')), so an input with
// no newline at all (/dev/zero) costs max_bytes of memory and the time to read them, never more.
LineRead read_line_bounded(std::istream& in, std::string& line, size_t max_bytes = kMaxInputLineBytes);

}  // namespace mc
