// The gateway's pure parts (gateway/include/mc/gateway/tokenizer.hpp, openai.hpp): byte-level tokenizer and
// detokenizer, the chat template, request parsing and its 400/413 errors, stop strings and end of sequence.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mc/gateway/openai.hpp"
#include "mc/gateway/tokenizer.hpp"

namespace mc::gateway {
namespace {

using nlohmann::json;

Tokenizer tiny() { return *Tokenizer::for_model("tiny"); }
Tokenizer llama() { return *Tokenizer::for_model("llama3-70b"); }

TEST(GatewayTokenizer, TextIsItsUtf8BytesAndEqualPrefixesGiveEqualIds) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.encode("hi"), (std::vector<uint32_t>{'h', 'i'}));
  EXPECT_EQ(t.encode("é").size(), 2u);  // two UTF-8 bytes, two tokens
  const auto a = t.encode("You are a helpful assistant. Question one");
  const auto b = t.encode("You are a helpful assistant. Question two");
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 38, b.begin()));
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_FALSE(t.is_eos(255));
  EXPECT_TRUE(llama().is_eos(128'009));
  EXPECT_TRUE(llama().is_eos(128'001));
  EXPECT_FALSE(llama().is_eos(65));
  EXPECT_FALSE(Tokenizer::for_model("no-such-model").is_ok());
}

// A checkpoint's answers end at its own end tokens (config.json, then generation_config.json), not Llama 3's: a
// Qwen2.5 vocabulary holds ids 128001 and 128009 as ordinary tokens.
TEST(GatewayTokenizer, AHuggingFaceModelEndsAtItsOwnEndTokens) {
  char tmpl[] = "/tmp/mc-gw-eos-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  {
    std::ofstream(dir + "/config.json") << R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
      "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
      "vocab_size": 151936, "max_position_embeddings": 32768, "hidden_act": "silu", "torch_dtype": "bfloat16",
      "tie_word_embeddings": true, "eos_token_id": 151643})";
    std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [151645, 151643]})";
  }
  auto t = Tokenizer::for_model(dir);
  // Only SentencePiece's own tokenizer.model, no tokenizer.json: refused, naming what to write (a byte-level tokenizer
  // would be silently wrong for a 151,936-id vocabulary).
  std::ofstream(dir + "/tokenizer.model") << "sentencepiece";
  auto sp = Tokenizer::for_model(dir);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(sp.is_ok());
  EXPECT_NE(sp.status().message().find("tokenizer.json"), std::string::npos) << sp.status().to_string();
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(t->is_eos(151'645));
  EXPECT_TRUE(t->is_eos(151'643));
  EXPECT_FALSE(t->is_eos(128'009));
  EXPECT_FALSE(t->is_eos(128'001));
}

TEST(GatewayTokenizer, StreamHoldsIncompleteCharactersAndReplacesBadBytes) {
  TextStream s;
  EXPECT_EQ(s.feed('a'), "a");
  EXPECT_EQ(s.feed(0xC3), "");  // first byte of é
  EXPECT_EQ(s.feed(0xA9), "\xC3\xA9");
  EXPECT_EQ(s.feed(0xFF), "\xEF\xBF\xBD");  // never a UTF-8 byte
  EXPECT_EQ(s.feed(0xE2), "");              // start of a 3-byte character ...
  EXPECT_EQ(s.feed('x'),
            "\xEF\xBF\xBD"
            "x");  // ... broken by 'x'
  EXPECT_EQ(s.feed(0xF0), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");  // incomplete at the end
  EXPECT_EQ(s.feed(0xED), "");
  EXPECT_EQ(s.feed(0xA0), "\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate is not UTF-8: both bytes replaced
  EXPECT_EQ(s.feed(300), std::string(1, static_cast<char>(' ' + 300 % 95)));  // a non-byte id: one printable char
}

TEST(GatewayTokenizer, ChatTemplateRepeatsThePreviousTurnAsPrefix) {
  std::vector<ChatMessage> turn1 = {{"system", "Be brief."}, {"user", "Hi"}};
  const std::string p1 = apply_chat_template(turn1);
  EXPECT_EQ(p1, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
  std::vector<ChatMessage> turn2 = turn1;
  turn2.push_back({"assistant", "Hello."});
  turn2.push_back({"user", "More"});
  const std::string p2 = apply_chat_template(turn2);
  EXPECT_EQ(p2.rfind(p1 + "Hello.\n", 0), 0u);
}

Result<GenerationRequest> parse(const json& body, bool chat, ApiError* e, const Tokenizer& t = tiny()) {
  return parse_generation(body, chat, t, ParseLimits{}, e);
}

TEST(GatewayParse, CompletionWithTextAndTokenPromptsAndTheMcExtension) {
  ApiError e;
  auto r = parse({{"model", "tiny"},
                  {"prompt", "abc"},
                  {"max_tokens", 5},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}}},
                  {"stop", {"\n", "END"}},
                  {"ignore_eos", true},
                  {"temperature", 0},
                  {"mc", {{"slo_ttft_ms", 500}, {"slo_tbt_ms", 50}, {"salt", "s1"}}}},
                 false, &e);
  ASSERT_TRUE(r.is_ok()) << e.message;
  EXPECT_EQ(r->prompt_tokens, (std::vector<uint32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->ignore_eos);
  EXPECT_EQ(r->stop.size(), 2u);
  EXPECT_EQ(r->slo_ttft_ms, 500);
  EXPECT_EQ(r->slo_tbt_ms, 50);
  EXPECT_EQ(r->salt, "s1");
  auto ids = parse({{"model", "tiny"}, {"prompt", {1, 2, 3}}}, false, &e);
  ASSERT_TRUE(ids.is_ok()) << e.message;
  EXPECT_EQ(ids->prompt_tokens, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(ids->max_tokens, 16);  // OpenAI's default for completions
  auto one = parse({{"model", "tiny"}, {"prompt", {{7, 8}}}}, false, &e);
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->prompt_tokens.size(), 2u);
}

TEST(GatewayParse, ChatMessagesGoThroughTheTemplate) {
  ApiError e;
  auto r = parse(
      {{"model", "tiny"},
       {"messages",
        {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "U"}}}}}}},
       {"max_completion_tokens", 3}},
      true, &e);
  ASSERT_TRUE(r.is_ok()) << e.message;
  EXPECT_EQ(r->prompt_tokens, tiny().encode("<|system|>\nS\n<|user|>\nU\n<|assistant|>\n"));
  // Text parts are joined by a newline (as vLLM joins them); modalities ["text"] is what is served anyway.
  auto parts = parse(
      {{"model", "tiny"},
       {"messages",
        {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"modalities", {"text"}}},
      true, &e);
  ASSERT_TRUE(parts.is_ok()) << e.message;
  EXPECT_EQ(parts->prompt_tokens, tiny().encode("<|user|>\na\nb\n<|assistant|>\n"));
  EXPECT_EQ(r->max_tokens, 3);
}

TEST(GatewayParse, SamplingParametersReachTheRequest) {
  ApiError e;
  auto d = parse({{"model", "tiny"}, {"prompt", "x"}}, false, &e);
  ASSERT_TRUE(d.is_ok()) << e.message;
  EXPECT_EQ(d->sampling.temperature, 1.0);  // OpenAI's default: sampling
  EXPECT_FALSE(d->seed_given);
  EXPECT_EQ(d->sampling.logprobs, -1);
  EXPECT_EQ(d->n, 1);
  auto r = parse({{"model", "tiny"},
                  {"prompt", "x"},
                  {"temperature", 0.7},
                  {"top_p", 0.9},
                  {"top_k", 40},
                  {"min_p", 0.05},
                  {"seed", -3},
                  {"presence_penalty", 0.5},
                  {"frequency_penalty", -0.5},
                  {"n", 3},
                  {"best_of", 3},
                  {"logprobs", 2}},
                 false, &e);
  ASSERT_TRUE(r.is_ok()) << e.message;
  EXPECT_EQ(r->sampling.temperature, 0.7);
  EXPECT_EQ(r->sampling.top_p, 0.9);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.min_p, 0.05);
  EXPECT_TRUE(r->seed_given);
  EXPECT_EQ(r->sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r->sampling.presence_penalty, 0.5);
  EXPECT_EQ(r->sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r->n, 3);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->sampling.logprobs, 2);
  auto chat = parse({{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", "x"}}}},
                     {"logprobs", true},
                     {"top_logprobs", 5},
                     {"top_k", -1}},
                    true, &e);
  ASSERT_TRUE(chat.is_ok()) << e.message;
  EXPECT_TRUE(chat->logprobs);
  EXPECT_EQ(chat->sampling.logprobs, 5);
  EXPECT_EQ(chat->sampling.top_k, 0);  // vLLM's -1: no limit
  auto echo = parse({{"model", "tiny"}, {"prompt", {104, 105}}, {"echo", true}}, false, &e);
  ASSERT_TRUE(echo.is_ok()) << e.message;
  EXPECT_EQ(echo->echo_text, "hi");
}

TEST(GatewayDocuments, LogprobsInTheChatAndCompletionShapes) {
  const Tokenizer t = tiny();
  LogprobsBuilder chat(t, true);
  chat.add('a', {{'a', -0.5f}, {'a', -0.5f}, {'b', -1.5f}});
  const json c = chat.document();
  ASSERT_EQ(c["content"].size(), 1u);
  EXPECT_EQ(c["content"][0]["token"], "a");
  EXPECT_FLOAT_EQ(c["content"][0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(c["content"][0]["bytes"], json::array({97}));
  EXPECT_EQ(c["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["token"], "b");
  EXPECT_FALSE(chat.take().is_null());
  EXPECT_TRUE(chat.take().is_null());  // nothing new since
  LogprobsBuilder text(t, false);
  text.add('h', {{'h', -0.1f}, {'h', -0.1f}});
  text.add('i', {{'i', -0.2f}, {'i', -0.2f}});
  const json d = text.document();
  EXPECT_EQ(d["tokens"], json::array({"h", "i"}));
  EXPECT_EQ(d["text_offset"], json::array({0, 1}));
  EXPECT_FLOAT_EQ(d["token_logprobs"][1].get<float>(), -0.2f);
  EXPECT_TRUE(d["top_logprobs"][0].contains("h"));
}

// Each unsupported or malformed field is a 400 naming it.
TEST(GatewayParse, UnsupportedOrBadFieldsAre400NamingTheField) {
  const json base = {{"model", "tiny"}, {"prompt", "x"}};
  auto expect_param = [&](json body, const std::string& param, bool chat = false) {
    ApiError e;
    auto r = parse(body, chat, &e);
    EXPECT_FALSE(r.is_ok()) << body.dump();
    EXPECT_EQ(e.http_status, 400) << body.dump();
    EXPECT_EQ(e.param, param) << body.dump() << ": " << e.message;
    EXPECT_NE(e.message.find(param), std::string::npos) << e.message;
  };
  auto with = [&](const char* k, json v) {
    json b = base;
    b[k] = std::move(v);
    return b;
  };
  expect_param(with("n", 17), "n");
  expect_param(with("n", 0), "n");
  expect_param(with("logprobs", 21), "logprobs");
  expect_param(with("logprobs", true), "logprobs");  // completions: a count
  expect_param(with("temperature", 2.5), "temperature");
  expect_param(with("temperature", "hot"), "temperature");
  expect_param(with("top_p", 0), "top_p");
  expect_param(with("top_k", -2), "top_k");
  expect_param(with("min_p", 1.5), "min_p");
  expect_param(with("presence_penalty", 3), "presence_penalty");
  expect_param(with("frequency_penalty", -2.5), "frequency_penalty");
  expect_param(with("seed", 1.5), "seed");
  expect_param(with("best_of", 3), "best_of");
  expect_param(with("echo", "yes"), "echo");
  expect_param(json{{"model", "tiny"}, {"prompt", "x"}, {"echo", true}, {"logprobs", 1}}, "echo");
  expect_param(with("logit_bias", {{"5", 10}}), "logit_bias");
  expect_param(with("suffix", "s"), "suffix");
  expect_param(json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}},
               "top_logprobs", true);  // without logprobs: true
  expect_param(json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"logprobs", 2}},
               "logprobs", true);  // chat: a boolean
  expect_param(json{{"model", "tiny"},
                    {"messages", {{{"role", "user"}, {"content", "x"}}}},
                    {"response_format", {{"type", "json_object"}}}},
               "response_format", true);
  expect_param(json{{"model", "tiny"},
                    {"messages", {{{"role", "user"}, {"content", "x"}}}},
                    {"chat_template_kwargs", {{"bos_token", "<evil>"}}}},
               "chat_template_kwargs.bos_token", true);
  expect_param(
      json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"chat_template_kwargs", 3}},
      "chat_template_kwargs", true);
  expect_param(with("frobnicate", 1), "frobnicate");
  expect_param(with("max_tokens", 0), "max_tokens");
  expect_param(with("max_tokens", "5"), "max_tokens");
  expect_param(with("stop", {"a", "b", "c", "d", "e"}), "stop");
  expect_param(with("stop", ""), "stop");
  expect_param(with("stream", "yes"), "stream");
  expect_param(with("stream_options", {{"include_usage", true}}), "stream_options");  // without stream
  expect_param(with("mc", {{"slo_ttft_ms", -1}}), "mc.slo_ttft_ms");
  expect_param(with("mc", {{"tenant", "x"}}), "mc.tenant");
  expect_param(with("prompt", {"a", "b"}), "prompt");  // two prompts
  expect_param(with("prompt", {1, 256}), "prompt");    // beyond the tiny vocabulary
  expect_param(with("prompt", {1, -1}), "prompt");
  expect_param(json{{"prompt", "x"}}, "model");
  expect_param(json{{"model", "tiny"}}, "prompt");
  expect_param(json{{"model", "tiny"}, {"messages", json::array()}}, "messages", true);
  expect_param(json{{"model", "tiny"}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}}, "messages[0].role", true);
  expect_param(json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
               "messages[0].content[0]", true);
  expect_param(json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", json::array()}},
               "tools", true);
  ApiError e;
  EXPECT_FALSE(parse(json::array(), false, &e).is_ok());
  EXPECT_EQ(e.http_status, 400);
}

