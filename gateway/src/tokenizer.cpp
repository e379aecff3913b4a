#include "mc/gateway/tokenizer.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "mc/common/log.hpp"
#include "mc/model/model_config.hpp"
#include "mc/text/chat_template.hpp"
#include "mc/text/tokenizer.hpp"

namespace mc::gateway {

struct Tokenizer::Impl {
  text::Tokenizer tokenizer;
  std::optional<text::ChatTemplate> chat;  // none: the model has no chat template
};

struct TextStream::HfState {
  explicit HfState(const text::Tokenizer& t) : stream(t, /*skip_special_tokens=*/true) {}
  text::DecodeStream stream;
};

Tokenizer::Tokenizer(std::string model, int64_t vocab_size, std::vector<uint32_t> eos_ids)
    : model_(std::move(model)), vocab_size_(vocab_size), eos_ids_(std::move(eos_ids)) {}

Result<Tokenizer> Tokenizer::for_model(std::string_view spec) {
  MC_ASSIGN_OR_RETURN(model::ModelConfig m, model::load_model(spec));
  std::vector<uint32_t> eos;
  // The model's own end tokens (config.json, then generation_config.json: Qwen2.5's 151643/151645, Mistral's 2,
  // Llama 3.1 Instruct's 128001/128008/128009); a preset names none: Llama 3's <|end_of_text|> and <|eot_id|>, where
  // the vocabulary has them.
  for (int64_t id : m.eos_token_ids) {
    if (id >= 0 && id < m.vocab_size) eos.push_back(static_cast<uint32_t>(id));
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!m.checkpoint_dir.empty() && fs::is_regular_file(fs::path(m.checkpoint_dir) / "tokenizer.json", ec)) {
    MC_ASSIGN_OR_RETURN(text::Tokenizer loaded, text::Tokenizer::load(m.checkpoint_dir));
    auto impl = std::make_shared<Impl>(Impl{std::move(loaded), std::nullopt});
    if (impl->tokenizer.vocab_size() > m.vocab_size) {
      return Status(Code::kInvalidArgument, "model '" + m.name + "': " + m.checkpoint_dir + "/tokenizer.json has " +
                                                std::to_string(impl->tokenizer.vocab_size()) +
                                                " token ids but config.json's vocab_size is " +
                                                std::to_string(m.vocab_size) + ": the tokenizer is not this model's");
    }
    Result<text::ChatTemplate> chat = text::ChatTemplate::load(m.checkpoint_dir);
    if (chat.is_ok()) {
      impl->chat = std::move(chat).value();
    } else if (chat.status().code() != Code::kNotFound) {
      return chat.status().with_context("model '" + m.name + "': its chat template");
    }
    // The template's end of turn (Qwen's <|im_end|>, Llama 3's <|eot_id|>) ends an answer too.
    if (impl->chat) {
      if (auto id = impl->tokenizer.token_to_id(impl->chat->eos_token()); id && *id < m.vocab_size) {
        if (std::find(eos.begin(), eos.end(), *id) == eos.end()) eos.push_back(*id);
      }
    }
    Tokenizer t(m.name, m.vocab_size, std::move(eos));
    t.hf_ = std::move(impl);
    t.set_max_context_tokens(m.max_context_tokens);
    return t;
  }
  if (!m.checkpoint_dir.empty()) {
    // A Hugging Face directory without tokenizer.json: the byte-level tokenizer is right only for a 256-id vocabulary.
    if (fs::exists(fs::path(m.checkpoint_dir) / "tokenizer.model", ec)) {
      return Status(Code::kInvalidArgument,
                    "model '" + m.name + "': " + m.checkpoint_dir +
                        " has tokenizer.model (SentencePiece's own format) but no tokenizer.json, the only tokenizer "
                        "mc reads: write one beside it (transformers: AutoTokenizer.from_pretrained(DIR)"
                        ".save_pretrained(DIR))");
    }
    if (m.vocab_size != 256) {
      MC_LOG_WARN << "mc-gateway: model '" << m.name << "' (" << m.checkpoint_dir
                  << ") has no tokenizer.json: serving it byte-level (a prompt's UTF-8 bytes are its token ids, "
                     "output ids above 255 shown as one character each) with mc's own chat template, not the "
                     "model's vocabulary of "
                  << m.vocab_size << " ids or its tokenizer_config.json; put the model's tokenizer.json beside "
                  << "config.json to serve its text";
    }
  }
  if (m.vocab_size < 256) {
    return Status(Code::kInvalidArgument, "model '" + m.name + "' has a vocabulary of " + std::to_string(m.vocab_size) +
                                              " ids: the byte-level tokenizer needs at least 256");
  }
  if (eos.empty() && m.checkpoint_dir.empty() && m.vocab_size > 128'009) eos = {128'001, 128'009};
  Tokenizer t(m.name, m.vocab_size, std::move(eos));
  t.set_max_context_tokens(m.max_context_tokens);
  return t;
}

std::string Tokenizer::kind() const { return hf_ ? "tokenizer.json" : "byte-level"; }

bool Tokenizer::has_chat_template() const { return !hf_ || hf_->chat.has_value(); }

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool parse_special) const {
  if (hf_) return hf_->tokenizer.encode(text, add_special_tokens, parse_special);
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  if (hf_) return hf_->tokenizer.decode(ids, skip_special_tokens);
  TextStream s;
  std::string out;
  for (uint32_t id : ids) out += s.feed(id);
  return out + s.finish();
}

Result<std::string> Tokenizer::render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& kwargs) const {
  if (!hf_) {
    std::vector<ChatMessage> ms;
    for (const auto& m : messages) {
      ms.push_back({m.value("role", ""),
                    m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : ""});
    }
    return apply_chat_template(ms);
  }
  if (!hf_->chat) {
    return Status(Code::kFailedPrecondition, "model '" + model_ +
                                                 "' has no chat template (no chat_template.jinja, no chat_template in "
                                                 "tokenizer_config.json): use /v1/completions with the prompt as text");
  }
  return hf_->chat->render(messages, nullptr, add_generation_prompt,
                           kwargs.is_object() ? kwargs : nlohmann::ordered_json::object());
}
std::string Tokenizer::token_bytes(uint32_t id) const {
  if (hf_) return hf_->tokenizer.token_bytes(id);
  if (id < 256) return std::string(1, static_cast<char>(id));
  const uint32_t ids[1] = {id};
  return decode(ids);
}

