// Tokenizers read from a Hugging Face tokenizer.json, and streaming detokenization (DESIGN.md §15, "Tokenizers").
//
// Shapes. encode(text) -> token ids; decode(ids) -> text through the file's decoders. Text in and out is UTF-8.
//
// Supported (anything else in the file is refused at load with kUnimplemented naming the component and the file,
// never tokenized approximately):
//   model          BPE: vocab, merges ("a b" strings or [a, b] arrays), byte_fallback, ignore_merges, unk_token,
//                  fuse_unk. Refused: dropout > 0, continuing_subword_prefix, end_of_word_suffix; other model
//                  types (WordPiece, Unigram, WordLevel).
//   normalizer     NFC (full canonical composition, tables from Unicode 14), Prepend, Replace (String or Regex),
//                  Lowercase (simple per-code-point lowering of Latin, Greek and Cyrillic), Strip, Sequence.
//                  Refused: NFD, NFKC, NFKD, BertNormalizer, StripAccents, Precompiled.
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex: GPT-2's pattern), Split (Regex or String pattern;
//                  behavior Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert),
//                  Metaspace (replacement, prepend_scheme first/always/never, split), Digits, Whitespace,
//                  WhitespaceSplit, Sequence.
//   post_processor TemplateProcessing (its "single" template), ByteLevel (ids unchanged), Sequence; applied when
//                  encode's add_special_tokens is true.
//   decoder        ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence.
//   added_tokens   matched in the raw text before normalization (longest match first, leftmost first), with
//                  lstrip/rstrip (neighbouring whitespace absorbed) and single_word. Special ones only when
//                  encode's parse_special is true; otherwise they are tokenized as plain text. Limit: a token with
//                  normalized=true is matched against the raw text, not the normalized text (the same for every
//                  tokenizer we know of: their added tokens are plain ASCII).
//
// Regular expressions are PCRE2 (PCRE2_UTF | PCRE2_UCP, JIT when available); Hugging Face's are Oniguruma/fancy-
// regex, which agree on the patterns tokenizers use (GPT-2's, Llama 3's, Qwen2's).
//
// Invalid UTF-8 in encode's input: each maximal ill-formed subsequence (Unicode §3.9) becomes U+FFFD before
// anything else runs (as Python's bytes.decode(errors="replace")), so decode(encode(x)) == x for valid UTF-8 x only.
// decode: ids outside the vocabulary are skipped; byte tokens that do not form UTF-8 become U+FFFD: ByteLevel one
// per maximal ill-formed subsequence (as Hugging Face); ByteFallback one per byte that is not part of a valid
// character, keeping the valid ones (as SentencePiece; Hugging Face replaces the whole run of byte tokens when any
// of it is ill-formed, which would make text already streamed change later).
//
// Errors (load only; encode and decode never fail): kNotFound (no file), kIo, kInvalidArgument (bad JSON, a field
// of the wrong type, merges naming tokens not in the vocabulary, a bound exceeded), kUnimplemented (a component
// above that is not supported). Messages name the file (the `source` of from_json) and the field.
// Bounds on what a file can make us hold: the file 256 MiB, vocab and merges 2^22 entries each, ids < 2^24, a
// token 1 KiB, 65,536 added tokens, a regex 4 KiB, components nested 16 deep.
//
// Thread safety: a Tokenizer is immutable after load; copies share its state (a shared_ptr) and every const method
// may be called from any number of threads at once (the word cache inside is locked). DecodeStream is one
// answer's state: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::text {

struct TokenizerImpl;

class Tokenizer {
 public:
  // A tokenizer.json file, or a directory holding one (a Hugging Face model directory).
  static Result<Tokenizer> load(const std::string& path);
  // The text of a tokenizer.json; `source` names it in error messages.
  static Result<Tokenizer> from_json(std::string_view json, std::string_view source);

