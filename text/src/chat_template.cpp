// mc::text::ChatTemplate: loading a model's chat template and rendering a conversation with it.
#include "mc/text/chat_template.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace mc::text {

namespace chat_template_detail {

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(Code::kIo, "cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: a string, or an AddedToken object {content: ...}; absent or null is "".
Result<std::string> special_token(const nlohmann::json& config, const char* key, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return error(Code::kInvalidArgument,
               file + ": " + key + " is neither a string nor an object with a string 'content' (fix the file)");
}

}  // namespace chat_template_detail

Result<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  using chat_template_detail::read_file;
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    auto text = read_file(config_path);
    if (!text) return text.status();
    config = nlohmann::json::parse(text.value(), nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return error(Code::kInvalidArgument, config_path.string() + " is not a JSON object (fix or replace the file)");
    }
  }
  auto bos = chat_template_detail::special_token(config, "bos_token", config_path.string());
  if (!bos) return bos.status();
  auto eos = chat_template_detail::special_token(config, "eos_token", config_path.string());
  if (!eos) return eos.status();

  std::string source;
  std::string origin;
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    auto text = read_file(jinja_path);
    if (!text) return text.status();
    source = std::move(text).value();
    origin = jinja_path.string();
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const auto& ct = config["chat_template"];
    origin = config_path.string() + " chat_template";
    if (ct.is_string()) {
      source = ct.get<std::string>();
    } else if (ct.is_array()) {
      bool found = false;
      for (const auto& entry : ct) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string()) {
          source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return error(Code::kNotFound, config_path.string() +
                                          ": chat_template is a list of named templates without one named "
                                          "\"default\" (add chat_template.jinja to the model directory)");
      }
      origin += "[default]";
    } else {
      return error(Code::kInvalidArgument,
                   config_path.string() + ": chat_template is neither a string nor a list of {name, template}");
    }
  } else {
    return error(Code::kNotFound, "model directory " + model_dir +
                                      " has no chat template (neither chat_template.jinja nor tokenizer_config.json's "
                                      "chat_template): use the completions API, or add a template");
  }
  auto tmpl = jinja::Template::parse(source, "chat template " + origin);
  if (!tmpl) return tmpl.status();
  return ChatTemplate(std::move(tmpl).value(), std::move(source), std::move(bos).value(), std::move(eos).value());
}

Result<ChatTemplate> ChatTemplate::from_string(std::string source, std::string bos_token, std::string eos_token) {
  auto tmpl = jinja::Template::parse(source, "chat template");
  if (!tmpl) return tmpl.status();
  return ChatTemplate(std::move(tmpl).value(), std::move(source), std::move(bos_token), std::move(eos_token));
}

template <typename Json>
Result<std::string> ChatTemplate::render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                              const Json& extra) const {
  if (!messages.is_array()) return error(Code::kInvalidArgument, "chat template: messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) {
    return error(Code::kInvalidArgument, "chat template: tools must be a JSON array or null");
  }
  Json vars = Json::object();
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) vars[it.key()] = it.value();
  }
  // apply_chat_template's own arguments win over extra ones of the same name, as in Python's call.
  vars["messages"] = messages;
  vars["tools"] = tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["bos_token"] = bos_token_;
  vars["eos_token"] = eos_token_;
  return template_.render(vars);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                         bool add_generation_prompt, const nlohmann::json& extra) const {
  return render_impl(messages, tools, add_generation_prompt, extra);
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                         bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  return render_impl(messages, tools, add_generation_prompt, extra);
}

}  // namespace mc::text
