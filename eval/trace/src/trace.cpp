#include "mc/trace/trace.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>
#include "mc/common/input_file.hpp"
#include "mc/common/json_guard.hpp"
#include "mc/common/splitmix.hpp"
#include "mc/trace/csv.hpp"
#include "mc/trace/trace_prefix.hpp"

namespace mc::trace {
namespace {

using json = nlohmann::json;

// Arrival times up to 2^63 ns (~292 years); lengths up to 2^31-1 tokens (a larger prompt is not a prompt).
constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
// Rows are JSON objects holding arrays; deeper nesting is refused before parsing.
constexpr size_t kMaxJsonDepth = 32;
// A first timestamp at or after this is an epoch time (2001-09-09T01:46:40Z).
constexpr int64_t kEpochNs = 1'000'000'000LL * 1'000'000'000LL;
// The seed of the ids of rows without ids when no prefix model is given (unique ids).
constexpr uint64_t kUniqueSeed = 0x554E495155450000ULL;

Status bad(const std::string& where, const std::string& why) {
  return Status(Code::kInvalidArgument, where + ": " + why);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Text from the file as a message shows it: at most `max` bytes ("..." after a cut), control bytes (a terminal's
// escape sequences, NULs of a binary file) as \xNN, so that a garbled or hostile file cannot drive the terminal.
std::string shown_text(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

// A JSON value as a message shows it: its first 64 bytes (a line may hold 16 MiB of one value).
std::string shown_json(const nlohmann::json& value) { return shown_text(value.dump(), 64); }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// An integer field within [lo, hi]; floats (512.5, 1e3), strings, and values outside the range fail.
Result<int64_t> int_field(const json& obj, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return bad(where, std::string("missing field \"") + key + "\"");
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi))
      return bad(where,
                 std::string("\"") + key + "\" = " + std::to_string(v) + " is larger than " + std::to_string(hi));
    if (static_cast<int64_t>(v) < lo)
      return bad(where, std::string("\"") + key + "\" = " + std::to_string(v) + " is below " + std::to_string(lo));
    return static_cast<int64_t>(v);
  }
  if (it->is_number_integer()) {
    int64_t v = it->get<int64_t>();
    if (v < lo || v > hi)
      return bad(where, std::string("\"") + key + "\" = " + std::to_string(v) + " is outside [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
    return v;
  }
  return bad(where, std::string("\"") + key + "\" must be an integer, got " + shown_json(*it));
}

// A CSV integer field within [lo, hi]: decimal digits only (blanks around are allowed).
Result<int64_t> int_text(std::string_view text, std::string_view column, int64_t lo, int64_t hi,
                         const std::string& where) {
  const std::string_view t = trim(text);
  int64_t v = 0;
  const char* end = t.data() + t.size();
  auto [p, ec] = std::from_chars(t.data(), end, v);
  if (t.empty() || ec != std::errc() || p != end || t.front() == '+')
    return bad(where, "field \"" + std::string(column) + "\" = \"" + shown_text(t, 64) + "\" is not an integer in [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  if (v < lo || v > hi)
    return bad(where, "field \"" + std::string(column) + "\" = " + std::to_string(v) + " is outside [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// An optional string field ("" when absent).
Result<std::string> optional_string_field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::string();
  if (!it->is_string()) return bad(where, std::string("\"") + key + "\" must be a string, got " + shown_json(*it));
  return it->get<std::string>();
}

int unit_exponent(TimeUnit unit) {
  switch (unit) {
    case TimeUnit::kSeconds:
      return 9;
    case TimeUnit::kMicros:
      return 3;
    case TimeUnit::kNanos:
      return 0;
    case TimeUnit::kMillis:
    case TimeUnit::kAuto:
      break;
  }
  return 6;
}

// Days since 1970-01-01 of a proleptic Gregorian date (the days-from-civil arithmetic: years start in March so that
// the leap day ends the year).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// The inverse: (year, month, day) of a day count since 1970-01-01.
void civil_from_days(int64_t z, int64_t& y, int64_t& m, int64_t& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = yoe + era * 400 + (m <= 2 ? 1 : 0);
}

bool is_leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

// "YYYY-MM-DD[ T]HH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]" as ns since the epoch (UTC; an offset is taken off).
Result<int64_t> parse_date(std::string_view t, std::string_view field, const std::string& where) {
  const std::string shown = shown_text(t, 64);
  auto fail = [&](const std::string& why) {
    return bad(where, "\"" + std::string(field) + "\" = \"" + shown + "\" is not a date and time " +
                          "(YYYY-MM-DD HH:MM:SS[.fraction], UTC or with an offset +HH:MM): " + why);
  };
  auto digits = [&](size_t pos, size_t n, int64_t& out) {
    if (pos + n > t.size()) return false;
    out = 0;
    for (size_t i = pos; i < pos + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return false;
      out = out * 10 + (t[i] - '0');
    }
    return true;
  };
  int64_t y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  if (!digits(0, 4, y) || t.size() < 19 || t[4] != '-' || !digits(5, 2, mo) || t[7] != '-' || !digits(8, 2, d) ||
      (t[10] != ' ' && t[10] != 'T') || !digits(11, 2, h) || t[13] != ':' || !digits(14, 2, mi) || t[16] != ':' ||
      !digits(17, 2, s))
    return fail("malformed");
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 1970 || y > 2262) return fail("year outside 1970 to 2262");
  if (mo < 1 || mo > 12) return fail("month outside 1 to 12");
  if (d < 1 || d > kDays[mo - 1] + (mo == 2 && is_leap(y) ? 1 : 0)) return fail("no such day");
  if (h > 23 || mi > 59 || s > 60) return fail("time of day out of range");
  size_t pos = 19;
  int64_t frac_ns = 0;
  if (pos < t.size() && t[pos] == '.') {
    ++pos;
    int n = 0;
    const size_t start = pos;
    while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') {
      if (n < 9) {
        frac_ns = frac_ns * 10 + (t[pos] - '0');
        ++n;
      }
      ++pos;
    }
    if (pos == start || pos - start > 30) return fail("bad fraction of a second");
    for (; n < 9; ++n) frac_ns *= 10;
  }
  // A UTC offset: Z, or +HH:MM, +HHMM, +HH (either sign), as the Azure 2024 trace writes ("...+00:00").
  int64_t offset_s = 0;
  if (pos < t.size() && t[pos] == 'Z') {
    ++pos;
  } else if (pos < t.size() && (t[pos] == '+' || t[pos] == '-')) {
    const int64_t sign = t[pos] == '-' ? -1 : 1;
    int64_t oh = 0, om = 0;
    const size_t rest = t.size() - pos - 1;
    const bool ok = (rest == 2 && digits(pos + 1, 2, oh)) ||
                    (rest == 4 && digits(pos + 1, 2, oh) && digits(pos + 3, 2, om)) ||
                    (rest == 5 && digits(pos + 1, 2, oh) && t[pos + 3] == ':' && digits(pos + 4, 2, om));
    if (!ok || oh > 23 || om > 59) return fail("bad UTC offset (give Z, +HH:MM, +HHMM or +HH)");
    offset_s = sign * (oh * 3600 + om * 60);
    pos = t.size();
  }
  if (pos != t.size()) return fail("unexpected text after the time");
  const int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s - offset_s;
  if (secs < 0) return fail("before 1970-01-01T00:00:00Z");
  if (secs > std::numeric_limits<int64_t>::max() / 1'000'000'000 - 1) return fail("past 2262-04-11");
  return secs * 1'000'000'000 + frac_ns;
}

std::string format_date(int64_t ns) {
  const int64_t secs = ns / 1'000'000'000;
  int64_t y = 0, m = 0, d = 0;
  civil_from_days(secs / 86400, y, m, d);
  const int64_t sod = secs % 86400;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%03lldZ", static_cast<long long>(y),
                static_cast<long long>(m), static_cast<long long>(d), static_cast<long long>(sod / 3600),
                static_cast<long long>(sod / 60 % 60), static_cast<long long>(sod % 60),
                static_cast<long long>(ns / 1'000'000 % 1000));
  return buf;
}

// The timestamp value of a JSON field: a number or a string.
Result<TimeValue> json_time(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return bad(where, std::string("missing field \"") + key + "\"");
  if (it->is_string()) return parse_time_text(it->get_ref<const std::string&>(), key, where);
  if (it->is_number()) return parse_time_text(it->dump(), key, where);
  return bad(where, std::string("\"") + key + "\" must be a number or a string, got " + shown_json(*it));
}

// The columns each CSV format needs, lower-case; index 0 is the timestamp.
const std::vector<std::string>& csv_columns(Format f) {
  static const std::vector<std::string> kAzure = {"timestamp", "contexttokens", "generatedtokens"};
  static const std::vector<std::string> kBurst = {"timestamp", "request tokens", "response tokens"};
  static const std::vector<std::string> kNone;
  if (f == Format::kAzure) return kAzure;
  if (f == Format::kBurstGpt) return kBurst;
  return kNone;
}

// The columns as the files spell them, for messages.
const char* csv_column_label(Format f, size_t i) {
  static const char* kAzure[] = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};
  static const char* kBurst[] = {"Timestamp", "Request tokens", "Response tokens"};
  return f == Format::kAzure ? kAzure[i] : kBurst[i];
}

}  // namespace

std::string_view format_name(Format f) {
  switch (f) {
    case Format::kMooncake:
      return "mooncake";
    case Format::kAzure:
      return "azure";
    case Format::kBurstGpt:
      return "burstgpt";
    case Format::kAuto:
      break;
  }
  return "auto";
}

std::string_view unit_name(TimeUnit u) {
  switch (u) {
    case TimeUnit::kSeconds:
      return "s";
    case TimeUnit::kMillis:
      return "ms";
    case TimeUnit::kMicros:
      return "us";
    case TimeUnit::kNanos:
      return "ns";
    case TimeUnit::kAuto:
      break;
  }
  return "auto";
}

Result<Format> parse_format(std::string_view name) {
  for (Format f : {Format::kAuto, Format::kMooncake, Format::kAzure, Format::kBurstGpt})
    if (name == format_name(f)) return f;
  return Status(Code::kInvalidArgument, "--format '" + std::string(name) + "': give auto, mooncake, azure or burstgpt");
}

Result<TimeUnit> parse_unit(std::string_view name) {
  for (TimeUnit u : {TimeUnit::kAuto, TimeUnit::kSeconds, TimeUnit::kMillis, TimeUnit::kMicros, TimeUnit::kNanos})
    if (name == unit_name(u)) return u;
  return Status(Code::kInvalidArgument, "--timestamp-unit '" + std::string(name) + "': give auto, s, ms, us or ns");
}

Result<TimeValue> parse_time_text(std::string_view text, std::string_view field, const std::string& where) {
  const std::string_view t = trim(text);
  TimeValue v;
  if (t.size() > 10 && (t[4] == '-' || t.find(':') != std::string_view::npos)) {
    MC_ASSIGN_OR_RETURN(v.date_ns, parse_date(t, field, where));
    v.is_date = true;
    v.approx = static_cast<double>(v.date_ns) * 1e-9;
    return v;
  }
  const std::string shown = shown_text(t, 64);
  auto fail = [&](const std::string& why) {
    return bad(where, "\"" + std::string(field) + "\" = \"" + shown + "\" " + why);
  };
  if (!t.empty() && t.front() == '-') return fail("is negative (a timestamp is >= 0)");
  size_t i = 0;
  if (i < t.size() && t[i] == '+') ++i;
  std::string digits;
  int64_t exponent = 0;
  bool any = false, point = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c >= '0' && c <= '9') {
      any = true;
      if (digits.empty() && c == '0') {
        if (point) --exponent;  // leading zeros of a fraction scale the value, they are not digits
        continue;
      }
      if (digits.size() >= 40) return fail("has too many digits");
      digits.push_back(c);
      if (point) --exponent;
    } else if (c == '.' && !point) {
      point = true;
    } else {
      break;
    }
  }
  if (!any) return fail("is not a number (a decimal timestamp, or a date and time)");
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
    int64_t e = 0;
    const size_t start = i;
    for (; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i) {
      if (e < 100000) e = e * 10 + (t[i] - '0');
    }
    if (i == start) return fail("has a bad exponent");
    exponent += neg ? -e : e;
  }
  if (i != t.size()) return fail("is not a number (a decimal timestamp, or a date and time)");
  if (exponent > 1000 || exponent < -1000) {
    if (exponent > 0 && !digits.empty()) return fail("is too large");
    digits.clear();
    exponent = 0;
  }
  v.digits = digits;
  v.exponent = static_cast<int32_t>(exponent);
  v.approx = digits.empty() ? 0.0 : std::strtod((digits + "e" + std::to_string(exponent)).c_str(), nullptr);
  return v;
}

