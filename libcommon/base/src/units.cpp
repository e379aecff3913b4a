#include "mc/common/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace mc::units {
namespace {

Result<int64_t> parse_with_suffix(std::string_view text, bool sizes) {
  std::string s;
  for (char c : text)
    if (c != ',' && c != '_' && !std::isspace(static_cast<unsigned char>(c))) s += c;
  auto bad = [&](const std::string& why) {
    return Status(Code::kInvalidArgument,
                  "'" + std::string(text) + "' is not a valid " + (sizes ? "size" : "count") + ": " + why +
                      (sizes ? " (examples: 4096, 64KiB, 1MiB, 1.5GB)" : " (examples: 1000, 3M, 1.5G)"));
  };
  if (s.empty()) return bad("empty");
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad("does not start with a number");
  std::string num = s.substr(0, i);
  std::string suf = s.substr(i);
  for (auto& c : suf) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (suf.empty() || suf == "b")
    mult = 1;
  else if (suf == "k" || suf == "kb")
    mult = 1e3;
  else if (suf == "m" || suf == "mb")
    mult = 1e6;
  else if (suf == "g" || suf == "gb")
    mult = 1e9;
  else if (suf == "t" || suf == "tb")
    mult = 1e12;
  else if (sizes && (suf == "ki" || suf == "kib"))
    mult = 1024.0;
  else if (sizes && (suf == "mi" || suf == "mib"))
    mult = 1024.0 * 1024;
  else if (sizes && (suf == "gi" || suf == "gib"))
    mult = 1024.0 * 1024 * 1024;
  else if (sizes && (suf == "ti" || suf == "tib"))
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return bad("unknown suffix '" + suf + "'");
  if (num.find('.') == std::string::npos) {
    // Exact integer path (no double rounding for large plain numbers).
    unsigned long long v = 0;
    for (char c : num) {
      if (v > (std::numeric_limits<unsigned long long>::max() - 9) / 10) return bad("too large");
      v = v * 10 + static_cast<unsigned>(c - '0');
    }
    long double r = static_cast<long double>(v) * static_cast<long double>(mult);
    if (r > static_cast<long double>(std::numeric_limits<int64_t>::max())) return bad("too large");
    return static_cast<int64_t>(v) * static_cast<int64_t>(mult);
  }
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end == nullptr || *end != '\0') return bad("malformed number");
  double r = v * mult;
  if (!(r < 9.2e18)) return bad("too large");
  double rounded = std::llround(r);
  if (std::fabs(rounded - r) > 1e-6 * std::max(1.0, r)) return bad("not a whole number of units");
  return static_cast<int64_t>(rounded);
}

Result<std::vector<int64_t>> parse_list(std::string_view text, bool sizes) {
  std::vector<int64_t> out;
  size_t start = 0;
  std::string t(text);
  // Lists are separated by ','; a size such as "1,000" is therefore not accepted inside lists.
  while (start <= t.size()) {
    size_t comma = t.find(',', start);
    std::string item = t.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    Result<int64_t> v = parse_with_suffix(item, sizes);
    if (!v.is_ok()) return v.status();
    out.push_back(v.value());
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

Result<int64_t> parse_size_bytes(std::string_view text) { return parse_with_suffix(text, true); }
Result<int64_t> parse_count(std::string_view text) { return parse_with_suffix(text, false); }
Result<std::vector<int64_t>> parse_size_list(std::string_view text) { return parse_list(text, true); }
Result<std::vector<int64_t>> parse_count_list(std::string_view text) { return parse_list(text, false); }

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace mc::units
