// mc::text::Tokenizer and DecodeStream (issue 50): three small tokenizers trained by make_tokenizers.py (byte-level
// Llama 3 / Qwen2 style, GPT-2 style, SentencePiece-style BPE) checked id for id against ref_tokenizer.py, an
// independent Python implementation, on prose, emoji, CJK, combining marks, invalid UTF-8, special tokens, long
// words, whitespace and digits; decode(encode(x)) round trips; streaming output == decode on every case; and
// malformed tokenizer.json files refused with clear errors; token_bytes (a token's raw bytes) and
// DecodeStream::pending (the text held back).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "mc/testkit/process.hpp"
#include "mc/text/tokenizer.hpp"

namespace MC_UNITY_ID {

using mc::Code;
using mc::text::DecodeStream;
using mc::text::Tokenizer;

const std::string kPython = "/usr/bin/python3";

std::string test_dir() { return std::filesystem::path(__FILE__).parent_path().string(); }

std::string to_hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (char c : s) {
    h.push_back(d[static_cast<uint8_t>(c) >> 4]);
    h.push_back(d[static_cast<uint8_t>(c) & 15]);
  }
  return h;
}

std::string from_hex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return s;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string repo_text(size_t max_bytes) {
  std::string s = read_file(test_dir() + "/../../docs/DESIGN.md");
  if (s.size() > max_bytes) {
    s.resize(max_bytes);
    while (!s.empty() && (static_cast<uint8_t>(s.back()) & 0xC0) == 0x80) s.pop_back();  // whole characters
    if (!s.empty() && static_cast<uint8_t>(s.back()) >= 0xC0) s.pop_back();
  }
  return s;
}

struct Case {
  std::string name;
  std::string text;
  bool exact_round_trip = true;  // decode(encode(text)) == text (false: NFC or invalid UTF-8 change it)
};

std::vector<Case> cases() {
  std::string long_word;
  std::mt19937 rng(7);
  for (int i = 0; i < 1500; ++i) long_word.push_back(static_cast<char>('a' + rng() % 26));
  return {
      {"empty", ""},
      {"ascii_prose",
       "The Conductor picks a prefill instance and a decode instance for each request. It's what they'll say: "
       "\"KV cache reuse\" matters (a lot)! Doesn't it? I'M SURE THEY'LL SAY you'd've known."},
      {"emoji",
       "Family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 thumbs "
       "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD flags \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7\xF0\x9F\x87\xAF\xF0\x9F\x87"
       "\xB5\xF0\x9F\x87\xBA\xF0\x9F\x87\xB8 heart \xE2\x9D\xA4\xEF\xB8\x8F robot\xF0\x9F\xA4\x96!"},
      {"cjk",
       "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88"
       "\xE3\x80\x81\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE6\x9C\xAC\xEF\xBC\x8C\xED\x95\x9C\xEA\xB5\xAD"
       "\xEC\x96\xB4 \xED\x85\x8D\xEC\x8A\xA4\xED\x8A\xB8\xE3\x80\x82 \xE6\x9D\xB1\xE4\xBA\xAC"},
      {"combining_precomposed",
       "Gr\xC3\xBC\xC3\x9F"
       "e, na\xC3\xAFve caf\xC3\xA9 r\xC3\xA9sum\xC3\xA9 Z\xCC\xB5\xCC\xA1"
       "a\xCC\xB6l\xCC\xB7g\xCC\xB8o \xE1\xBB\x87"},
      // Decomposed: NFC composes e + U+0301 into U+00E9 for the tokenizer with an NFC normalizer.
      {"combining_decomposed",
       "cafe\xCC\x81 a\xCC\x88 n\xCC\x83 o\xCC\x82\xCC\xA3 o\xCC\xA3\xCC\x82 \xE1\x84\x80\xE1\x85\xA1", false},
      {"invalid_utf8",
       std::string("abc\xFF\xFE"
                   "def \xE2\x82 ghi \xED\xA0\x80 x\xC0\xAF y \xF0\x9F\x98"),
       false},
      {"specials_in_text", "<|begin_of_text|>Hi<|eot_id|> and <s>x</s> <tool> y <|end_of_text|><|eot_id|><|eot_id",
       false},  // GPT-2 style: <tool> absorbs the spaces beside it (lstrip, rstrip)
      {"whitespace", "a   b\t\t c \n\n\n  d   \r\n  e    \n\t \xC2\xA0z  "},
      {"digits", "1234567890 3.14159 x123y 2024-06-01 \xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4 12345678"},
      {"long_word", long_word},
      {"design_md", repo_text(3000)},
  };
}

struct RefResult {
  std::vector<uint32_t> ids;
  std::string decoded;
};