TimeUnit detect_unit(double first) {
  if (first >= 1e17) return TimeUnit::kNanos;
  if (first >= 1e14) return TimeUnit::kMicros;
  if (first >= 1e11) return TimeUnit::kMillis;
  if (first >= 1e9) return TimeUnit::kSeconds;
  return TimeUnit::kMillis;
}

Result<int64_t> to_ns(const TimeValue& v, TimeUnit unit, std::string_view field, const std::string& where) {
  if (v.is_date) return v.date_ns;
  std::string digits = v.digits;
  int64_t e = static_cast<int64_t>(v.exponent) + unit_exponent(unit);
  if (e < 0) {
    if (static_cast<int64_t>(digits.size()) <= -e) return int64_t{0};
    digits.resize(digits.size() - static_cast<size_t>(-e));  // truncated to whole ns
    e = 0;
  }
  if (digits.empty()) return int64_t{0};
  unsigned __int128 value = 0;
  const unsigned __int128 limit = std::numeric_limits<int64_t>::max();
  bool over = static_cast<int64_t>(digits.size()) + e > 19;
  for (char c : digits) {
    if (over) break;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  for (int64_t k = 0; k < e && !over; ++k) value *= 10;
  if (over || value > limit)
    return bad(where, "\"" + std::string(field) + "\" is too large: " + std::string(v.digits.substr(0, 24)) + "e" +
                          std::to_string(v.exponent) + " " + std::string(unit_name(unit)) +
                          " is past 2^63 ns (292 years); check --timestamp-unit");
  return static_cast<int64_t>(value);
}

std::vector<uint64_t> recut_ids(const std::vector<uint64_t>& ids, int64_t input_length, int64_t block_size) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t len = input_length;
  // Id i covers tokens [start(i), start(i + 1)): L/n each, rounded to whole tokens.
  auto start = [&](int64_t i) { return static_cast<int64_t>((static_cast<__int128>(2) * i * len + n) / (2 * n)); };
  const int64_t blocks = (len + block_size - 1) / block_size;
  std::vector<uint64_t> out;
  out.reserve(static_cast<size_t>(blocks));
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t end = std::min((j + 1) * block_size, len);
    const int64_t last = end - 1;  // the block's last token
    int64_t i = std::min<int64_t>(n - 1, static_cast<int64_t>(static_cast<__int128>(last) * n / len));
    while (i + 1 < n && start(i + 1) <= last) ++i;
    while (i > 0 && start(i) > last) --i;
    // (covering id, block end): equal leading ids give equal blocks wherever the ids reach as far.
    uint64_t state = ids[static_cast<size_t>(i)] ^ 0x5245435554000000ULL;
    uint64_t h = splitmix64(state);
    state = h ^ static_cast<uint64_t>(end);
    out.push_back(splitmix64(state));
  }
  return out;
}

