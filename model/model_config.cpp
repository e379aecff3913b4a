#include "mc/model/model_config.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include "mc/common/input_file.hpp"
#include "mc/common/json_guard.hpp"

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

Status key_error(std::string_view key, std::string_view why) {
  return error(Code::kInvalidArgument, "model config: \"" + std::string(key) + "\" " + std::string(why));
}

// A boolean key: absent keeps `out`; null counts as absent.
Status read_bool(const nlohmann::json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return key_error(key, "must be true or false");
  out = it->get<bool>();
  return Status::ok();
}

// A token id or a list of them ("eos_token_id" may be either); null or absent leaves `out` as it is.
Status read_token_ids(const nlohmann::json& j, const char* key, std::vector<int64_t>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  std::vector<int64_t> ids;
  auto take = [&](const nlohmann::json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (int64_t{1} << 31)) {
      return key_error(key, "must be a token id (an integer in [0, 2^31)) or a list of them");
    }
    ids.push_back(v.get<int64_t>());
    return Status::ok();
  };
  if (it->is_array()) {
    if (it->size() > 64) return key_error(key, "lists more than 64 token ids");
    for (const auto& v : *it) MC_RETURN_IF_ERROR(take(v));
  } else {
    MC_RETURN_IF_ERROR(take(*it));
  }
  out = std::move(ids);
  return Status::ok();
}

// "rope_scaling": null, {"rope_type": "default"}, or {"rope_type": "llama3", ...} ("type" in older configs).
Status read_rope_scaling(const nlohmann::json& j, RopeScaling& out) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_object()) return key_error("rope_scaling", "must be an object or null");
  auto type = it->find("rope_type");
  if (type == it->end()) type = it->find("type");
  const std::string kind = type != it->end() && type->is_string() ? type->get<std::string>() : "";
  if (kind == "default") return Status::ok();
  if (kind != "llama3") {
    return key_error("rope_scaling", "of type '" + kind +
                                         "' is not supported (mc computes RoPE unscaled or with Llama 3.1's "
                                         "\"llama3\" scaling)");
  }
  RopeScaling r;
  r.kind = RopeScaling::Kind::kLlama3;
  for (auto [key, field] : {std::pair<const char*, double*>{"factor", &r.factor},
                            {"low_freq_factor", &r.low_freq_factor},
                            {"high_freq_factor", &r.high_freq_factor}}) {
    auto v = it->find(key);
    if (v == it->end() || !v->is_number())
      return key_error("rope_scaling", std::string("needs a number \"") + key + "\"");
    *field = v->get<double>();
  }
  auto original = it->find("original_max_position_embeddings");
  if (original == it->end() || !original->is_number_integer()) {
    return key_error("rope_scaling", "needs an integer \"original_max_position_embeddings\"");
  }
  r.original_max_position_embeddings = original->get<int64_t>();
  out = r;
  return Status::ok();
}

// The architecture and what it changes in the forward pass (the header comment).
Status read_architecture(const nlohmann::json& j, ModelConfig& m) {
  std::string name;
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return key_error("architectures", "must be a list holding the model class name");
    }
    name = (*it)[0].get<std::string>();
  } else if (auto it2 = j.find("architecture"); it2 != j.end()) {
    if (!it2->is_string()) return key_error("architecture", "must be a model class name");
    name = it2->get<std::string>();
  }
  if (!name.empty()) {
    bool known = false;
    std::string supported;
    for (Architecture a : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3, Architecture::kMistral}) {
      supported += (supported.empty() ? "" : ", ") + std::string(architecture_name(a));
      if (name == architecture_name(a)) {
        m.architecture = a;
        known = true;
      }
    }
    if (!known)
      return error(Code::kInvalidArgument,
                   "model config: architecture '" + name + "' is not supported (" + supported + ")");
  }
  if (auto act = j.find("hidden_act"); act != j.end() && !(act->is_string() && act->get<std::string>() == "silu")) {
    return key_error("hidden_act",
                     "must be \"silu\" (the SwiGLU MLP of the supported architectures), got " + act->dump());
  }
  bool mlp_bias = false;
  MC_RETURN_IF_ERROR(read_bool(j, "mlp_bias", mlp_bias));
  if (mlp_bias) return key_error("mlp_bias", "true is not supported (no supported architecture has MLP biases)");
  m.attention_bias = m.architecture == Architecture::kQwen2;  // Qwen2's q/k/v biases have no switch
  if (m.architecture != Architecture::kQwen2) MC_RETURN_IF_ERROR(read_bool(j, "attention_bias", m.attention_bias));
  m.qk_norm = m.architecture == Architecture::kQwen3;
  MC_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", m.tie_word_embeddings));
  MC_RETURN_IF_ERROR(read_rope_scaling(j, m.rope_scaling));
  bool use_sliding_window = m.architecture == Architecture::kMistral;  // Qwen's configs carry a switch
  MC_RETURN_IF_ERROR(read_bool(j, "use_sliding_window", use_sliding_window));
  if (use_sliding_window && m.architecture != Architecture::kMistral) {
    return key_error("use_sliding_window", "true is not supported for " +
                                               std::string(architecture_name(m.architecture)) +
                                               " (sliding-window layers; mc computes full attention)");
  }
  if (auto sw = j.find("sliding_window"); use_sliding_window && sw != j.end() && !sw->is_null()) {
    if (!sw->is_number_integer() || sw->get<int64_t>() <= 0)
      return key_error("sliding_window", "must be a positive integer or null");
    m.sliding_window_tokens = sw->get<int64_t>();
    m.max_context_tokens = std::min(m.max_context_tokens, m.sliding_window_tokens);
  }
  if (auto bos = j.find("bos_token_id"); bos != j.end() && !bos->is_null()) {
    std::vector<int64_t> ids;
    MC_RETURN_IF_ERROR(read_token_ids(j, "bos_token_id", ids));
    if (ids.size() != 1) return key_error("bos_token_id", "must be one token id");
    m.bos_token_id = ids[0];
  }
  return read_token_ids(j, "eos_token_id", m.eos_token_ids);
}

}  // namespace

