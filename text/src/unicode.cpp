// Unicode helpers of mc_text: see unicode.hpp.
#include "unicode.hpp"

#include <algorithm>
#include <vector>

namespace mc::text::unicode {
namespace data {
#include "unicode_data.inc"
}  // namespace data

const char* unicode_version() { return data::kUnicodeVersion; }

size_t utf8_sequence(std::string_view s, size_t i, size_t* len_bad) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const size_t n = s.size();
  const uint8_t c = b(i);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    if (len_bad != nullptr) *len_bad = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= n) break;
    const uint8_t x = b(i + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) break;
  }
  if (k == need + 1) return need + 1;
  if (len_bad != nullptr) *len_bad = k;  // the lead byte plus the continuation bytes that were still possible
  return 0;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence(s, i, nullptr);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    size_t bad = 0;
    const size_t len = utf8_sequence(s, i, &bad);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

uint32_t next_cp(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  const uint32_t c = b(i);
  if (c < 0x80) {
    i += 1;
    return c;
  }
  if (c < 0xE0 && i + 1 < s.size()) {
    const uint32_t cp = ((c & 0x1F) << 6) | (b(i + 1) & 0x3F);
    i += 2;
    return cp;
  }
  if (c < 0xF0 && i + 2 < s.size()) {
    const uint32_t cp = ((c & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    i += 3;
    return cp;
  }
  if (i + 3 < s.size()) {
    const uint32_t cp = ((c & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
    i += 4;
    return cp;
  }
  i = s.size();  // truncated (not valid UTF-8): the caller broke its promise; end safely
  return kReplacement;
}

size_t prev_cp_start(std::string_view s, size_t end) {
  size_t i = end;
  while (i > 0) {
    --i;
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) break;
  }
  return i;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t ccc_of(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = std::end(data::kCcc);
  const auto* it =
      std::lower_bound(std::begin(data::kCcc), end, cp, [](const data::Ccc& e, uint32_t v) { return e.cp < v; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out, int depth = 0) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && depth < 8) {
    const auto* end = std::end(data::kDecomp);
    const auto* it = std::lower_bound(std::begin(data::kDecomp), end, cp,
                                      [](const data::Decomp& e, uint32_t v) { return e.cp < v; });
    if (it != end && it->cp == cp) {
      decompose(it->a, out, depth + 1);
      if (it->b != 0) decompose(it->b, out, depth + 1);
      return;
    }
  }
  out.push_back(cp);
}

uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* end = std::end(data::kCompose);
  const auto* it = std::lower_bound(std::begin(data::kCompose), end, std::pair{a, b},
                                    [](const data::Compose& e, std::pair<uint32_t, uint32_t> v) {
                                      return e.a != v.first ? e.a < v.first : e.b < v.second;
                                    });
  return it != end && it->a == a && it->b == b ? it->c : 0;
}

bool in_ranges(const data::Range* begin, const data::Range* end, uint32_t cp) {
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t v, const data::Range& r) { return v < r.lo; });
  return it != begin && cp <= (it - 1)->hi;
}
}  // namespace