class TokenizerRef : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kPython)) {
      skip_ = kPython + " is missing: the reference tokenizers cannot be made";
      return;
    }
    dir_ = ::testing::TempDir() + "mc_tokenizer_test_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    auto r = mc::testkit::shell(kPython + " " + test_dir() + "/make_tokenizers.py " + dir_ + " 2>&1");
    if (r.code != 0) made_error_ = "make_tokenizers.py failed: " + r.out;
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(made_error_.empty()) << made_error_;
  }
  static std::string path(const std::string& name) { return dir_ + "/" + name + "/tokenizer.json"; }

  // Runs ref_tokenizer.py over (case, add_special, parse_special) triples.
  static std::vector<RefResult> reference(const std::string& name, const std::vector<Case>& cs,
                                          const std::vector<std::pair<bool, bool>>& flags) {
    const std::string in = dir_ + "/" + name + "_cases.jsonl";
    {
      std::ofstream f(in);
      for (const auto& c : cs)
        for (auto [add, parse] : flags)
          f << nlohmann::json{{"hex", to_hex(c.text)}, {"add_special", add}, {"parse_special", parse}}.dump() << "\n";
    }
    auto r = mc::testkit::shell(kPython + " " + test_dir() + "/ref_tokenizer.py " + path(name) + " " + in);
    std::vector<RefResult> out;
    if (r.code != 0) {
      ADD_FAILURE() << "ref_tokenizer.py failed for " << name << ": " << r.out;
      return out;
    }
    std::istringstream is(r.out);
    std::string line;
    while (std::getline(is, line)) {
      auto j = nlohmann::json::parse(line);
      out.push_back({j["ids"].get<std::vector<uint32_t>>(), from_hex(j["decoded_hex"].get<std::string>())});
    }
    return out;
  }

  static std::string skip_, made_error_, dir_;
};
std::string TokenizerRef::skip_, TokenizerRef::made_error_, TokenizerRef::dir_;

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    cps.push_back(cp);
    i += n;
  }
  return cps;
}

// A chunk boundary must not split a grapheme: the next chunk may not start with an extender, the previous may not
// end in ZWJ, and a regional-indicator pair may not be split.
void expect_grapheme_safe(const std::vector<std::string>& chunks, const std::string& what) {
  std::string all;
  std::vector<size_t> bounds;
  for (const auto& c : chunks) {
    all += c;
    bounds.push_back(all.size());
  }
  const auto cp_before = [&](size_t end, size_t* start) {
    size_t i = end;
    while (i > 0 && (static_cast<uint8_t>(all[--i]) & 0xC0) == 0x80) {
    }
    *start = i;
    return code_points(all.substr(i, end - i)).front();
  };
  for (size_t k = 0; k < bounds.size(); ++k) {
    const size_t b = bounds[k];
    if (b == 0 || b >= all.size() || (k > 0 && bounds[k - 1] == b)) continue;
    size_t start = 0;
    const uint32_t a = cp_before(b, &start);
    const uint32_t n = code_points(all.substr(b, 4)).front();
    const bool extender =
        (n >= 0x300 && n <= 0x36F) || n == 0x200D || (n >= 0xFE00 && n <= 0xFE0F) || (n >= 0x1F3FB && n <= 0x1F3FF);
    EXPECT_FALSE(extender) << what << ": chunk " << k + 1 << " starts with extender U+" << std::hex << n;
    EXPECT_NE(a, 0x200Du) << what << ": chunk " << k << " ends with ZWJ";
    if (n >= 0x1F1E6 && n <= 0x1F1FF) {
      size_t ri = 0, end = b;
      for (uint32_t c = a; c >= 0x1F1E6 && c <= 0x1F1FF && end > 0; c = end > 0 ? cp_before(end, &start) : 0) {
        ++ri;
        end = start;
      }
      EXPECT_EQ(ri % 2, 0u) << what << ": a flag split at chunk " << k;
    }
  }
}

// Feeds ids one at a time; checks every chunk is valid UTF-8, graphemes are whole, and the whole == decode.
void expect_stream_equals_decode(const Tokenizer& tok, const std::vector<uint32_t>& ids, bool skip,
                                 const std::string& what) {
  DecodeStream ds(tok, skip);
  std::vector<std::string> chunks;
  for (uint32_t id : ids) chunks.push_back(ds.feed(id));
  chunks.push_back(ds.finish());
  std::string all;
  for (const auto& c : chunks) {
    EXPECT_TRUE(valid_utf8(c)) << what << ": a chunk is not UTF-8";
    all += c;
  }
  EXPECT_EQ(all, tok.decode(ids, skip)) << what << ": stream != decode (skip_special=" << skip << ")";
  expect_grapheme_safe(chunks, what);
}

