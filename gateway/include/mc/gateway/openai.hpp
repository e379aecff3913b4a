// The OpenAI API shapes mc-gateway speaks (DESIGN.md §15): request bodies of POST /v1/completions and
// POST /v1/chat/completions parsed and checked into one GenerationRequest, the response and stream-chunk
// documents, and the error document. Pure functions over nlohmann::json: no I/O, no clock (times are passed in).
//
// What is accepted (everything else, and every unknown field, is a 400 naming the field: never silently ignored).
// Both: model, max_tokens (chat also max_completion_tokens), stream, stream_options ({include_usage}), stop (a string
// or up to 4 strings), ignore_eos, user, n (1-16 choices, each its own cluster request), seed, the sampling
// parameters temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty (proto::SamplingParams: their
// bounds), and the extension object "mc": {slo_ttft_ms, slo_tbt_ms, salt} (SLOs in ms, > 0; salt: the request's key
// namespace salt, DESIGN.md §4.1). Completions: prompt as a string, a token-id array, or a one-element array of
// either; logprobs (0-20), echo (not with logprobs: mc computes no prompt logprobs), best_of (only equal to n).
// Chat: messages [{role: system|developer|user|assistant, content: a string or an array of {type: "text", text}}],
// logprobs (a boolean) and top_logprobs (0-20), response_format {type: text}, chat_template_kwargs (variables for the
// model's template, parse_chat_template_kwargs). Refused by name: tools, tool_choice,
// functions, image and audio parts, logit_bias, suffix, response_format json. temperature 0 is greedy decoding
// (then top_p, top_k and min_p change nothing); with temperature > 0 and no seed each choice gets a random seed; with
// a seed, choice i uses seed + i, so the same seed gives the same text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/gateway/tokenizer.hpp"
#include "mc/proto/sampling.hpp"

namespace mc::gateway {

// An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with this HTTP status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;      // the offending field ("" = none)
  std::string code;       // e.g. "context_length_exceeded", "slo_unattainable" ("" = none)
  int retry_after_s = 0;  // > 0: a Retry-After header (429)
};
nlohmann::json error_document(const ApiError& e);
// Whether a Conductor rejection reason (mc::sched::reject_reason_name) is early rejection under load, answered 429
// with Retry-After: ttft_slo, tbt_slo, kv_capacity and load_shed (DESIGN.md §10); the others are not the client's
// rate (invalid_request is a 400, no instance a 503).
bool is_early_rejection(std::string_view reject_reason);
// The answer to a Conductor's rejection (ConductorSubmitReply reject_reason, reason, predicted_ttft_ms; the
// request's TTFT SLO in ms, 0 = the Conductor's default): 429 with Retry-After (the predicted TTFT, 1-60 s) and code
// slo_unattainable or load_shed for early rejection, 400 for invalid_request, 503 otherwise, code the reason. The
// message is a fixed text per reason, with the predicted TTFT and the SLO for ttft_slo: the Conductor's own
// explanation (instance ids, the prefix it found where) is not a client's to read; it is in the Conductor's
// decision log. Only invalid_request passes `conductor_reason` on (it is about the request the client sent).
ApiError rejection_error(std::string_view reject_reason, std::string_view conductor_reason, double predicted_ttft_ms,
                         double slo_ttft_ms);

// Limits and defaults of parsing (mc-gateway flags).
struct ParseLimits {
  int64_t default_max_tokens_completion = 16;  // OpenAI's default for /v1/completions
  int64_t default_max_tokens_chat = 256;       // chat has no default bound in OpenAI's API; ours
  int64_t max_prompt_tokens = 0;               // 0: the model's context; beyond it 413
  size_t max_stop_bytes = 256;                 // one stop string at most
};

struct GenerationRequest {
  bool chat = false;
  std::string model;  // as the client named it (the base model or an adapter)
  std::vector<uint32_t> prompt_tokens;
  proto::SamplingParams sampling;  // seed: as given (seed_given) or 0; the gateway draws one per choice otherwise
  bool seed_given = false;
  int64_t n = 1;          // choices
  bool logprobs = false;  // report each token's logprob (sampling.logprobs = the alternatives asked for)
  bool echo = false;      // completions: the prompt's text before the answer
  std::string echo_text;  // with echo: that text (the prompt string as sent, or its ids decoded)
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  double slo_ttft_ms = 0;  // 0: the gateway's default (then the Conductor's)
  double slo_tbt_ms = 0;
  std::string salt;
};

// Parses a request body as JSON after bounding its shape (mc/common/json_guard.hpp: nesting at most 32 levels, at
// most 16,384 arrays and objects, at most the model's context + 65,536 values), so that neither the parse's memory
// nor a recursive copy or dump of the value depends on what a client sends beyond those bounds. Errors: 400 for
// text that is not JSON or nests too deep, 413 for too many values.
Result<nlohmann::json> parse_body(std::string_view body, const Tokenizer& tokenizer, ApiError* error);

// A chat request's messages checked (roles system, developer as system, user, assistant; content a string or text
// parts, joined; an optional string name) into the array the chat template renders, keys in the order
// role, content, name. Errors: 400 naming the message and field.
Result<nlohmann::ordered_json> parse_chat_messages(const nlohmann::json& messages, ApiError* error);