namespace {
// NFC of a span that starts at a character NFC leaves alone (or the text's start) and ends before one.
void nfc_span(std::string_view s, std::string& r) {
  std::vector<uint32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose(next_cp(s, i), d);
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t x, uint32_t y) { return ccc_of(x) < ccc_of(y); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless blocked.
  std::vector<uint32_t> out;
  out.reserve(d.size());
  std::ptrdiff_t starter = -1;
  int last_ccc = -1;  // the class of the last character kept after the starter (-1: none yet)
  for (uint32_t c : d) {
    const int cc = ccc_of(c);
    if (starter >= 0) {
      const bool adjacent = static_cast<size_t>(starter) + 1 == out.size();
      const bool blocked = !adjacent && (last_ccc == 0 || last_ccc >= cc);
      if (!blocked) {
        const uint32_t composed = compose(out[static_cast<size_t>(starter)], c);
        if (composed != 0) {
          out[static_cast<size_t>(starter)] = composed;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = static_cast<std::ptrdiff_t>(out.size());
      last_ccc = -1;
    } else {
      last_ccc = cc;
    }
    out.push_back(c);
    if (cc == 0) last_ccc = -1;
  }
  for (uint32_t c : out) append_utf8(r, c);
}
}  // namespace

std::string nfc(std::string_view s) {
  // Only the spans around characters NFC may change are normalized: from the last "safe" character before one
  // (it may compose with what follows) to the next safe character (a starter nothing joins to).
  std::string r;
  size_t copied = 0, last_safe = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const uint32_t c = next_cp(s, i);
    if (c < 0x300 || !in_ranges(std::begin(data::kNfcUnsafe), std::end(data::kNfcUnsafe), c)) {
      last_safe = at;
      continue;
    }
    size_t end = i;
    while (end < s.size()) {
      size_t j = end;
      const uint32_t n = next_cp(s, j);
      if (n < 0x300 || !in_ranges(std::begin(data::kNfcUnsafe), std::end(data::kNfcUnsafe), n)) break;
      end = j;
    }
    if (r.empty()) r.reserve(s.size());
    const size_t start = std::max(last_safe, copied);
    r.append(s.substr(copied, start - copied));
    nfc_span(s.substr(start, end - start), r);
    copied = end;
    i = end;
  }
  if (copied == 0) return std::string(s);
  r.append(s.substr(copied));
  return r;
}

std::string lowercase(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_cp(s, i);
    if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
        (c >= 0x410 && c <= 0x42F)) {
      c += 0x20;
    } else if (c >= 0x400 && c <= 0x40F) {
      c += 0x50;
    } else if (c == 0x178) {
      c = 0xFF;
    } else if ((c >= 0x100 && c <= 0x137 && c % 2 == 0 && c != 0x130) || (c >= 0x14A && c <= 0x177 && c % 2 == 0) ||
               (c >= 0x139 && c <= 0x148 && c % 2 == 1) || (c >= 0x179 && c <= 0x17E && c % 2 == 1)) {
      c += 1;
    }
    append_utf8(r, c);
  }
  return r;
}

// ---- Python's str semantics ----

uint32_t next_unit(std::string_view s, size_t& i) {
  if (utf8_sequence(s, i, nullptr) == 0) return kRawByte | static_cast<uint8_t>(s[i++]);
  return next_cp(s, i);
}

void append_unit(std::string& out, uint32_t unit) {
  if ((unit & kRawByte) != 0) {
    out.push_back(static_cast<char>(unit & 0xFF));
  } else {
    append_utf8(out, unit);
  }
}

bool is_py_space(uint32_t unit) { return in_ranges(std::begin(data::kPySpace), std::end(data::kPySpace), unit); }

bool is_py_line_break(uint32_t unit) {
  return (unit >= 0x0A && unit <= 0x0D) || (unit >= 0x1C && unit <= 0x1E) || unit == 0x85 || unit == 0x2028 ||
         unit == 0x2029;
}

