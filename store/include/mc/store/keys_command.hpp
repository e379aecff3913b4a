// `mc-store keys`: token ids on an input stream -> the prefix-chained block key (seq hash) of each
// complete block, one per line as 0x + 16 hex digits (DESIGN.md §4). For admins asking why a prefix
// did not hit: same tokens and namespace give the same keys in every process, on every host.
#pragma once

#include <istream>
#include <ostream>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"

namespace mc::store {

struct KeysOptions {
  KeyNamespace ns;          // block_size, seed, model_id, salt, ...
  bool store_keys = false;  // print the full store key ("kv/<ns>/<hash>") instead of the seq hash
};

// Reads whitespace-separated token ids (each an integer in [0, 2^32-1]) from `in` and writes one line
// per complete block to `out`. A token that is not such an integer fails with kInvalidArgument naming
// the token and its position; nothing is printed for a bad input.
Status run_keys(std::istream& in, std::ostream& out, const KeysOptions& options);

}  // namespace mc::store
