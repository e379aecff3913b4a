#include "mc/gateway/openai.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>

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
    // Parts joined by a newline, as vLLM joins them.
    if (k > 0) *out += "\n";
    *out += part["text"].get<std::string>();
  }
  return Status::ok();
}

}  // namespace

Result<nlohmann::ordered_json> parse_chat_messages(const json& ms, ApiError* error) {
  ApiError scratch;
  if (error == nullptr) error = &scratch;
  if (!ms.is_array() || ms.empty()) {
    return fail(error, 400, "messages", "'messages' is required: a non-empty array of {role, content}");
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
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
    std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      return fail(error, 400, field + ".role",
                  "'" + field + ".role' = '" + role +
                      "': only system, developer, user and assistant are supported (no tool messages: mc-gateway "
                      "does not implement tools)");
    }
    if (role == "developer") role = "system";
    if (!m.contains("content") || m["content"].is_null()) {
      return fail(error, 400, field + ".content", "'" + field + ".content' is required");
    }
    std::string content;
    MC_RETURN_IF_ERROR(parse_content(m["content"], i, &content, error));
    // In the order a Python client wrote them (role, content, name): a template's tojson of a message shows it so.
    nlohmann::ordered_json message = {{"role", role}, {"content", std::move(content)}};
    if (m.contains("name")) {
      if (!m["name"].is_string()) return fail(error, 400, field + ".name", "'" + field + ".name' must be a string");
      message["name"] = m["name"].get<std::string>();
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

Result<nlohmann::ordered_json> parse_chat_template_kwargs(const json& v, ApiError* error) {
  ApiError scratch;
  if (error == nullptr) error = &scratch;
  if (v.is_null()) return nlohmann::ordered_json::object();
  if (!v.is_object() || v.size() > 64) {
    return fail(error, 400, "chat_template_kwargs",
                "'chat_template_kwargs' must be an object of at most 64 variables for the chat template");
  }
  // The variables the gateway itself sets are not the client's to replace.
  static const std::set<std::string> kReserved = {"messages",  "tools",           "add_generation_prompt", "bos_token",
                                                  "eos_token", "raise_exception", "strftime_now",          "documents"};
  for (const auto& [key, value] : v.items()) {
    if (kReserved.count(key) != 0) {
      return fail(error, 400, "chat_template_kwargs." + key,
                  "'chat_template_kwargs." + key + "' is set by mc-gateway, not by a request");
    }
  }
  return nlohmann::ordered_json::parse(v.dump());
}

Result<std::vector<uint32_t>> chat_prompt_tokens(const json& body, const Tokenizer& tokenizer,
                                                 bool add_generation_prompt, bool add_special_tokens, ApiError* error) {
  ApiError scratch;
  if (error == nullptr) error = &scratch;
  if (!body.contains("messages")) {
    return fail(error, 400, "messages", "'messages' is required: a non-empty array of {role, content}");
  }
  MC_ASSIGN_OR_RETURN(nlohmann::ordered_json messages, parse_chat_messages(body["messages"], error));
  if (!tokenizer.has_chat_template()) {
    return fail(error, 400, "messages",
                "model '" + tokenizer.model() +
                    "' has no chat template (its directory has no chat_template.jinja and tokenizer_config.json "
                    "names none): use /v1/completions");
  }
  MC_ASSIGN_OR_RETURN(nlohmann::ordered_json kwargs,
                      parse_chat_template_kwargs(body.value("chat_template_kwargs", json()), error));
  Result<std::string> prompt = tokenizer.render_chat(messages, add_generation_prompt, kwargs);
  if (!prompt.is_ok()) {
    return fail(error, 400, "messages", "the model's chat template refused the messages: " + prompt.status().message());
  }
  // The template writes the model's own special tokens (BOS, turn markers): a chat completion adds no
  // post-processor on top.
  return tokenizer.encode(prompt.value(), add_special_tokens);
}

Result<json> parse_body(std::string_view body, const Tokenizer& tokenizer, ApiError* error) {
  JsonShapeLimits shape;
  shape.max_depth = 32;
  shape.max_containers = 16384;
  shape.max_values = static_cast<size_t>(std::max<int64_t>(0, tokenizer.max_context_tokens())) + 65536;
  if (Status s = check_json_shape(body, shape, "the request body"); !s.is_ok()) {
    return fail(error, s.code() == Code::kResourceExhausted ? 413 : 400, "", s.message());
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return fail(error, 400, "", "the request body is not valid JSON (or holds a number beyond a double's range)");
  }
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
                                                "top_k",
                                                "min_p",
                                                "n",
                                                "logprobs",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "logit_bias"};
  static const std::set<std::string> kCompletion = {"prompt", "best_of", "echo", "suffix"};
  static const std::set<std::string> kChat = {"messages", "max_completion_tokens", "response_format", "top_logprobs",
                                              "chat_template_kwargs"};
  // Known OpenAI fields mc does not implement: named as such.
  static const std::set<std::string> kRefused = {
      "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "modalities", "audio", "prediction"};
  for (const auto& [key, value] : body.items()) {
    if (key == "modalities" && value == json::array({"text"})) continue;  // what is served anyway
    if (kRefused.count(key) != 0 && !value.is_null()) {
      const bool tools = key == "tools" || key == "tool_choice" || key == "functions" || key == "function_call" ||
                         key == "parallel_tool_calls";
      return fail(error, 400, key,
                  "'" + key + "' is not supported by mc-gateway (" +
                      (tools                 ? "no tool calling"
                       : key == "prediction" ? "no predicted outputs"
                                             : "text output only") +
                      ")");
    }
    if (kRefused.count(key) == 0 && kCommon.count(key) == 0 && (chat ? kChat : kCompletion).count(key) == 0) {
      return fail(error, 400, key, "unrecognized request argument '" + key + "' (not supported by mc-gateway)");
    }
  }
  GenerationRequest r;
  r.chat = chat;
  if (!body.contains("model") || !body["model"].is_string() || body["model"].get<std::string>().empty()) {
    return fail(error, 400, "model", "'model' is required: a string naming a model of GET /v1/models");
  }
  r.model = body["model"].get<std::string>();

  // Sampling (proto::SamplingParams).
  auto number = [&](const char* f, double* out) -> Status {
    if (!body.contains(f) || body[f].is_null()) return Status::ok();
    if (!body[f].is_number())
      return fail(error, 400, f, std::string("'") + f + "' must be a number, got " + kind(body[f]));
    *out = body[f].get<double>();
    return Status::ok();
  };
  auto integer = [&](const char* f, int64_t lo, int64_t hi, int64_t* out) -> Status {
    if (!body.contains(f) || body[f].is_null()) return Status::ok();
    const json& v = body[f];
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      return fail(error, 400, f,
                  std::string("'") + f + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got " + brief(v));
    }
    *out = v.get<int64_t>();
    return Status::ok();
  };
  proto::SamplingParams& sp = r.sampling;
  sp.temperature = 1.0;  // OpenAI's default
  MC_RETURN_IF_ERROR(number("temperature", &sp.temperature));
  MC_RETURN_IF_ERROR(number("top_p", &sp.top_p));
  MC_RETURN_IF_ERROR(number("min_p", &sp.min_p));
  MC_RETURN_IF_ERROR(number("presence_penalty", &sp.presence_penalty));
  MC_RETURN_IF_ERROR(number("frequency_penalty", &sp.frequency_penalty));
  int64_t top_k = 0;
  MC_RETURN_IF_ERROR(integer("top_k", -1, 1 << 20, &top_k));  // vLLM's -1 and 0: no limit
  sp.top_k = std::max<int64_t>(top_k, 0);
  // OpenAI's bound on temperature, tighter than the cluster's (proto::check_sampling, below, checks the rest).
  if (sp.temperature > 2) {
    return fail(error, 400, "temperature", "'temperature' = " + brief(body["temperature"]) + " is outside [0, 2]");
  }
  MC_RETURN_IF_ERROR(integer("n", 1, 16, &r.n));
  if (body.contains("best_of") && !body["best_of"].is_null() &&
      !(body["best_of"].is_number_integer() && body["best_of"].get<int64_t>() == r.n)) {
    return fail(error, 400, "best_of",
                "'best_of' other than n is not supported by mc-gateway (it returns every choice)");
  }
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) return fail(error, 400, "logprobs", "'logprobs' must be a boolean");
      r.logprobs = body["logprobs"].get<bool>();
    }
    int64_t top = 0;
    MC_RETURN_IF_ERROR(integer("top_logprobs", 0, proto::kMaxTopLogprobs, &top));
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null() && !r.logprobs) {
      return fail(error, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (r.logprobs) sp.logprobs = static_cast<int32_t>(top);
  } else {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      int64_t top = 0;
      MC_RETURN_IF_ERROR(integer("logprobs", 0, proto::kMaxTopLogprobs, &top));
      r.logprobs = true;
      sp.logprobs = static_cast<int32_t>(top);
    }
    if (body.contains("echo") && !body["echo"].is_null()) {
      if (!body["echo"].is_boolean()) return fail(error, 400, "echo", "'echo' must be a boolean");
      r.echo = body["echo"].get<bool>();
      if (r.echo && r.logprobs) {
        return fail(error, 400, "echo",
                    "'echo' with 'logprobs' asks for the prompt's logprobs, which mc does not compute: send one of "
                    "them");
      }
    }
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
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return fail(error, 400, "seed", "'seed' must be an integer");
    sp.seed = body["seed"].is_number_unsigned() ? body["seed"].get<uint64_t>()
                                                : static_cast<uint64_t>(body["seed"].get<int64_t>());
    r.seed_given = true;
  }
  if (const proto::SamplingError bad = proto::check_sampling(sp); !bad.ok()) {
    const std::string value = body.contains(bad.field) ? " = " + brief(body[bad.field]) : "";
    return fail(error, 400, bad.field, "'" + bad.field + "'" + value + " is outside " + bad.rule);
  }
  if (body.contains("user") && !(body["user"].is_null() || body["user"].is_string())) {
    return fail(error, 400, "user", "'user' must be a string");
  }

  // The prompt.
  if (chat) {
    MC_ASSIGN_OR_RETURN(r.prompt_tokens, chat_prompt_tokens(body, tokenizer, /*add_generation_prompt=*/true,
                                                            /*add_special_tokens=*/false, error));
  } else {
    if (!body.contains("prompt")) return fail(error, 400, "prompt", "'prompt' is required: a string or token ids");
    const json* pp = &body["prompt"];  // not a copy: the value is the client's, as large as the body allows
    if (pp->is_array() && pp->size() == 1 && ((*pp)[0].is_string() || (*pp)[0].is_array())) pp = &(*pp)[0];
    const json& p = *pp;
    if (p.is_string()) {
      r.prompt_tokens = tokenizer.encode(p.get<std::string>(), /*add_special_tokens=*/true);
      if (r.echo) r.echo_text = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
      return fail(error, 400, "prompt",
                  "'prompt' holds " + std::to_string(p.size()) + " prompts: send one prompt per request");
    } else if (!token_array(p, &r.prompt_tokens)) {
      return fail(error, 400, "prompt", "'prompt' must be a string or a non-empty array of token ids (integers)");
    }
    if (Status ids = tokenizer.check_ids(r.prompt_tokens, "prompt"); !ids.is_ok()) {
      return fail(error, 400, "prompt", ids.message());
    }
    if (r.echo && !p.is_string()) r.echo_text = tokenizer.decode(r.prompt_tokens);
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
                         const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", finish_value(c.finish_reason)}, {"logprobs", c.logprobs}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  return json{{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created_s},
              {"model", model},
              {"choices", std::move(list)},
              {"usage", usage_document(usage)}};
}