bool read_differently(const ReaderStats& s) {
  return s.format == Format::kAzure || s.format == Format::kBurstGpt || s.dates || s.epoch_shift_ns > 0 ||
         (s.timestamp_unit != TimeUnit::kMillis && s.timestamp_unit != TimeUnit::kAuto) || s.reblocked_rows > 0 ||
         s.synthesized_rows > 0;
}

std::vector<std::pair<std::string, std::string>> describe(const ReaderStats& s, const FormatOptions& o) {
  std::vector<std::pair<std::string, std::string>> out;
  if (s.format != Format::kAuto)
    out.emplace_back("format", std::string(format_name(s.format)) + (s.format_detected ? " (detected)" : ""));
  if (s.timestamp_unit != TimeUnit::kAuto) {
    std::string how;
    if (s.unit_detected) {
      how = " (detected by magnitude)";
    } else if (o.timestamp_unit == TimeUnit::kAuto) {
      how = " (the format's)";
    }
    out.emplace_back("timestamp_unit", std::string(unit_name(s.timestamp_unit)) + how);
  }
  if (s.dates) out.emplace_back("timestamps", "dates and times (UTC)");
  if (s.epoch_shift_ns > 0) out.emplace_back("epoch_start", format_date(s.epoch_shift_ns) + " (shifted to 0)");
  if (o.block_accounting == BlockAccounting::kLenient) {
    out.emplace_back("block_accounting", "lenient");
    out.emplace_back("reblocked_rows", std::to_string(s.reblocked_rows));
  }
  if (s.synthesized_rows > 0) {
    out.emplace_back("prefix_ids", is_none_model(o.synthesize_prefixes) ? "unique (none in the trace; no reuse)"
                                                                        : o.synthesize_prefixes);
    out.emplace_back("synthesized_rows", std::to_string(s.synthesized_rows));
  }
  return out;
}