void check_against_reference(const std::string& name, const Tokenizer& tok, const std::vector<RefResult>& ref,
                             bool nfc) {
  const auto cs = cases();
  const std::vector<std::pair<bool, bool>> flags = {{true, true}, {false, true}, {false, false}};
  ASSERT_EQ(ref.size(), cs.size() * flags.size()) << name;
  size_t k = 0;
  for (const auto& c : cs) {
    for (auto [add, parse] : flags) {
      const std::string what =
          name + "/" + c.name + " add_special=" + std::to_string(add) + " parse_special=" + std::to_string(parse);
      const auto ids = tok.encode(c.text, add, parse);
      EXPECT_EQ(ids, ref[k].ids) << what;
      const std::string decoded = tok.decode(ids, false);
      EXPECT_EQ(decoded, ref[k].decoded) << what;
      expect_stream_equals_decode(tok, ids, false, what);
      expect_stream_equals_decode(tok, ids, true, what);
      // Round trip of plain text (special tokens not parsed, none added).
      if (!add && !parse && c.exact_round_trip && !(nfc && c.name == "combining_decomposed"))
        EXPECT_EQ(decoded, c.text) << what << ": decode(encode(x)) != x";
      ++k;
    }
  }
}

TEST_F(TokenizerRef, ByteLevelLlama3StyleMatchesReference) {
  auto tok = Tokenizer::load(dir_ + "/bytelevel");  // a directory holding tokenizer.json
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  check_against_reference("bytelevel", *tok,
                          reference("bytelevel", cases(), {{true, true}, {false, true}, {false, false}}), true);
}

TEST_F(TokenizerRef, Gpt2StyleMatchesReference) {
  auto tok = Tokenizer::load(path("gpt2"));
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  check_against_reference("gpt2", *tok, reference("gpt2", cases(), {{true, true}, {false, true}, {false, false}}),
                          false);
}

TEST_F(TokenizerRef, SentencePieceStyleMatchesReference) {
  auto tok = Tokenizer::load(path("sp"));
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  check_against_reference("sp", *tok, reference("sp", cases(), {{true, true}, {false, true}, {false, false}}), false);
}

TEST_F(TokenizerRef, SpecialTokensParsedOnlyWhenAsked) {
  auto tok = Tokenizer::load(path("bytelevel"));
  ASSERT_TRUE(tok.is_ok());
  const auto eot = tok->token_to_id("<|eot_id|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_TRUE(tok->is_special(*eot));
  const auto parsed = tok->encode("a<|eot_id|>b", false, true);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), *eot), parsed.end());
  const auto plain = tok->encode("a<|eot_id|>b", false, false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), *eot), plain.end());
  EXPECT_EQ(tok->decode(plain, true), "a<|eot_id|>b");  // user text survives skip_special_tokens
  EXPECT_EQ(tok->decode(parsed, true), "ab");
  // BOS from the post-processor, added only with add_special_tokens.
  ASSERT_TRUE(tok->bos_id().has_value());
  EXPECT_EQ(tok->bos_id(), tok->token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(tok->encode("x", true).front(), *tok->bos_id());
  EXPECT_NE(tok->encode("x", false).front(), *tok->bos_id());
  auto sp = Tokenizer::load(path("sp"));
  ASSERT_TRUE(sp.is_ok());
  EXPECT_EQ(sp->bos_id(), 1u);
  EXPECT_EQ(sp->id_to_token(1), "<s>");
  EXPECT_EQ(sp->id_to_token(3), "<0x00>");
  EXPECT_FALSE(sp->id_to_token(1u << 30).has_value());
  EXPECT_FALSE(sp->token_to_id("no such token").has_value());
  EXPECT_GT(sp->vocab_size(), 259);
  EXPECT_EQ(tok->vocab_size(), static_cast<int64_t>(*tok->token_to_id("<|eot_id|>")) + 1);
}

