// Bounds on the shape of an untrusted JSON text, checked by one linear scan before it is parsed.
//
// nlohmann::json parses iteratively, but copying and dump() recurse (a request body of 100,000 nested '[' crashed
// mc-gateway with a stack overflow), and a parsed value costs far more memory than its text (an 8 MiB body of "{},"
// held about 500 MB). So whatever reaches json::parse from a peer or a user's file is first checked here: its
// nesting depth, its containers (arrays and objects) and its values, counted as 1 + commas + containers, which is
// at least the number of values in the text (every value but the first of each container follows a comma).
// Strings and their escapes are skipped; the text need not be valid JSON (the parser judges that afterwards).
// Thread-safety: pure function. Errors: kInvalidArgument for depth, kResourceExhausted for a count, each naming
// `what` (the message starts with "what: " unless it is empty), the limit and the remedy.
#pragma once

#include <cstddef>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc {

struct JsonShapeLimits {
  size_t max_depth = 64;            // nesting of arrays and objects
  size_t max_containers = 1 << 16;  // arrays and objects in all
  size_t max_values = 1 << 21;      // values in all (upper bound: 1 + commas + containers)
};

Status check_json_shape(std::string_view text, const JsonShapeLimits& limits, std::string_view what);

}  // namespace mc