// A row as its format gives it, before its timestamp is resolved and its ids fixed.
struct PendingRow {
  TimeValue timestamp;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::optional<std::vector<uint64_t>> hash_ids;  // none in the CSV formats
  RequestKeyScope scope;
};

namespace {

// Parses the JSON object of one Mooncake row (timestamp as written, ids as given).
Result<PendingRow> parse_json_pending(const std::string& line, const std::string& where) {
  // A row nests two levels deep; parsing deep nesting costs ~80 bytes a level (a 16 MiB line of '[' held 1.4 GB).
  JsonShapeLimits shape;
  shape.max_depth = kMaxJsonDepth;
  if (Status s = check_json_shape(line, shape, ""); !s.is_ok()) return bad(where, s.message() + ": not a trace row");
  json obj;
  try {
    obj = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large ("1e999")
    return bad(where, std::string("not valid JSON (") + shown_text(e.what(), 240) + ")");
  }
  if (!obj.is_object()) return bad(where, "expected a JSON object, got " + std::string(obj.type_name()));
  PendingRow r;
  MC_ASSIGN_OR_RETURN(r.timestamp, json_time(obj, "timestamp", where));
  MC_ASSIGN_OR_RETURN(r.input_length, int_field(obj, "input_length", 1, kMaxTokens, where));
  MC_ASSIGN_OR_RETURN(r.output_length, int_field(obj, "output_length", 0, kMaxTokens, where));
  auto ids = obj.find("hash_ids");
  if (ids == obj.end()) return bad(where, "missing field \"hash_ids\"");
  if (!ids->is_array()) return bad(where, "\"hash_ids\" must be an array, got " + std::string(ids->type_name()));
  std::vector<uint64_t> hash_ids;
  hash_ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& id = (*ids)[i];
    if (id.is_number_unsigned()) {
      hash_ids.push_back(id.get<uint64_t>());
    } else if (id.is_number_integer() && id.get<int64_t>() >= 0) {
      hash_ids.push_back(static_cast<uint64_t>(id.get<int64_t>()));
    } else {
      return bad(where, "hash_ids[" + std::to_string(i) + "] = " + shown_json(id) +
                            " is not an integer in [0, 18446744073709551615]");
    }
  }
  r.hash_ids = std::move(hash_ids);
  MC_ASSIGN_OR_RETURN(r.scope.lora_name, optional_string_field(obj, "lora_name", where));
  MC_ASSIGN_OR_RETURN(r.scope.lora_version, optional_string_field(obj, "lora_version", where));
  MC_ASSIGN_OR_RETURN(r.scope.salt, optional_string_field(obj, "salt", where));
  MC_RETURN_IF_ERROR(validate_key_scope(r.scope, where));
  return r;
}

