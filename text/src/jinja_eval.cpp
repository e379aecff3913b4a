// mc::text::jinja: the evaluator. Walks the tree of jinja_internal.hpp with Python's semantics for the values a
// chat template sees (JSON values, namespaces, macros), as jinja2 in transformers' sandbox would.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <string_view>

#include "jinja_internal.hpp"
#include "unicode.hpp"

namespace mc::text::jinja::detail {
namespace jinja_eval {

using Kind = Value::Kind;

struct RenderError {
  Code code;
  int line;
  std::string message;
};

[[noreturn]] void fail(int line, std::string message, Code code = Code::kInvalidArgument) {
  throw RenderError{code, line, std::move(message)};
}

// ---- UTF-8 code points (Python indexes strings by code point) ----

std::vector<size_t> code_point_starts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t k = 0; k < s.size(); ++k) {
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) starts.push_back(k);
  }
  return starts;
}
size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}
std::vector<std::string> code_points(const std::string& s) {
  const auto starts = code_point_starts(s);
  std::vector<std::string> out;
  out.reserve(starts.size());
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t end = k + 1 < starts.size() ? starts[k + 1] : s.size();
    out.push_back(s.substr(starts[k], end - starts[k]));
  }
  return out;
}

bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// ---- printing ----

// Python's repr of a float: the shortest digits that read back, fixed between 1e-4 and 1e16, else exponent.
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (const char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  }
  if (out.empty()) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", u);
      out += b;
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

std::string to_str(const Value& v);

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Kind::kString:
      return py_repr_string(v.s);
    case Kind::kList: {
      std::string out(1, v.tuple ? '(' : '[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ')' : ']';
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : *v.dict) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(k) + ": " + py_repr(val);
      }
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

// Python's str(), which is what {{ x }} prints.
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return py_float(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kList:
    case Kind::kDict:
      return py_repr(v);
    case Kind::kNamespace:
      return "<Namespace>";
    case Kind::kMacro:
      return "<macro " + (v.macro ? v.macro->name : v.s) + ">";
  }
  return "";
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kMacro:
      return "callable";
  }
  return "?";
}

// json.dumps(ensure_ascii=False) of a string.
void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", u);
          out += b;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  bool indent = false;
  std::string indent_unit;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

// json.dumps with the options transformers' tojson filter passes.
void to_json(const Value& v, const JsonStyle& st, int level, std::string& out, int line) {
  if (level > 200) fail(line, "tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += st.indent_unit;
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.b ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.i);
      return;
    case Kind::kFloat:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f < 0 ? "-Infinity" : "Infinity";
      } else {
        out += py_float(v.f);
      }
      return;
    case Kind::kString:
      json_string(v.s, out);
      return;
    case Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += st.item_sep;
        if (st.indent) newline(level + 1);
        to_json((*v.list)[k], st, level + 1, out, line);
      }
      if (st.indent) newline(level);
      out += ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (v.kind == Kind::kNamespace) fail(line, "tojson: a namespace is not JSON serializable");
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> members;
      for (const auto& m : *v.dict) members.push_back(&m);
      if (st.sort_keys) {
        std::stable_sort(members.begin(), members.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t k = 0; k < members.size(); ++k) {
        if (k > 0) out += st.item_sep;
        if (st.indent) newline(level + 1);
        json_string(members[k]->first, out);
        out += st.key_sep;
        to_json(members[k]->second, st, level + 1, out, line);
      }
      if (st.indent) newline(level);
      out += '}';
      return;
    }
    case Kind::kUndefined:
      fail(line, "tojson: an undefined value is not JSON serializable");
    case Kind::kMacro:
      fail(line, "tojson: a callable is not JSON serializable");
  }
}

// ---- value semantics ----

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->empty();
    case Kind::kNamespace:
    case Kind::kMacro:
      return true;
  }
  return false;
}

bool numeric(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kFloat || v.kind == Kind::kBool; }
double as_double(const Value& v) {
  return v.kind == Kind::kFloat ? v.f : static_cast<double>(v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i);
}
int64_t as_int(const Value& v) { return v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i; }
bool integral(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }

const Value* dict_find(const Dict& d, std::string_view key) {
  for (const auto& [k, v] : d) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool equals(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) {
    if (integral(a) && integral(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& member : *a.dict) {
        const Value* other = dict_find(*b.dict, member.first);
        if (other == nullptr || !equals(member.second, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return a.dict == b.dict;
    case Kind::kMacro:
      return a.macro == b.macro && a.s == b.s;
    default:
      return false;
  }
}

// Python's ordering: numbers with numbers, strings with strings (code point order = UTF-8 byte order), lists
// element by element. -1, 0, 1.
int order(const Value& a, const Value& b, int line) {
  if (numeric(a) && numeric(b)) {
    if (integral(a) && integral(b)) return as_int(a) < as_int(b) ? -1 : (as_int(a) > as_int(b) ? 1 : 0);
    const double x = as_double(a);
    const double y = as_double(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.s < b.s ? -1 : (a.s > b.s ? 1 : 0);
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return order((*a.list)[k], (*b.list)[k], line);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  fail(line, std::string("cannot order a ") + type_name(a) + " and a " + type_name(b));
}

// Python slice semantics: the indices selected from a sequence of `len` items.
std::vector<size_t> slice_indices(int64_t len, const Value* start, const Value* stop, const Value* step, int line) {
  int64_t st = 1;
  if (step && !step->is_undefined() && step->kind != Kind::kNone) {
    if (!integral(*step)) fail(line, "a slice step must be an integer");
    st = as_int(*step);
    if (st == 0) fail(line, "a slice step cannot be zero");
  }
  auto bound = [&](const Value* v, int64_t dflt) -> int64_t {
    if (!v || v->is_undefined() || v->kind == Kind::kNone) return dflt;
    if (!integral(*v)) fail(line, "slice indices must be integers");
    int64_t x = as_int(*v);
    if (x < 0) x += len;
    if (st > 0) return std::clamp<int64_t>(x, 0, len);
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : len - 1);
  const int64_t e = bound(stop, st > 0 ? len : -1);
  std::vector<size_t> out;
  if (st > 0) {
    for (int64_t k = b; k < e; k += st) out.push_back(static_cast<size_t>(k));
  } else {
    for (int64_t k = b; k > e; k += st) out.push_back(static_cast<size_t>(k));
  }
  return out;
}

// Python's text units of s with their byte offsets (unicode::next_unit: code points, ill-formed bytes opaque);
// starts has one more element than units, s.size().
struct Units {
  std::vector<uint32_t> units;
  std::vector<size_t> starts;
};
Units units_of(const std::string& s) {
  Units u;
  for (size_t i = 0; i < s.size();) {
    u.starts.push_back(i);
    u.units.push_back(unicode::next_unit(s, i));
  }
  u.starts.push_back(s.size());
  return u;
}

// str.strip/lstrip/rstrip: `chars` (a string: a set of code points) or, when absent or none, str.isspace().
std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  const bool whitespace = !chars || chars->kind == Kind::kNone || chars->is_undefined();
  if (!whitespace) set = units_of(chars->s).units;
  auto strip = [&](uint32_t unit) {
    return whitespace ? unicode::is_py_space(unit) : std::find(set.begin(), set.end(), unit) != set.end();
  };
  const Units u = units_of(s);
  size_t b = 0;
  size_t e = u.units.size();
  if (left) {
    while (b < e && strip(u.units[b])) ++b;
  }
  if (right) {
    while (e > b && strip(u.units[e - 1])) --e;
  }
  return s.substr(u.starts[b], u.starts[e] - u.starts[b]);
}

// jinja2's `title` filter (not str.title): words begin after runs of '-', whitespace, '(', '{', '[', '<' (its
// regex ([-\s({\[<]+)); each word's first character is upper-cased and the rest lowered, so "o'neil" -> "O'neil".
std::string jinja_title(const std::string& s) {
  const Units u = units_of(s);
  auto separator = [](uint32_t unit) {
    return unit == '-' || unit == '(' || unit == '{' || unit == '[' || unit == '<' || unicode::is_py_space(unit);
  };
  std::string out;
  size_t k = 0;
  while (k < u.units.size()) {
    size_t e = k;
    if (separator(u.units[k])) {
      while (e < u.units.size() && separator(u.units[e])) ++e;
      out.append(s, u.starts[k], u.starts[e] - u.starts[k]);
    } else {
      while (e < u.units.size() && !separator(u.units[e])) ++e;
      const std::string_view word(s.data() + u.starts[k], u.starts[e] - u.starts[k]);
      const size_t second = u.starts[k + 1] - u.starts[k];
      out += unicode::py_upper(word.substr(0, second));
      out += unicode::py_lower(word.substr(second));
    }
    k = e;
  }
  return out;
}

// str.split(): by `sep`, or when it is absent or none by runs of str.isspace() characters, ignoring them at the
// ends (after maxsplit splits the rest is one piece, its leading whitespace dropped and its trailing kept).
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  std::vector<std::string> out;
  if (!sep || sep->kind == Kind::kNone || sep->is_undefined()) {
    const Units u = units_of(s);
    const size_t n = u.units.size();
    size_t k = 0;
    while (k < n) {
      while (k < n && unicode::is_py_space(u.units[k])) ++k;
      if (k >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(s.substr(u.starts[k]));
        break;
      }
      size_t e = k;
      while (e < n && !unicode::is_py_space(u.units[e])) ++e;
      out.push_back(s.substr(u.starts[k], u.starts[e] - u.starts[k]));
      k = e;
    }
    return out;
  }
  if (sep->kind != Kind::kString) fail(line, "split: the separator must be a string");
  if (sep->s.empty()) fail(line, "split: empty separator");
  size_t k = 0;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t at = s.find(sep->s, k);
    if (at == std::string::npos) break;
    out.push_back(s.substr(k, at - k));
    k = at + sep->s.size();
  }
  out.push_back(s.substr(k));
  return out;
}

// str.splitlines() (without keepends): split at each of Python's line boundaries, \r\n counting as one; no
// empty last line after a final boundary.
std::vector<std::string> py_splitlines(const std::string& s) {
  const Units u = units_of(s);
  const size_t n = u.units.size();
  std::vector<std::string> out;
  size_t k = 0;
  while (k < n) {
    size_t e = k;
    while (e < n && !unicode::is_py_line_break(u.units[e])) ++e;
    out.push_back(s.substr(u.starts[k], u.starts[e] - u.starts[k]));
    if (e + 1 < n && u.units[e] == '\r' && u.units[e + 1] == '\n') ++e;
    k = e + 1;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                       size_t max_size, int line) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` around every code point
    const auto cps = code_points(s);
    for (const auto& cp : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += cp;
      if (out.size() > max_size) fail(line, "replace: result too large", Code::kResourceExhausted);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t k = 0;
  for (;;) {
    const size_t at = (count < 0 || done < count) ? s.find(from, k) : std::string::npos;
    if (at == std::string::npos) {
      out.append(s, k, std::string::npos);
      break;
    }
    out.append(s, k, at - k);
    out += to;
    ++done;
    k = at + from.size();
    if (out.size() > max_size) fail(line, "replace: result too large", Code::kResourceExhausted);
  }
  return out;
}

// ---- the renderer ----

struct Scope {
  std::map<std::string, Value, std::less<>> vars;
  Scope* parent = nullptr;
  Value* find(std::string_view name) {
    for (Scope* s = this; s != nullptr; s = s->parent) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  Renderer(const Program& program, Dict globals) : program_(program), limits_(program.limits) {
    for (auto& [k, v] : globals) globals_.vars[k] = std::move(v);
    for (const char* name : {"namespace", "range", "dict", "raise_exception", "strftime_now"}) {
      if (!globals_.vars.contains(name)) {
        Value fn;
        fn.kind = Kind::kMacro;
        fn.s = name;
        globals_.vars[name] = fn;
      }
    }
    top_.parent = &globals_;
  }

  std::string run() {
    std::string out;
    exec_body(program_.body, top_, out);
    return out;
  }

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  void step(int line) {
    if (++steps_ > limits_.max_steps) {
      fail(line,
           "the template ran past " + std::to_string(limits_.max_steps) +
               " evaluation steps (a runaway loop, or a conversation far larger than the template expects)",
           Code::kResourceExhausted);
    }
  }
  void emit(std::string& out, std::string_view text, int line) {
    if (out.size() + text.size() > limits_.max_output_bytes) {
      fail(line, "the rendered prompt would pass " + std::to_string(limits_.max_output_bytes) + " bytes",
           Code::kResourceExhausted);
    }
    out += text;
  }
  void check_size(size_t n, int line) const {
    if (n > limits_.max_value_size) {
      fail(line,
           "a value built by the template would hold " + std::to_string(n) + " bytes or items (limit " +
               std::to_string(limits_.max_value_size) + ")",
           Code::kResourceExhausted);
    }
  }

  // ---- statements ----

  Flow exec_body(const Body& body, Scope& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  void assign(Scope& scope, const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    if (v.kind != Kind::kList) fail(line, std::string("cannot unpack a ") + type_name(v) + " into several names");
    if (v.list->size() != targets.size()) {
      fail(line, "cannot unpack " + std::to_string(v.list->size()) + " values into " + std::to_string(targets.size()) +
                     " names");
    }
    for (size_t k = 0; k < targets.size(); ++k) scope.vars[targets[k]] = (*v.list)[k];
  }

  List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Kind::kUndefined:
        return {};
      case Kind::kList:
        return *v.list;
      case Kind::kDict: {
        List keys;
        for (const auto& m : *v.dict) keys.push_back(Value::string(m.first));
        return keys;
      }
      case Kind::kString: {
        List chars;
        for (auto& cp : code_points(v.s)) chars.push_back(Value::string(std::move(cp)));
        return chars;
      }
      default:
        fail(line, std::string("a ") + type_name(v) + " is not iterable");
    }
  }

  Flow exec(const Stmt& s, Scope& scope, std::string& out) {
    step(s.line);
    switch (s.kind) {
      case Stmt::Kind::kText:
        emit(out, s.text, s.line);
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        const Value v = eval(*s.expr, scope);
        emit(out, to_str(v), s.line);
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (truthy(eval(*cond, scope))) return exec_body(body, scope, out);
        }
        return exec_body(s.else_body, scope, out);
      case Stmt::Kind::kFor:
        return exec_for(s, scope, out);
      case Stmt::Kind::kSet:
        if (!s.attr.empty()) {
          Value* ns = scope.find(s.targets[0]);
          if (ns == nullptr || ns->kind != Kind::kNamespace) {
            fail(s.line, "{% set " + s.targets[0] + "." + s.attr + " %}: '" + s.targets[0] +
                             "' is not a namespace() (only a namespace's attributes can be assigned)");
          }
          Value v = eval(*s.expr, scope);
          for (auto& m : *ns->dict) {
            if (m.first == s.attr) {
              m.second = std::move(v);
              return Flow::kNormal;
            }
          }
          ns->dict->emplace_back(s.attr, std::move(v));
          return Flow::kNormal;
        }
        assign(scope, s.targets, eval(*s.expr, scope), s.line);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string text;
        exec_body(s.body, scope, text);
        check_size(text.size(), s.line);
        scope.vars[s.targets[0]] = Value::string(std::move(text));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: {
        Value m;
        m.kind = Kind::kMacro;
        m.macro = s.macro;
        scope.vars[s.macro->name] = std::move(m);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBlock:
        return exec_body(s.body, scope, out);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& s, Scope& scope, std::string& out) {
    const List all = iterate(eval(*s.expr, scope), s.line);
    List items;
    if (s.cond) {
      for (const auto& item : all) {
        step(s.line);
        Scope probe;
        probe.parent = &scope;
        assign(probe, s.targets, item, s.line);
        if (truthy(eval(*s.cond, probe))) items.push_back(item);
      }
    } else {
      items = all;
    }
    if (items.empty()) return exec_body(s.else_body, scope, out);
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      step(s.line);
      Scope iter;
      iter.parent = &scope;
      Dict loop{{"index", Value::integer(k + 1)},
                {"index0", Value::integer(k)},
                {"revindex", Value::integer(n - k)},
                {"revindex0", Value::integer(n - k - 1)},
                {"first", Value::boolean(k == 0)},
                {"last", Value::boolean(k == n - 1)},
                {"length", Value::integer(n)},
                {"depth", Value::integer(1)},
                {"depth0", Value::integer(0)},
                {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("loop.previtem")},
                {"nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("loop.nextitem")}};
      iter.vars["loop"] = Value::of_dict(std::move(loop));
      assign(iter, s.targets, items[static_cast<size_t>(k)], s.line);
      if (exec_body(s.body, iter, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // ---- expressions ----

  Value eval(const Expr& e, Scope& scope) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& item : e.items) items.push_back(eval(*item, scope));
        return Value::of_list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          const Value key = eval(*e.items[k], scope);
          if (key.kind != Kind::kString) fail(e.line, "dict literal keys must be strings here");
          Value val = eval(*e.items[k + 1], scope);
          auto it = std::find_if(d.begin(), d.end(), [&](const auto& m) { return m.first == key.s; });
          if (it != d.end()) {
            it->second = std::move(val);
          } else {
            d.emplace_back(key.s, std::move(val));
          }
        }
        return Value::of_dict(std::move(d));
      }
      case Expr::Kind::kGetAttr:
        return get_attr(eval(*e.items[0], scope), e.name, e.line, describe(*e.items[0]));
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.items[0], scope), eval(*e.items[1], scope), e.line, describe(*e.items[0]));
      case Expr::Kind::kSlice:
        return eval_slice(e, scope);
      case Expr::Kind::kCall:
        return eval_call(e, scope);
      case Expr::Kind::kFilter:
        return eval_filter(e, scope);
      case Expr::Kind::kTest: {
        const bool r = eval_test(e, scope);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.items[0], scope);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (!numeric(v)) fail(e.line, "unary " + e.name + " of a " + type_name(v));
        if (e.name == "+") return integral(v) ? Value::integer(as_int(v)) : v;
        if (integral(v)) {
          if (as_int(v) == INT64_MIN) fail(e.line, "integer overflow");
          return Value::integer(-as_int(v));
        }
        return Value::number(-v.f);
      }
      case Expr::Kind::kBinary:
        return binary(e.name, eval(*e.items[0], scope), eval(*e.items[1], scope), e.line);
      case Expr::Kind::kCompare: {
        const Value a = eval(*e.items[0], scope);
        const Value b = eval(*e.items[1], scope);
        if (e.name == "==") return Value::boolean(equals(a, b));
        if (e.name == "!=") return Value::boolean(!equals(a, b));
        if (e.name == "in") return Value::boolean(contains(b, a, e.line));
        if (e.name == "not in") return Value::boolean(!contains(b, a, e.line));
        const int c = order(a, b, e.line);
        if (e.name == "<") return Value::boolean(c < 0);
        if (e.name == "<=") return Value::boolean(c <= 0);
        if (e.name == ">") return Value::boolean(c > 0);
        return Value::boolean(c >= 0);
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.items[0], scope);
        return truthy(a) ? eval(*e.items[1], scope) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.items[0], scope);
        return truthy(a) ? a : eval(*e.items[1], scope);
      }
      case Expr::Kind::kCond:
        if (truthy(eval(*e.items[1], scope))) return eval(*e.items[0], scope);
        return e.items[2] ? eval(*e.items[2], scope) : Value::undefined();
    }
    return Value::undefined();
  }

  static std::string describe(const Expr& e) {
    if (e.kind == Expr::Kind::kName) return "'" + e.name + "'";
    if (e.kind == Expr::Kind::kGetAttr) return describe(*e.items[0]) + "." + e.name;
    return "the value";
  }

  bool contains(const Value& container, const Value& needle, int line) {
    switch (container.kind) {
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        if (needle.kind != Kind::kString) fail(line, "'in <string>' needs a string on the left");
        return container.s.find(needle.s) != std::string::npos;
      case Kind::kList:
        return std::any_of(container.list->begin(), container.list->end(),
                           [&](const Value& x) { return equals(x, needle); });
      case Kind::kDict:
      case Kind::kNamespace:
        return needle.kind == Kind::kString && dict_find(*container.dict, needle.s) != nullptr;
      default:
        fail(line, std::string("'in': a ") + type_name(container) + " is not a container");
    }
  }

  Value get_attr(const Value& obj, const std::string& name, int line, const std::string& what) {
    switch (obj.kind) {
      case Kind::kUndefined:
        fail(line, what + " is undefined" + (obj.s.empty() ? "" : " ('" + obj.s + "')") + ", so it has no attribute '" +
                       name + "'");
      case Kind::kDict:
      case Kind::kNamespace: {
        if (const Value* v = dict_find(*obj.dict, name)) return *v;
        return Value::undefined(name);
      }
      case Kind::kList:
        return Value::undefined(name);
      default:
        return Value::undefined(name);
    }
  }

  Value get_item(const Value& obj, const Value& key, int line, const std::string& what) {
    switch (obj.kind) {
      case Kind::kUndefined:
        fail(line, what + " is undefined" + (obj.s.empty() ? "" : " ('" + obj.s + "')") + ", so it cannot be indexed");
      case Kind::kDict:
      case Kind::kNamespace:
        if (key.kind == Kind::kString) {
          if (const Value* v = dict_find(*obj.dict, key.s)) return *v;
        }
        return Value::undefined(key.kind == Kind::kString ? key.s : "");
      case Kind::kList: {
        if (!integral(key)) return Value::undefined();
        int64_t k = as_int(key);
        const auto n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined();
        return (*obj.list)[static_cast<size_t>(k)];
      }
      case Kind::kString: {
        if (!integral(key)) return Value::undefined();
        const auto cps = code_points(obj.s);
        int64_t k = as_int(key);
        const auto n = static_cast<int64_t>(cps.size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined();
        return Value::string(cps[static_cast<size_t>(k)]);
      }
      default:
        return Value::undefined();
    }
  }

  Value eval_slice(const Expr& e, Scope& scope) {
    const Value obj = eval(*e.items[0], scope);
    Value parts[3];
    for (int k = 0; k < 3; ++k) {
      if (e.items[static_cast<size_t>(k) + 1]) parts[k] = eval(*e.items[static_cast<size_t>(k) + 1], scope);
    }
    if (obj.kind == Kind::kList) {
      const auto idx = slice_indices(static_cast<int64_t>(obj.list->size()), &parts[0], &parts[1], &parts[2], e.line);
      List out;
      out.reserve(idx.size());
      for (const size_t k : idx) out.push_back((*obj.list)[k]);
      return Value::of_list(std::move(out), obj.tuple);
    }
    if (obj.kind == Kind::kString) {
      const auto cps = code_points(obj.s);
      const auto idx = slice_indices(static_cast<int64_t>(cps.size()), &parts[0], &parts[1], &parts[2], e.line);
      std::string out;
      for (const size_t k : idx) out += cps[k];
      return Value::string(std::move(out));
    }
    if (obj.is_undefined()) fail(e.line, describe(*e.items[0]) + " is undefined, so it cannot be sliced");
    fail(e.line, std::string("a ") + type_name(obj) + " cannot be sliced");
  }

  Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") {
      std::string s = to_str(a) + to_str(b);
      check_size(s.size(), line);
      return Value::string(std::move(s));
    }
    if (a.is_undefined() || b.is_undefined()) {
      const Value& u = a.is_undefined() ? a : b;
      fail(line, "'" + op + "' with an undefined value" + (u.s.empty() ? "" : " ('" + u.s + "')"));
    }
    if (op == "+") {
      if (a.kind == Kind::kString && b.kind == Kind::kString) {
        check_size(a.s.size() + b.s.size(), line);
        return Value::string(a.s + b.s);
      }
      if (a.kind == Kind::kList && b.kind == Kind::kList) {
        check_size(a.list->size() + b.list->size(), line);
        List out = *a.list;
        out.insert(out.end(), b.list->begin(), b.list->end());
        return Value::of_list(std::move(out));
      }
    }
    if (op == "*" && ((a.kind == Kind::kString || a.kind == Kind::kList) && integral(b)))
      return repeat(a, as_int(b), line);
    if (op == "*" && ((b.kind == Kind::kString || b.kind == Kind::kList) && integral(a)))
      return repeat(b, as_int(a), line);
    if (op == "%" && a.kind == Kind::kString) fail(line, "string formatting with '%' is not supported");
    if (!numeric(a) || !numeric(b)) {
      fail(line, std::string("unsupported operand types for ") + op + ": " + type_name(a) + " and " + type_name(b));
    }
    if (op == "/") {
      if (as_double(b) == 0) fail(line, "division by zero");
      return Value::number(as_double(a) / as_double(b));
    }
    if (integral(a) && integral(b)) {
      const int64_t x = as_int(a);
      const int64_t y = as_int(b);
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::integer(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::integer(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::integer(r);
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail(line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail(line, "integer overflow");
        int64_t q = x / y;
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t acc = 1;
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(acc, x, &acc)) fail(line, "integer overflow");
          if (acc == 0 || acc == 1) break;
        }
        return Value::integer(acc);
      }
    }
    const double x = as_double(a);
    const double y = as_double(b);
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "**") return Value::number(std::pow(x, y));
    if (y == 0) fail(line, "float division or modulo by zero");
    const double q = std::floor(x / y);
    if (op == "//") return Value::number(q);
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::number(m);
  }

  Value repeat(const Value& v, int64_t n, int line) {
    if (n <= 0) return v.kind == Kind::kString ? Value::string("") : Value::of_list({});
    const size_t unit = v.kind == Kind::kString ? v.s.size() : v.list->size();
    if (unit != 0 && static_cast<uint64_t>(n) > limits_.max_value_size / unit)
      check_size(limits_.max_value_size + 1, line);
    if (v.kind == Kind::kString) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += v.s;
      return Value::string(std::move(out));
    }
    List out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), v.list->begin(), v.list->end());
    return Value::of_list(std::move(out));
  }

  // ---- calls ----

  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* get(size_t index, std::string_view name) const {
      for (const auto& [k, v] : kw) {
        if (k == name) return &v;
      }
      return index < pos.size() ? &pos[index] : nullptr;
    }
  };

  Args eval_args(const Expr& e, Scope& scope, size_t first) {
    Args a;
    for (size_t k = first; k < e.items.size(); ++k) a.pos.push_back(eval(*e.items[k], scope));
    for (const auto& [name, expr] : e.kwargs) a.kw.emplace_back(name, eval(*expr, scope));
    return a;
  }

  Value eval_call(const Expr& e, Scope& scope) {
    const Expr& callee = *e.items[0];
    if (callee.kind == Expr::Kind::kGetAttr) {
      const Value obj = eval(*callee.items[0], scope);
      if (obj.kind == Kind::kString || obj.kind == Kind::kDict) {
        return call_method(obj, callee.name, eval_args(e, scope, 1), e.line);
      }
      const Value fn = get_attr(obj, callee.name, e.line, describe(*callee.items[0]));
      if (fn.kind == Kind::kMacro) return call_value(fn, eval_args(e, scope, 1), e.line);
      fail(e.line, describe(callee) + " (a " + type_name(obj) + "'s '" + callee.name + "') is not callable");
    }
    const Value fn = eval(callee, scope);
    if (fn.kind != Kind::kMacro) {
      fail(e.line, describe(callee) + " is " + (fn.is_undefined() ? "undefined" : std::string("a ") + type_name(fn)) +
                       ", not something to call");
    }
    return call_value(fn, eval_args(e, scope, 1), e.line);
  }

  Value call_value(const Value& fn, const Args& args, int line) {
    if (fn.macro) return call_macro(*fn.macro, args, line);
    const std::string& name = fn.s;
    if (name == "raise_exception") {
      const Value* msg = args.get(0, "message");
      throw RenderError{Code::kInvalidArgument, line,
                        "the template raised an exception: " + (msg ? to_str(*msg) : std::string())};
    }
    if (name == "strftime_now") {
      const Value* fmt = args.get(0, "format");
      if (!fmt || fmt->kind != Kind::kString) fail(line, "strftime_now(format) needs a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
      return Value::string(std::string(buf, n));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (!args.pos.empty()) {
        if (args.pos.size() > 1 || args.pos[0].kind != Kind::kDict) fail(line, name + "() takes one dict and keywords");
        d = *args.pos[0].dict;
      }
      for (const auto& kw : args.kw) {
        auto it = std::find_if(d.begin(), d.end(), [&](const auto& m) { return m.first == kw.first; });
        if (it != d.end()) {
          it->second = kw.second;
        } else {
          d.emplace_back(kw.first, kw.second);
        }
      }
      Value out = Value::of_dict(std::move(d));
      if (name == "namespace") out.kind = Kind::kNamespace;
      return out;
    }
    if (name == "range") {
      int64_t start = 0;
      int64_t stop = 0;
      int64_t stepv = 1;
      for (const auto& a : args.pos) {
        if (!integral(a)) fail(line, "range() takes integers");
      }
      if (args.pos.size() == 1) {
        stop = as_int(args.pos[0]);
      } else if (args.pos.size() == 2 || args.pos.size() == 3) {
        start = as_int(args.pos[0]);
        stop = as_int(args.pos[1]);
        if (args.pos.size() == 3) stepv = as_int(args.pos[2]);
      } else {
        fail(line, "range() takes one to three integers");
      }
      if (stepv == 0) fail(line, "range() step cannot be zero");
      List out;
      for (int64_t k = start; stepv > 0 ? k < stop : k > stop; k += stepv) {
        if (out.size() >= 100000)
          fail(line, "range() is limited to 100000 items (jinja2's sandbox limit)", Code::kResourceExhausted);
        out.push_back(Value::integer(k));
      }
      return Value::of_list(std::move(out));
    }
    fail(line, "'" + name + "' is not callable");
  }

  Value call_macro(const Macro& m, const Args& args, int line) {
    if (++call_depth_ > limits_.max_call_depth) {
      fail(line, "macro calls nested deeper than " + std::to_string(limits_.max_call_depth) + " (runaway recursion?)",
           Code::kResourceExhausted);
    }
    if (args.pos.size() > m.params.size()) {
      fail(line, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments, given " +
                     std::to_string(args.pos.size()));
    }
    Scope frame;
    frame.parent = &top_;
    for (size_t k = 0; k < m.params.size(); ++k) {
      const Value* v = args.get(k, m.params[k]);
      if (v) {
        frame.vars[m.params[k]] = *v;
      } else if (m.defaults[k]) {
        frame.vars[m.params[k]] = eval(*m.defaults[k], frame);
      } else {
        frame.vars[m.params[k]] = Value::undefined(m.params[k]);
      }
    }
    for (const auto& [k, v] : args.kw) {
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end()) {
        fail(line, "macro '" + m.name + "' has no parameter '" + k + "'");
      }
    }
    std::string out;
    exec_body(m.body, frame, out);
    --call_depth_;
    check_size(out.size(), line);
    return Value::string(std::move(out));
  }

  Value call_method(const Value& obj, const std::string& name, const Args& args, int line) {
    if (obj.kind == Kind::kDict) {
      if (name == "items") {
        List out;
        for (const auto& [k, v] : *obj.dict) out.push_back(Value::of_list({Value::string(k), v}, true));
        return Value::of_list(std::move(out));
      }
      if (name == "keys") {
        List out;
        for (const auto& m : *obj.dict) out.push_back(Value::string(m.first));
        return Value::of_list(std::move(out));
      }
      if (name == "values") {
        List out;
        for (const auto& m : *obj.dict) out.push_back(m.second);
        return Value::of_list(std::move(out));
      }
      if (name == "get") {
        const Value* key = args.get(0, "key");
        const Value* dflt = args.get(1, "default");
        if (key && key->kind == Kind::kString) {
          if (const Value* v = dict_find(*obj.dict, key->s)) return *v;
        }
        return dflt ? *dflt : Value::none();
      }
      const Value v = get_attr(obj, name, line, "the dict");
      if (v.kind == Kind::kMacro) return call_value(v, args, line);
      fail(line, "a dict has no method '" + name + "'");
    }
    const std::string& s = obj.s;
    auto str_arg = [&](size_t k, std::string_view kw) -> const Value* {
      const Value* v = args.get(k, kw);
      if (v && v->kind != Kind::kString && v->kind != Kind::kNone) {
        fail(line, "str." + name + "(): argument must be a string, not a " + type_name(*v));
      }
      return v;
    };
    if (name == "strip") return Value::string(strip_chars(s, str_arg(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(strip_chars(s, str_arg(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(strip_chars(s, str_arg(0, "chars"), false, true));
    if (name == "upper") return Value::string(unicode::py_upper(s));
    if (name == "lower") return Value::string(unicode::py_lower(s));
    if (name == "title") return Value::string(unicode::py_title(s));
    if (name == "capitalize") return Value::string(unicode::py_capitalize(s));
    if (name == "startswith" || name == "endswith") {
      const Value* p = args.get(0, "prefix");
      if (!p) fail(line, "str." + name + "() needs an argument");
      List cands = p->kind == Kind::kList ? *p->list : List{*p};
      for (const auto& c : cands) {
        if (c.kind != Kind::kString) fail(line, "str." + name + "(): argument must be a string or a tuple of strings");
        if (name == "startswith" ? s.starts_with(c.s) : s.ends_with(c.s)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "split") {
      const Value* mx = args.get(1, "maxsplit");
      List out;
      for (auto& part : py_split(s, str_arg(0, "sep"), mx && integral(*mx) ? as_int(*mx) : -1, line)) {
        out.push_back(Value::string(std::move(part)));
      }
      return Value::of_list(std::move(out));
    }
    if (name == "splitlines") {
      List out;
      for (auto& l : py_splitlines(s)) out.push_back(Value::string(std::move(l)));
      return Value::of_list(std::move(out));
    }
    if (name == "replace") {
      const Value* a = str_arg(0, "old");
      const Value* b = str_arg(1, "new");
      const Value* c = args.get(2, "count");
      if (!a || !b || a->kind != Kind::kString || b->kind != Kind::kString)
        fail(line, "str.replace(old, new) needs two strings");
      return Value::string(
          py_replace(s, a->s, b->s, c && integral(*c) ? as_int(*c) : -1, limits_.max_value_size, line));
    }
    if (name == "find" || name == "count") {
      const Value* a = str_arg(0, "sub");
      if (!a || a->kind != Kind::kString) fail(line, "str." + name + "(sub) needs a string");
      if (name == "find") {
        const size_t at = s.find(a->s);
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(code_point_count(s.substr(0, at))));
      }
      if (a->s.empty()) return Value::integer(static_cast<int64_t>(code_point_count(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(a->s); at != std::string::npos; at = s.find(a->s, at + a->s.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value* items = args.get(0, "iterable");
      if (!items) fail(line, "str.join(iterable) needs an argument");
      std::string out;
      bool first = true;
      for (const auto& v : iterate(*items, line)) {
        if (v.kind != Kind::kString) fail(line, "str.join(): items must be strings");
        if (!first) out += s;
        first = false;
        out += v.s;
        check_size(out.size(), line);
      }
      return Value::string(std::move(out));
    }
    fail(line, "a string has no method '" + name + "'");
  }

  // ---- filters ----

  // attribute "a.b" as jinja2's make_attrgetter reads it (dots walk down; digits index lists).
  Value attr_path(const Value& v, const std::string& path, int line) {
    Value cur = v;
    size_t k = 0;
    while (k <= path.size()) {
      const size_t dot = path.find('.', k);
      const std::string part = path.substr(k, dot == std::string::npos ? std::string::npos : dot - k);
      if (cur.is_undefined()) return cur;
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      cur = digits ? get_item(cur, Value::integer(std::stoll(part)), line, "the item")
                   : get_item(cur, Value::string(part), line, "the item");
      if (dot == std::string::npos) break;
      k = dot + 1;
    }
    return cur;
  }

  Value eval_filter(const Expr& e, Scope& scope) {
    const Value v = eval(*e.items[0], scope);
    const Args args = eval_args(e, scope, 1);
    return apply_filter(e.name, v, args, e.line);
  }

  Value apply_filter(const std::string& name, const Value& v, const Args& args, int line) {
    auto need_string = [&](const char* filter) -> std::string {
      if (v.is_undefined()) return "";
      return to_str(v);
      (void)filter;
    };
    if (name == "safe" || name == "string") return v.kind == Kind::kString ? v : Value::string(to_str(v));
    if (name == "trim") {
      const Value* chars = args.get(0, "chars");
      return Value::string(strip_chars(need_string("trim"), chars, true, true));
    }
    if (name == "title") return Value::string(jinja_title(need_string("title")));
    if (name == "upper" || name == "lower" || name == "capitalize") {  // jinja2 calls the str methods
      Args none;
      return call_method(Value::string(need_string(name.c_str())), name, none, line);
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Kind::kUndefined:
          return Value::integer(0);
        case Kind::kString:
          return Value::integer(static_cast<int64_t>(code_point_count(v.s)));
        case Kind::kList:
          return Value::integer(static_cast<int64_t>(v.list->size()));
        case Kind::kDict:
        case Kind::kNamespace:
          return Value::integer(static_cast<int64_t>(v.dict->size()));
        default:
          fail(line, std::string("length of a ") + type_name(v));
      }
    }
    if (name == "default" || name == "d") {
      const Value* dflt = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      const bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      if (use) return dflt ? *dflt : Value::string("");
      return v;
    }
    if (name == "tojson") {
      JsonStyle st;
      const Value* indent = args.get(1, "indent");
      if (const Value* ea = args.get(0, "ensure_ascii"); ea && truthy(*ea)) {
        fail(line, "tojson(ensure_ascii=True) is not supported (transformers' default is False)");
      }
      if (indent && indent->kind != Kind::kNone) {
        st.indent = true;
        if (integral(*indent)) {
          st.indent_unit = std::string(static_cast<size_t>(std::clamp<int64_t>(as_int(*indent), 0, 64)), ' ');
        } else if (indent->kind == Kind::kString) {
          st.indent_unit = indent->s;
        } else {
          fail(line, "tojson(indent=...) takes an integer or a string");
        }
        st.item_sep = ",";
      }
      if (const Value* seps = args.get(2, "separators"); seps && seps->kind != Kind::kNone) {
        if (seps->kind != Kind::kList || seps->list->size() != 2 || (*seps->list)[0].kind != Kind::kString ||
            (*seps->list)[1].kind != Kind::kString) {
          fail(line, "tojson(separators=...) takes a pair of strings");
        }
        st.item_sep = (*seps->list)[0].s;
        st.key_sep = (*seps->list)[1].s;
      }
      if (const Value* sk = args.get(3, "sort_keys")) st.sort_keys = truthy(*sk);
      std::string out;
      to_json(v, st, 0, out, line);
      check_size(out.size(), line);
      return Value::string(std::move(out));
    }
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      const Value* attr = args.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& item : iterate(v, line)) {
        if (!first && sep) out += to_str(*sep);
        first = false;
        out += to_str(attr ? attr_path(item, to_str(*attr), line) : item);
        check_size(out.size(), line);
      }
      return Value::string(std::move(out));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::of_list({});
      if (!v.is_mapping()) fail(line, std::string("items: a ") + type_name(v) + " is not a mapping");
      Args none;
      Value d = v;
      d.kind = Kind::kDict;
      return call_method(d, "items", none, line);
    }
    if (name == "list") return Value::of_list(iterate(v, line));
    if (name == "first" || name == "last") {
      const List items = iterate(v, line);
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.kind == Kind::kString) {
        auto cps = code_points(v.s);
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value::string(std::move(out));
      }
      List items = iterate(v, line);
      std::reverse(items.begin(), items.end());
      return Value::of_list(std::move(items));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name.ends_with("attr");
      const bool keep_if = name.starts_with("select");
      const size_t first_arg = by_attr ? 1 : 0;
      if (by_attr && (args.pos.empty() || args.pos[0].kind != Kind::kString)) {
        fail(line, name + " needs an attribute name");
      }
      List out;
      for (const auto& item : iterate(v, line)) {
        step(line);
        const Value subject = by_attr ? attr_path(item, args.pos[0].s, line) : item;
        bool r = false;
        if (args.pos.size() <= first_arg) {
          r = truthy(subject);
        } else {
          if (args.pos[first_arg].kind != Kind::kString) fail(line, name + ": the test must be named by a string");
          std::vector<Value> test_args(args.pos.begin() + static_cast<std::ptrdiff_t>(first_arg) + 1, args.pos.end());
          r = run_test(args.pos[first_arg].s, subject, test_args, line);
        }
        if (r == keep_if) out.push_back(item);
      }
      return Value::of_list(std::move(out));
    }
    if (name == "map") {
      List out;
      const Value* attr = args.get(99, "attribute");
      for (const auto& item : iterate(v, line)) {
        step(line);
        if (attr) {
          Value x = attr_path(item, to_str(*attr), line);
          if (x.is_undefined()) {
            if (const Value* dflt = args.get(99, "default")) x = *dflt;
          }
          out.push_back(std::move(x));
        } else {
          if (args.pos.empty() || args.pos[0].kind != Kind::kString)
            fail(line, "map needs a filter name or attribute=");
          const std::string& f = args.pos[0].s;
          if (f == "map" || f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
            fail(line, "map('" + f + "') is not supported");
          }
          Args rest;
          rest.pos.assign(args.pos.begin() + 1, args.pos.end());
          rest.kw = args.kw;
          out.push_back(apply_filter(f, item, rest, line));
        }
      }
      return Value::of_list(std::move(out));
    }
    if (name == "int") {
      const Value* dflt = args.get(0, "default");
      const Value fallback = dflt ? *dflt : Value::integer(0);
      if (integral(v)) return Value::integer(as_int(v));
      if (v.kind == Kind::kFloat) {
        if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return fallback;
        return Value::integer(static_cast<int64_t>(v.f));
      }
      if (v.kind == Kind::kString) {
        const std::string t = strip_chars(v.s, nullptr, true, true);
        int64_t x = 0;
        const auto r = std::from_chars(t.data(), t.data() + t.size(), x);
        if (r.ec == std::errc() && r.ptr == t.data() + t.size() && !t.empty()) return Value::integer(x);
        double d = 0;
        const auto rf = std::from_chars(t.data(), t.data() + t.size(), d);
        if (rf.ec == std::errc() && rf.ptr == t.data() + t.size() && !t.empty() && std::fabs(d) < 9.2e18) {
          return Value::integer(static_cast<int64_t>(d));
        }
      }
      return fallback;
    }
    if (name == "float") {
      const Value* dflt = args.get(0, "default");
      if (numeric(v)) return Value::number(as_double(v));
      if (v.kind == Kind::kString) {
        const std::string t = strip_chars(v.s, nullptr, true, true);
        double d = 0;
        const auto r = std::from_chars(t.data(), t.data() + t.size(), d);
        if (r.ec == std::errc() && r.ptr == t.data() + t.size() && !t.empty()) return Value::number(d);
      }
      return dflt ? *dflt : Value::number(0);
    }
    if (name == "abs") {
      if (!numeric(v)) fail(line, std::string("abs of a ") + type_name(v));
      if (integral(v)) {
        if (as_int(v) == INT64_MIN) fail(line, "integer overflow");
        return Value::integer(std::llabs(as_int(v)));
      }
      return Value::number(std::fabs(v.f));
    }
    if (name == "replace") {
      const Value* a = args.get(0, "old");
      const Value* b = args.get(1, "new");
      const Value* c = args.get(2, "count");
      if (!a || !b) fail(line, "replace(old, new) needs two arguments");
      return Value::string(py_replace(need_string("replace"), to_str(*a), to_str(*b),
                                      c && integral(*c) ? as_int(*c) : -1, limits_.max_value_size, line));
    }
    if (name == "indent") {
      const Value* width = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      std::string unit = "    ";
      if (width)
        unit = width->kind == Kind::kString
                   ? width->s
                   : std::string(static_cast<size_t>(std::clamp<int64_t>(as_int(*width), 0, 256)), ' ');
      const std::vector<std::string> lines = py_splitlines(need_string("indent") + "\n");  // as jinja2 does
      std::string out;
      if (blank && truthy(*blank)) {
        for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + unit : "") + lines[k];
      } else {
        out = lines.empty() ? "" : lines[0];
        for (size_t k = 1; k < lines.size(); ++k) out += "\n" + (lines[k].empty() ? "" : unit) + lines[k];
      }
      if (first && truthy(*first)) out = unit + out;
      check_size(out.size(), line);
      return Value::string(std::move(out));
    }
    if (name == "sort" || name == "unique") {
      const Value* rev = args.get(0, "reverse");
      const Value* cs = args.get(name == "sort" ? 1 : 0, "case_sensitive");
      const Value* attr = args.get(name == "sort" ? 2 : 1, "attribute");
      const bool case_sensitive = cs && truthy(*cs);
      List items = iterate(v, line);
      auto key = [&](const Value& x) {
        Value k = attr ? attr_path(x, to_str(*attr), line) : x;
        if (!case_sensitive && k.kind == Kind::kString) {
          k.s = unicode::py_lower(k.s);  // jinja2's ignore_case: str.lower()
        }
        return k;
      };
      if (name == "sort") {
        std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
          const int c = order(key(a), key(b), line);
          return rev && truthy(*rev) ? c > 0 : c < 0;
        });
        return Value::of_list(std::move(items));
      }
      List out;
      List seen;
      for (const auto& x : items) {
        const Value k = key(x);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return Value::of_list(std::move(out));
    }
    if (name == "sum") {
      const Value* attr = args.get(0, "attribute");
      const Value* start = args.get(1, "start");
      Value acc = start ? *start : Value::integer(0);
      for (const auto& x : iterate(v, line)) acc = binary("+", acc, attr ? attr_path(x, to_str(*attr), line) : x, line);
      return acc;
    }
    if (name == "wordcount") {
      int64_t n = 0;
      bool in_word = false;
      for (const char c : need_string("wordcount")) {
        const bool w = ascii_alpha(c) || (c >= '0' && c <= '9') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::integer(n);
    }
    fail(line, "the filter '" + name + "' is not supported");
  }

  // ---- tests ----

  bool eval_test(const Expr& e, Scope& scope) {
    const Value v = eval(*e.items[0], scope);
    const Args args = eval_args(e, scope, 1);
    return run_test(e.name, v, args.pos, e.line);
  }

  bool run_test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
    auto arg = [&]() -> const Value& {
      if (args.empty()) fail(line, "the test '" + name + "' needs an argument");
      return args[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "string") return v.kind == Kind::kString;
    if (name == "mapping") return v.is_mapping();
    if (name == "iterable") {
      return v.kind == Kind::kUndefined || v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict;
    }
    if (name == "sequence") return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict;
    if (name == "number") return numeric(v);
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "float") return v.kind == Kind::kFloat;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.b;
    if (name == "false") return v.kind == Kind::kBool && !v.b;
    if (name == "callable") return v.kind == Kind::kMacro;
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
    if (name == "ne") return !equals(v, arg());
    if (name == "lt") return order(v, arg(), line) < 0;
    if (name == "le") return order(v, arg(), line) <= 0;
    if (name == "gt") return order(v, arg(), line) > 0;
    if (name == "ge") return order(v, arg(), line) >= 0;
    if (name == "in") return contains(arg(), v, line);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.kind != o.kind) return false;
      if (v.kind == Kind::kNone || v.kind == Kind::kUndefined) return true;
      if (v.kind == Kind::kBool) return v.b == o.b;
      if (v.kind == Kind::kList) return v.list == o.list;
      if (v.kind == Kind::kDict || v.kind == Kind::kNamespace) return v.dict == o.dict;
      return equals(v, o);
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (!integral(v)) fail(line, "the test '" + name + "' needs an integer");
      const int64_t x = as_int(v);
      if (name == "odd") return x % 2 != 0;
      if (name == "even") return x % 2 == 0;
      const Value& d = arg();
      if (!integral(d) || as_int(d) == 0) fail(line, "divisibleby needs a non-zero integer");
      return x % as_int(d) == 0;
    }
    if (name == "lower" || name == "upper") {
      if (v.kind != Kind::kString) return false;
      bool cased = false;
      for (const char c : v.s) {
        if (ascii_alpha(c)) {
          cased = true;
          if (name == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
        }
      }
      return cased;
    }
    fail(line, "the test '" + name + "' is not supported");
  }

  const Program& program_;
  Limits limits_;
  Scope globals_;
  Scope top_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace jinja_eval

Result<std::string> render_program(const Program& program, Dict globals) {
  try {
    jinja_eval::Renderer r(program, std::move(globals));
    return r.run();
  } catch (const jinja_eval::RenderError& e) {
    return error(e.code, program.name + " line " + std::to_string(e.line) + ": " + e.message);
  }
}

}  // namespace mc::text::jinja::detail