std::string_view architecture_name(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
  }
  return "LlamaForCausalLM";
}

int64_t ModelConfig::matmul_param_count() const {
  return num_layers * (attention_params(*this) + 3 * hidden_size * ffn_size) + vocab_size * hidden_size;
}

int64_t ModelConfig::param_count() const {
  int64_t n = matmul_param_count() + num_layers * 2 * hidden_size + hidden_size;  // + the norms
  if (!tie_word_embeddings) n += vocab_size * hidden_size;                        // the embedding, when its own
  if (attention_bias) n += num_layers * (num_heads + 2 * num_kv_heads) * head_dim;
  if (qk_norm) n += num_layers * 2 * head_dim;
  return n;
}

Status ModelConfig::validate() const {
  const std::pair<const char*, int64_t> positive[] = {
      {"num_layers", num_layers}, {"hidden_size", hidden_size},
      {"num_heads", num_heads},   {"num_kv_heads", num_kv_heads},
      {"head_dim", head_dim},     {"ffn_size", ffn_size},
      {"vocab_size", vocab_size}, {"max_context_tokens", max_context_tokens}};
  for (const auto& [field, value] : positive) {
    if (value <= 0) return field_error(field, value, "must be > 0");
    if (value >= (int64_t{1} << 31)) return field_error(field, value, "must be < 2^31");
  }
  // The products every user of the config forms (parameters, weight and KV bytes) stay far inside int64: a model of
  // more than 2^50 parameters, or 2^40 KV bytes a token, is no model (the largest published ones are below 2^41).
  {
    const long double h = static_cast<long double>(hidden_size), L = static_cast<long double>(num_layers);
    const long double q = static_cast<long double>(num_heads) * static_cast<long double>(head_dim);
    const long double kv = static_cast<long double>(num_kv_heads) * static_cast<long double>(head_dim);
    const long double params = L * (h * (2 * q + 2 * kv) + 3 * h * static_cast<long double>(ffn_size) + 4 * h + 2 * q) +
                               2 * static_cast<long double>(vocab_size) * h + h;
    if (params > 0x1p50L) {
      return error(Code::kInvalidArgument, "model config: the shape makes " +
                                               std::to_string(static_cast<double>(params)) +
                                               " parameters (more than 2^50): not a model (check num_hidden_layers, "
                                               "hidden_size, intermediate_size, vocab_size, head_dim)");
    }
    if (2 * L * kv * 4 > 0x1p40L) {
      return error(Code::kInvalidArgument,
                   "model config: more than 2^40 KV bytes a token (layers x KV heads x head_dim): not a model");
    }
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
  if (sliding_window_tokens < 0) return field_error("sliding_window", sliding_window_tokens, "must be >= 0");
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    const RopeScaling& r = rope_scaling;
    if (!(r.factor >= 1.0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
        r.original_max_position_embeddings <= 0) {
      return error(Code::kInvalidArgument,
                   "model config: rope_scaling of type llama3 needs factor >= 1, 0 < low_freq_factor < "
                   "high_freq_factor and original_max_position_embeddings > 0");
    }
  }
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
                      {"param_count", param_count()},
                      {"architecture", architecture_name(architecture)},
                      {"attention_bias", attention_bias},
                      {"qk_norm", qk_norm},
                      {"tie_word_embeddings", tie_word_embeddings}};
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  if (sliding_window_tokens > 0) j["sliding_window"] = sliding_window_tokens;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  if (!checkpoint_dir.empty()) j["checkpoint_dir"] = checkpoint_dir;
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
                                           "; or give a Hugging Face model directory or a JSON file)");
}