std::string count_message(int64_t input_length, int64_t block_size, int64_t expected, size_t got) {
  return "input_length " + std::to_string(input_length) + " needs ceil(" + std::to_string(input_length) + "/" +
         std::to_string(block_size) + ") = " + std::to_string(expected) + " hash_ids, the row has " +
         std::to_string(got);
}

}  // namespace

Result<Request> parse_row(const std::string& line, int64_t block_size, const std::string& where) {
  MC_ASSIGN_OR_RETURN(PendingRow p, parse_json_pending(line, where));
  Request r;
  MC_ASSIGN_OR_RETURN(const int64_t ns, to_ns(p.timestamp, TimeUnit::kMillis, "timestamp", where));
  r.timestamp_ms = ns / 1'000'000;
  r.input_length = p.input_length;
  r.output_length = p.output_length;
  r.hash_ids = std::move(*p.hash_ids);
  r.scope = std::move(p.scope);
  const int64_t expected = (r.input_length + block_size - 1) / block_size;
  if (static_cast<int64_t>(r.hash_ids.size()) != expected)
    return bad(where, count_message(r.input_length, block_size, expected, r.hash_ids.size()));
  return r;
}

std::string to_jsonl(const Request& r) {
  nlohmann::ordered_json j = {{"timestamp", r.timestamp_ms},
                              {"input_length", r.input_length},
                              {"output_length", r.output_length},
                              {"hash_ids", r.hash_ids}};
  if (!r.scope.lora_name.empty()) j["lora_name"] = r.scope.lora_name;
  if (!r.scope.lora_version.empty()) j["lora_version"] = r.scope.lora_version;
  if (!r.scope.salt.empty()) j["salt"] = r.scope.salt;
  return j.dump();
}

Reader::Reader(std::istream& in, ReaderOptions options) : in_(&in), options_(std::move(options)) {
  if (options_.block_size <= 0) {
    setup_ = Status(Code::kInvalidArgument, "trace block size must be positive");
    return;
  }
  if (!is_none_model(options_.formats.synthesize_prefixes)) {
    Result<PrefixModel> m = parse_prefix_model(options_.formats.synthesize_prefixes);
    if (!m.is_ok()) {
      setup_ = m.status();
      return;
    }
    prefixes_ = std::make_unique<PrefixSynthesizer>(std::move(m).value());
  }
}

