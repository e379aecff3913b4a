// Fuzz harness: what mc-gateway does with an HTTP request body before anything leaves the process
// (gateway/include/mc/gateway/openai.hpp): parse_body (the shape bounds, then JSON), then parse_generation against the
// tiny (vocabulary 256) or the llama3-70b tokenizer, as a completion or a chat completion. Input: one control byte (bit
// 0: chat, bit 1: llama3-70b), then the body. Invariants: no crash or throw; a refusal is 400 or 413 with a message; an
// accepted request has a non-empty prompt of ids inside the vocabulary that with max_tokens fits the context; and
// feeding its own prompt ids back as output through an AnswerBuilder ends with a finish reason and valid UTF-8 JSON.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "mc/gateway/openai.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_openai_request: invariant broken: %s\n", what);
  std::abort();
}

const mc::gateway::Tokenizer& tokenizer(bool llama) {
  static const mc::gateway::Tokenizer tiny = *mc::gateway::Tokenizer::for_model("tiny");
  static const mc::gateway::Tokenizer big = *mc::gateway::Tokenizer::for_model("llama3-70b");
  return llama ? big : tiny;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) != 0;
  const mc::gateway::Tokenizer& tok = tokenizer((data[0] & 2) != 0);
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  mc::gateway::ApiError error;
  mc::Result<nlohmann::json> j = mc::gateway::parse_body(body, tok, &error);
  if (!j.is_ok()) {
    if (error.http_status != 400 && error.http_status != 413) broken("a body refusal that is neither 400 nor 413");
    if (error.message.empty()) broken("a body refusal without a message");
    return 0;
  }
  mc::Result<mc::gateway::GenerationRequest> r = mc::gateway::parse_generation(j.value(), chat, tok, {}, &error);
  if (!r.is_ok()) {
    if (error.http_status != 400 && error.http_status != 413) broken("a refusal that is neither 400 nor 413");
    if (error.message.empty()) broken("a refusal without a message");
    return 0;
  }
  if (r->prompt_tokens.empty()) broken("an accepted empty prompt");
  if (!tok.check_ids(r->prompt_tokens, "prompt").is_ok()) broken("an accepted id outside the vocabulary");
  if (r->max_tokens < 1 || static_cast<int64_t>(r->prompt_tokens.size()) + r->max_tokens > tok.max_context_tokens()) {
    broken("an accepted request beyond the context");
  }
  mc::gateway::AnswerBuilder answer(tok, *r);
  std::string text;
  for (size_t i = 0; i < r->prompt_tokens.size() && i < 4096; ++i) text += answer.on_token(r->prompt_tokens[i]);
  text += answer.on_done();
  if (!answer.finished()) broken("an answer without a finish reason");
  const nlohmann::json doc =
      mc::gateway::completion_document(chat, "id", 0, r->model, {{text, answer.finish_reason(), nullptr}}, {});
  (void)doc.dump();  // throws on invalid UTF-8: the detokenizer must never produce it
  return 0;
}