namespace {

enum class Case { kUpper, kLower, kTitle };

// Appends Python's full `which` mapping of one unit (itself when it has none).
void append_case(std::string& out, uint32_t unit, Case which) {
  const auto* end = std::end(data::kCaseMap);
  const auto* it = std::lower_bound(std::begin(data::kCaseMap), end, unit,
                                    [](const data::CaseMap& m, uint32_t v) { return m.cp < v; });
  if (it == end || it->cp != unit) {
    append_unit(out, unit);
    return;
  }
  const uint32_t mapped = which == Case::kUpper ? it->upper : which == Case::kLower ? it->lower : it->title;
  if ((mapped & data::kCaseSpecialBit) == 0) {
    append_utf8(out, mapped);
    return;
  }
  for (const uint32_t cp : data::kCaseSpecial[mapped & ~data::kCaseSpecialBit].cp) {
    if (cp != 0) append_utf8(out, cp);
  }
}

bool is_cased(uint32_t unit) { return in_ranges(std::begin(data::kCased), std::end(data::kCased), unit); }
bool is_case_ignorable(uint32_t unit) {
  return in_ranges(std::begin(data::kCaseIgnorable), std::end(data::kCaseIgnorable), unit);
}

std::vector<uint32_t> units_of(std::string_view s) {
  std::vector<uint32_t> units;
  units.reserve(s.size());
  for (size_t i = 0; i < s.size();) units.push_back(next_unit(s, i));
  return units;
}

// Python's lowering of units[k] within its string: U+03A3 becomes final sigma U+03C2 when a cased character
// precedes it and none follows, case-ignorable characters skipped either way (Unicode's Final_Sigma context, as
// CPython's handle_capital_sigma reads it); any other unit its full lower mapping.
void append_lower_at(std::string& out, const std::vector<uint32_t>& units, size_t k) {
  if (units[k] != 0x3A3) {
    append_case(out, units[k], Case::kLower);
    return;
  }
  size_t j = k;
  while (j > 0 && is_case_ignorable(units[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased(units[j - 1]);
  if (final_sigma) {
    j = k + 1;
    while (j < units.size() && is_case_ignorable(units[j])) ++j;
    final_sigma = j == units.size() || !is_cased(units[j]);
  }
  append_utf8(out, final_sigma ? 0x3C2 : 0x3C3);
}

}  // namespace

std::string py_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_case(out, next_unit(s, i), Case::kUpper);
  return out;
}

std::string py_lower(std::string_view s) {
  const auto units = units_of(s);
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < units.size(); ++k) append_lower_at(out, units, k);
  return out;
}

// Each character title-cased after an uncased one (or at the start) and lowered after a cased one.
std::string py_title(std::string_view s) {
  const auto units = units_of(s);
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t k = 0; k < units.size(); ++k) {
    if (previous_cased) {
      append_lower_at(out, units, k);
    } else {
      append_case(out, units[k], Case::kTitle);
    }
    previous_cased = is_cased(units[k]);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  const auto units = units_of(s);
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < units.size(); ++k) {
    if (k == 0) {
      append_case(out, units[k], Case::kTitle);
    } else {
      append_lower_at(out, units, k);
    }
  }
  return out;
}

bool is_space(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
bool is_extender(uint32_t c) {
  if (c < 0x300) return false;
  if (c == 0x200D || (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0x1F3FB && c <= 0x1F3FF) || (c >= 0xE0020 && c <= 0xE007F) ||
      (c >= 0x1160 && c <= 0x11FF) || (c >= 0xD7B0 && c <= 0xD7FF))
    return true;
  return in_ranges(std::begin(data::kMarks), std::end(data::kMarks), c);
}
bool is_regional(uint32_t c) { return c >= 0x1F1E6 && c <= 0x1F1FF; }
uint32_t cp_at(std::string_view s, size_t i) { return next_cp(s, i); }
}  // namespace

size_t held_tail_start(std::string_view s, size_t max_bytes) {
  if (s.empty()) return 0;
  size_t i = prev_cp_start(s, s.size());
  const uint32_t last = cp_at(s, i);
  if (last == '\n' || (last < 0x20 && last != '\r') || last == 0x7F) return s.size();
  for (;;) {
    // Back over extenders to the cluster's base.
    while (i > 0 && is_extender(cp_at(s, i))) i = prev_cp_start(s, i);
    if (is_regional(cp_at(s, i))) {
      size_t run = 1, j = i;
      while (j > 0) {
        const size_t p = prev_cp_start(s, j);
        if (!is_regional(cp_at(s, p))) break;
        ++run;
        j = p;
      }
      if (run % 2 == 0) i = prev_cp_start(s, i);  // the last two form a flag
    }
    // A ZWJ before the base joins it to the previous cluster (emoji ZWJ sequences).
    if (i > 0) {
      const size_t p = prev_cp_start(s, i);
      if (cp_at(s, p) == 0x200D) {
        i = p;
        if (s.size() - i > max_bytes) return s.size();
        continue;
      }
    }
    break;
  }
  if (s.size() - i > max_bytes) return s.size();
  return i;
}

}  // namespace mc::text::unicode
