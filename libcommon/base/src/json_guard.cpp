// One pass over a JSON text: nesting depth, containers and values (mc/common/json_guard.hpp).
#include "mc/common/json_guard.hpp"

#include <string>

namespace mc {

namespace {
std::string named(std::string_view what, const std::string& text) {
  return what.empty() ? text : std::string(what) + ": " + text;
}
}  // namespace

Status check_json_shape(std::string_view text, const JsonShapeLimits& limits, std::string_view what) {
  size_t depth = 0;
  size_t containers = 0;
  size_t commas = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) {
          return Status(Code::kInvalidArgument,
                        named(what, "JSON nested deeper than " + std::to_string(limits.max_depth) + " levels"));
        }
        if (++containers > limits.max_containers) {
          return Status(Code::kResourceExhausted, named(what, "more than " + std::to_string(limits.max_containers) +
                                                                  " JSON arrays and objects; send a smaller document"));
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      case ',':
        ++commas;
        break;
      default:
        continue;
    }
    if (1 + commas + containers > limits.max_values) {
      return Status(Code::kResourceExhausted, named(what, "more than " + std::to_string(limits.max_values) +
                                                              " JSON values; send a smaller document"));
    }
  }
  return Status::ok();
}

}  // namespace mc