// 100 KB without a space is one word for every pre-tokenizer here: BPE must stay O(n log n). Runs of spaces, digits,
// punctuation and newlines must not make the regexes backtrack quadratically either.
TEST_F(TokenizerRef, LongWordIsNotQuadratic) {
  std::string word;
  std::mt19937 rng(11);
  for (int i = 0; i < 100 * 1024; ++i) word.push_back(static_cast<char>('a' + rng() % 26));
  const std::vector<std::string> texts = {word, std::string(30 * 1024, ' '), std::string(30 * 1024, '7'),
                                          std::string(15 * 1024, '!') + std::string(15 * 1024, '\n')};
  for (const char* name : {"bytelevel", "gpt2", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    for (size_t k = 0; k < texts.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok->encode(texts[k], false, false);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Quadratic work on 100 KB would take minutes; linear-ish takes ~0.1 s optimized, a few s under ASan on a busy
      // machine.
      EXPECT_LT(s, 20.0) << name << ": " << s << " s for text " << k << " (sanitizer build)";
      EXPECT_EQ(tok->decode(ids, false), texts[k]) << name << " text " << k;
      if (k == 0) EXPECT_LT(ids.size(), texts[k].size()) << name;
    }
  }
}

// The stream over a long answer: equal to decode, and each feed costs a bounded window (not the whole answer).
TEST_F(TokenizerRef, StreamLongAnswer) {
  const std::string text = repo_text(30000) + " \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 e\xCC\x81\xCC\x81";
  for (const char* name : {"bytelevel", "gpt2", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    const auto ids = tok->encode(text, true, false);
    expect_stream_equals_decode(*tok, ids, false, name);
    expect_stream_equals_decode(*tok, ids, true, name);
  }
}

TEST_F(TokenizerRef, StreamHoldsGraphemes) {
  auto tok = Tokenizer::load(path("gpt2"));
  ASSERT_TRUE(tok.is_ok());
  DecodeStream ds(*tok, false);
  const auto e = tok->encode("e", false), acute = tok->encode("\xCC\x81", false);
  std::string out;
  for (uint32_t id : e) out += ds.feed(id);
  EXPECT_EQ(out, "");  // "e" may still take a combining mark
  for (uint32_t id : acute) out += ds.feed(id);
  EXPECT_EQ(out, "");  // the acute's first byte alone is not a character; then the cluster is still open
  for (uint32_t id : tok->encode("\n", false)) out += ds.feed(id);
  EXPECT_EQ(out, "e\xCC\x81\n");  // a line break ends every cluster
  EXPECT_EQ(ds.finish(), "");
  // Byte by byte, a 4-byte emoji is never shown in part.
  DecodeStream bytes(*tok, false);
  std::string shown;
  for (uint32_t id : tok->encode("\xF0\x9F\xA4\x96 ok", false)) {
    shown += bytes.feed(id);
    EXPECT_TRUE(valid_utf8(shown));
  }
  shown += bytes.finish();
  EXPECT_EQ(shown, "\xF0\x9F\xA4\x96 ok");
}

// Arbitrary ids (what a model may generate: partial characters, invalid byte runs, specials anywhere): the
// stream never crashes, shows only UTF-8 and equals decode exactly (ByteFallback's runs are held until closed).
TEST_F(TokenizerRef, StreamArbitraryIds) {
  std::mt19937 rng(3);
  for (const char* name : {"bytelevel", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    const auto n = static_cast<uint32_t>(tok->vocab_size());
    for (int round = 0; round < 200; ++round) {
      std::vector<uint32_t> ids;
      const int len = static_cast<int>(rng() % 120);
      for (int i = 0; i < len; ++i) ids.push_back(rng() % 4 == 0 ? rng() % 260 : rng() % (n + 5));  // bytes often
      DecodeStream ds(*tok, round % 2 == 0);
      std::string all;
      for (uint32_t id : ids) {
        const std::string chunk = ds.feed(id);
        EXPECT_TRUE(valid_utf8(chunk)) << name;
        all += chunk;
      }
      all += ds.finish();
      EXPECT_TRUE(valid_utf8(all)) << name;
      EXPECT_EQ(all, tok->decode(ids, round % 2 == 0)) << name << " round " << round;
    }
  }
}

// ---------------------------------------------------------------------------------- token_bytes and pending

std::string joined_token_bytes(const Tokenizer& tok, std::span<const uint32_t> ids) {
  std::string s;
  for (uint32_t id : ids) s += tok.token_bytes(id);
  return s;
}

// What token_bytes concatenate to over encode(text, false, false): the text itself for the byte-level tokenizers
// (the cases below are NFC already), " " + text for SentencePiece style (its Prepend, ▁ back to a space).
std::string expected_token_bytes(const std::string& name, const std::string& text) {
  return name == "sp" && !text.empty() ? " " + text : text;
}

std::vector<Case> valid_cases() {
  std::vector<Case> out;
  for (auto& c : cases())
    if (c.exact_round_trip) out.push_back(c);
  out.push_back({"rare_emoji_and_cjk", "\xF0\x9F\xA6\x80 crab \xF0\x9F\xAA\xBC \xE9\xBE\x98\xE9\xBD\x89 \xEA\xB0\x80"});
  // The docs, less the GPT-2 style tokenizer's added token "<tool>" (which absorbs the spaces beside it), and NFC
  // already (x has no precomposed form with an acute).
  std::string docs = repo_text(12000);
  for (size_t p = docs.find("<tool>"); p != std::string::npos; p = docs.find("<tool>", p)) docs.replace(p, 6, "(tool)");
  out.push_back({"long_answer", docs + " \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 x\xCC\x81\xCC\x81 \xF0\x9F\xA6\x80"});
  return out;
}

TEST_F(TokenizerRef, TokenBytesConcatenateToText) {
  for (const char* name : {"bytelevel", "gpt2", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    for (const auto& c : valid_cases()) {
      const auto ids = tok->encode(c.text, false, false);
      const std::string joined = joined_token_bytes(*tok, ids);
      EXPECT_EQ(joined, expected_token_bytes(name, c.text)) << name << "/" << c.name;
      // decode is the same bytes (repaired: valid text has nothing to repair) less SentencePiece's stripped space.
      EXPECT_EQ(expected_token_bytes(name, tok->decode(ids, false)), joined) << name << "/" << c.name;
    }
  }
}

TEST_F(TokenizerRef, TokenBytesOfSplitCharactersAndSpecials) {
  auto tok = Tokenizer::load(path("gpt2"));
  ASSERT_TRUE(tok.is_ok());
  // A crab (U+1F980) is not in the training corpus: it takes more than one token, each with part of its bytes.
  const std::string crab = "\xF0\x9F\xA6\x80";
  const auto ids = tok->encode(crab, false, false);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(joined_token_bytes(*tok, ids), crab);
  EXPECT_EQ(tok->decode(std::vector<uint32_t>{ids[0]}, false), "\xEF\xBF\xBD");  // decode repairs; token_bytes not
  EXPECT_EQ(tok->token_bytes(ids[0]), crab.substr(0, tok->token_bytes(ids[0]).size()));
  // An emoji split in exactly two tokens: "ðŁ" (bytes F0 9F, a token in every vocabulary trained here) and the rest.
  const auto f09f = tok->token_to_id("\xC3\xB0\xC5\x81");
  ASSERT_TRUE(f09f.has_value());
  EXPECT_EQ(tok->token_bytes(*f09f), "\xF0\x9F");
  const auto a6 = tok->token_to_id("\xC2\xA6"), x80 = tok->token_to_id("\xC4\xA2");  // bytes A6 and 80
  ASSERT_TRUE(a6.has_value() && x80.has_value());
  EXPECT_EQ(tok->token_bytes(*a6) + tok->token_bytes(*x80), "\xA6\x80");
  EXPECT_EQ(tok->token_bytes(*f09f) + tok->token_bytes(*a6) + tok->token_bytes(*x80), crab);
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("\xC4\xA0the")), " the");  // Ġ is the space byte
  // Added tokens: their content; ids outside the vocabulary: nothing.
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("<|endoftext|>")), "<|endoftext|>");
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("<tool>")), "<tool>");
  EXPECT_EQ(tok->token_bytes(static_cast<uint32_t>(tok->vocab_size())), "");
  EXPECT_EQ(tok->token_bytes(1u << 30), "");

  auto sp = Tokenizer::load(path("sp"));
  ASSERT_TRUE(sp.is_ok());
  EXPECT_EQ(sp->token_bytes(*sp->token_to_id("<0xF0>")), "\xF0");  // byte fallback: the one byte
  EXPECT_EQ(sp->token_bytes(*sp->token_to_id("<0x20>")), " ");
  EXPECT_EQ(sp->token_bytes(*sp->token_to_id("<s>")), "<s>");
  EXPECT_EQ(sp->token_bytes(*sp->token_to_id("\xE2\x96\x81")), " ");  // ▁ is a space, even as the first token
  const auto crab_ids = sp->encode(crab, false, false);               // ▁ then the four byte tokens
  ASSERT_EQ(crab_ids.size(), 5u);
  EXPECT_EQ(sp->token_bytes(crab_ids[1]) + sp->token_bytes(crab_ids[2]), "\xF0\x9F");
  EXPECT_EQ(joined_token_bytes(*sp, crab_ids), " " + crab);
  EXPECT_EQ(sp->decode(crab_ids, false), crab);  // the Strip decoder removes the leading space; token_bytes keeps it
}

