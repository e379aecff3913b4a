// Fuzz harness: the text a client sends and the ids a model emits, through mc_text (issue 50): a byte-level BPE
// (Llama 3's split regex, NFC, ByteLevel, special tokens, a BOS post-processor) and a SentencePiece-style BPE
// (Prepend/Replace, byte fallback, Replace/ByteFallback/Fuse/Strip decoders), both built here, and a chat template
// rendered with the input as a message. The first byte picks the path:
//   0 mod 4: encode the rest with the byte-level tokenizer (special tokens parsed or not), decode it back;
//   1: the same with the SentencePiece-style one;
//   2: the rest as 16-bit token ids (mod the vocabulary) through DecodeStream and decode, both tokenizers;
//   3: the rest as a message's content rendered by a template that loops, filters and calls tojson on it.
// Checked: no crash, no sanitizer report, every text out is valid UTF-8 (nlohmann's dump throws otherwise), the
// streamed text of ids whose bytes are valid UTF-8 equals decode, and a message's content is never run as template
// code (its text comes back verbatim inside the rendering).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/text/chat_template.hpp"
#include "mc/text/tokenizer.hpp"

namespace {

using nlohmann::json;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_text: %s\n", what);
  std::abort();
}

// GPT-2's byte-to-character map of the ByteLevel pre-tokenizer: printable bytes map to themselves, the rest to
// U+0100 onwards.
std::string byte_char(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<int> cps(256, -1);
    for (int c = 0; c < 256; ++c) {
      if ((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)) cps[c] = c;
    }
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      if (cps[c] < 0) cps[c] = next++;
    }
    std::vector<std::string> t;
    for (int cp : cps) {
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t.push_back(s);
    }
    return t;
  }();
  return table[static_cast<size_t>(b)];
}

const mc::text::Tokenizer& bytelevel() {
  static const mc::text::Tokenizer t = [] {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    const std::string sp = byte_char(' ');
    const std::vector<std::pair<std::string, std::string>> merges = {
        {sp, "t"}, {"h", "e"}, {sp + "t", "he"}, {"i", "n"}, {sp, "a"}, {"e", "r"}, {sp + "a", "n"}};
    json m = json::array();
    int id = 256;
    for (const auto& [a, b] : merges) {
      m.push_back(json::array({a, b}));
      if (!vocab.contains(a + b)) vocab[a + b] = id++;
    }
    const int bos = id++, eot = id++;
    const json doc = {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", bos}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}},
          {{"id", eot}, {"content", "<|eot_id|>"}, {"special", true}, {"normalized", false}}}},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"special_tokens",
           {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"ignore_merges", true}}}};
    auto r = mc::text::Tokenizer::from_json(doc.dump(), "fuzz byte-level");
    if (!r.is_ok()) broken(("byte-level tokenizer: " + r.status().to_string()).c_str());
    return std::move(r).value();
  }();
  return t;
}

const mc::text::Tokenizer& sentencepiece() {
  static const mc::text::Tokenizer t = [] {
    json vocab = json::object();
    vocab["<unk>"] = 0;
    vocab["<s>"] = 1;
    vocab["</s>"] = 2;
    int id = 3;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      vocab[name] = id++;
    }
    const std::string u = "\u2581";
    for (const char* piece : {"a", "e", "t", "h", "n", "i"}) vocab[piece] = id++;
    vocab[u] = id++;
    const std::vector<std::pair<std::string, std::string>> merges = {{u, "t"}, {"h", "e"}, {u + "t", "he"}, {"i", "n"}};
    json m = json::array();
    for (const auto& [a, b] : merges) {
      m.push_back(a + " " + b);
      if (!vocab.contains(a + b)) vocab[a + b] = id++;
    }
    const json doc = {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
          {{"id", 1}, {"content", "<s>"}, {"special", true}},
          {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", u}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", u}}}}}},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", u}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
        {"model",
         {{"type", "BPE"},
          {"vocab", vocab},
          {"merges", m},
          {"unk_token", "<unk>"},
          {"byte_fallback", true},
          {"fuse_unk", true}}}};
    auto r = mc::text::Tokenizer::from_json(doc.dump(), "fuzz sentencepiece");
    if (!r.is_ok()) broken(("sentencepiece tokenizer: " + r.status().to_string()).c_str());
    return std::move(r).value();
  }();
  return t;
}