TEST(GatewayParse, PromptBeyondTheContextIs413AndPromptPlusMaxTokensIs400) {
  Tokenizer t = tiny();
  t.set_max_context_tokens(10);
  ApiError e;
  auto r = parse({{"model", "tiny"}, {"prompt", std::string(10, 'a')}}, false, &e, t);
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(e.http_status, 413);
  EXPECT_EQ(e.code, "context_length_exceeded");
  r = parse({{"model", "tiny"}, {"prompt", std::string(5, 'a')}, {"max_tokens", 6}}, false, &e, t);
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  // Without max_tokens the default shrinks to what the context leaves.
  r = parse({{"model", "tiny"}, {"prompt", std::string(5, 'a')}}, false, &e, t);
  ASSERT_TRUE(r.is_ok()) << e.message;
  EXPECT_EQ(r->max_tokens, 5);
}

std::string feed_all(AnswerBuilder& a, const std::string& text) {
  std::string out;
  for (unsigned char c : text) out += a.on_token(c);
  return out;
}

TEST(GatewayAnswer, StopStringEndsTheAnswerAndIsNeverStreamed) {
  GenerationRequest req;
  req.stop = {"END"};
  const Tokenizer t = tiny();
  AnswerBuilder a(t, req);
  std::string out = feed_all(a, "hello EN");
  EXPECT_EQ(out, "hello ");  // "EN" is held: it may begin "END"
  out += a.on_token('D');
  EXPECT_TRUE(a.finished());
  EXPECT_EQ(a.finish_reason(), "stop");
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(a.on_token('x'), "");  // ignored after the end
  EXPECT_EQ(a.completion_tokens(), 9);
}