// A model config is a flat object of a few dozen keys (a Hugging Face config.json may carry label maps and a
// quantization block): bounded before it is parsed (json_guard.hpp), as it may come from a downloaded directory.
constexpr JsonShapeLimits kConfigShape{/*max_depth=*/16, /*max_containers=*/4096, /*max_values=*/size_t{1} << 16};

Result<ModelConfig> model_from_json(std::string_view json_text) {
  MC_RETURN_IF_ERROR(check_json_shape(json_text, kConfigShape, "model config"));
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
  MC_RETURN_IF_ERROR(read_architecture(j, m));
  if (!j.contains("dtype_bytes")) {
    auto it = j.find("torch_dtype");
    if (it == j.end()) it = j.find("dtype");  // transformers' newer name
    if (it != j.end()) {
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

namespace {

// A model's JSON file, at most 4 MiB (a config.json is a few KiB; a path to anything else must not be read whole).
Result<std::string> read_config_file(const std::string& path, std::string_view what, std::string_view remedy) {
  constexpr std::streamsize kMaxConfigBytes = std::streamsize{4} << 20;
  struct ::stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {  // a FIFO would block the open, a device not end
    return error(Code::kInvalidArgument, std::string(what) + " '" + path + "' is not a regular file");
  }
  MC_ASSIGN_OR_RETURN(std::ifstream in, open_input_file(path, what, remedy));
  std::string text(static_cast<size_t>(kMaxConfigBytes) + 1, '\0');
  in.read(text.data(), kMaxConfigBytes + 1);
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<std::streamsize>(text.size()) > kMaxConfigBytes) {
    return error(Code::kInvalidArgument,
                 std::string(what) + " '" + path + "' is larger than 4 MiB: not a model config");
  }
  return text;
}

// DIR/config.json, then DIR/generation_config.json when present (its token ids win: they are what generation uses).
Result<ModelConfig> load_checkpoint_config(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  MC_ASSIGN_OR_RETURN(std::string text,
                      read_config_file(config_path, "Hugging Face config",
                                       "a model directory holds config.json beside its *.safetensors files"));
  auto m = model_from_json(text);
  if (!m) return m.status().with_context("in '" + config_path + "'");
  const std::string gen_path = dir + "/generation_config.json";
  if (::access(gen_path.c_str(), F_OK) == 0) {
    MC_ASSIGN_OR_RETURN(std::string gen_text, read_config_file(gen_path, "generation config", {}));
    if (Status shape = check_json_shape(gen_text, kConfigShape, gen_path); !shape.is_ok()) return shape;
    nlohmann::json g = nlohmann::json::parse(gen_text, nullptr, /*allow_exceptions=*/false);
    if (g.is_discarded() || !g.is_object()) {
      return error(Code::kInvalidArgument, "model config: '" + gen_path + "' is not a JSON object");
    }
    Status s = read_token_ids(g, "eos_token_id", m->eos_token_ids);
    if (s.is_ok() && g.contains("bos_token_id") && !g["bos_token_id"].is_null()) {
      std::vector<int64_t> bos;
      s = read_token_ids(g, "bos_token_id", bos);
      if (s.is_ok() && bos.size() == 1) m->bos_token_id = bos[0];
    }
    if (!s.is_ok()) return s.with_context("in '" + gen_path + "'");
  }
  m->checkpoint_dir = dir;
  if (!nlohmann::json::parse(text, nullptr, false).contains("name")) {  // the directory's name, not _name_or_path
    std::string trimmed = dir;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const size_t slash = trimmed.find_last_of('/');
    m->name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  }
  return m;
}

}  // namespace

Result<ModelConfig> load_model(std::string_view spec) {
  const bool is_path =
      spec.find('/') != std::string_view::npos || (spec.size() > 5 && spec.substr(spec.size() - 5) == ".json");
  struct ::stat st {};
  const bool is_dir = !spec.empty() && ::stat(std::string(spec).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (!is_path) {
    // A preset name wins over a directory of that name in the working directory ("./tiny" names the directory).
    auto preset = model_preset(spec);
    if (preset || !is_dir) return preset;
  }
  if (is_dir) return load_checkpoint_config(std::string(spec));
  // DIR/config.json of a checkpoint names the checkpoint (its weights beside it), not a bare shape: read as DIR, so
  // the ref backend computes its weights instead of seeded ones.
  if (const std::string path(spec); path == "config.json" || path.ends_with("/config.json")) {
    const std::string dir = path == "config.json" ? "." : path.substr(0, path.size() - 12);
    const std::string base = dir.empty() ? "/" : dir;
    if (::access((base + "/model.safetensors").c_str(), F_OK) == 0 ||
        ::access((base + "/model.safetensors.index.json").c_str(), F_OK) == 0) {
      return load_checkpoint_config(base);
    }
  }
  MC_ASSIGN_OR_RETURN(std::string text, read_config_file(std::string(spec), "model config file",
                                                         "name a preset, a Hugging Face model directory or a JSON "
                                                         "config file"));
  auto m = model_from_json(text);
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