Reader::~Reader() = default;

Result<std::unique_ptr<Reader>> Reader::open(const std::string& path, ReaderOptions options) {
  if (options.block_size <= 0) return Status(Code::kInvalidArgument, "trace block size must be positive");
  if (!is_none_model(options.formats.synthesize_prefixes))
    MC_RETURN_IF_ERROR(parse_prefix_model(options.formats.synthesize_prefixes).status());
  if (path == "-") {
    if (options.source_name == "-") options.source_name = "<stdin>";
    return std::make_unique<Reader>(std::cin, std::move(options));
  }
  MC_ASSIGN_OR_RETURN(
      std::ifstream in,
      open_input_file(path, "trace file",
                      "give a path to a trace (Mooncake JSONL, Azure or BurstGPT CSV), or - for stdin"));
  auto file = std::make_unique<std::ifstream>(std::move(in));
  if (options.source_name == "-") options.source_name = path;
  auto reader = std::make_unique<Reader>(*file, std::move(options));
  reader->owned_ = std::move(file);
  reader->in_ = reader->owned_.get();
  return reader;
}

Status Reader::read_header(const std::string& line, const std::string& where, bool named) {
  std::vector<std::string> fields;
  const csv::SplitResult split = csv::split_record(line, fields);
  std::vector<std::string> names;
  if (split.status == csv::Split::kOk)
    for (const std::string& f : fields) names.push_back(lower(trim(f)));
  auto has = [&](Format f) {
    for (const std::string& c : csv_columns(f))
      if (std::find(names.begin(), names.end(), c) == names.end()) return false;
    return true;
  };
  const std::string shown = shown_text(line, 120);
  if (!named) {
    if (has(Format::kAzure)) {
      format_ = Format::kAzure;
    } else if (has(Format::kBurstGpt)) {
      format_ = Format::kBurstGpt;
    } else {
      return bad(where,
                 "the first line is neither a Mooncake JSONL row ({\"timestamp\": ...}) nor the header of a "
                 "known CSV trace (Azure: TIMESTAMP,ContextTokens,GeneratedTokens; BurstGPT: Timestamp,"
                 "Request tokens,Response tokens,...): \"" +
                     shown + "\" (name the format with --format)");
    }
  }
  const std::vector<std::string>& needed = csv_columns(format_);
  columns_.assign(needed.size(), -1);
  for (size_t i = 0; i < needed.size(); ++i) {
    auto it = std::find(names.begin(), names.end(), needed[i]);
    if (it == names.end())
      return bad(where, std::string("the ") + std::string(format_name(format_)) + " CSV header lacks column \"" +
                            csv_column_label(format_, i) + "\": \"" + shown + "\"");
    auto again = std::find(it + 1, names.end(), needed[i]);
    if (again != names.end())
      return bad(where, std::string("the ") + std::string(format_name(format_)) + " CSV header names column \"" +
                            csv_column_label(format_, i) + "\" twice (fields " +
                            std::to_string(it - names.begin() + 1) + " and " +
                            std::to_string(again - names.begin() + 1) + "), so which one holds it is unclear: \"" +
                            shown + "\"");
    columns_[i] = static_cast<int>(it - names.begin());
  }
  columns_.push_back(static_cast<int>(names.size()));  // the field count every row must have
  return Status::ok();
}

Result<PendingRow> Reader::parse_csv_row(const std::vector<std::string>& fields, const std::string& where) {
  const auto expected = static_cast<size_t>(columns_.back());
  if (fields.size() != expected)
    return bad(where,
               "the row has " + std::to_string(fields.size()) + " fields, the header " + std::to_string(expected));
  PendingRow p;
  auto field = [&](size_t i) -> const std::string& { return fields[static_cast<size_t>(columns_[i])]; };
  MC_ASSIGN_OR_RETURN(p.timestamp, parse_time_text(field(0), csv_column_label(format_, 0), where));
  MC_ASSIGN_OR_RETURN(p.input_length, int_text(field(1), csv_column_label(format_, 1), 1, kMaxTokens, where));
  MC_ASSIGN_OR_RETURN(p.output_length, int_text(field(2), csv_column_label(format_, 2), 0, kMaxTokens, where));
  return p;
}