// A chat request's chat_template_kwargs (vLLM's name): further variables for the model's template, e.g. Qwen3's
// enable_thinking or Llama 3's date_string; an object of at most 64, none of the variables the gateway sets
// (messages, tools, add_generation_prompt, bos_token, eos_token, raise_exception, strftime_now, documents).
// null: none. Errors: 400 naming the field.
Result<nlohmann::ordered_json> parse_chat_template_kwargs(const nlohmann::json& kwargs, ApiError* error);

// A chat body's prompt as the model sees it: its messages checked (parse_chat_messages), rendered by the model's chat
// template with its chat_template_kwargs, and encoded (the post-processor's tokens only with add_special_tokens).
// Used by chat completions (true, false) and /tokenize (as asked). Errors: 400 naming the field (no template, a
// message, the template's raise_exception).
Result<std::vector<uint32_t>> chat_prompt_tokens(const nlohmann::json& body, const Tokenizer& tokenizer,
                                                 bool add_generation_prompt, bool add_special_tokens, ApiError* error);

// Parses and checks a body (already JSON) against the tokenizer and limits. Errors: 400 naming the field,
// 413 for a prompt beyond the context (code context_length_exceeded), 400 when prompt + max_tokens exceed it.
Result<GenerationRequest> parse_generation(const nlohmann::json& body, bool chat, const Tokenizer& tokenizer,
                                           const ParseLimits& limits, ApiError* error);

// Why an answer ended: "stop" (a stop string or end of sequence), "length" (max_tokens).
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV the cache served (the ledger's hit_tokens)
};
nlohmann::json usage_document(const Usage& u);

// The whole (non-streamed) response. `id` e.g. "cmpl-…", created in Unix seconds.
// One choice of a response: its text, why it ended, and its logprobs document (null: not asked).
struct ChoiceResult {
  std::string text;
  std::string finish_reason;
  nlohmann::json logprobs;
};
nlohmann::json completion_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                                   const std::vector<ChoiceResult>& choices, const Usage& usage);
// One streamed chunk: text delta (chat: delta.content; the first chat chunk also carries role), finish_reason
// (null when empty).
nlohmann::json chunk_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                              const std::string& text, const std::string& finish_reason, bool first, int64_t index = 0,
                              const nlohmann::json& logprobs = nullptr);
// The usage-only chunk of stream_options.include_usage (choices empty).
nlohmann::json usage_chunk_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                                    const Usage& usage);

// One answer's text as its tokens arrive (both streamed and whole responses): detokenizes (TextStream), ends it at
// the first stop string (the string itself and what follows are not returned) or at an end-of-sequence id (unless
// ignore_eos), and holds back the last bytes that could still begin a stop string, so no streamed text is ever
// taken back. completion_tokens counts every token fed, the one that ended the answer included.
class AnswerBuilder {
 public:
  AnswerBuilder(const Tokenizer& tokenizer, const GenerationRequest& request);
  // The text now safe to send after token `id` (often ""). After finished() further tokens are ignored.
  std::string on_token(uint32_t id);
  // The rest of the text when the cluster finished the answer (max_tokens generated): finish_reason "length"
  // unless a stop already ended it.
  std::string on_done();
  bool finished() const { return !finish_reason_.empty(); }
  const std::string& finish_reason() const { return finish_reason_; }
  int64_t completion_tokens() const { return completion_tokens_; }

 private:
  std::string release(bool all);

  const Tokenizer& tokenizer_;
  const GenerationRequest& request_;
  TextStream text_;
  std::string held_;  // decoded text not yet returned (may hold the start of a stop string)
  size_t max_stop_ = 0;
  std::string finish_reason_;
  int64_t completion_tokens_ = 0;
};

// The logprobs of one choice, in the shape its endpoint answers: chat {"content": [{token, logprob, bytes,
// top_logprobs: [{token, logprob, bytes}]}]}; completions {tokens, token_logprobs, top_logprobs: [{token: logprob}],
// text_offset}. A token's text is the tokenizer's decoding of that id alone (a piece of a multi-byte character
// decodes to U+FFFD; `bytes` are those of that text).
class LogprobsBuilder {
 public:
  LogprobsBuilder(const Tokenizer& tokenizer, bool chat) : tokenizer_(tokenizer), chat_(chat) {}
  // One token's entry (proto::TokenEvent::logprobs: the token's, then the alternatives). Empty: the backend had no
  // distribution (sim): the token is listed with logprob 0.
  void add(uint32_t token, const std::vector<proto::TokenLogprob>& entry);
  // The whole document, or the entries added since the last take() (a stream's chunk); null when none.
  nlohmann::json document() const;
  nlohmann::json take();

 private:
  nlohmann::json make(size_t from) const;
  const Tokenizer& tokenizer_;
  bool chat_;
  nlohmann::json entries_ = nlohmann::json::array();  // chat: content entries; completions: {token, lp, top, offset}
  size_t taken_ = 0;
  int64_t text_offset_ = 0;
};

// Finds the first stop string in `text` at or after byte `from`; the position or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stop, size_t from);

}  // namespace mc::gateway
