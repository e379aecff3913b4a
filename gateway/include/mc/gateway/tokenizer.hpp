// The gateway's tokenizer and chat template (DESIGN.md §15): how the text of an OpenAI request becomes the
// token ids the cluster prefills and keys (block_key.hpp), and how output token ids become text.
//
// One tokenizer for every model preset, byte-level: a prompt's UTF-8 bytes are its token ids (0..255), so
// prompt_tokens is exactly the byte count, the mapping needs no vocabulary file, and equal text prefixes give
// equal token prefixes, hence equal block keys (the prefix cache works on text). It is exact for the `ref`
// backend's presets (tiny: vocabulary 256, each id one byte). The larger presets (small: 1,024; llama3-*:
// 128,256) accept the same ids; an output id at or above 256 (the `sim` backend emits h mod vocab, a hash,
// DESIGN.md §7) is shown as one printable ASCII character (' ' + id mod 95), so completion_tokens still counts
// characters one to one. End of sequence: the llama3 presets' <|end_of_text|> (128001) and <|eot_id|> (128009);
// the byte-level presets have none (every id is a byte), so their answers end at max_tokens or a stop string.
//
// Thread-safety: Tokenizer is immutable after construction (share it); TextStream is one request's state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::gateway {

class Tokenizer {
 public:
  // vocab_size > 0; ids in eos_ids end an answer unless the request sets ignore_eos.
  Tokenizer(std::string model, int64_t vocab_size, std::vector<uint32_t> eos_ids);
  // The tokenizer of a model preset (mc/model/model_config.hpp names) or model JSON file; kInvalidArgument
  // lists the presets for an unknown name.
  static Result<Tokenizer> for_model(std::string_view spec);

  const std::string& model() const { return model_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_context_tokens() const { return max_context_tokens_; }
  void set_max_context_tokens(int64_t n) { max_context_tokens_ = n; }

  // The text's UTF-8 bytes as ids.
  std::vector<uint32_t> encode(std::string_view text) const;
  bool is_eos(uint32_t id) const;
  // kInvalidArgument naming `field` and the first id at or above the vocabulary.
  Status check_ids(std::span<const uint32_t> ids, std::string_view field) const;

 private:
  std::string model_;
  int64_t vocab_size_;
  int64_t max_context_tokens_ = 32768;
  std::vector<uint32_t> eos_ids_;
};

// Output ids -> text, one token at a time, always valid UTF-8: bytes of a multi-byte character are held until
// it is complete; a byte that cannot start or continue one becomes U+FFFD.
class TextStream {
 public:
  // The text that `id` completes (often empty or one character).
  std::string feed(uint32_t id);
  // What is still held (an incomplete character) as U+FFFD, at the end of the answer.
  std::string finish();

 private:
  std::string pending_;  // bytes of an incomplete UTF-8 character
  size_t need_ = 0;      // its total length
};

// A chat message of a chat completion (content already reduced to text).
struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// The chat template (DESIGN.md §15): each message as "<|ROLE|>\n" CONTENT "\n", then "<|assistant|>\n" where the
// answer begins. Deterministic, so a conversation's next turn repeats the previous prompt as its prefix.
std::string apply_chat_template(std::span<const ChatMessage> messages);

}  // namespace mc::gateway