Result<Request> Reader::finish(PendingRow p, const std::string& where) {
  const FormatOptions& fo = options_.formats;
  const char* ts_field = format_ == Format::kMooncake ? "timestamp" : csv_column_label(format_, 0);
  // The unit of numeric timestamps: named, the format's, or detected from the first numeric one.
  TimeUnit unit = stats_.timestamp_unit;
  bool detected = stats_.unit_detected;
  if (!p.timestamp.is_date && unit == TimeUnit::kAuto) {
    detected = false;
    if (fo.timestamp_unit != TimeUnit::kAuto) {
      unit = fo.timestamp_unit;
    } else if (format_ == Format::kBurstGpt) {
      unit = TimeUnit::kSeconds;
    } else {
      unit = detect_unit(p.timestamp.approx);
      detected = true;
    }
  }
  // One file's timestamps are all numbers or all dates: a date has no common origin with relative numbers (a
  // relative trace followed by a date would put that row decades later), and numbers after dates have no unit.
  if (p.timestamp.is_date && stats_.timestamp_unit != TimeUnit::kAuto)
    return bad(where, "\"" + std::string(ts_field) +
                          "\" is a date and time but the earlier rows' are numbers (one file's timestamps are all "
                          "numbers or all dates)");
  if (!p.timestamp.is_date && stats_.dates)
    return bad(where, "\"" + std::string(ts_field) +
                          "\" is a number but the earlier rows' are dates and times (one file's timestamps are all "
                          "numbers or all dates)");
  MC_ASSIGN_OR_RETURN(const int64_t ns, to_ns(p.timestamp, unit, ts_field, where));
  const int64_t shift = shift_fixed_ ? stats_.epoch_shift_ns : (p.timestamp.is_date || ns >= kEpochNs ? ns : 0);
  const int64_t ms = ns < shift ? -1 : (ns - shift) / 1'000'000;
  if (ms < last_timestamp_ms_) {
    return bad(where, "timestamp " + (ns < shift ? std::string("before the first row's") : std::to_string(ms) + " ms") +
                          " goes back from " + std::to_string(last_timestamp_ms_) +
                          " ms (rows must be in arrival order)");
  }
  Request r;
  r.timestamp_ms = ms;
  r.input_length = p.input_length;
  r.output_length = p.output_length;
  r.scope = std::move(p.scope);
  const int64_t bs = options_.block_size;
  const int64_t expected = (r.input_length + bs - 1) / bs;
  bool recut = false;
  if (p.hash_ids) {
    if (static_cast<int64_t>(p.hash_ids->size()) == expected) {
      r.hash_ids = std::move(*p.hash_ids);
    } else if (fo.block_accounting == BlockAccounting::kStrict) {
      return bad(where, count_message(r.input_length, bs, expected, p.hash_ids->size()) +
                            " (--block-accounting lenient accepts ids that each cover input_length / len(hash_ids) "
                            "tokens)");
    } else if (p.hash_ids->empty()) {
      return bad(where, "\"hash_ids\" is empty: no ids to cover " + std::to_string(r.input_length) + " tokens");
    } else if (expected > kMaxSynthesizedBlocks) {
      return bad(where, "input_length " + std::to_string(r.input_length) + " needs " + std::to_string(expected) +
                            " blocks of " + std::to_string(bs) + " tokens: more than " +
                            std::to_string(kMaxSynthesizedBlocks) + " to re-cut for one row");
    } else {
      r.hash_ids = recut_ids(*p.hash_ids, r.input_length, bs);
      recut = true;
    }
  } else {
    if (expected > kMaxSynthesizedBlocks)
      return bad(where, "input_length " + std::to_string(r.input_length) + " needs " + std::to_string(expected) +
                            " blocks of " + std::to_string(bs) + " tokens: more than " +
                            std::to_string(kMaxSynthesizedBlocks) + " ids to make for one row");
    if (prefixes_) {
      r.hash_ids = prefixes_->next(r.input_length, r.output_length, bs);
    } else {
      const PrefixIds unique(kUniqueSeed);
      r.hash_ids = unique.prompt_ids({}, 0, r.input_length, bs, static_cast<uint64_t>(stats_.rows));
    }
    ++stats_.synthesized_rows;
  }
  // The row is good: what it fixed stays.
  if (recut) ++stats_.reblocked_rows;
  if (p.timestamp.is_date) {
    stats_.dates = true;
  } else {
    stats_.timestamp_unit = unit;
    stats_.unit_detected = detected;
  }
  if (!shift_fixed_) {
    shift_fixed_ = true;
    stats_.epoch_shift_ns = shift;
  }
  last_timestamp_ms_ = ms;
  return r;
}