json chunk_document(bool chat, const std::string& id, int64_t created_s, const std::string& model,
                    const std::string& text, const std::string& finish_reason, bool first, int64_t index,
                    const json& logprobs) {
  json choice = {{"index", index}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", logprobs}};
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

namespace {
json utf8_bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(c);
  return out;
}
}  // namespace

void LogprobsBuilder::add(uint32_t token, const std::vector<proto::TokenLogprob>& entry) {
  const uint32_t ids[1] = {token};
  const std::string text = tokenizer_.decode(ids);
  const std::string raw = tokenizer_.token_bytes(token);
  const float lp = entry.empty() ? 0.0f : entry[0].logprob;
  if (chat_) {
    json top = json::array();
    for (size_t i = 1; i < entry.size(); ++i) {
      const uint32_t alt[1] = {entry[i].token};
      const std::string t = tokenizer_.decode(alt);
      top.push_back(
          {{"token", t}, {"logprob", entry[i].logprob}, {"bytes", utf8_bytes(tokenizer_.token_bytes(entry[i].token))}});
    }
    entries_.push_back({{"token", text}, {"logprob", lp}, {"bytes", utf8_bytes(raw)}, {"top_logprobs", top}});
  } else {
    json top = json::object();
    for (size_t i = 1; i < entry.size(); ++i) {
      const uint32_t alt[1] = {entry[i].token};
      top[tokenizer_.decode(alt)] = entry[i].logprob;
    }
    entries_.push_back({{"token", text}, {"logprob", lp}, {"top", top}, {"offset", text_offset_}});
    // In characters (code points), as vLLM counts them: every byte that does not continue a UTF-8 sequence.
    text_offset_ +=
        std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
  }
}

json LogprobsBuilder::make(size_t from) const {
  if (chat_) {
    json content = json::array();
    for (size_t i = from; i < entries_.size(); ++i) content.push_back(entries_[i]);
    return json{{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = from; i < entries_.size(); ++i) {
    tokens.push_back(entries_[i]["token"]);
    lps.push_back(entries_[i]["logprob"]);
    tops.push_back(entries_[i]["top"]);
    offsets.push_back(entries_[i]["offset"]);
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json LogprobsBuilder::document() const { return make(0); }

json LogprobsBuilder::take() {
  if (taken_ == entries_.size()) return nullptr;
  json out = make(taken_);
  taken_ = entries_.size();
  return out;
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
    : tokenizer_(tokenizer), request_(request), text_(tokenizer) {
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
  // A stop string can only end in the new text, so the search starts max_stop - 1 bytes before it. The new text
  // includes what the stream still holds back (a grapheme a later token could extend): the answer ends at the token
  // that completes a stop string, not one later.
  const size_t before = held_.size();
  held_ += text_.feed(id);
  if (!request_.stop.empty()) {
    const size_t from = before >= max_stop_ ? before - max_stop_ + 1 : 0;
    std::string view = held_ + text_.pending();
    const size_t at = find_stop(view, request_.stop, from);
    if (at != std::string::npos) {
      view.resize(at);
      held_ = std::move(view);
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