// After every feed, released + pending() is everything the ids so far stand for: decode(ids) where it ends in a
// whole character, else the same with the trailing partial character as raw bytes, i.e. the token_bytes (less
// SentencePiece's stripped leading space); finish() returns pending().
TEST_F(TokenizerRef, StreamPendingIsTheUnreleasedText) {
  for (const char* name : {"bytelevel", "gpt2", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    for (const auto& c : valid_cases()) {
      for (bool skip : {false, true}) {
        const std::string what = std::string(name) + "/" + c.name + " skip=" + std::to_string(skip);
        const auto ids = tok->encode(c.text, true, false);  // with BOS: a special the stream may skip
        DecodeStream ds(*tok, skip);
        EXPECT_EQ(ds.pending(), "") << what;
        std::string released, held_at_end, raw;
        size_t held_often = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
          const size_t before = released.size();
          released += ds.feed(ids[i]);
          const std::string pending = ds.pending();
          held_often += pending.empty() ? 0 : 1;
          held_at_end = pending;
          if (!(skip && tok->is_special(ids[i]))) raw += tok->token_bytes(ids[i]);
          // released + pending == raw (less SentencePiece's stripped space), checked on the new part only.
          const size_t off = std::string(name) == "sp" && !raw.empty() && raw[0] == ' ' ? 1 : 0;
          ASSERT_EQ(raw.size() - off, released.size() + pending.size()) << what << " after " << i + 1 << " ids";
          ASSERT_EQ(raw.substr(off + before), released.substr(before) + pending) << what << " after " << i + 1;
          // decode(ids so far) costs O(ids): every id of the shorter answers, a sample of the long one.
          if (ids.size() > 1500 && i % 97 != 0 && i + 1 != ids.size()) continue;
          const std::string decoded = tok->decode(std::span<const uint32_t>(ids.data(), i + 1), skip);
          if (decoded.size() < 3 || decoded.compare(decoded.size() - 3, 3, "\xEF\xBF\xBD") != 0)
            ASSERT_EQ(released + pending, decoded) << what << " after " << i + 1 << " ids";
        }
        EXPECT_EQ(ds.finish(), held_at_end) << what;
        EXPECT_EQ(ds.pending(), "") << what;
        if (c.text.size() > 20) EXPECT_GT(held_often, 0u) << what;
      }
    }
  }
}

