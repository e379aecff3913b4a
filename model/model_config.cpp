#include "mc/model/model_config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include "mc/common/input_file.hpp"

namespace mc::model {
namespace {

ModelConfig make(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 int64_t ffn, int64_t vocab, int64_t dtype_bytes, double rope_theta, int64_t max_context) {
  ModelConfig m;
  m.name = std::move(name);
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_heads = heads;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.ffn_size = ffn;
  m.vocab_size = vocab;
  m.dtype_bytes = dtype_bytes;
  m.rope_theta = rope_theta;
  m.max_context_tokens = max_context;
  return m;
}

const std::vector<ModelConfig>& presets() {
  static const std::vector<ModelConfig> kPresets = {
      make("tiny", 4, 64, 4, 2, 16, 128, 256, 4, 10000.0, 32768),
      make("small", 8, 256, 8, 2, 32, 704, 1024, 4, 10000.0, 32768),
      make("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 2, 500000.0, 131072),
      make("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 2, 500000.0, 131072),
  };
  return kPresets;
}

int64_t attention_params(const ModelConfig& m) {
  return m.hidden_size * m.num_heads * m.head_dim           // q
         + 2 * m.hidden_size * m.num_kv_heads * m.head_dim  // k, v
         + m.num_heads * m.head_dim * m.hidden_size;        // o
}

Status field_error(std::string_view field, int64_t value, std::string_view why) {
  return error(Code::kInvalidArgument,
               "model config: " + std::string(field) + " = " + std::to_string(value) + ": " + std::string(why));
}

}  // namespace

int64_t ModelConfig::matmul_param_count() const {
  return num_layers * (attention_params(*this) + 3 * hidden_size * ffn_size) + vocab_size * hidden_size;
}

int64_t ModelConfig::param_count() const {
  return matmul_param_count() + vocab_size * hidden_size /* embedding */ + num_layers * 2 * hidden_size + hidden_size;
}

Status ModelConfig::validate() const {
  const std::pair<const char*, int64_t> positive[] = {
      {"num_layers", num_layers}, {"hidden_size", hidden_size},
      {"num_heads", num_heads},   {"num_kv_heads", num_kv_heads},
      {"head_dim", head_dim},     {"ffn_size", ffn_size},
      {"vocab_size", vocab_size}, {"max_context_tokens", max_context_tokens}};
  for (const auto& [field, value] : positive) {
    if (value <= 0) return field_error(field, value, "must be > 0");
    if (value > (int64_t{1} << 31)) return field_error(field, value, "must be < 2^31");
  }
  if (num_heads % num_kv_heads != 0) {
    return field_error(
        "num_heads", num_heads,
        "must be a multiple of num_kv_heads = " + std::to_string(num_kv_heads) + " (grouped-query attention)");
  }
  if (head_dim % 2 != 0) return field_error("head_dim", head_dim, "must be even (RoPE rotates pairs)");
  if (dtype_bytes != 1 && dtype_bytes != 2 && dtype_bytes != 4) {
    return field_error("dtype_bytes", dtype_bytes, "must be 1, 2 or 4");
  }
  if (!(rope_theta > 0)) return error(Code::kInvalidArgument, "model config: rope_theta must be > 0");
  if (!(rms_norm_eps > 0)) return error(Code::kInvalidArgument, "model config: rms_norm_eps must be > 0");
  return Status::ok();
}

std::string ModelConfig::to_json() const {
  nlohmann::json j = {{"name", name},
                      {"num_layers", num_layers},
                      {"hidden_size", hidden_size},
                      {"num_heads", num_heads},
                      {"num_kv_heads", num_kv_heads},
                      {"head_dim", head_dim},
                      {"ffn_size", ffn_size},
                      {"vocab_size", vocab_size},
                      {"dtype_bytes", dtype_bytes},
                      {"rope_theta", rope_theta},
                      {"rms_norm_eps", rms_norm_eps},
                      {"max_context_tokens", max_context_tokens},
                      {"kv_bytes_per_token", kv_bytes_per_token()},
                      {"param_count", param_count()}};
  return j.dump();
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

Result<ModelConfig> model_preset(std::string_view name) {
  for (const auto& p : presets()) {
    if (p.name == name) return p;
  }
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  return error(Code::kInvalidArgument, "unknown model preset '" + std::string(name) + "' (known: " + known +
                                           "; or give a path to a JSON file)");
}

Result<ModelConfig> model_from_json(std::string_view json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return error(Code::kInvalidArgument, "model config: not a JSON object");
  }
  ModelConfig m;
  if (auto it = j.find("base"); it != j.end()) {
    if (!it->is_string()) return error(Code::kInvalidArgument, "model config: \"base\" must be a preset name");
    MC_ASSIGN_OR_RETURN(m, model_preset(it->get<std::string>()));
  }
  bool head_dim_given = false;
  auto get_int = [&](std::initializer_list<const char*> keys, int64_t& out) -> Status {
    for (const char* key : keys) {
      auto it = j.find(key);
      if (it == j.end()) continue;
      if (!it->is_number_integer()) {
        return error(Code::kInvalidArgument, std::string("model config: \"") + key + "\" must be an integer");
      }
      out = it->get<int64_t>();
      return Status::ok();
    }
    return Status::ok();
  };
  auto get_double = [&](const char* key, double& out) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::ok();
    if (!it->is_number())
      return error(Code::kInvalidArgument, std::string("model config: \"") + key + "\" must be a number");
    out = it->get<double>();
    return Status::ok();
  };
  if (auto it = j.find("name"); it != j.end()) {
    if (!it->is_string()) return error(Code::kInvalidArgument, "model config: \"name\" must be a string");
    m.name = it->get<std::string>();
  } else if (auto it2 = j.find("_name_or_path"); it2 != j.end() && it2->is_string()) {
    m.name = it2->get<std::string>();
  } else if (j.find("base") == j.end()) {
    m.name = "custom";
  }
  MC_RETURN_IF_ERROR(get_int({"num_layers", "num_hidden_layers"}, m.num_layers));
  MC_RETURN_IF_ERROR(get_int({"hidden_size"}, m.hidden_size));
  MC_RETURN_IF_ERROR(get_int({"num_heads", "num_attention_heads"}, m.num_heads));
  MC_RETURN_IF_ERROR(get_int({"num_kv_heads", "num_key_value_heads"}, m.num_kv_heads));
  head_dim_given = j.contains("head_dim");
  MC_RETURN_IF_ERROR(get_int({"head_dim"}, m.head_dim));
  MC_RETURN_IF_ERROR(get_int({"ffn_size", "intermediate_size"}, m.ffn_size));
  MC_RETURN_IF_ERROR(get_int({"vocab_size"}, m.vocab_size));
  MC_RETURN_IF_ERROR(get_int({"dtype_bytes"}, m.dtype_bytes));
  MC_RETURN_IF_ERROR(get_int({"max_context_tokens", "max_position_embeddings"}, m.max_context_tokens));
  MC_RETURN_IF_ERROR(get_double("rope_theta", m.rope_theta));
  MC_RETURN_IF_ERROR(get_double("rms_norm_eps", m.rms_norm_eps));
  if (!head_dim_given && (j.contains("num_attention_heads") || j.contains("num_heads") || j.contains("hidden_size"))) {
    if (m.num_heads > 0 && m.hidden_size % m.num_heads == 0) m.head_dim = m.hidden_size / m.num_heads;
  }
  if (!j.contains("dtype_bytes")) {
    if (auto it = j.find("torch_dtype"); it != j.end()) {
      const std::string t = it->is_string() ? it->get<std::string>() : "";
      if (t == "bfloat16" || t == "float16") {
        m.dtype_bytes = 2;
      } else if (t == "float32") {
        m.dtype_bytes = 4;
      } else {
        return error(Code::kInvalidArgument, "model config: torch_dtype '" + t +
                                                 "' not understood (bfloat16, float16, float32; or set dtype_bytes)");
      }
    }
  }
  MC_RETURN_IF_ERROR(m.validate());
  return m;
}

Result<ModelConfig> load_model(std::string_view spec) {
  const bool is_path =
      spec.find('/') != std::string_view::npos || (spec.size() > 5 && spec.substr(spec.size() - 5) == ".json");
  if (!is_path) return model_preset(spec);
  MC_ASSIGN_OR_RETURN(std::ifstream in,
                      open_input_file(std::string(spec), "model config file", "name a preset or a JSON config file"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto m = model_from_json(ss.str());
  if (!m) return m.status().with_context("in '" + std::string(spec) + "'");
  return m;
}

int64_t sim_kv_bytes_per_token(const ModelConfig& model, int64_t requested) {
  const int64_t layers = std::max<int64_t>(1, model.num_layers);
  const int64_t per_token = requested > 0 ? requested : model.kv_bytes_per_token();
  int64_t per_layer = (per_token + layers - 1) / layers;
  per_layer = std::max<int64_t>(16, (per_layer + 1) / 2 * 2);  // even, room for the 8-byte hash in K and V
  return per_layer * layers;
}

}  // namespace mc::model