TEST(GatewayAnswer, HeldBytesAreReleasedWhenTheyCannotBeAStopAndAtTheEnd) {
  GenerationRequest req;
  req.stop = {"END"};
  const Tokenizer t = tiny();
  AnswerBuilder a(t, req);
  std::string out = feed_all(a, "ENx");
  out += a.on_done();
  EXPECT_EQ(out, "ENx");
  EXPECT_EQ(a.finish_reason(), "length");
}

TEST(GatewayAnswer, EndOfSequenceStopsUnlessIgnored) {
  const Tokenizer t = llama();
  GenerationRequest req;
  AnswerBuilder a(t, req);
  EXPECT_EQ(a.on_token('o'), "o");
  EXPECT_EQ(a.on_token(128'009), "");
  EXPECT_EQ(a.finish_reason(), "stop");
  req.ignore_eos = true;
  AnswerBuilder b(t, req);
  b.on_token(128'009);
  EXPECT_FALSE(b.finished());
  EXPECT_EQ(b.on_done(), "");
  EXPECT_EQ(b.finish_reason(), "length");
}

TEST(GatewayDocuments, ShapesOfResponsesChunksUsageAndErrors) {
  Usage u{10, 4, 8};
  const json whole = completion_document(true, "chatcmpl-1", 7, "m", {{"hey", "length", nullptr}}, u);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["total_tokens"], 14);
  EXPECT_EQ(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  const json text =
      completion_document(false, "cmpl-1", 7, "m", {{"hey", "stop", nullptr}, {"ho", "length", nullptr}}, u);
  EXPECT_EQ(text["choices"].size(), 2u);
  EXPECT_EQ(text["choices"][1]["index"], 1);
  EXPECT_EQ(text["choices"][1]["text"], "ho");
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "hey");
  const json first = chunk_document(true, "c", 7, "m", "", "", true);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json usage = usage_chunk_document(true, "c", 7, "m", u);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
  ApiError e;
  e.http_status = 429;
  e.message = "slow down";
  e.code = "slo_unattainable";
  const json err = error_document(e);
  EXPECT_EQ(err["error"]["message"], "slow down");
  EXPECT_EQ(err["error"]["code"], "slo_unattainable");
  EXPECT_TRUE(err["error"]["param"].is_null());
  // The Conductor's early rejections, load shedding included, are the client's 429; the others are not.
  for (const char* r : {"ttft_slo", "tbt_slo", "kv_capacity", "load_shed"}) EXPECT_TRUE(is_early_rejection(r)) << r;
  for (const char* r : {"invalid_request", "no_prefill_instance", "no_decode_instance", "", "none"}) {
    EXPECT_FALSE(is_early_rejection(r)) << r;
  }
}

// What a client reads of a Conductor's rejection: the status and code by reason, a fixed text that carries none of
// the Conductor's explanation (instance ids, where the prefix was found), the predicted TTFT and SLO for ttft_slo.
TEST(GatewayDocuments, ARejectionTellsTheClientTheReasonButNotThePlacement) {
  const std::string placement = "best: P1 on host h1 reuses 3 of 4 blocks from gpu-P1";
  const ApiError ttft = rejection_error("ttft_slo", placement, 2500.04, 1000);
  EXPECT_EQ(ttft.http_status, 429);
  EXPECT_EQ(ttft.type, "rate_limit_error");
  EXPECT_EQ(ttft.code, "slo_unattainable");
  EXPECT_EQ(ttft.retry_after_s, 2);
  EXPECT_NE(ttft.message.find("[predicted TTFT 2500.0 ms, TTFT SLO 1000 ms]"), std::string::npos) << ttft.message;
  EXPECT_NE(rejection_error("ttft_slo", placement, 10, 0).message.find("the Conductor's default"), std::string::npos);
  EXPECT_EQ(rejection_error("ttft_slo", placement, 10, 0).retry_after_s, 1);    // at least 1 s
  EXPECT_EQ(rejection_error("ttft_slo", placement, 1e9, 0).retry_after_s, 60);  // at most 60 s
  const ApiError shed = rejection_error("load_shed", placement, 20'000, 30'000);
  EXPECT_EQ(shed.http_status, 429);
  EXPECT_EQ(shed.code, "load_shed");
  EXPECT_EQ(shed.retry_after_s, 20);
  EXPECT_NE(shed.message.find("shorter prompt"), std::string::npos) << shed.message;
  for (const char* r : {"tbt_slo", "kv_capacity"}) {
    const ApiError e = rejection_error(r, placement, 5, 0);
    EXPECT_EQ(e.http_status, 429) << r;
    EXPECT_EQ(e.code, "slo_unattainable") << r;
  }
  const ApiError bad = rejection_error("invalid_request", "tokens: id 70000 is outside the vocabulary", 0, 0);
  EXPECT_EQ(bad.http_status, 400);
  EXPECT_NE(bad.message.find("outside the vocabulary"), std::string::npos) << bad.message;
  for (const char* r : {"no_prefill_instance", "no_decode_instance", "decode_refused", "instance_lost", "cancelled"}) {
    const ApiError e = rejection_error(r, "decode instance D0 at tcp://10.0.0.7:5555 refused: " + placement, 5, 0);
    EXPECT_EQ(e.http_status, 503) << r;
    EXPECT_EQ(e.type, "server_error") << r;
    EXPECT_EQ(e.code, r);
  }
  for (const char* r : {"ttft_slo", "tbt_slo", "kv_capacity", "load_shed", "no_prefill_instance", "decode_refused",
                        "instance_lost", "cancelled"}) {
    const std::string m = rejection_error(r, "decode instance D0 at tcp://10.0.0.7:5555: " + placement, 5, 0).message;
    for (const char* leak : {"P1", "h1", "gpu-P1", "D0", "10.0.0.7", "blocks"}) {
      EXPECT_EQ(m.find(leak), std::string::npos) << r << ": " << m;
    }
  }
}

}  // namespace
}  // namespace mc::gateway