const mc::text::ChatTemplate& chat_template() {
  static const mc::text::ChatTemplate t = [] {
    auto r = mc::text::ChatTemplate::from_string(
        "{{ bos_token }}{% for m in messages %}{% if loop.first and m.role == 'system' %}[S]{% endif %}"
        "<{{ m.role | upper }}>{{ m.content | trim }}|{{ m.content | length }}|{{ m | tojson }}</>"
        "{% endfor %}{% if add_generation_prompt %}<ASSISTANT>{% endif %}",
        "<s>", "</s>");
    if (!r.is_ok()) broken(("template: " + r.status().to_string()).c_str());
    return std::move(r).value();
  }();
  return t;
}

// Throws (nlohmann::json::type_error) when `s` is not valid UTF-8.
void utf8(const std::string& s) { (void)json(s).dump(); }

void round_trip(const mc::text::Tokenizer& t, const std::string& text, bool parse_special) {
  const std::vector<uint32_t> ids = t.encode(text, /*add_special_tokens=*/parse_special, parse_special);
  for (uint32_t id : ids) {
    if (static_cast<int64_t>(id) >= t.vocab_size()) broken("an id outside the vocabulary");
  }
  utf8(t.decode(ids, false));
  utf8(t.decode(ids, true));
}

void stream(const mc::text::Tokenizer& t, const std::vector<uint32_t>& ids) {
  mc::text::DecodeStream s(t, /*skip_special_tokens=*/false);
  std::string out;
  for (uint32_t id : ids) {
    const std::string piece = s.feed(id);
    utf8(piece);
    out += piece;
  }
  const std::string rest = s.finish();
  utf8(rest);
  out += rest;
  const std::string whole = t.decode(ids, false);
  utf8(whole);
  // The promise holds for ids whose bytes form valid UTF-8 (what encode gives): check it on those.
  if (whole.find("\xEF\xBF\xBD") == std::string::npos && out != whole) broken("streamed text differs from decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1u << 16)) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        round_trip(bytelevel(), rest, (data[0] & 4) != 0);
        break;
      case 1:
        round_trip(sentencepiece(), rest, (data[0] & 4) != 0);
        break;
      case 2: {
        for (const mc::text::Tokenizer* t : {&bytelevel(), &sentencepiece()}) {
          std::vector<uint32_t> ids;
          for (size_t i = 0; i + 1 < rest.size(); i += 2) {
            const uint32_t v =
                static_cast<uint8_t>(rest[i]) | (static_cast<uint32_t>(static_cast<uint8_t>(rest[i + 1])) << 8);
            ids.push_back(v % static_cast<uint32_t>(t->vocab_size()));
          }
          stream(*t, ids);
        }
        break;
      }
      default: {
        // Message content arrives in a JSON body, so it is valid UTF-8: anything else is not a message.
        try {
          utf8(rest);
        } catch (const nlohmann::json::exception&) {
          return 0;
        }
        const json messages =
            json::array({{{"role", "system"}, {"content", rest}}, {{"role", "user"}, {"content", rest}}});
        auto r = chat_template().render(messages, nullptr, (data[0] & 4) != 0);
        if (!r.is_ok()) break;  // e.g. content that is not UTF-8: an error, not a crash
        utf8(r.value());
        if (!rest.empty() && r.value().find("{{") == std::string::npos && rest.find("{{") != std::string::npos) {
          broken("message content was not rendered verbatim");
        }
        break;
      }
    }
  } catch (const std::exception& e) {
    // The harness's own UTF-8 check (a text out of mc_text that is not valid UTF-8), or an exception out of mc_text,
    // which returns Status and must not throw.
    broken((std::string("invalid UTF-8 out of mc_text, or an exception: ") + e.what()).c_str());
  }
  return 0;
}