TEST_F(TokenizerRef, StreamPendingHoldsPartialCharacters) {
  auto tok = Tokenizer::load(path("gpt2"));
  ASSERT_TRUE(tok.is_ok());
  // The crab byte by byte: pending is its raw bytes so far; nothing is released until the next token shows the
  // cluster complete.
  const std::vector<uint32_t> ids = {*tok->token_to_id("\xC3\xB0"), *tok->token_to_id("\xC5\x81"),
                                     *tok->token_to_id("\xC2\xA6"), *tok->token_to_id("\xC4\xA2")};
  DecodeStream ds(*tok, false);
  const std::string crab = "\xF0\x9F\xA6\x80";
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ds.feed(ids[i]), "");
    EXPECT_EQ(ds.pending(), crab.substr(0, i + 1));
  }
  EXPECT_EQ(ds.feed(*tok->token_to_id("!")), crab);
  EXPECT_EQ(ds.pending(), "!");
  EXPECT_EQ(ds.feed(*tok->token_to_id("\xC4\x8A")), "!\n");  // a line break releases everything
  EXPECT_EQ(ds.pending(), "");
  EXPECT_EQ(ds.finish(), "");
  // A stop string that ends in the held cluster ("f" may still take a combining mark) is visible before the next
  // token comes.
  DecodeStream stop(*tok, false);
  std::string released;
  for (uint32_t id : tok->encode("STOP caf", false)) released += stop.feed(id);
  EXPECT_NE((released + stop.pending()).find("STOP caf"), std::string::npos);
  // A byte that can never start a character stays U+FFFD in pending (as decode and finish show it).
  DecodeStream bad(*tok, false);
  bad.feed(*tok->token_to_id("a"));
  bad.feed(*tok->token_to_id("\xC3\xBF"));  // byte FF
  EXPECT_EQ(bad.pending(), "a\xEF\xBF\xBD");
  EXPECT_EQ(bad.finish(), "a\xEF\xBF\xBD");
}

