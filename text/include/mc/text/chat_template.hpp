// mc::text::ChatTemplate: a model's chat template (Hugging Face tokenizer_config.json / chat_template.jinja),
// rendered with mc's Jinja engine (mc/text/jinja.hpp) exactly as transformers' apply_chat_template renders it
// (DESIGN.md §15, "Chat templates").
//
// The template is parsed at load, so a template the engine cannot handle is an error at start-up naming the
// construct and its line, never a wrong prompt later. Messages are data: their content is passed to the template
// as values and never parsed as template code.
//
// Limits: those of mc/text/jinja.hpp. Variables given to the template: messages, tools (none when null),
// documents (none), add_generation_prompt, bos_token, eos_token, and the members of `extra` (e.g.
// enable_thinking, date_string), which cannot replace the former. strftime_now reads the local clock; pass
// date_string in `extra` for a reproducible Llama 3.x prompt.
//
// Thread-safety: copies share the parsed template; render() is const and safe from many threads.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/text/jinja.hpp"

namespace mc::text {

class ChatTemplate {
 public:
  // Reads `model_dir`/chat_template.jinja if present, else tokenizer_config.json's `chat_template` (a string, or
  // a list of {name, template} of which "default" is used), and bos_token/eos_token (strings or {content: ...})
  // from tokenizer_config.json. kNotFound when the model has no chat template; kInvalidArgument for a template
  // the engine cannot parse (the message names the file, the line and the construct).
  static Result<ChatTemplate> load(const std::string& model_dir);

  static Result<ChatTemplate> from_string(std::string source, std::string bos_token, std::string eos_token);

  // messages: a JSON array of {role, content (string or null), tool_calls?, ...} as the OpenAI request sent them
  // (content already reduced to a string by the caller); tools: a JSON array or null; extra: further variables.
  // A template's raise_exception() is kInvalidArgument carrying its message (e.g. roles must alternate).
  Result<std::string> render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                             const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same with a client's key order kept (nlohmann::json sorts object keys; Python keeps them as sent).
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate(jinja::Template tmpl, std::string source, std::string bos, std::string eos)
      : template_(std::move(tmpl)),
        source_(std::move(source)),
        bos_token_(std::move(bos)),
        eos_token_(std::move(eos)) {}

  template <typename Json>
  Result<std::string> render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                  const Json& extra) const;

  jinja::Template template_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace mc::text