bool Tokenizer::is_eos(uint32_t id) const { return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end(); }

Status Tokenizer::check_ids(std::span<const uint32_t> ids, std::string_view field) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (static_cast<int64_t>(ids[i]) >= vocab_size_) {
      return Status(Code::kInvalidArgument, std::string(field) + "[" + std::to_string(i) +
                                                "] = " + std::to_string(ids[i]) + " is not a token id of model '" +
                                                model_ + "' (vocabulary " + std::to_string(vocab_size_) + ")");
    }
  }
  return Status::ok();
}

TextStream::TextStream() = default;
TextStream::TextStream(const Tokenizer& tokenizer) {
  if (tokenizer.hf_) hf_ = std::make_unique<HfState>(tokenizer.hf_->tokenizer);
}
TextStream::~TextStream() = default;
TextStream::TextStream(TextStream&&) noexcept = default;
TextStream& TextStream::operator=(TextStream&&) noexcept = default;

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Total length of a UTF-8 character from its lead byte; 0 when it cannot start one.
size_t utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether `b` may be byte `index` (>= 1) of a character whose lead is `lead` (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF).
bool continues(unsigned char lead, size_t index, unsigned char b) {
  if ((b & 0xC0) != 0x80) return false;
  if (index != 1) return true;
  if (lead == 0xE0) return b >= 0xA0;
  if (lead == 0xED) return b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90;
  if (lead == 0xF4) return b <= 0x8F;
  return true;
}
}  // namespace

std::string TextStream::feed(uint32_t id) {
  if (hf_) return hf_->stream.feed(id);
  if (id >= 256) {
    // A non-byte id (sim backend, large vocabulary): one printable character.
    std::string out = finish();
    out.push_back(static_cast<char>(' ' + id % 95));
    return out;
  }
  const auto b = static_cast<unsigned char>(id);
  std::string out;
  if (!pending_.empty()) {
    if (continues(static_cast<unsigned char>(pending_[0]), pending_.size(), b)) {
      pending_.push_back(static_cast<char>(b));
      if (pending_.size() == need_) {
        out = std::move(pending_);
        pending_.clear();
      }
      return out;
    }
    out = finish();  // the held bytes were not a character
  }
  const size_t n = utf8_length(b);
  if (n == 0) {
    out += kReplacement;
  } else if (n == 1) {
    out.push_back(static_cast<char>(b));
  } else {
    pending_.assign(1, static_cast<char>(b));
    need_ = n;
  }
  return out;
}

std::string TextStream::pending() const { return hf_ ? hf_->stream.pending() : pending_; }

std::string TextStream::finish() {
  if (hf_) return hf_->stream.finish();
  if (pending_.empty()) return {};
  pending_.clear();
  return std::string(kReplacement);
}

std::string apply_chat_template(std::span<const ChatMessage> messages) {
  std::string text;
  for (const ChatMessage& m : messages) text += "<|" + m.role + "|>\n" + m.content + "\n";
  return text + "<|assistant|>\n";
}

}  // namespace mc::gateway
