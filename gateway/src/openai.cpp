#include "mc/gateway/openai.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include "mc/common/json_guard.hpp"

namespace mc::gateway {

using nlohmann::json;

bool is_early_rejection(std::string_view reject_reason) {
  return reject_reason == "ttft_slo" || reject_reason == "tbt_slo" || reject_reason == "kv_capacity" ||
         reject_reason == "load_shed";
}

ApiError rejection_error(std::string_view reject_reason, std::string_view conductor_reason, double predicted_ttft_ms,
                         double slo_ttft_ms) {
  ApiError e;
  e.code = std::string(reject_reason);
  if (is_early_rejection(reject_reason)) {
    // The paper's early rejection (Mooncake §6 [paper]; DESIGN.md §10): the SLO cannot be met now, or only after a
    // wait longer than the Conductor's SLO headroom, or the prompt would hold up the requests after it too long in
    // a burst (load_shed); retry later.
    e.http_status = 429;
    e.type = "rate_limit_error";
    e.retry_after_s = static_cast<int>(std::clamp(predicted_ttft_ms / 1000.0, 1.0, 60.0));
    if (reject_reason == "load_shed") {
      e.message =
          "the cluster is under load and this prompt's prefill would hold up the requests queued after it "
          "(load shedding); retry later, or send a shorter prompt";
      return e;
    }
    e.code = "slo_unattainable";
    if (reject_reason == "ttft_slo") {
      char slo[64];
      if (slo_ttft_ms > 0) {
        std::snprintf(slo, sizeof slo, "%g ms", slo_ttft_ms);
      } else {
        std::snprintf(slo, sizeof slo, "the Conductor's default");
      }
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "the cluster cannot meet this request's time-to-first-token SLO now [predicted TTFT %.1f ms, TTFT "
                    "SLO %s]; retry later",
                    predicted_ttft_ms, slo);
      e.message = buf;
    } else if (reject_reason == "tbt_slo") {
      e.message = "no decode instance can meet this request's time-between-tokens SLO now; retry later";
    } else {
      e.message =
          "no decode instance has room for this request's KV cache (its prompt and max_tokens) now; retry "
          "later, or ask for fewer tokens";
    }
    return e;
  }
  if (reject_reason == "invalid_request") {
    e.http_status = 400;
    e.message = "the Conductor refused the request: " + std::string(conductor_reason);
    return e;
  }
  e.http_status = 503;  // no_prefill_instance, no_decode_instance, decode_refused, instance_lost, cancelled, ...
  e.type = "server_error";
  if (reject_reason == "no_prefill_instance") {
    e.message = "no prefill instance can take the request now; retry later";
  } else if (reject_reason == "no_decode_instance" || reject_reason == "decode_refused") {
    e.message = "no decode instance can take the request now; retry later";
  } else if (reject_reason == "instance_lost") {
    e.message = "the instance serving the request was lost and no other could take it; retry later";
  } else {
    e.message = "the cluster did not take the request (" + e.code + "); retry later";
  }
  return e;
}

json error_document(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

namespace {

// Fills *error and returns its status (kInvalidArgument for 400s, kOutOfRange for 413).
Status fail(ApiError* error, int http_status, std::string param, std::string message, std::string code = "") {
  error->http_status = http_status;
  error->param = std::move(param);
  error->message = std::move(message);
  error->code = std::move(code);
  error->type = "invalid_request_error";
  return Status(http_status == 413 ? Code::kOutOfRange : Code::kInvalidArgument, error->message);
}

std::string kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

// A token-id array: every element an integer in [0, 2^32).
bool token_array(const json& v, std::vector<uint32_t>* ids) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& e : v) {
    if (!e.is_number_integer()) return false;
    const auto id = e.get<int64_t>();
    if (id < 0 || id > UINT32_MAX) return false;
    ids->push_back(static_cast<uint32_t>(id));
  }
  return true;
}

// A client's value as it appears in an error message: its JSON, cut to 64 bytes (a value may be a huge array).
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

// A number field that greedy decoding supports only at `neutral`.
Status neutral_number(const json& body, const char* field, double neutral, ApiError* error) {
  const json& v = body.at(field);
  if (v.is_null()) return Status::ok();
  if (!v.is_number()) return fail(error, 400, field, std::string("'") + field + "' must be a number, got " + kind(v));
  if (v.get<double>() != neutral) {
    return fail(error, 400, field,
                std::string("'") + field + "' = " + brief(v) + " is not supported: mc decodes greedily (only " +
                    (neutral == static_cast<double>(static_cast<int64_t>(neutral))
                         ? std::to_string(static_cast<int64_t>(neutral))
                         : json(neutral).dump()) +
                    " is accepted)");
  }
  return Status::ok();
}

