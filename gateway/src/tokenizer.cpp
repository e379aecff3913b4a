#include "mc/gateway/tokenizer.hpp"

#include <algorithm>

#include "mc/model/model_config.hpp"

namespace mc::gateway {

Tokenizer::Tokenizer(std::string model, int64_t vocab_size, std::vector<uint32_t> eos_ids)
    : model_(std::move(model)), vocab_size_(vocab_size), eos_ids_(std::move(eos_ids)) {}

Result<Tokenizer> Tokenizer::for_model(std::string_view spec) {
  MC_ASSIGN_OR_RETURN(model::ModelConfig m, model::load_model(spec));
  if (m.vocab_size < 256) {
    return Status(Code::kInvalidArgument, "model '" + m.name + "' has a vocabulary of " + std::to_string(m.vocab_size) +
                                              " ids: the byte-level tokenizer needs at least 256");
  }
  std::vector<uint32_t> eos;
  // The model's own end tokens (config.json, then generation_config.json: Qwen2.5's 151643/151645, Mistral's 2,
  // Llama 3.1 Instruct's 128001/128008/128009); a preset names none: Llama 3's <|end_of_text|> and <|eot_id|>, where
  // the vocabulary has them.
  for (int64_t id : m.eos_token_ids) {
    if (id >= 0 && id < m.vocab_size) eos.push_back(static_cast<uint32_t>(id));
  }
  if (eos.empty() && m.checkpoint_dir.empty() && m.vocab_size > 128'009) eos = {128'001, 128'009};
  Tokenizer t(m.name, m.vocab_size, std::move(eos));
  t.set_max_context_tokens(m.max_context_tokens);
  return t;
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
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

std::string TextStream::finish() {
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