// Arbitrary ids: wherever decode(ids so far) ends in a whole character, released + pending() equals it.
TEST_F(TokenizerRef, StreamPendingOnArbitraryIds) {
  std::mt19937 rng(9);
  for (const char* name : {"bytelevel", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    const auto n = static_cast<uint32_t>(tok->vocab_size());
    for (int round = 0; round < 100; ++round) {
      std::vector<uint32_t> ids;
      const int len = static_cast<int>(rng() % 80);
      for (int i = 0; i < len; ++i) ids.push_back(rng() % 4 == 0 ? rng() % 260 : rng() % (n + 5));
      const bool skip = round % 2 == 0;
      DecodeStream ds(*tok, skip);
      std::string released, last_pending;
      bool last_whole = true;
      for (size_t i = 0; i < ids.size(); ++i) {
        released += ds.feed(ids[i]);
        last_pending = ds.pending();
        const std::string decoded = tok->decode(std::span<const uint32_t>(ids.data(), i + 1), skip);
        last_whole = decoded.size() < 3 || decoded.compare(decoded.size() - 3, 3, "\xEF\xBF\xBD") != 0;
        if (last_whole) ASSERT_EQ(released + last_pending, decoded) << name << " round " << round << " id " << i;
      }
      const std::string rest = ds.finish();
      if (last_whole) EXPECT_EQ(rest, last_pending) << name << " round " << round;
    }
  }
}

// Decoders on arbitrary ids (stray bytes, specials, unknown ids) agree with the reference.
TEST_F(TokenizerRef, DecodeArbitraryIdsMatchesReference) {
  for (const char* name : {"bytelevel", "gpt2", "sp"}) {
    auto tok = Tokenizer::load(path(name));
    ASSERT_TRUE(tok.is_ok());
    std::mt19937 rng(5);
    const auto n = static_cast<uint32_t>(tok->vocab_size());
    std::vector<std::pair<std::vector<uint32_t>, bool>> seqs;
    for (int round = 0; round < 100; ++round) {
      std::vector<uint32_t> ids;
      const int len = static_cast<int>(rng() % 40);
      for (int i = 0; i < len; ++i) ids.push_back(rng() % 3 == 0 ? rng() % 260 : rng() % (n + 5));
      seqs.emplace_back(ids, round % 2 == 1);
    }
    const std::string in = dir_ + "/" + name + "_decode.jsonl";
    {
      std::ofstream f(in);
      for (const auto& [ids, skip] : seqs)
        f << nlohmann::json{{"decode_ids", ids}, {"skip_special", skip}}.dump() << "\n";
    }
    auto r = mc::testkit::shell(kPython + " " + test_dir() + "/ref_tokenizer.py " + path(name) + " " + in);
    ASSERT_EQ(r.code, 0) << r.out;
    std::istringstream is(r.out);
    std::string line;
    size_t k = 0;
    while (std::getline(is, line) && k < seqs.size()) {
      const auto j = nlohmann::json::parse(line);
      EXPECT_EQ(tok->decode(seqs[k].first, seqs[k].second), from_hex(j["decoded_hex"].get<std::string>()))
          << name << " sequence " << k;
      ++k;
    }
    EXPECT_EQ(k, seqs.size()) << name;
  }
}

// Qwen2's split pattern (\p{N} one digit at a time) compiles and splits digits one by one.
TEST_F(TokenizerRef, Qwen2Pattern) {
  auto j = nlohmann::json::parse(read_file(path("bytelevel")));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto tok = Tokenizer::from_json(j.dump(), "qwen2-like");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const auto ids = tok->encode("x 2024", false);
  ASSERT_EQ(ids.size(), 6u);  // "x", " ", "2", "0", "2", "4"
  for (size_t k = 2; k < 6; ++k) EXPECT_EQ(tok->id_to_token(ids[k])->size(), 1u);
  EXPECT_EQ(tok->decode(ids, false), "x 2024");
}

TEST_F(TokenizerRef, SharedAcrossThreads) {
  auto tok = Tokenizer::load(path("bytelevel"));
  ASSERT_TRUE(tok.is_ok());
  const std::string text = repo_text(20000);
  const auto want = tok->encode(text, true);
  Tokenizer copy = *tok;  // copies share the state
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int k = 0; k < 3; ++k)
        if (copy.encode(text, true) != want || copy.decode(want, false) != tok->decode(want, false)) ++bad;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// ------------------------------------------------------------------------------------------ malformed files

std::string minimal(const std::string& model_extra, const std::string& rest = "") {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"])" + model_extra + "}" +
         rest + "}";
}

void expect_error(const std::string& json, Code code, const std::string& needle) {
  auto r = Tokenizer::from_json(json, "test.json");
  ASSERT_FALSE(r.is_ok()) << json;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("test.json"), std::string::npos) << r.status().to_string();
}

