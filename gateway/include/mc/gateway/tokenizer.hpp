// The gateway's tokenizer and chat template (DESIGN.md §15): how the text of an OpenAI request becomes the
// token ids the cluster prefills and keys (block_key.hpp), and how output token ids become text.
//
// Two kinds, chosen by the model mc-gateway serves (--model):
//  - A Hugging Face model directory with a tokenizer.json: its own tokenizer (mc/text/tokenizer.hpp: byte-level
//    or SentencePiece-style BPE, added and special tokens), and its chat template (mc/text/chat_template.hpp:
//    chat_template.jinja or tokenizer_config.json's, with its bos_token and eos_token). A chat request to a model
//    without a template is refused (400), not templated by guess. End of sequence: the model's eos ids
//    (config.json, generation_config.json) and the template's eos_token.
//  - A model preset or a model JSON file (no vocabulary file): byte-level, a prompt's UTF-8 bytes are its token
//    ids (0..255), so prompt_tokens is exactly the byte count and equal text prefixes give equal token prefixes.
//    Exact for the `ref` backend's presets (tiny: vocabulary 256, each id one byte). The larger presets (small:
//    1,024; llama3-*: 128,256) accept the same ids; an output id at or above 256 (the `sim` backend emits h mod
//    vocab, a hash, DESIGN.md §7) is shown as one printable ASCII character (' ' + id mod 95), so
//    completion_tokens still counts characters one to one. End of sequence: the llama3 presets' <|end_of_text|>
//    (128001) and <|eot_id|> (128009); the byte-level presets have none. Its chat template is mc's own:
//    "<|ROLE|>\n" CONTENT "\n" per message, then "<|assistant|>\n".
//
// Either way a conversation's next turn renders the previous prompt as its prefix (the templates of real models
// do), so the Conductor finds the earlier turn's KV blocks (DESIGN.md §15 "The prefix cache sees what the model
// sees").
//
// Thread-safety: Tokenizer is immutable after construction and cheap to copy (shares its state); TextStream is one
// answer's state.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"

namespace mc::gateway {

class Tokenizer {
 public:
  // A byte-level tokenizer: vocab_size > 0; ids in eos_ids end an answer unless the request sets ignore_eos.
  Tokenizer(std::string model, int64_t vocab_size, std::vector<uint32_t> eos_ids);
  // The tokenizer of a model preset, model JSON file or Hugging Face model directory (above). kInvalidArgument lists
  // the presets for an unknown name; a directory's tokenizer.json or chat template that cannot be read or is not
  // supported is an error naming the file and the construct (never a silently different tokenization).
  static Result<Tokenizer> for_model(std::string_view spec);

  const std::string& model() const { return model_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_context_tokens() const { return max_context_tokens_; }
  void set_max_context_tokens(int64_t n) { max_context_tokens_ = n; }
  // "byte-level" or "tokenizer.json" (what /tokenize and the ready line report).
  std::string kind() const;
  bool has_chat_template() const;

  // Text -> ids. add_special_tokens: the tokenizer's post-processor (a Llama 3 BOS) — completions' prompts; a chat
  // prompt's template writes its own. Special-token text inside `text` is matched as the special token only when
  // parse_special (the template's own text); a user's text never is (chat content is rendered by the template, so
  // render_chat's output is encoded with parse_special; a completion's prompt is the client's text alone and is
  // encoded with parse_special as vLLM does).
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = false, bool parse_special = true) const;
  // Ids -> text (the tokenizer's decoders). Byte-level: the bytes, invalid UTF-8 replaced by U+FFFD.
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens = false) const;
  // The raw bytes one token stands for (OpenAI logprobs' `bytes`: a client concatenates them to rebuild a character
  // that spans tokens): tokenizer.json: text::Tokenizer::token_bytes; byte-level: the byte, or for an id above 255
  // the one character decode() shows.
  std::string token_bytes(uint32_t id) const;
  bool is_eos(uint32_t id) const;
  // kInvalidArgument naming `field` and the first id at or above the vocabulary.
  Status check_ids(std::span<const uint32_t> ids, std::string_view field) const;

  // The chat template applied to `messages` (a JSON array of {role, content: string}: parse_chat_messages), ending
  // where the assistant's answer begins when add_generation_prompt. kFailedPrecondition when the model has no chat
  // template; the template's raise_exception (e.g. "roles must alternate") as kInvalidArgument with its text.
  // kwargs: further variables for the template (a request's chat_template_kwargs, e.g. Qwen3's enable_thinking or
  // Llama 3's date_string); mc's own template has none and ignores them.
  Result<std::string> render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt = true,
                                  const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;

  struct Impl;  // the tokenizer.json kind's state (tokenizer.cpp)

 private:
  friend class TextStream;
  std::string model_;
  int64_t vocab_size_;
  int64_t max_context_tokens_ = 32768;
  std::vector<uint32_t> eos_ids_;
  std::shared_ptr<const Impl> hf_;  // null: byte-level
};

// Output ids -> text, one token at a time, always valid UTF-8 and never taken back: the concatenation of every
// feed() and finish() is the text of all ids. Byte-level: bytes of a multi-byte character are held until it is
// complete, a byte that cannot start or continue one becomes U+FFFD. tokenizer.json: mc/text's DecodeStream (also
// holds a grapheme a later token could still extend). The Tokenizer must outlive it.
class TextStream {
 public:
  TextStream();  // byte-level
  explicit TextStream(const Tokenizer& tokenizer);
  ~TextStream();
  TextStream(TextStream&&) noexcept;
  TextStream& operator=(TextStream&&) noexcept;
  // The text that `id` completes (often empty or one character).
  std::string feed(uint32_t id);
  // What is still held, at the end of the answer (byte-level: an incomplete character as U+FFFD).
  std::string finish();
  // What feed() has decoded but holds back, as raw bytes (an incomplete character; a grapheme a later token could
  // extend), so a stop string can be found without waiting for the next token. Not released by this call.
  std::string pending() const;

 private:
  struct HfState;
  std::unique_ptr<HfState> hf_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
  size_t need_ = 0;      // its total length
};

// A chat message of a chat completion (content already reduced to text).
struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// mc's own chat template of the byte-level models: each message as "<|ROLE|>\n" CONTENT "\n", then "<|assistant|>\n"
// where the answer begins. Deterministic, so a conversation's next turn repeats the previous prompt as its prefix.
std::string apply_chat_template(std::span<const ChatMessage> messages);

}  // namespace mc::gateway