Status parse_content(const json& v, size_t i, std::string* out, ApiError* error) {
  const std::string field = "messages[" + std::to_string(i) + "].content";
  if (v.is_string()) {
    *out = v.get<std::string>();
    return Status::ok();
  }
  if (!v.is_array()) return fail(error, 400, field, "'" + field + "' must be a string or an array of parts");
  for (size_t k = 0; k < v.size(); ++k) {
    const json& part = v[k];
    const std::string pf = field + "[" + std::to_string(k) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return fail(error, 400, pf, "'" + pf + "': only {\"type\": \"text\", \"text\": STRING} parts are supported");
    }
    *out += part["text"].get<std::string>();
  }
  return Status::ok();
}

}  // namespace

Result<json> parse_body(std::string_view body, const Tokenizer& tokenizer, ApiError* error) {
  JsonShapeLimits shape;
  shape.max_depth = 32;
  shape.max_containers = 16384;
  shape.max_values = static_cast<size_t>(std::max<int64_t>(0, tokenizer.max_context_tokens())) + 65536;
  if (Status s = check_json_shape(body, shape, "the request body"); !s.is_ok()) {
    return fail(error, s.code() == Code::kResourceExhausted ? 413 : 400, "", s.message());
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(error, 400, "", "the request body is not valid JSON");
  return j;
}

Result<GenerationRequest> parse_generation(const json& body, bool chat, const Tokenizer& tokenizer,
                                           const ParseLimits& limits, ApiError* error) {
  ApiError scratch;
  if (error == nullptr) error = &scratch;
  if (!body.is_object()) return fail(error, 400, "", "the request body must be a JSON object");
  static const std::set<std::string> kCommon = {"model",
                                                "max_tokens",
                                                "stream",
                                                "stream_options",
                                                "stop",
                                                "ignore_eos",
                                                "user",
                                                "seed",
                                                "mc",
                                                "temperature",
                                                "top_p",
                                                "n",
                                                "logprobs",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "logit_bias"};
  static const std::set<std::string> kCompletion = {"prompt", "best_of", "echo", "suffix"};
  static const std::set<std::string> kChat = {"messages", "max_completion_tokens", "response_format", "top_logprobs"};
  for (const auto& [key, value] : body.items()) {
    if (kCommon.count(key) == 0 && (chat ? kChat : kCompletion).count(key) == 0) {
      return fail(error, 400, key, "unrecognized request argument '" + key + "' (not supported by mc-gateway)");
    }
  }
  GenerationRequest r;
  r.chat = chat;
  if (!body.contains("model") || !body["model"].is_string() || body["model"].get<std::string>().empty()) {
    return fail(error, 400, "model", "'model' is required: a string naming a model of GET /v1/models");
  }
  r.model = body["model"].get<std::string>();

  for (const char* f : {"temperature", "presence_penalty", "frequency_penalty"}) {
    if (body.contains(f)) MC_RETURN_IF_ERROR(neutral_number(body, f, 0, error));
  }
  for (const char* f : {"top_p", "n", "best_of"}) {
    if (body.contains(f)) MC_RETURN_IF_ERROR(neutral_number(body, f, 1, error));
  }
  if (body.contains("logprobs")) {
    const json& v = body["logprobs"];
    if (!(v.is_null() || v == false)) {
      return fail(error, 400, "logprobs", "'logprobs' is not supported by mc-gateway (send null or false)");
    }
  }
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    return fail(error, 400, "top_logprobs", "'top_logprobs' is not supported by mc-gateway");
  }
  if (body.contains("echo") && !(body["echo"].is_null() || body["echo"] == false)) {
    return fail(error, 400, "echo", "'echo' is not supported by mc-gateway");
  }
  if (body.contains("suffix") && !body["suffix"].is_null()) {
    return fail(error, 400, "suffix", "'suffix' is not supported by mc-gateway");
  }
  if (body.contains("logit_bias") && !(body["logit_bias"].is_null() || body["logit_bias"].empty())) {
    return fail(error, 400, "logit_bias", "'logit_bias' is not supported by mc-gateway");
  }
  if (body.contains("response_format")) {
    const json& v = body["response_format"];
    if (!(v.is_null() || (v.is_object() && v.value("type", "") == "text" && v.size() == 1))) {
      return fail(error, 400, "response_format", "'response_format' other than {\"type\": \"text\"} is not supported");
    }
  }
  if (body.contains("seed") && !(body["seed"].is_null() || body["seed"].is_number_integer())) {
    return fail(error, 400, "seed", "'seed' must be an integer");
  }
  if (body.contains("user") && !(body["user"].is_null() || body["user"].is_string())) {
    return fail(error, 400, "user", "'user' must be a string");
  }

  // The prompt.
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
      return fail(error, 400, "messages", "'messages' is required: a non-empty array of {role, content}");
    }
    std::vector<ChatMessage> messages;
    const json& ms = body["messages"];
    for (size_t i = 0; i < ms.size(); ++i) {
      const json& m = ms[i];
      const std::string field = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return fail(error, 400, field + ".role", "'" + field + "' must be an object with a string 'role'");
      }
      for (const auto& [key, value] : m.items()) {
        if (key != "role" && key != "content" && key != "name") {
          return fail(error, 400, field + "." + key, "'" + field + "." + key + "' is not supported by mc-gateway");
        }
      }
      ChatMessage cm;
      cm.role = m["role"].get<std::string>();
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "developer") {
        return fail(
            error, 400, field + ".role",
            "'" + field + ".role' = '" + cm.role + "': only system, developer, user and assistant are supported");
      }
      if (cm.role == "developer") cm.role = "system";
      if (!m.contains("content") || m["content"].is_null()) {
        return fail(error, 400, field + ".content", "'" + field + ".content' is required");
      }
      MC_RETURN_IF_ERROR(parse_content(m["content"], i, &cm.content, error));
      messages.push_back(std::move(cm));
    }
    r.prompt_tokens = tokenizer.encode(apply_chat_template(messages));
  } else {
    if (!body.contains("prompt")) return fail(error, 400, "prompt", "'prompt' is required: a string or token ids");
    const json* pp = &body["prompt"];  // not a copy: the value is the client's, as large as the body allows
    if (pp->is_array() && pp->size() == 1 && ((*pp)[0].is_string() || (*pp)[0].is_array())) pp = &(*pp)[0];
    const json& p = *pp;
    if (p.is_string()) {
      r.prompt_tokens = tokenizer.encode(p.get<std::string>());
    } else if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
      return fail(error, 400, "prompt",
                  "'prompt' holds " + std::to_string(p.size()) + " prompts: send one prompt per request");
    } else if (!token_array(p, &r.prompt_tokens)) {
      return fail(error, 400, "prompt", "'prompt' must be a string or a non-empty array of token ids (integers)");
    }
    if (Status ids = tokenizer.check_ids(r.prompt_tokens, "prompt"); !ids.is_ok()) {
      return fail(error, 400, "prompt", ids.message());
    }
  }
  if (r.prompt_tokens.empty()) return fail(error, 400, chat ? "messages" : "prompt", "the prompt is empty");

  // Lengths.
  const int64_t context = tokenizer.max_context_tokens();
  const int64_t prompt_limit = limits.max_prompt_tokens > 0 ? std::min(limits.max_prompt_tokens, context) : context;
  const auto prompt_n = static_cast<int64_t>(r.prompt_tokens.size());
  if (prompt_n >= prompt_limit) {
    return fail(error, 413, chat ? "messages" : "prompt",
                "the prompt is " + std::to_string(prompt_n) + " tokens; model '" + tokenizer.model() + "' takes " +
                    std::to_string(prompt_limit - 1) + " at most (one is left for the answer)",
                "context_length_exceeded");
  }
  r.max_tokens = chat ? limits.default_max_tokens_chat : limits.default_max_tokens_completion;
  for (const char* f : {"max_tokens", "max_completion_tokens"}) {
    if (!body.contains(f) || body[f].is_null()) continue;
    const json& v = body[f];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      return fail(error, 400, f, std::string("'") + f + "' must be an integer >= 1, got " + brief(v));
    }
    r.max_tokens = v.get<int64_t>();
  }
  if (!body.contains("max_tokens") && !body.contains("max_completion_tokens")) {
    r.max_tokens = std::min(r.max_tokens, context - prompt_n);
  }
  if (r.max_tokens > context - prompt_n) {  // not prompt_n + max_tokens: that overflows near INT64_MAX
    return fail(error, 400, "max_tokens",
                "the prompt (" + std::to_string(prompt_n) + " tokens) and max_tokens (" + std::to_string(r.max_tokens) +
                    ") exceed the context of model '" + tokenizer.model() + "' (" + std::to_string(context) +
                    " tokens)",
                "context_length_exceeded");
  }

  // Streaming and stopping.
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return fail(error, 400, "stream", "'stream' must be a boolean");
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return fail(error, 400, "stream_options", "'stream_options' must be an object");
    if (!r.stream) return fail(error, 400, "stream_options", "'stream_options' is only allowed with stream: true");
    for (const auto& [key, value] : so.items()) {
      if (key != "include_usage" || !value.is_boolean()) {
        return fail(error, 400, "stream_options." + key,
                    "'stream_options." + key + "' is not supported (only include_usage, a boolean)");
      }
      r.include_usage = value.get<bool>();
    }
  }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) return fail(error, 400, "ignore_eos", "'ignore_eos' must be a boolean");
    r.ignore_eos = body["ignore_eos"].get<bool>();
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& e : s) {
        if (!e.is_string()) return fail(error, 400, "stop", "'stop' must hold strings");
        r.stop.push_back(e.get<std::string>());
      }
    } else {
      return fail(error, 400, "stop", "'stop' must be a string or an array of at most 4 strings");
    }
    for (const std::string& st : r.stop) {
      if (st.empty() || st.size() > limits.max_stop_bytes) {
        return fail(error, 400, "stop",
                    "each stop string must be 1 to " + std::to_string(limits.max_stop_bytes) + " bytes");
      }
    }
  }

  // The mc extension.
  if (body.contains("mc") && !body["mc"].is_null()) {
    const json& ext = body["mc"];
    if (!ext.is_object()) return fail(error, 400, "mc", "'mc' must be an object {slo_ttft_ms, slo_tbt_ms, salt}");
    for (const auto& [key, value] : ext.items()) {
      const std::string field = "mc." + key;
      if (key == "slo_ttft_ms" || key == "slo_tbt_ms") {
        if (!value.is_number() || !(value.get<double>() > 0) || value.get<double>() > 86'400'000.0) {
          return fail(error, 400, field, "'" + field + "' must be a number of milliseconds in (0, 86400000]");
        }
        (key == "slo_ttft_ms" ? r.slo_ttft_ms : r.slo_tbt_ms) = value.get<double>();
      } else if (key == "salt") {
        if (!value.is_string() || value.get<std::string>().size() > 256) {
          return fail(error, 400, field, "'" + field + "' must be a string of at most 256 bytes");
        }
        r.salt = value.get<std::string>();
      } else {
        return fail(error, 400, field, "'" + field + "' is not an mc extension field (slo_ttft_ms, slo_tbt_ms, salt)");
      }
    }
  }
  return r;
}