TEST(TokenizerLoad, MinimalWorks) {
  auto t = Tokenizer::from_json(minimal(""), "test.json");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->encode("abab", false), (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(t->encode("", true), std::vector<uint32_t>{});
  EXPECT_EQ(t->decode(std::vector<uint32_t>{2, 0, 99}, false), "aba");  // unknown ids skipped
  EXPECT_FALSE(t->bos_id().has_value());
}

TEST(TokenizerLoad, MalformedFilesAreRefused) {
  expect_error("{not json", Code::kInvalidArgument, "not valid JSON");
  expect_error("[1, 2]", Code::kInvalidArgument, "not a JSON object");
  expect_error("{}", Code::kInvalidArgument, "model");
  expect_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", Code::kUnimplemented, "WordPiece");
  expect_error(R"({"model": {"type": "Unigram", "vocab": []}})", Code::kUnimplemented, "Unigram");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}})", Code::kInvalidArgument, "zz");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})", Code::kInvalidArgument,
               "merges[0]");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}})",
               Code::kInvalidArgument, "\"ab\"");  // the merged token must be in the vocabulary
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 1099511627776}, "merges": []}})", Code::kInvalidArgument,
               "model.vocab.a");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", Code::kInvalidArgument,
               "model.vocab.a");
  expect_error(R"({"model": {"type": "BPE", "vocab": {")" + std::string(2000, 'x') + R"(": 0}, "merges": []}})",
               Code::kInvalidArgument, "1024 bytes");
  expect_error(minimal(R"(, "byte_fallback": true)"), Code::kInvalidArgument, "<0x00>");
  expect_error(minimal(R"(, "unk_token": "<unk>")"), Code::kInvalidArgument, "unk_token");
  expect_error(minimal(R"(, "dropout": 0.1)"), Code::kUnimplemented, "dropout");
  expect_error(minimal(R"(, "continuing_subword_prefix": "##")"), Code::kUnimplemented, "continuing_subword_prefix");
  expect_error(minimal("", R"(, "normalizer": {"type": "NFKC"})"), Code::kUnimplemented, "NFKC");
  expect_error(minimal("", R"(, "normalizer": {"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]})"),
               Code::kUnimplemented, "normalizer.normalizers[0]");
  expect_error(minimal("", R"(, "pre_tokenizer": {"type": "BertPreTokenizer"})"), Code::kUnimplemented,
               "BertPreTokenizer");
  expect_error(minimal("", R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}})"),
               Code::kInvalidArgument, "does not compile");
  expect_error(minimal("", R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Odd"})"),
               Code::kUnimplemented, "behavior");
  expect_error(minimal("", R"(, "decoder": {"type": "WordPiece"})"), Code::kUnimplemented, "WordPiece");
  expect_error(minimal("", R"(, "post_processor": {"type": "BertProcessing"})"), Code::kUnimplemented,
               "BertProcessing");
  expect_error(
      minimal("",
              R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>"}}]})"),
      Code::kInvalidArgument, "<bos>");
  expect_error(minimal("", R"(, "added_tokens": [{"id": 5}])"), Code::kInvalidArgument, "added_tokens[0].content");
  expect_error(minimal("", R"(, "added_tokens": {"a": 1})"), Code::kInvalidArgument, "added_tokens");
  // Nesting beyond the bound.
  std::string deep = R"({"type": "NFC"})";
  for (int i = 0; i < 20; ++i) deep = R"({"type": "Sequence", "normalizers": [)" + deep + "]}";
  expect_error(minimal("", R"(, "normalizer": )" + deep), Code::kInvalidArgument, "16 deep");
}

TEST(TokenizerLoad, HugeArraysAreRefused) {
  // merges of 2^22 + 1 entries: over the bound, refused by the first pass before a document is built (the same
  // pass bounds model.vocab; a vocabulary of 2^22 + 1 distinct tokens is refused the same way).
  std::string j = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [0)";
  const size_t n = size_t{1} << 22;
  j.reserve(n * 2 + 64);
  for (size_t i = 0; i < n; ++i) j += ",0";
  j += "]}}";
  expect_error(j, Code::kInvalidArgument, "more than 4194304 entries");
}

TEST(TokenizerLoad, MissingFileAndDirectory) {
  auto r = Tokenizer::load("/nonexistent/dir");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/dir"), std::string::npos);
  auto d = Tokenizer::load(::testing::TempDir());  // a directory without tokenizer.json
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoad, NfcAndSplitBehaviors) {
  // NFC composes; Split behaviours cut as documented; a Metaspace pre-tokenizer and decoder round trip.
  const std::string vocab = R"({"a": 0, "b": 1, "-": 2, "\u00e9": 3, "\u2581": 4, "e": 5, "\u0301": 6})";
  auto tok = Tokenizer::from_json(R"({"normalizer": {"type": "NFC"},
      "pre_tokenizer": {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious"},
      "model": {"type": "BPE", "vocab": )" +
                                      vocab + R"(, "merges": []}})",
                                  "nfc.json");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->encode("e\xCC\x81-a", false), (std::vector<uint32_t>{3, 2, 0}));
  auto ms = Tokenizer::from_json(R"({
      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true},
      "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
      "model": {"type": "BPE", "vocab": )" +
                                     vocab + R"(, "merges": []}})",
                                 "ms.json");
  ASSERT_TRUE(ms.is_ok()) << ms.status().to_string();
  const auto ids = ms->encode("a b", false);
  EXPECT_EQ(ids, (std::vector<uint32_t>{4, 0, 4, 1}));
  EXPECT_EQ(ms->decode(ids, false), "a b");
  expect_stream_equals_decode(*ms, ids, false, "metaspace");
}

}  // namespace MC_UNITY_ID
