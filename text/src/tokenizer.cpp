// Tokenizers read from a Hugging Face tokenizer.json (mc/text/tokenizer.hpp; DESIGN.md §15, "Tokenizers").
//
// Load turns the file's components into flat lists (Sequences are flattened) of small tagged structs; encode runs
// added-token splitting -> normalizers -> pre-tokenizers -> BPE -> post-processor, decode runs the decoders over
// the ids' strings. BPE merges a word with a min-heap of adjacent pairs keyed (rank, position), so a word of n
// symbols costs O(n log n); words up to kCacheWordBytes are cached (bounded, sharded, locked).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "mc/text/tokenizer.hpp"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "unicode.hpp"

namespace mc::text {
namespace tok {

using json = nlohmann::json;

inline constexpr size_t kMaxFileBytes = size_t{256} << 20;
inline constexpr size_t kMaxVocab = size_t{1} << 22;
inline constexpr size_t kMaxMerges = size_t{1} << 22;
inline constexpr uint64_t kMaxId = (uint64_t{1} << 24) - 1;
inline constexpr size_t kMaxTokenBytes = 1024;
inline constexpr size_t kMaxAddedTokens = 65536;
inline constexpr size_t kMaxPatternBytes = 4096;
inline constexpr int kMaxDepth = 16;
inline constexpr size_t kCacheWordBytes = 64;
inline constexpr size_t kCacheShards = 16;
inline constexpr size_t kCacheEntriesPerShard = 4096;

// ---------------------------------------------------------------------------------------------------- regexes

// A PCRE2 pattern compiled once and shared by every thread (pcre2_code is read-only at match time); each thread
// has its own match data and JIT stack.
class Regex {
 public:
  static Result<std::shared_ptr<const Regex>> compile(const std::string& pattern, const std::string& what) {
    if (pattern.size() > kMaxPatternBytes)
      return error(Code::kInvalidArgument, what + ": a regex of " + std::to_string(pattern.size()) +
                                               " bytes (at most " + std::to_string(kMaxPatternBytes) + ")");
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return error(Code::kInvalidArgument, what + ": regex " + json(pattern).dump() + " does not compile at offset " +
                                               std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
    }
    auto r = std::shared_ptr<Regex>(new Regex());
    r->code_ = code;
    r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return std::shared_ptr<const Regex>(std::move(r));
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for each non-empty match, left to right, in valid UTF-8 `s`. A matching error (a PCRE2
  // resource limit) ends the scan: the rest of `s` is then left unmatched.
  template <typename F>
  void for_each(std::string_view s, F&& f) const {
    Scratch& sc = scratch();
    size_t pos = 0;
    while (pos < s.size()) {
      const int rc =
          pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, sc.md, sc.ctx);
      if (rc < 0) break;  // PCRE2_ERROR_NOMATCH or a limit
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
      const size_t b = ov[0], e = ov[1];
      if (e <= b) {  // an empty match: step one code point
        pos = b + 1;
        while (pos < s.size() && (static_cast<uint8_t>(s[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      f(b, e);
      pos = e;
    }
  }

 private:
  Regex() = default;
  struct Scratch {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* ctx = nullptr;
    pcre2_jit_stack* stack = nullptr;
    Scratch() {
      md = pcre2_match_data_create(32, nullptr);
      ctx = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
      if (ctx != nullptr && stack != nullptr) pcre2_jit_stack_assign(ctx, nullptr, stack);
    }
    ~Scratch() {
      pcre2_match_data_free(md);
      pcre2_match_context_free(ctx);
      pcre2_jit_stack_free(stack);
    }
  };
  static Scratch& scratch() {
    thread_local Scratch s;
    return s;
  }
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// A Split/Replace pattern: {"String": s} (literal) or {"Regex": r}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;
  template <typename F>
  void for_each(std::string_view s, F&& f) const {
    if (regex) {
      regex->for_each(s, f);
      return;
    }
    if (literal.empty()) return;
    for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, p + literal.size()))
      f(p, p + literal.size());
  }
  std::string replace_all(std::string_view s, std::string_view content) const {
    std::string out;
    size_t last = 0;
    for_each(s, [&](size_t b, size_t e) {
      out.append(s.substr(last, b - last));
      out.append(content);
      last = e;
    });
    out.append(s.substr(last));
    return out;
  }
};

// --------------------------------------------------------------------------------------------- the components

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Normalizer {
  enum Kind { kNfc, kPrepend, kReplace, kLowercase, kStrip } kind;
  std::string text;  // Prepend: the prefix; Replace: the content
  Pattern pattern;   // Replace
  bool left = false, right = false;
};

struct PreTokenizer {
  enum Kind { kByteLevel, kSplit, kMetaspace, kDigits } kind;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel
  Pattern pattern;                // Split
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  std::string replacement;  // Metaspace
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;
  bool individual_digits = false;  // Digits
};

struct Decoder {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  Pattern pattern;             // Replace
  std::string text;            // Replace: content; Metaspace: replacement; Strip: content
  bool prepend = true;         // Metaspace: strip the first token's leading space
  size_t start = 0, stop = 0;  // Strip
};

struct TemplateItem {
  bool is_sequence = false;
  std::vector<uint32_t> ids;  // a special token's ids
};

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

// GPT-2's byte -> printable code point map (bytes 33-126, 161-172, 174-255 are themselves; the rest 256+n).
struct ByteAlphabet {
  std::array<std::string, 256> to_char;
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteAlphabet() {
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = self ? b : 256 + n++;
      unicode::append_utf8(to_char[b], cp);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// ------------------------------------------------------------------------------------------------------- BPE

struct Bpe {
  std::unordered_map<std::string, uint32_t, SvHash, std::equal_to<>> vocab;
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> rank and merged id
  bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
  std::optional<uint32_t> unk;
  std::array<int64_t, 256> byte_ids{};  // <0xXX> tokens (-1: absent)

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<uint32_t>, SvHash, std::equal_to<>> map;
  };
  mutable std::array<CacheShard, kCacheShards> cache;

  static uint64_t key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

  void encode_word(std::string_view word, std::vector<uint32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      if (auto it = vocab.find(word); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    CacheShard* shard = nullptr;
    if (word.size() <= kCacheWordBytes) {
      shard = &cache[SvHash{}(word) % kCacheShards];
      std::lock_guard<std::mutex> lock(shard->mu);
      if (auto it = shard->map.find(word); it != shard->map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out.size();
    merge_word(word, out);
    if (shard != nullptr) {
      std::vector<uint32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      std::lock_guard<std::mutex> lock(shard->mu);
      if (shard->map.size() >= kCacheEntriesPerShard) shard->map.clear();
      shard->map.emplace(std::string(word), std::move(ids));
    }
  }

  void merge_word(std::string_view word, std::vector<uint32_t>& out) const {
    // Symbols: one per character (or per byte for byte fallback), as a doubly linked list over a vector.
    std::vector<uint32_t> id;
    id.reserve(word.size());
    bool last_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t b = i;
      unicode::next_cp(word, i);
      const std::string_view ch = word.substr(b, i - b);
      if (auto it = vocab.find(ch); it != vocab.end()) {
        id.push_back(it->second);
        last_unk = false;
        continue;
      }
      if (byte_fallback &&
          std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_ids[static_cast<uint8_t>(c)] >= 0; })) {
        for (char c : ch) id.push_back(static_cast<uint32_t>(byte_ids[static_cast<uint8_t>(c)]));
        last_unk = false;
        continue;
      }
      if (unk) {
        if (!(fuse_unk && last_unk)) id.push_back(*unk);
        last_unk = true;
      }  // no unk token: the character is dropped (Hugging Face does the same)
    }
    const size_t n = id.size();
    if (n > 1 && !merges.empty()) {
      std::vector<int64_t> prev(n), next(n);
      std::vector<bool> alive(n, true);
      for (size_t i = 0; i < n; ++i) {
        prev[i] = static_cast<int64_t>(i) - 1;
        next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
      }
      struct Cand {
        uint32_t rank;
        uint32_t pos;
        uint32_t left, right;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
      };
      std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
      const auto push = [&](int64_t a) {
        if (a < 0 || next[static_cast<size_t>(a)] < 0) return;
        const uint32_t l = id[static_cast<size_t>(a)], r = id[static_cast<size_t>(next[static_cast<size_t>(a)])];
        if (auto it = merges.find(key(l, r)); it != merges.end())
          heap.push({it->second.rank, static_cast<uint32_t>(a), l, r});
      };
      for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
      while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        const size_t a = c.pos;
        if (!alive[a] || next[a] < 0) continue;
        const auto b = static_cast<size_t>(next[a]);
        if (id[a] != c.left || id[b] != c.right) continue;  // stale: a neighbour merged since
        id[a] = merges.find(key(c.left, c.right))->second.id;
        alive[b] = false;
        next[a] = next[b];
        if (next[b] >= 0) prev[static_cast<size_t>(next[b])] = static_cast<int64_t>(a);
        push(prev[a]);
        push(static_cast<int64_t>(a));
      }
      for (int64_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) out.push_back(id[static_cast<size_t>(i)]);
      return;
    }
    out.insert(out.end(), id.begin(), id.end());
  }
};

}  // namespace tok

// -------------------------------------------------------------------------------------------- the tokenizer

struct TokenizerImpl {
  std::string source;
  tok::Bpe bpe;
  std::vector<tok::Normalizer> normalizers;
  std::vector<tok::PreTokenizer> pre_tokenizers;
  std::vector<tok::Decoder> decoders;
  std::vector<std::vector<tok::TemplateItem>> post;  // TemplateProcessing "single" templates, applied in order
  std::vector<tok::AddedToken> added;
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // indices into added, longest content first
  std::vector<std::string> token_of;                         // id -> string (vocab and added tokens)
  std::vector<uint8_t> has_token, special;                   // by id
  std::unordered_map<std::string, uint32_t, tok::SvHash, std::equal_to<>> added_ids;
  int64_t vocab_size = 0;
  std::optional<uint32_t> bos;
  bool split_before_metaspace = false;  // see encode_segment

  void encode(std::string_view text, bool add_special, bool parse_special, std::vector<uint32_t>& out) const;
  void encode_segment(std::string_view seg, bool at_start, std::vector<uint32_t>& out) const;
  std::string decode(std::span<const uint32_t> ids, bool skip_special) const;
  std::string token_bytes(uint32_t id) const;  // Tokenizer::token_bytes
  // The raw bytes of the incomplete UTF-8 character decode(ids, skip_special) ends with ("" when it ends with none),
  // and in *replacements how many U+FFFD decode shows for them.
  std::string incomplete_tail(std::span<const uint32_t> ids, bool skip_special, size_t* replacements) const;
};

namespace tok {

// ---------------------------------------------------------------------------------------------------- loading

// A first pass over the file that builds nothing: refuses, before the document is built, an array or object of
// more than kMaxVocab entries or nesting deeper than 64 (so a hostile file cannot make the parse hold much more
// than the file itself).
class ShapeGuard : public nlohmann::json_sax<json> {
 public:
  std::string problem;
  bool null() override { return count(); }
  bool boolean(bool) override { return count(); }
  bool number_integer(number_integer_t) override { return count(); }
  bool number_unsigned(number_unsigned_t) override { return count(); }
  bool number_float(number_float_t, const string_t&) override { return count(); }
  bool string(string_t&) override { return count(); }
  bool binary(binary_t&) override { return count(); }
  bool key(string_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception&) override {
    if (problem.empty()) problem = "not valid JSON (at byte " + std::to_string(pos) + ")";
    return false;
  }

 private:
  bool count() {
    if (counts_.empty() || ++counts_.back() <= kMaxVocab) return true;
    problem = "an array or object of more than " + std::to_string(kMaxVocab) + " entries (at most " +
              std::to_string(kMaxVocab) + " vocabulary entries or merges)";
    return false;
  }
  bool open() {
    if (!count()) return false;
    if (counts_.size() >= 64) {
      problem = "JSON nested more than 64 deep";
      return false;
    }
    counts_.push_back(0);
    return true;
  }
  bool close() {
    counts_.pop_back();
    return true;
  }
  std::vector<size_t> counts_;
};

class Loader {
 public:
  explicit Loader(std::string source) : src_(std::move(source)) {}

  Status fail(Code code, const std::string& field, const std::string& what) const {
    return error(code, src_ + ": " + field + ": " + what);
  }
  Status unsupported(const std::string& field, const std::string& type) const {
    return fail(Code::kUnimplemented, field,
                "type " + json(type).dump() +
                    " is not supported by mc_text (see mc/text/tokenizer.hpp for what is); this tokenizer cannot be "
                    "used");
  }

  // Typed field access: absent or null -> fallback; present with the wrong type -> error.
  Status get_bool(const json& o, const char* k, const std::string& where, bool* v) const {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) return Status::ok();
    if (!it->is_boolean()) return fail(Code::kInvalidArgument, where + "." + k, "must be true or false");
    *v = it->get<bool>();
    return Status::ok();
  }
  Status get_string(const json& o, const char* k, const std::string& where, std::string* v, bool required) const {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) {
      if (required) return fail(Code::kInvalidArgument, where + "." + k, "missing (a string is required)");
      return Status::ok();
    }
    if (!it->is_string()) return fail(Code::kInvalidArgument, where + "." + k, "must be a string");
    *v = it->get<std::string>();
    return Status::ok();
  }
  Status get_uint(const json& o, const char* k, const std::string& where, uint64_t* v, uint64_t max) const {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) return Status::ok();
    if (!it->is_number_unsigned() || it->get<uint64_t>() > max)
      return fail(Code::kInvalidArgument, where + "." + k, "must be an integer from 0 to " + std::to_string(max));
    *v = it->get<uint64_t>();
    return Status::ok();
  }
  Status get_type(const json& o, const std::string& where, std::string* type) const {
    if (!o.is_object()) return fail(Code::kInvalidArgument, where, "must be an object or null");
    return get_string(o, "type", where, type, true);
  }

  Status pattern(const json& o, const std::string& where, Pattern* p) const {
    if (!o.is_object()) return fail(Code::kInvalidArgument, where, "must be {\"String\": ...} or {\"Regex\": ...}");
    if (auto it = o.find("String"); it != o.end() && it->is_string()) {
      p->literal = it->get<std::string>();
      return Status::ok();
    }
    if (auto it = o.find("Regex"); it != o.end() && it->is_string()) {
      auto r = Regex::compile(it->get<std::string>(), src_ + ": " + where);
      if (!r) return r.status();
      p->regex = *r;
      return Status::ok();
    }
    return fail(Code::kInvalidArgument, where, "must be {\"String\": ...} or {\"Regex\": ...}");
  }

  Status normalizer(const json& o, const std::string& where, int depth, std::vector<Normalizer>* out) const {
    if (o.is_null()) return Status::ok();
    if (depth > kMaxDepth) return fail(Code::kInvalidArgument, where, "nested more than 16 deep");
    std::string type;
    if (Status s = get_type(o, where, &type); !s) return s;
    if (type == "Sequence") {
      auto it = o.find("normalizers");
      if (it == o.end() || !it->is_array())
        return fail(Code::kInvalidArgument, where + ".normalizers", "must be an array");
      for (size_t i = 0; i < it->size(); ++i)
        if (Status s = normalizer((*it)[i], where + ".normalizers[" + std::to_string(i) + "]", depth + 1, out); !s)
          return s;
      return Status::ok();
    }
    Normalizer n{};
    if (type == "NFC") {
      n.kind = Normalizer::kNfc;
    } else if (type == "Lowercase") {
      n.kind = Normalizer::kLowercase;
    } else if (type == "Prepend") {
      n.kind = Normalizer::kPrepend;
      if (Status s = get_string(o, "prepend", where, &n.text, true); !s) return s;
    } else if (type == "Replace") {
      n.kind = Normalizer::kReplace;
      if (Status s = get_string(o, "content", where, &n.text, true); !s) return s;
      auto it = o.find("pattern");
      if (it == o.end()) return fail(Code::kInvalidArgument, where + ".pattern", "missing");
      if (Status s = pattern(*it, where + ".pattern", &n.pattern); !s) return s;
    } else if (type == "Strip") {
      n.kind = Normalizer::kStrip;
      n.left = n.right = true;
      if (Status s = get_bool(o, "strip_left", where, &n.left); !s) return s;
      if (Status s = get_bool(o, "strip_right", where, &n.right); !s) return s;
    } else {
      return unsupported(where, type);
    }
    out->push_back(std::move(n));
    return Status::ok();
  }

  Status behavior(const json& o, const std::string& where, Behavior* b) const {
    std::string name = "Isolated";
    if (Status s = get_string(o, "behavior", where, &name, false); !s) return s;
    static const std::pair<const char*, Behavior> kNames[] = {{"Removed", Behavior::kRemoved},
                                                              {"Isolated", Behavior::kIsolated},
                                                              {"MergedWithPrevious", Behavior::kMergedWithPrevious},
                                                              {"MergedWithNext", Behavior::kMergedWithNext},
                                                              {"Contiguous", Behavior::kContiguous}};
    for (const auto& [n, v] : kNames)
      if (name == n) {
        *b = v;
        return Status::ok();
      }
    return fail(Code::kUnimplemented, where + ".behavior", "unknown behavior " + json(name).dump());
  }

  Status pre_tokenizer(const json& o, const std::string& where, int depth, std::vector<PreTokenizer>* out) const {
    if (o.is_null()) return Status::ok();
    if (depth > kMaxDepth) return fail(Code::kInvalidArgument, where, "nested more than 16 deep");
    std::string type;
    if (Status s = get_type(o, where, &type); !s) return s;
    if (type == "Sequence") {
      auto it = o.find("pretokenizers");
      if (it == o.end() || !it->is_array())
        return fail(Code::kInvalidArgument, where + ".pretokenizers", "must be an array");
      for (size_t i = 0; i < it->size(); ++i)
        if (Status s = pre_tokenizer((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]", depth + 1, out); !s)
          return s;
      return Status::ok();
    }
    PreTokenizer p{};
    if (type == "ByteLevel") {
      p.kind = PreTokenizer::kByteLevel;
      p.add_prefix_space = false;
      p.use_regex = true;
      if (Status s = get_bool(o, "add_prefix_space", where, &p.add_prefix_space); !s) return s;
      if (Status s = get_bool(o, "use_regex", where, &p.use_regex); !s) return s;
      if (p.use_regex) {
        auto r = Regex::compile(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                                src_ + ": " + where);
        if (!r) return r.status();
        p.pattern.regex = *r;
      }
    } else if (type == "Split") {
      p.kind = PreTokenizer::kSplit;
      auto it = o.find("pattern");
      if (it == o.end()) return fail(Code::kInvalidArgument, where + ".pattern", "missing");
      if (Status s = pattern(*it, where + ".pattern", &p.pattern); !s) return s;
      if (Status s = behavior(o, where, &p.behavior); !s) return s;
      if (Status s = get_bool(o, "invert", where, &p.invert); !s) return s;
    } else if (type == "Whitespace" || type == "WhitespaceSplit") {
      p.kind = PreTokenizer::kSplit;
      const bool ws = type == "Whitespace";
      auto r = Regex::compile(ws ? R"(\w+|[^\w\s]+)" : R"(\s+)", src_ + ": " + where);
      if (!r) return r.status();
      p.pattern.regex = *r;
      p.behavior = Behavior::kRemoved;
      p.invert = ws;
    } else if (type == "Metaspace") {
      p.kind = PreTokenizer::kMetaspace;
      p.replacement = "\xE2\x96\x81";
      if (Status s = get_string(o, "replacement", where, &p.replacement, false); !s) return s;
      if (p.replacement.empty() || p.replacement.size() > 4)
        return fail(Code::kInvalidArgument, where + ".replacement", "must be one character");
      if (Status s = get_bool(o, "split", where, &p.split); !s) return s;
      std::string scheme;
      bool legacy_add = true;
      if (Status s = get_bool(o, "add_prefix_space", where, &legacy_add); !s) return s;
      if (Status s = get_string(o, "prepend_scheme", where, &scheme, false); !s) return s;
      if (scheme.empty()) {
        p.prepend = legacy_add ? PreTokenizer::kAlways : PreTokenizer::kNever;
      } else if (scheme == "always") {
        p.prepend = PreTokenizer::kAlways;
      } else if (scheme == "first") {
        p.prepend = PreTokenizer::kFirst;
      } else if (scheme == "never") {
        p.prepend = PreTokenizer::kNever;
      } else {
        return fail(Code::kInvalidArgument, where + ".prepend_scheme", "must be first, always or never");
      }
    } else if (type == "Digits") {
      p.kind = PreTokenizer::kDigits;
      if (Status s = get_bool(o, "individual_digits", where, &p.individual_digits); !s) return s;
    } else {
      return unsupported(where, type);
    }
    out->push_back(std::move(p));
    return Status::ok();
  }

  Status decoder(const json& o, const std::string& where, int depth, std::vector<Decoder>* out) const {
    if (o.is_null()) return Status::ok();
    if (depth > kMaxDepth) return fail(Code::kInvalidArgument, where, "nested more than 16 deep");
    std::string type;
    if (Status s = get_type(o, where, &type); !s) return s;
    if (type == "Sequence") {
      auto it = o.find("decoders");
      if (it == o.end() || !it->is_array())
        return fail(Code::kInvalidArgument, where + ".decoders", "must be an array");
      for (size_t i = 0; i < it->size(); ++i)
        if (Status s = decoder((*it)[i], where + ".decoders[" + std::to_string(i) + "]", depth + 1, out); !s) return s;
      return Status::ok();
    }
    Decoder d{};
    if (type == "ByteLevel") {
      d.kind = Decoder::kByteLevel;
    } else if (type == "ByteFallback") {
      d.kind = Decoder::kByteFallback;
    } else if (type == "Fuse") {
      d.kind = Decoder::kFuse;
    } else if (type == "Replace") {
      d.kind = Decoder::kReplace;
      if (Status s = get_string(o, "content", where, &d.text, true); !s) return s;
      auto it = o.find("pattern");
      if (it == o.end()) return fail(Code::kInvalidArgument, where + ".pattern", "missing");
      if (Status s = pattern(*it, where + ".pattern", &d.pattern); !s) return s;
    } else if (type == "Strip") {
      d.kind = Decoder::kStrip;
      uint64_t start = 0, stop = 0;
      if (Status s = get_string(o, "content", where, &d.text, true); !s) return s;
      if (Status s = get_uint(o, "start", where, &start, 1024); !s) return s;
      if (Status s = get_uint(o, "stop", where, &stop, 1024); !s) return s;
      d.start = start;
      d.stop = stop;
    } else if (type == "Metaspace") {
      d.kind = Decoder::kMetaspace;
      d.text = "\xE2\x96\x81";
      if (Status s = get_string(o, "replacement", where, &d.text, false); !s) return s;
      std::string scheme;
      bool legacy_add = true;
      if (Status s = get_bool(o, "add_prefix_space", where, &legacy_add); !s) return s;
      if (Status s = get_string(o, "prepend_scheme", where, &scheme, false); !s) return s;
      d.prepend = scheme.empty() ? legacy_add : scheme != "never";
    } else {
      return unsupported(where, type);
    }
    out->push_back(std::move(d));
    return Status::ok();
  }

  Status post_processor(const json& o, const std::string& where, int depth, TokenizerImpl* t) const {
    if (o.is_null()) return Status::ok();
    if (depth > kMaxDepth) return fail(Code::kInvalidArgument, where, "nested more than 16 deep");
    std::string type;
    if (Status s = get_type(o, where, &type); !s) return s;
    if (type == "Sequence") {
      auto it = o.find("processors");
      if (it == o.end() || !it->is_array())
        return fail(Code::kInvalidArgument, where + ".processors", "must be an array");
      for (size_t i = 0; i < it->size(); ++i)
        if (Status s = post_processor((*it)[i], where + ".processors[" + std::to_string(i) + "]", depth + 1, t); !s)
          return s;
      return Status::ok();
    }
    if (type == "ByteLevel") return Status::ok();  // offsets only: the ids are unchanged
    if (type != "TemplateProcessing") return unsupported(where, type);
    auto single = o.find("single");
    if (single == o.end() || !single->is_array() || single->size() > 64)
      return fail(Code::kInvalidArgument, where + ".single", "must be an array of at most 64 items");
    auto specials = o.find("special_tokens");
    std::vector<TemplateItem> items;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& it = (*single)[i];
      const std::string w = where + ".single[" + std::to_string(i) + "]";
      if (!it.is_object()) return fail(Code::kInvalidArgument, w, "must be an object");
      TemplateItem item;
      if (it.contains("Sequence")) {
        item.is_sequence = true;
      } else if (auto sp = it.find("SpecialToken"); sp != it.end() && sp->is_object()) {
        std::string name;
        if (Status s = get_string(*sp, "id", w + ".SpecialToken", &name, true); !s) return s;
        const json* entry = nullptr;
        if (specials != o.end() && specials->is_object()) {
          auto e = specials->find(name);
          if (e != specials->end()) entry = &*e;
        }
        if (entry != nullptr && entry->is_object() && entry->contains("ids") && (*entry)["ids"].is_array()) {
          for (const json& id : (*entry)["ids"]) {
            if (!id.is_number_unsigned() || id.get<uint64_t>() > kMaxId)
              return fail(Code::kInvalidArgument, where + ".special_tokens." + name + ".ids", "must be token ids");
            item.ids.push_back(static_cast<uint32_t>(id.get<uint64_t>()));
          }
        } else if (auto id = t->added_ids.find(name); id != t->added_ids.end()) {
          item.ids.push_back(id->second);
        } else if (auto v = t->bpe.vocab.find(name); v != t->bpe.vocab.end()) {
          item.ids.push_back(v->second);
        } else {
          return fail(
              Code::kInvalidArgument, w,
              "names special token " + json(name).dump() + " found neither in special_tokens nor in the vocabulary");
        }
      } else {
        return fail(Code::kInvalidArgument, w, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
      items.push_back(std::move(item));
    }
    if (!t->bos && !items.empty() && !items.front().is_sequence && !items.front().ids.empty())
      t->bos = items.front().ids.front();
    t->post.push_back(std::move(items));
    return Status::ok();
  }

  Status add_id(TokenizerImpl* t, uint32_t id, const std::string& token) const {
    if (id >= t->token_of.size()) {
      t->token_of.resize(id + 1);
      t->has_token.resize(id + 1, 0);
      t->special.resize(id + 1, 0);
    }
    if (!t->has_token[id]) t->token_of[id] = token;
    t->has_token[id] = 1;
    return Status::ok();
  }

  Status model(const json& o, TokenizerImpl* t) const {
    std::string type;
    if (!o.is_object()) return fail(Code::kInvalidArgument, "model", "missing (an object is required)");
    if (Status s = get_string(o, "type", "model", &type, false); !s) return s;
    if (type.empty() && o.contains("merges")) type = "BPE";
    if (type != "BPE") return unsupported("model", type);
    Bpe& b = t->bpe;
    double dropout = 0;
    if (auto it = o.find("dropout"); it != o.end() && !it->is_null()) {
      if (!it->is_number()) return fail(Code::kInvalidArgument, "model.dropout", "must be a number or null");
      dropout = it->get<double>();
    }
    if (dropout > 0)
      return fail(Code::kUnimplemented, "model.dropout", "BPE dropout (a training-time option) is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      std::string v;
      if (Status s = get_string(o, k, "model", &v, false); !s) return s;
      if (!v.empty()) return fail(Code::kUnimplemented, std::string("model.") + k, "is not supported (must be null)");
    }
    if (Status s = get_bool(o, "byte_fallback", "model", &b.byte_fallback); !s) return s;
    if (Status s = get_bool(o, "ignore_merges", "model", &b.ignore_merges); !s) return s;
    if (Status s = get_bool(o, "fuse_unk", "model", &b.fuse_unk); !s) return s;
    auto vocab = o.find("vocab");
    if (vocab == o.end() || !vocab->is_object())
      return fail(Code::kInvalidArgument, "model.vocab", "missing (an object of token -> id is required)");
    if (vocab->size() > kMaxVocab)
      return fail(Code::kInvalidArgument, "model.vocab",
                  std::to_string(vocab->size()) + " entries (at most " + std::to_string(kMaxVocab) + ")");
    b.vocab.reserve(vocab->size());
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
      if (!it.value().is_number_unsigned() || it.value().get<uint64_t>() > kMaxId)
        return fail(Code::kInvalidArgument, "model.vocab." + it.key(),
                    "must be an id from 0 to " + std::to_string(kMaxId));
      if (it.key().size() > kMaxTokenBytes || it.key().empty() || !unicode::is_valid_utf8(it.key()))
        return fail(Code::kInvalidArgument, "model.vocab",
                    "a token must be 1 to 1024 bytes of UTF-8 (one is " + std::to_string(it.key().size()) + " bytes)");
      const auto id = static_cast<uint32_t>(it.value().get<uint64_t>());
      b.vocab.emplace(it.key(), id);
      if (Status s = add_id(t, id, it.key()); !s) return s;
    }
    b.byte_ids.fill(-1);
    for (int i = 0; i < 256; ++i) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", i);
      if (auto it = b.vocab.find(std::string_view(name)); it != b.vocab.end())
        b.byte_ids[static_cast<size_t>(i)] = it->second;
    }
    if (b.byte_fallback && std::any_of(b.byte_ids.begin(), b.byte_ids.end(), [](int64_t v) { return v < 0; }))
      return fail(Code::kInvalidArgument, "model.byte_fallback",
                  "is true but the vocabulary lacks some of the 256 byte tokens <0x00>..<0xFF>");
    std::string unk;
    if (Status s = get_string(o, "unk_token", "model", &unk, false); !s) return s;
    if (!unk.empty()) {
      auto it = b.vocab.find(unk);
      if (it == b.vocab.end())
        return fail(Code::kInvalidArgument, "model.unk_token", json(unk).dump() + " is not in the vocabulary");
      b.unk = it->second;
    }
    auto merges = o.find("merges");
    if (merges != o.end() && !merges->is_null()) {
      if (!merges->is_array()) return fail(Code::kInvalidArgument, "model.merges", "must be an array");
      if (merges->size() > kMaxMerges)
        return fail(Code::kInvalidArgument, "model.merges",
                    std::to_string(merges->size()) + " entries (at most " + std::to_string(kMaxMerges) + ")");
      b.merges.reserve(merges->size());
      for (size_t r = 0; r < merges->size(); ++r) {
        const json& m = (*merges)[r];
        std::string left, right;
        if (m.is_string()) {
          const std::string& s = m.get_ref<const std::string&>();
          const size_t sp = s.find(' ');
          if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
            return fail(Code::kInvalidArgument, "model.merges[" + std::to_string(r) + "]",
                        json(s).dump() + " is not two tokens separated by one space");
          left = s.substr(0, sp);
          right = s.substr(sp + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
          left = m[0].get<std::string>();
          right = m[1].get<std::string>();
        } else {
          return fail(Code::kInvalidArgument, "model.merges[" + std::to_string(r) + "]",
                      "must be \"a b\" or [\"a\", \"b\"]");
        }
        auto l = b.vocab.find(left), rr = b.vocab.find(right), lr = b.vocab.find(left + right);
        if (l == b.vocab.end() || rr == b.vocab.end() || lr == b.vocab.end()) {
          const std::string& missing = l == b.vocab.end() ? left : rr == b.vocab.end() ? right : left + right;
          return fail(Code::kInvalidArgument, "model.merges[" + std::to_string(r) + "]",
                      "names token " + json(missing).dump() + ", which is not in model.vocab (a broken file?)");
        }
        b.merges.emplace(Bpe::key(l->second, rr->second), Bpe::Merge{static_cast<uint32_t>(r), lr->second});
      }
    }
    return Status::ok();
  }

  Status added_tokens(const json& root, TokenizerImpl* t) const {
    auto list = root.find("added_tokens");
    if (list == root.end() || list->is_null()) return Status::ok();
    if (!list->is_array()) return fail(Code::kInvalidArgument, "added_tokens", "must be an array");
    if (list->size() > kMaxAddedTokens)
      return fail(Code::kInvalidArgument, "added_tokens", std::to_string(list->size()) + " entries (at most 65536)");
    for (size_t i = 0; i < list->size(); ++i) {
      const json& o = (*list)[i];
      const std::string w = "added_tokens[" + std::to_string(i) + "]";
      if (!o.is_object()) return fail(Code::kInvalidArgument, w, "must be an object");
      AddedToken a;
      uint64_t id = 0;
      if (!o.contains("id")) return fail(Code::kInvalidArgument, w + ".id", "missing");
      if (Status s = get_uint(o, "id", w, &id, kMaxId); !s) return s;
      if (Status s = get_string(o, "content", w, &a.content, true); !s) return s;
      if (a.content.empty() || a.content.size() > kMaxTokenBytes || !unicode::is_valid_utf8(a.content))
        return fail(Code::kInvalidArgument, w + ".content", "must be 1 to 1024 bytes of UTF-8");
      if (Status s = get_bool(o, "special", w, &a.special); !s) return s;
      if (Status s = get_bool(o, "lstrip", w, &a.lstrip); !s) return s;
      if (Status s = get_bool(o, "rstrip", w, &a.rstrip); !s) return s;
      if (Status s = get_bool(o, "single_word", w, &a.single_word); !s) return s;
      a.id = static_cast<uint32_t>(id);
      if (Status s = add_id(t, a.id, a.content); !s) return s;
      t->token_of[a.id] = a.content;
      t->special[a.id] = a.special ? 1 : 0;
      t->added_ids[a.content] = a.id;
      t->added.push_back(std::move(a));
    }
    for (size_t i = 0; i < t->added.size(); ++i)
      t->added_by_first_byte[static_cast<uint8_t>(t->added[i].content[0])].push_back(i);
    for (auto& v : t->added_by_first_byte)
      std::stable_sort(v.begin(), v.end(),
                       [&](size_t x, size_t y) { return t->added[x].content.size() > t->added[y].content.size(); });
    return Status::ok();
  }

  Result<std::shared_ptr<TokenizerImpl>> load(std::string_view text) const {
    if (text.size() > kMaxFileBytes)
      return fail(Code::kInvalidArgument, "file", std::to_string(text.size()) + " bytes (at most 256 MiB)");
    ShapeGuard guard;
    if (!json::sax_parse(text.begin(), text.end(), &guard, nlohmann::detail::input_format_t::json, /*strict=*/true))
      return error(Code::kInvalidArgument, src_ + ": " +
                                               (guard.problem.empty() ? std::string("not valid JSON") : guard.problem) +
                                               " (is this a Hugging Face tokenizer.json?)");
    json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded())
      return error(Code::kInvalidArgument, src_ + ": not valid JSON (is this a Hugging Face tokenizer.json?)");
    if (!root.is_object())
      return error(Code::kInvalidArgument, src_ + ": not a JSON object (is this a Hugging Face tokenizer.json?)");
    auto t = std::make_shared<TokenizerImpl>();
    t->source = src_;
    auto model_it = root.find("model");
    if (model_it == root.end()) return fail(Code::kInvalidArgument, "model", "missing (is this a tokenizer.json?)");
    if (Status s = model(*model_it, t.get()); !s) return s;
    if (Status s = added_tokens(root, t.get()); !s) return s;
    static const json kNull;
    const auto field = [&](const char* k) -> const json& {
      auto it = root.find(k);
      return it == root.end() ? kNull : *it;
    };
    if (Status s = normalizer(field("normalizer"), "normalizer", 0, &t->normalizers); !s) return s;
    if (Status s = pre_tokenizer(field("pre_tokenizer"), "pre_tokenizer", 0, &t->pre_tokenizers); !s) return s;
    if (Status s = decoder(field("decoder"), "decoder", 0, &t->decoders); !s) return s;
    if (Status s = post_processor(field("post_processor"), "post_processor", 0, t.get()); !s) return s;
    t->vocab_size = static_cast<int64_t>(t->token_of.size());
    if (t->pre_tokenizers.empty() && t->bpe.vocab.count(std::string_view("\xE2\x96\x81")) != 0) {
      t->split_before_metaspace = std::none_of(t->bpe.vocab.begin(), t->bpe.vocab.end(), [](const auto& e) {
        const std::string& k = e.first;
        for (size_t p = k.find("\xE2\x96\x81", 1); p != std::string::npos; p = k.find("\xE2\x96\x81", p + 3))
          if (p < 3 || k.compare(p - 3, 3, "\xE2\x96\x81") != 0) return true;  // a character, then U+2581
        return false;
      });
    }
    if (!t->bos) {
      for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"})
        if (auto it = t->added_ids.find(std::string_view(name)); it != t->added_ids.end()) {
          t->bos = it->second;
          break;
        }
    }
    return t;
  }

 private:
  std::string src_;
};

// -------------------------------------------------------------------------------------------- pre-tokenizing

// Splits `s` by the matches of `p` according to `behavior` (and `invert`), calling emit(begin, end) for each
// non-empty piece in order. Streams: one range of lookahead, nothing materialized.
template <typename Emit>
void split_by(const Pattern& p, Behavior behavior, bool invert, std::string_view s, Emit&& emit) {
  struct Range {
    size_t b, e;
    bool match;
  };
  Range pending{0, 0, false};
  bool has = false;
  const auto out = [&](const Range& r) {
    if (r.e > r.b) emit(r.b, r.e);
  };
  const auto feed = [&](Range r) {
    if (r.e <= r.b) return;
    if (invert) r.match = !r.match;
    switch (behavior) {
      case Behavior::kRemoved:
        if (!r.match) out(r);
        return;
      case Behavior::kIsolated:
        out(r);
        return;
      case Behavior::kMergedWithPrevious:
        if (r.match && has && !pending.match) {
          pending.e = r.e;
          pending.match = true;
          return;
        }
        break;
      case Behavior::kMergedWithNext:
        if (has && pending.match) {
          pending.e = r.e;
          pending.match = r.match;
          return;
        }
        break;
      case Behavior::kContiguous:
        if (r.match && has && pending.match) {
          pending.e = r.e;
          return;
        }
        break;
    }
    if (has) out(pending);
    pending = r;
    has = true;
  };
  size_t last = 0;
  p.for_each(s, [&](size_t b, size_t e) {
    feed({last, b, false});
    feed({b, e, true});
    last = e;
  });
  feed({last, s.size(), false});
  if (has) out(pending);
}

// Runs pre-tokenizers k.. over `text`, calling word(piece) for each final piece (the BPE model's words).
template <typename Word>
void pre_tokenize(const std::vector<PreTokenizer>& steps, size_t k, std::string_view text, bool first, Word& word) {
  if (text.empty()) return;
  if (k == steps.size()) {
    word(text);
    return;
  }
  const PreTokenizer& p = steps[k];
  const auto next = [&](std::string_view piece, bool f) { pre_tokenize(steps, k + 1, piece, f, word); };
  switch (p.kind) {
    case PreTokenizer::kSplit:
      split_by(p.pattern, p.behavior, p.invert, text,
               [&](size_t b, size_t e) { next(text.substr(b, e - b), first && b == 0); });
      return;
    case PreTokenizer::kByteLevel: {
      const ByteAlphabet& alpha = byte_alphabet();
      std::string prefixed;
      std::string_view t = text;
      if (p.add_prefix_space && t[0] != ' ') {
        prefixed = " ";
        prefixed += t;
        t = prefixed;
      }
      std::string mapped;
      const auto map_piece = [&](std::string_view piece, bool f) {
        mapped.clear();
        for (char c : piece) mapped += alpha.to_char[static_cast<uint8_t>(c)];
        next(mapped, f);
      };
      if (p.use_regex)
        split_by(p.pattern, Behavior::kIsolated, false, t,
                 [&](size_t b, size_t e) { map_piece(t.substr(b, e - b), first && b == 0); });
      else
        map_piece(t, first);
      return;
    }
    case PreTokenizer::kMetaspace: {
      std::string t;
      t.reserve(text.size() + 8);
      for (char c : text) {
        if (c == ' ')
          t += p.replacement;
        else
          t.push_back(c);
      }
      const bool prepend = p.prepend == PreTokenizer::kAlways || (p.prepend == PreTokenizer::kFirst && first);
      if (prepend && t.compare(0, p.replacement.size(), p.replacement) != 0) t.insert(0, p.replacement);
      if (!p.split) {
        next(t, first);
        return;
      }
      const std::string_view tv = t;
      size_t start = 0;
      for (size_t pos = tv.find(p.replacement, 1); pos != std::string_view::npos;
           pos = tv.find(p.replacement, pos + 1)) {
        if (pos > start) next(tv.substr(start, pos - start), first && start == 0);
        start = pos;
      }
      if (start < tv.size()) next(tv.substr(start), first && start == 0);
      return;
    }
    case PreTokenizer::kDigits:
      for (size_t i = 0; i < text.size();) {
        const auto digit = [&](size_t j) { return text[j] >= '0' && text[j] <= '9'; };
        const bool d = digit(i);
        size_t j = i + 1;
        if (d && !p.individual_digits)
          while (j < text.size() && digit(j)) ++j;
        if (!d)
          while (j < text.size() && !digit(j)) ++j;
        next(text.substr(i, j - i), first && i == 0);
        i = j;
      }
      return;
  }
}

std::string apply_normalizer(const Normalizer& n, std::string s) {
  switch (n.kind) {
    case Normalizer::kNfc:
      return unicode::nfc(s);
    case Normalizer::kLowercase:
      return unicode::lowercase(s);
    case Normalizer::kPrepend:
      return s.empty() ? s : n.text + s;
    case Normalizer::kReplace:
      return n.pattern.replace_all(s, n.text);
    case Normalizer::kStrip: {
      size_t b = 0, e = s.size();
      if (n.left)
        while (b < e) {
          size_t i = b;
          if (!unicode::is_space(unicode::next_cp(s, i))) break;
          b = i;
        }
      if (n.right)
        while (e > b) {
          size_t i = unicode::prev_cp_start(s, e), j = i;
          if (!unicode::is_space(unicode::next_cp(s, j))) break;
          e = i;
        }
      return s.substr(b, e - b);
    }
  }
  return s;
}

bool is_word_byte(char c) {
  const auto u = static_cast<uint8_t>(c);
  return u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

size_t skip_space_forward(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t j = i;
    if (!unicode::is_space(unicode::next_cp(s, j))) break;
    i = j;
  }
  return i;
}

size_t skip_space_backward(std::string_view s, size_t begin, size_t e) {
  while (e > begin) {
    size_t i = unicode::prev_cp_start(s, e), j = i;
    if (!unicode::is_space(unicode::next_cp(s, j))) break;
    e = i;
  }
  return e;
}

// ------------------------------------------------------------------------------------------------- decoding

// A byte-level token's bytes: each character back through GPT-2's byte map; the token itself (as decode keeps it)
// when a character is outside the map. `t` is valid UTF-8 (a vocabulary string).
std::string byte_level_bytes(const std::string& t) {
  const ByteAlphabet& alpha = byte_alphabet();
  std::string b;
  for (size_t i = 0; i < t.size();) {
    auto it = alpha.to_byte.find(unicode::next_cp(t, i));
    if (it == alpha.to_byte.end()) return t;
    b.push_back(static_cast<char>(it->second));
  }
  return b;
}

// The byte a byte-fallback token <0xNN> stands for, or -1 when `t` is not one.
int byte_token_value(std::string_view t) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>' || hex(t[3]) < 0 || hex(t[4]) < 0) return -1;
  return hex(t[3]) * 16 + hex(t[4]);
}

// The Metaspace decoder on one token: each `replacement` becomes a space.
std::string metaspace_to_spaces(const std::string& t, const std::string& replacement) {
  std::string r;
  for (size_t p = 0; p < t.size();) {
    if (!replacement.empty() && t.compare(p, replacement.size(), replacement) == 0) {
      r.push_back(' ');
      p += replacement.size();
    } else {
      r.push_back(t[p++]);
    }
  }
  return r;
}

void apply_decoder(const Decoder& d, std::vector<std::string>& toks) {
  switch (d.kind) {
    case Decoder::kByteLevel: {
      std::string bytes;
      for (const auto& t : toks) bytes += byte_level_bytes(t);
      toks.assign(1, unicode::repair_utf8(bytes));
      break;
    }
    case Decoder::kMetaspace:
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string r = metaspace_to_spaces(toks[i], d.text);
        if (i == 0 && d.prepend && !r.empty() && r[0] == ' ') r.erase(0, 1);
        toks[i] = std::move(r);
      }
      break;
    case Decoder::kReplace:
      for (auto& t : toks)
        if (d.pattern.regex || t.find(d.pattern.literal) != std::string::npos) t = d.pattern.replace_all(t, d.text);
      break;
    case Decoder::kByteFallback: {
      std::vector<std::string> out;
      out.reserve(toks.size());
      std::string bytes;
      const auto flush = [&] {
        if (bytes.empty()) return;
        // Valid characters are kept and each byte that is not part of one becomes U+FFFD (as SentencePiece does;
        // Hugging Face turns the whole run into U+FFFDs when any of it is ill-formed). So text already decoded
        // never changes when more bytes come, which DecodeStream relies on.
        std::string text;
        for (size_t i = 0; i < bytes.size();) {
          const size_t len = unicode::utf8_sequence(bytes, i, nullptr);
          if (len > 0) {
            text.append(bytes, i, len);
            i += len;
          } else {
            text += "\xEF\xBF\xBD";
            ++i;
          }
        }
        out.push_back(std::move(text));
        bytes.clear();
      };
      for (auto& t : toks) {
        if (const int byte = byte_token_value(t); byte >= 0) {
          bytes.push_back(static_cast<char>(byte));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      toks = std::move(out);
      break;
    }
    case Decoder::kFuse: {
      std::string all;
      size_t n = 0;
      for (const auto& t : toks) n += t.size();
      all.reserve(n);
      for (const auto& t : toks) all += t;
      toks.clear();
      toks.push_back(std::move(all));
      break;
    }
    case Decoder::kStrip:
      for (auto& t : toks) {
        size_t b = 0, e = t.size();
        for (size_t k = 0; k < d.start && !d.text.empty() && t.compare(b, d.text.size(), d.text) == 0 && b < e; ++k)
          b += d.text.size();
        for (size_t k = 0; k < d.stop && !d.text.empty() && e >= b + d.text.size() &&
                           t.compare(e - d.text.size(), d.text.size(), d.text) == 0;
             ++k)
          e -= d.text.size();
        if (b > 0 || e < t.size()) t = t.substr(b, e - b);
      }
      break;
  }
}

}  // namespace tok

void TokenizerImpl::encode_segment(std::string_view seg, bool at_start, std::vector<uint32_t>& out) const {
  std::string s(seg);
  for (const auto& n : normalizers) s = tok::apply_normalizer(n, std::move(s));
  if (s.empty()) return;
  auto word = [&](std::string_view w) { bpe.encode_word(w, out); };
  if (!pre_tokenizers.empty() || !split_before_metaspace) {
    tok::pre_tokenize(pre_tokenizers, 0, s, at_start, word);
    return;
  }
  // No pre-tokenizer (Llama 2 style): the segment is one word. No token holds a character followed by U+2581, so
  // no merge crosses such a point: encoding the pieces cut before each U+2581 that follows another character gives
  // the same ids, in O(piece) each and through the word cache.
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  const std::string_view v = s;
  size_t start = 0;
  for (size_t pos = v.find(kMeta, 1); pos != std::string_view::npos; pos = v.find(kMeta, pos + kMeta.size())) {
    if (pos >= kMeta.size() && v.compare(pos - kMeta.size(), kMeta.size(), kMeta) == 0) continue;
    word(v.substr(start, pos - start));
    start = pos;
  }
  word(v.substr(start));
}

void TokenizerImpl::encode(std::string_view raw, bool add_special, bool parse_special,
                           std::vector<uint32_t>& out) const {
  const std::string text = unicode::repair_utf8(raw);
  const std::string_view s = text;
  std::vector<uint32_t> ids;
  size_t seg = 0;  // the start of the text not yet encoded
  size_t i = 0;
  while (i < s.size()) {
    const auto& cands = added_by_first_byte[static_cast<uint8_t>(s[i])];
    const tok::AddedToken* hit = nullptr;
    for (size_t k : cands) {
      const tok::AddedToken& a = added[k];
      if (a.special && !parse_special) continue;
      if (s.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word && ((i > 0 && tok::is_word_byte(s[i - 1])) ||
                            (i + a.content.size() < s.size() && tok::is_word_byte(s[i + a.content.size()]))))
        continue;
      hit = &a;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    const size_t seg_end = hit->lstrip ? tok::skip_space_backward(s, seg, i) : i;
    if (seg_end > seg) encode_segment(s.substr(seg, seg_end - seg), seg == 0, ids);
    ids.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) i = tok::skip_space_forward(s, i);
    seg = i;
  }
  if (seg < s.size()) encode_segment(s.substr(seg), seg == 0, ids);
  if (!add_special || post.empty()) {
    out = std::move(ids);
    return;
  }
  for (const auto& tmpl : post) {
    std::vector<uint32_t> next;
    next.reserve(ids.size() + 4);
    for (const auto& item : tmpl) {
      if (item.is_sequence)
        next.insert(next.end(), ids.begin(), ids.end());
      else
        next.insert(next.end(), item.ids.begin(), item.ids.end());
    }
    ids = std::move(next);
  }
  out = std::move(ids);
}

std::string TokenizerImpl::decode(std::span<const uint32_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id >= token_of.size() || !has_token[id]) continue;
    if (skip_special && special[id]) continue;
    toks.push_back(token_of[id]);
  }
  for (const auto& d : decoders) tok::apply_decoder(d, toks);
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

std::string TokenizerImpl::token_bytes(uint32_t id) const {
  if (id >= token_of.size() || !has_token[id]) return "";
  const std::string& token = token_of[id];
  if (auto it = added_ids.find(token); it != added_ids.end() && it->second == id) return token;
  std::string s = token;
  for (const auto& d : decoders) {
    switch (d.kind) {
      case tok::Decoder::kByteLevel:
        // The map applies to the vocabulary's (valid UTF-8) string only: once a decoder made raw bytes, decode's
        // ByteLevel would see the repaired text instead, which a single token's bytes cannot stand for.
        if (unicode::is_valid_utf8(s)) s = tok::byte_level_bytes(s);
        break;
      case tok::Decoder::kMetaspace:
        s = tok::metaspace_to_spaces(s, d.text);
        break;
      case tok::Decoder::kReplace:
        if (!d.pattern.regex || unicode::is_valid_utf8(s)) s = d.pattern.replace_all(s, d.text);
        break;
      case tok::Decoder::kByteFallback:
        if (const int byte = tok::byte_token_value(s); byte >= 0) s.assign(1, static_cast<char>(byte));
        break;
      case tok::Decoder::kFuse:   // joins tokens: nothing to do for one
      case tok::Decoder::kStrip:  // depends on the token's position in the text
        break;
    }
  }
  return s;
}

std::string TokenizerImpl::incomplete_tail(std::span<const uint32_t> ids, bool skip_special,
                                           size_t* replacements) const {
  *replacements = 0;
  // An incomplete character is at most 3 bytes: the last tokens' own bytes are enough (ids decode skips add none).
  std::string bytes;
  for (size_t k = ids.size(); k > 0 && bytes.size() < 3; --k) {
    const uint32_t id = ids[k - 1];
    if (skip_special && id < special.size() && special[id]) continue;
    bytes.insert(0, token_bytes(id));
  }
  // The last lead byte within the last 3 bytes: a proper prefix of a well-formed sequence is incomplete.
  for (size_t n = 1; n <= 3 && n <= bytes.size(); ++n) {
    const auto lead = static_cast<uint8_t>(bytes[bytes.size() - n]);
    if ((lead & 0xC0) == 0x80) continue;
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need <= n) return "";
    std::string tail = bytes.substr(bytes.size() - n);
    bool prefix = lead >= 0xC2 && lead <= 0xF4;
    if (prefix && n >= 2) {  // the second byte's range depends on the lead; later ones are any continuation byte
      std::string padded = tail;
      padded.append(need - n, '\x80');
      prefix = unicode::utf8_sequence(padded, 0, nullptr) == need;
    }
    if (!prefix) return "";
    // ByteLevel repairs the incomplete character as one maximal ill-formed subpart (one U+FFFD); ByteFallback gives
    // one U+FFFD per byte.
    const bool byte_level = std::any_of(decoders.begin(), decoders.end(),
                                        [](const tok::Decoder& d) { return d.kind == tok::Decoder::kByteLevel; });
    *replacements = byte_level ? 1 : tail.size();
    return tail;
  }
  return "";
}

// ------------------------------------------------------------------------------------------------ the API

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, std::string_view source) {
  auto impl = tok::Loader(std::string(source)).load(json_text);
  if (!impl) return impl.status();
  return Tokenizer(std::shared_ptr<const TokenizerImpl>(std::move(impl).value()));
}

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  if (!fs::exists(file, ec))
    return error(Code::kNotFound, file + ": no such file (give a tokenizer.json or the model directory holding one)");
  const auto size = fs::file_size(file, ec);
  if (ec) return error(Code::kIo, file + ": " + ec.message());
  if (size > tok::kMaxFileBytes)
    return error(Code::kInvalidArgument,
                 file + ": " + std::to_string(size) + " bytes (a tokenizer.json is at most 256 MiB)");
  std::ifstream in(file, std::ios::binary);
  if (!in) return error(Code::kIo, file + ": cannot be opened for reading");
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) return error(Code::kIo, file + ": short read");
  return from_json(text, file);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool parse_special) const {
  std::vector<uint32_t> out;
  impl_->encode(text, add_special_tokens, parse_special, out);
  return out;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->bpe.vocab.find(token); it != impl_->bpe.vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  if (id >= impl_->token_of.size() || !impl_->has_token[id]) return std::nullopt;
  return impl_->token_of[id];
}