  // Text -> ids: added tokens split out, then normalizer, pre-tokenizer, BPE, and (add_special_tokens) the
  // post-processor. parse_special=false tokenizes special tokens written in `text` as plain text (user input).
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens, bool parse_special = true) const;
  // Ids -> text via the decoders; skip_special_tokens drops the special added tokens.
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens) const;

  int64_t vocab_size() const;  // max id + 1 over the vocabulary and the added tokens
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(uint32_t id) const;  // the vocabulary's string (byte-level form etc.)
  // The raw bytes token `id` stands for on its own, before any UTF-8 repair (OpenAI logprobs' `bytes`: a client
  // concatenates them to rebuild a character that spans tokens, so half of an emoji gives its raw bytes, not
  // U+FFFD). The result need not be valid UTF-8:
  //   an added token (special or not)  its content;
  //   an id outside the vocabulary     "";
  //   any other token                  its vocabulary string through the file's decoders, in order, each applied to
  //                                    this token alone and without UTF-8 repair: ByteLevel maps every character
  //                                    back through GPT-2's byte map (a string with a character outside the map is
  //                                    kept, as decode does); ByteFallback makes <0xNN> the one byte 0xNN; Metaspace
  //                                    and Replace replace ("▁" -> " " in Llama 2's files; a regex Replace only
  //                                    when the bytes are valid UTF-8). What depends on the token's position is not
  //                                    applied: Strip, and Metaspace's removal of the first token's leading space.
  // So over ids = encode(x, false, false) of valid UTF-8 x, the concatenation of token_bytes is x as the normalizer
  // left it: x itself for a byte-level tokenizer (NFC(x) with an NFC normalizer), and " " + x with the "▁"s
  // back to spaces for SentencePiece style (Prepend + Replace), i.e. decode(ids) with the leading space its Strip
  // removes. Characters the vocabulary lacks and byte fallback cannot cover (<unk>) are not recovered.
  std::string token_bytes(uint32_t id) const;
  bool is_special(uint32_t id) const;
  // The post-processor's leading special token, else an added token named <s>, <|begin_of_text|>, <bos> or
  // <|startoftext|>; nullopt when neither exists.
  std::optional<uint32_t> bos_id() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;
  friend class DecodeStream;
};

// One answer's ids -> text as they arrive. feed() returns text safe to show now: valid UTF-8, never taken back,
// never splitting a grapheme cluster that a later token could extend (so the last cluster is held until the next
// token shows it complete, or until finish(); a line break releases everything). finish() returns the rest.
// The concatenation of all feed() and finish() outputs equals tokenizer.decode(all ids): tested on every encoded
// case and on random id sequences (partial characters, invalid byte runs, specials anywhere). Should a decoder
// ever rewrite text already shown, the stream goes on from the next character boundary: its chunks are always
// valid UTF-8.
// Cost: each feed decodes a window of the last ~8-24 ids, so O(1) amortized per id whatever the answer's length.
// Holdback limits (a simplified UAX #29): extenders are general category M, ZWJ, variation selectors, emoji
// skin-tone modifiers, tag characters and Hangul medial/final jamo; regional indicators pair up; a cluster longer
// than 128 bytes is released anyway. The stream keeps a reference to the tokenizer's shared state.
class DecodeStream {
 public:
  DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string feed(uint32_t id);
  std::string finish();
  // What the ids fed so far decode to beyond what feed() has released: the held-back trailing grapheme cluster
  // and/or an incomplete character's bytes; "" when nothing is held (and after finish()). It lets a caller look for
  // a stop string in (released + pending()) without waiting for the next token. An incomplete UTF-8 character at
  // the end is given as its raw bytes (not the U+FFFD decode shows for it), so pending() need not be valid UTF-8;
  // other replacement characters (bytes that can never form UTF-8) stay U+FFFD. Hence, after every feed:
  //   released + pending() == decode(ids so far) whenever that decode does not end in U+FFFD;
  //   otherwise it is decode(ids so far) with the trailing incomplete character as raw bytes, the same bytes as the
  //   token_bytes of those ids (for ids encoded from valid text: the prefix of the text they stand for);
  //   finish() returns exactly pending() unless the decode ends in U+FFFD (then finish() shows the U+FFFD).
  std::string pending() const;

 private:
  std::string emit_ready(bool final);
  std::shared_ptr<const TokenizerImpl> impl_;
  bool skip_special_;
  std::vector<uint32_t> ids_;  // the window: ids_[0] is the window's first id
  std::string window_text_;    // decode(ids_) as of the last feed
  size_t emitted_ = 0;         // bytes of window_text_ already returned
};

}  // namespace mc::text
