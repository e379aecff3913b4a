// Opening a file the user named as input (a trace, a records file, a config, a decision log). A file
// that cannot be opened is the caller's mistake, like a bad flag: kInvalidArgument, so every tool exits
// 2 for it (cli::exit_code), with one message shape: "cannot open <what> '<path>': <strerror> (<remedy>)".
// Thread-safety: any thread.
#pragma once

#include <fstream>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

// The open stream (binary mode), or kInvalidArgument naming `what`, the path, errno's text and, when
// not empty, the remedy.
Result<std::ifstream> open_input_file(const std::string& path, std::string_view what, std::string_view remedy = {});

}  // namespace mc