json usage_document(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {
json finish_value(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }
}  // namespace

json completion_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                         const std::string& text, const std::string& finish_reason, const Usage& usage) {
  json choice = {{"index", 0}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  return json{{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created_s},
              {"model", model},
              {"choices", json::array({choice})},
              {"usage", usage_document(usage)}};
}

json chunk_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                    const std::string& text, const std::string& finish_reason, bool first) {
  json choice = {{"index", 0}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return json{{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_s},
              {"model", model},
              {"choices", json::array({choice})}};
}

json usage_chunk_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                          const Usage& usage) {
  return json{{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_s},
              {"model", model},
              {"choices", json::array()},
              {"usage", usage_document(usage)}};
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stop, size_t from) {
  size_t best = std::string::npos;
  for (const std::string& s : stop) {
    const size_t at = text.find(s, from);
    if (at < best) best = at;
  }
  return best;
}

AnswerBuilder::AnswerBuilder(const Tokenizer& tokenizer, const GenerationRequest& request)
    : tokenizer_(tokenizer), request_(request) {
  for (const std::string& s : request.stop) max_stop_ = std::max(max_stop_, s.size());
}

std::string AnswerBuilder::on_token(uint32_t id) {
  if (finished()) return {};
  ++completion_tokens_;
  if (!request_.ignore_eos && tokenizer_.is_eos(id)) {
    finish_reason_ = "stop";
    held_ += text_.finish();
    return release(true);
  }
  // A stop string can only end in the new text, so the search starts max_stop - 1 bytes before it.
  const size_t before = held_.size();
  held_ += text_.feed(id);
  if (!request_.stop.empty()) {
    const size_t from = before >= max_stop_ ? before - max_stop_ + 1 : 0;
    const size_t at = find_stop(held_, request_.stop, from);
    if (at != std::string::npos) {
      held_.resize(at);
      finish_reason_ = "stop";
      return release(true);
    }
  }
  return release(false);
}

std::string AnswerBuilder::on_done() {
  if (finished()) return {};
  held_ += text_.finish();
  if (const size_t at = find_stop(held_, request_.stop, 0); at != std::string::npos) {
    held_.resize(at);
    finish_reason_ = "stop";
  } else {
    finish_reason_ = "length";
  }
  return release(true);
}

std::string AnswerBuilder::release(bool all) {
  size_t n = held_.size();
  if (!all && max_stop_ > 0) {
    // Keep the last max_stop - 1 bytes (they may begin a stop string), cut at a character boundary.
    n = held_.size() >= max_stop_ - 1 ? held_.size() - (max_stop_ - 1) : 0;
    while (n > 0 && n < held_.size() && (static_cast<unsigned char>(held_[n]) & 0xC0) == 0x80) --n;
  }
  std::string out = held_.substr(0, n);
  held_.erase(0, n);
  return out;
}

}  // namespace mc::gateway