Result<std::optional<Request>> Reader::next() {
  if (!setup_.is_ok()) return setup_;
  std::string line;
  std::vector<std::string> fields;
  for (LineRead got; (got = read_line_bounded(*in_, line)) != LineRead::kEnd;) {
    const int64_t line_no = ++stats_.lines;
    if (line_no == 1 && line.size() >= 3 && static_cast<unsigned char>(line[0]) == 0xEF &&
        static_cast<unsigned char>(line[1]) == 0xBB && static_cast<unsigned char>(line[2]) == 0xBF) {
      line.erase(0, 3);
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (got == LineRead::kLine && line.find_first_not_of(" \t") == std::string::npos) {
      ++stats_.blank;
      continue;
    }
    const std::string where = options_.source_name + ":" + std::to_string(line_no);
    if (format_ == Format::kAuto && got == LineRead::kLine) {
      // The first non-blank line fixes the format: a JSON object, or a CSV header (consumed here).
      const Format named = options_.formats.format;
      const size_t first = line.find_first_not_of(" \t");
      if (named == Format::kMooncake || (named == Format::kAuto && line[first] == '{')) {
        format_ = Format::kMooncake;
      } else {
        format_ = named;
        MC_RETURN_IF_ERROR(read_header(line, where, named != Format::kAuto));
        stats_.format = format_;
        stats_.format_detected = named == Format::kAuto;
        ++stats_.header;
        continue;
      }
      stats_.format = format_;
      stats_.format_detected = named == Format::kAuto;
    }
    Result<Request> row = Status::ok();
    if (got == LineRead::kTooLong) {
      row = bad(where, "a line longer than " + std::to_string(kMaxInputLineBytes >> 20) +
                           " MiB (no newline?): not a trace row");
    } else if (format_ == Format::kMooncake) {
      Result<PendingRow> p = parse_json_pending(line, where);
      row = p.is_ok() ? finish(std::move(p).value(), where) : Result<Request>(p.status());
    } else {
      // A CSV record: a quoted field may go on past line breaks (bounded like a line).
      csv::SplitResult split;
      bool too_long = false;
      while ((split = csv::split_record(line, fields)).status == csv::Split::kOpenQuote) {
        std::string more;
        const LineRead next = read_line_bounded(*in_, more);
        if (next == LineRead::kEnd) break;
        ++stats_.lines;
        if (!more.empty() && more.back() == '\r') more.pop_back();
        line += '\n';
        line += more;
        if (next == LineRead::kTooLong || line.size() > kMaxInputLineBytes) {
          too_long = true;
          got = LineRead::kTooLong;
          break;
        }
      }
      if (too_long) {
        row = bad(where, "a CSV record longer than " + std::to_string(kMaxInputLineBytes >> 20) +
                             " MiB (an unclosed quote?): not a trace row");
      } else if (split.status == csv::Split::kOpenQuote) {
        row = bad(where, "field " + std::to_string(split.column) + " opens a quote that the file never closes");
      } else if (split.status == csv::Split::kBadQuote) {
        row = bad(where, "field " + std::to_string(split.column) +
                             " has a quote inside a bare field or text after its closing quote (RFC 4180)");
      } else if (split.status == csv::Split::kTooManyFields) {
        row = bad(where, "more than " + std::to_string(csv::kMaxCsvFields) + " fields");
      } else {
        Result<PendingRow> p = parse_csv_row(fields, where);
        row = p.is_ok() ? finish(std::move(p).value(), where) : Result<Request>(p.status());
      }
    }
    if (!row.is_ok()) {
      if (options_.mode == Mode::kStrict) return row.status();
      if (got == LineRead::kTooLong) in_->ignore(std::numeric_limits<std::streamsize>::max(), '\n');
      ++stats_.skipped;
      if (stats_.first_errors.size() < 10) stats_.first_errors.push_back(row.status().message());
      if (options_.warn_on_stderr) std::cerr << "warning: skipping row: " << row.status().message() << '\n';
      continue;
    }
    row.value().line_no = line_no;
    ++stats_.rows;
    return std::optional<Request>(std::move(row).value());
  }
  if (in_->bad()) {
    return Status(Code::kIo, "reading " + options_.source_name + " after line " + std::to_string(stats_.lines) + ": " +
                                 std::strerror(errno));
  }
  return std::optional<Request>();
}

}  // namespace mc::trace