std::string Tokenizer::token_bytes(uint32_t id) const { return impl_->token_bytes(id); }

bool Tokenizer::is_special(uint32_t id) const { return id < impl_->special.size() && impl_->special[id] != 0; }

std::optional<uint32_t> Tokenizer::bos_id() const { return impl_->bos; }

// --------------------------------------------------------------------------------------------- DecodeStream

namespace tok {
inline constexpr size_t kWindowKeep = 8;      // ids kept before the unshown text when the window is rebased
inline constexpr size_t kWindowMax = 24;      // the window is rebased when it holds more ids than this
inline constexpr size_t kMaxHeldBytes = 128;  // a trailing grapheme cluster longer than this is shown anyway
}  // namespace tok

DecodeStream::DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(tokenizer.impl_), skip_special_(skip_special_tokens) {}

std::string DecodeStream::emit_ready(bool final) {
  std::string text = impl_->decode(ids_, skip_special_);
  // What is already shown must still be the window's beginning; a decoder that rewrote earlier text (only for
  // byte tokens that are not UTF-8) cannot be taken back, so the stream goes on from the same offset.
  size_t end = text.size();
  if (!final) {
    // Hold a trailing U+FFFD (an incomplete character: its next bytes may come) and the last grapheme cluster.
    while (end >= 3 && text.compare(end - 3, 3, "\xEF\xBF\xBD") == 0 && end > emitted_) end -= 3;
    const size_t held = unicode::held_tail_start(std::string_view(text).substr(0, end), tok::kMaxHeldBytes);
    end = std::min(end, held);
  }
  // Never cut a character: a decoder that rewrote text already shown (possible only for byte tokens that are not
  // UTF-8) could leave emitted_ inside one.
  while (emitted_ < text.size() && (static_cast<uint8_t>(text[emitted_]) & 0xC0) == 0x80) ++emitted_;
  std::string out;
  if (end > emitted_) {
    out = text.substr(emitted_, end - emitted_);
    emitted_ = end;
  }
  window_text_ = std::move(text);
  // Rebase: drop the window's oldest ids, keeping kWindowKeep ids of context. The unshown tail of the new
  // window's text must be the same bytes as the old one's (it comes from the later ids), else keep the window.
  if (!final && ids_.size() > tok::kWindowMax) {
    const size_t unshown = window_text_.size() - emitted_;
    const size_t drop = ids_.size() - tok::kWindowKeep;
    std::span<const uint32_t> rest(ids_.data() + drop, ids_.size() - drop);
    std::string rebased = impl_->decode(rest, skip_special_);
    std::string rebased_after_first = impl_->decode(rest.subspan(1), skip_special_);
    const auto ends_with_unshown = [&](const std::string& t) {
      return t.size() >= unshown && t.compare(t.size() - unshown, unshown, window_text_, emitted_, unshown) == 0;
    };
    // The unshown text must come from ids after the new window's first one (whose decoding may differ when it is
    // first, e.g. a stripped leading space).
    if (ends_with_unshown(rebased) && ends_with_unshown(rebased_after_first)) {
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(drop));
      emitted_ = rebased.size() - unshown;
      window_text_ = std::move(rebased);
    }
  }
  return out;
}

std::string DecodeStream::feed(uint32_t id) {
  ids_.push_back(id);
  return emit_ready(false);
}

std::string DecodeStream::pending() const {
  if (emitted_ >= window_text_.size()) return "";
  std::string held = window_text_.substr(emitted_);
  // An incomplete character at the end: its raw bytes instead of the U+FFFDs decode shows for it (when those are
  // all unreleased, as emit_ready holds trailing U+FFFDs).
  size_t replacements = 0;
  const std::string tail = impl_->incomplete_tail(ids_, skip_special_, &replacements);
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const size_t n = replacements * kReplacement.size();
  if (tail.empty() || held.size() < n) return held;
  for (size_t k = 0; k < replacements; ++k)
    if (held.compare(held.size() - n + k * kReplacement.size(), kReplacement.size(), kReplacement) != 0) return held;
  held.resize(held.size() - n);
  return held + tail;
}

std::string DecodeStream::finish() {
  std::string out = emit_ready(true);
  ids_.clear();
  window_text_.clear();
  emitted_ = 0;
  return out;
}

}  // namespace mc::text
