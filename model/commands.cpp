#include "mc/model/commands.hpp"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/model/checkpoint_layout.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/model/safetensors.hpp"

namespace mc::model {
namespace {

namespace fs = std::filesystem;

bool exists(const std::string& path) {
  struct ::stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// What the checkpoint's weights are, checked against the architecture's tensors.
struct WeightsReport {
  std::vector<std::string> files;
  int64_t tensors = 0;
  uint64_t bytes = 0;
  std::map<std::string, int64_t> dtypes;  // dtype name -> tensors
  std::vector<std::string> ignored;       // tensors no supported architecture has
};

Result<WeightsReport> check_weights(const ModelConfig& m) {
  Result<CheckedCheckpoint> opened = open_checked_checkpoint(m);
  if (!opened) {
    // A truncated file is data loss to a daemon; to this command it is bad input (exit 2), as a malformed one is.
    if (opened.status().code() == Code::kDataLoss) return error(Code::kInvalidArgument, opened.status().message());
    return opened.status();
  }
  WeightsReport r;
  r.files = opened->checkpoint->file_paths();
  r.tensors = static_cast<int64_t>(opened->tensors.size());
  r.bytes = opened->bytes;
  r.dtypes = opened->dtypes;
  r.ignored = opened->ignored;
  return r;
}

std::string traits(const ModelConfig& m) {
  std::vector<std::string> t;
  if (m.attention_bias) t.push_back("q/k/v biases");
  if (m.qk_norm) t.push_back("q/k norms");
  if (m.tie_word_embeddings) t.push_back("tied embeddings");
  if (m.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    std::ostringstream s;
    s << "llama3 RoPE scaling x" << m.rope_scaling.factor;
    t.push_back(s.str());
  }
  if (m.sliding_window_tokens > 0) t.push_back("sliding window " + std::to_string(m.sliding_window_tokens));
  std::string out;
  for (const auto& x : t) out += (out.empty() ? "" : ", ") + x;
  return out;
}

}  // namespace

Status run_inspect_command(const InspectCommand& cmd, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(ModelConfig m, load_model(cmd.model));
  MC_ASSIGN_OR_RETURN(GpuSpec gpu, gpu_preset(cmd.gpu));
  const double threshold = fetch_threshold_bytes_per_s(m, gpu);
  std::optional<WeightsReport> weights;
  const bool has_weights =
      !m.checkpoint_dir.empty() && (exists(m.checkpoint_dir + "/" + std::string(Checkpoint::kSingleFileName)) ||
                                    exists(m.checkpoint_dir + "/" + std::string(Checkpoint::kIndexFileName)));
  if (has_weights) {
    MC_ASSIGN_OR_RETURN(WeightsReport w, check_weights(m));
    weights = std::move(w);
  }
  if (cmd.json) {
    nlohmann::json j;
    j["model"] = nlohmann::json::parse(m.to_json());
    j["weight_bytes"] = m.weight_bytes();
    j["gpu"] = gpu.name;
    j["fetch_threshold_bytes_per_s"] = threshold;
    if (weights) {
      j["weights"] = {{"files", weights->files},   {"tensors", weights->tensors}, {"bytes", weights->bytes},
                      {"dtypes", weights->dtypes}, {"ignored", weights->ignored}, {"match", true}};
    } else {
      j["weights"] = nullptr;
    }
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return Status::ok();
  }
  const int64_t kv = m.kv_bytes_per_token();
  out << "model           " << m.name << (m.checkpoint_dir.empty() ? "" : "  (" + m.checkpoint_dir + ")") << "\n"
      << "architecture    " << architecture_name(m.architecture) << (traits(m).empty() ? "" : "  (" + traits(m) + ")")
      << "\n"
      << "layers          " << m.num_layers << "\n"
      << "hidden          " << m.hidden_size << "  (FFN " << m.ffn_size << ")\n"
      << "attention       " << m.num_heads << " heads, " << m.num_kv_heads << " KV heads of " << m.head_dim << "\n"
      << "vocabulary      " << m.vocab_size << "\n"
      << "context         " << m.max_context_tokens << " tokens\n"
      << "parameters      " << with_commas(m.param_count()) << "  (" << with_commas(m.weight_bytes()) << " B at "
      << m.dtype_bytes << " B each)\n"
      << "KV per token    " << with_commas(kv) << " B  (" << kv / m.num_layers << " B a layer)\n";
  char line[160];
  std::snprintf(line, sizeof line, "fetch beats     recomputing above %.2f GB/s on %s (mc-plan threshold)\n",
                threshold * 1e-9, gpu.name.c_str());
  out << line;
  if (!m.eos_token_ids.empty()) {
    out << "end tokens     ";
    for (int64_t id : m.eos_token_ids) out << " " << id;
    out << "\n";
  }
  if (weights) {
    std::string dtypes;
    for (const auto& [d, n] : weights->dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d + " x" + std::to_string(n);
    out << "weights         " << weights->files.size() << " file(s), " << weights->tensors << " tensors, "
        << with_commas(static_cast<int64_t>(weights->bytes)) << " B (" << dtypes
        << "): every tensor of the architecture, shapes as config.json says\n";
    if (!weights->ignored.empty()) {
      out << "ignored         " << weights->ignored.size() << " tensor(s) no supported architecture has, e.g. "
          << weights->ignored.front() << "\n";
    }
  } else if (!m.checkpoint_dir.empty()) {
    out << "weights         none in the directory (config only)\n";
  }
  return Status::ok();
}

namespace {

Result<ModelConfig> init_config(const InitCommand& c) {
  const nlohmann::json probe = {{"architectures", {c.arch}}};
  MC_ASSIGN_OR_RETURN(ModelConfig m, model_from_json(probe.dump()));  // the architecture and its traits
  m.name = fs::path(c.dir).filename().string();
  m.num_layers = c.layers;
  m.hidden_size = c.hidden;
  m.num_heads = c.heads;
  m.num_kv_heads = c.kv_heads;
  m.head_dim = c.head_dim > 0 ? c.head_dim : (c.heads > 0 ? c.hidden / c.heads : 0);
  m.ffn_size = c.ffn;
  m.vocab_size = c.vocab;
  m.max_context_tokens = c.max_position;
  m.rope_theta = c.rope_theta;
  m.rms_norm_eps = c.rms_norm_eps;
  m.tie_word_embeddings = c.tie_word_embeddings;
  if (c.rope_scaling == "llama3") {
    if (m.architecture != Architecture::kLlama) {
      return error(Code::kInvalidArgument, "--rope-scaling llama3 is Llama's (LlamaForCausalLM), not " + c.arch + "'s");
    }
    m.rope_scaling.kind = RopeScaling::Kind::kLlama3;
    m.rope_scaling.factor = 32.0;
    m.rope_scaling.low_freq_factor = 1.0;
    m.rope_scaling.high_freq_factor = 4.0;
    m.rope_scaling.original_max_position_embeddings = 8192;
  } else if (c.rope_scaling != "none") {
    return error(Code::kInvalidArgument, "--rope-scaling must be none or llama3, got '" + c.rope_scaling + "'");
  }
  if (c.dtype != "bf16" && c.dtype != "fp32") {
    return error(Code::kInvalidArgument, "--dtype must be bf16 or fp32, got '" + c.dtype + "'");
  }
  m.dtype_bytes = c.dtype == "bf16" ? 2 : 4;
  if (c.vocab < 2) return error(Code::kInvalidArgument, "--vocab must be at least 2 (a begin and an end token)");
  MC_RETURN_IF_ERROR(m.validate());
  m.bos_token_id = 0;
  m.eos_token_ids = {1};
  return m;
}

std::string model_type(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kMistral:
      return "mistral";
  }
  return "llama";
}

}  // namespace

Status run_init_command(const InitCommand& c, std::ostream& out) {
  if (c.dir.empty()) return error(Code::kInvalidArgument, "init needs a directory to write");
  MC_ASSIGN_OR_RETURN(ModelConfig m, init_config(c));
  constexpr int64_t kMaxInitBytes = int64_t{8} << 30;
  if (m.weight_bytes() > kMaxInitBytes) {
    return error(Code::kInvalidArgument, "the checkpoint would hold " + with_commas(m.weight_bytes()) +
                                             " B of weights, more than init writes (8 GiB): fewer --layers or a "
                                             "smaller --hidden, --ffn or --vocab");
  }
  const std::string config_path = c.dir + "/config.json";
  const std::string weights_path = c.dir + "/" + std::string(Checkpoint::kSingleFileName);
  if (!c.force && (exists(config_path) || exists(weights_path))) {
    return error(Code::kInvalidArgument, "'" + c.dir + "' already holds a checkpoint: --force overwrites it");
  }
  std::error_code ec;
  fs::create_directories(c.dir, ec);
  if (ec) return error(Code::kIo, "cannot create '" + c.dir + "': " + ec.message());

  nlohmann::json config = {{"architectures", {std::string(architecture_name(m.architecture))}},
                           {"model_type", model_type(m.architecture)},
                           {"hidden_act", "silu"},
                           {"hidden_size", m.hidden_size},
                           {"intermediate_size", m.ffn_size},
                           {"num_attention_heads", m.num_heads},
                           {"num_hidden_layers", m.num_layers},
                           {"num_key_value_heads", m.num_kv_heads},
                           {"head_dim", m.head_dim},
                           {"vocab_size", m.vocab_size},
                           {"max_position_embeddings", m.max_context_tokens},
                           {"rms_norm_eps", m.rms_norm_eps},
                           {"rope_theta", m.rope_theta},
                           {"rope_scaling", nullptr},
                           {"tie_word_embeddings", m.tie_word_embeddings},
                           {"torch_dtype", m.dtype_bytes == 2 ? "bfloat16" : "float32"},
                           {"bos_token_id", m.bos_token_id},
                           {"eos_token_id", m.eos_token_ids.front()},
                           {"mc_init_seed", c.seed}};
  if (m.architecture == Architecture::kLlama || m.architecture == Architecture::kQwen3) {
    config["attention_bias"] = false;
  }
  if (m.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", m.rope_scaling.factor},
                              {"low_freq_factor", m.rope_scaling.low_freq_factor},
                              {"high_freq_factor", m.rope_scaling.high_freq_factor},
                              {"original_max_position_embeddings", m.rope_scaling.original_max_position_embeddings}};
  }
  if (m.architecture == Architecture::kMistral) config["sliding_window"] = nullptr;
  if (m.architecture == Architecture::kQwen2 || m.architecture == Architecture::kQwen3) {
    config["use_sliding_window"] = false;
  }
  const nlohmann::json generation = {
      {"bos_token_id", m.bos_token_id}, {"eos_token_id", m.eos_token_ids.front()}, {"do_sample", false}};
  for (const auto& [path, doc] : {std::pair<std::string, const nlohmann::json*>{config_path, &config},
                                  {c.dir + "/generation_config.json", &generation}}) {
    std::ofstream f(path, std::ios::trunc);
    f << doc->dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!f) return error(Code::kIo, "cannot write '" + path + "': " + std::strerror(errno));
  }

  // The weights: uniform draws of one seeded engine, tensor by tensor in the layout's order.
  std::mt19937_64 rng(c.seed);
  auto uniform = [&rng] {  // [-1, 1)
    return static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0);
  };
  const std::vector<TensorSpec> specs = expected_tensors(m);
  std::vector<std::vector<std::byte>> buffers;
  std::vector<TensorToWrite> tensors;
  buffers.reserve(specs.size());
  for (const TensorSpec& t : specs) {
    const bool norm = t.name.ends_with("norm.weight");
    const bool bias = t.name.ends_with(".bias");
    const float scale = norm || bias ? 0.1f : 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
    std::vector<std::byte>& b = buffers.emplace_back(static_cast<size_t>(t.elements() * m.dtype_bytes));
    for (int64_t i = 0; i < t.elements(); ++i) {
      const float v = (norm ? 1.0f : 0.0f) + scale * uniform();
      if (m.dtype_bytes == 2) {
        const uint16_t h = float_to_bf16(v);
        std::memcpy(b.data() + i * 2, &h, 2);
      } else {
        std::memcpy(b.data() + i * 4, &v, 4);
      }
    }
    tensors.push_back({t.name, m.dtype_bytes == 2 ? Dtype::kBF16 : Dtype::kF32, t.shape, b});
  }
  MC_RETURN_IF_ERROR(
      write_safetensors(weights_path, tensors, {{"format", "pt"}, {"mc_init_seed", std::to_string(c.seed)}}));
  if (c.json) {
    out << nlohmann::json{{"dir", c.dir},
                          {"architecture", architecture_name(m.architecture)},
                          {"tensors", specs.size()},
                          {"parameters", m.param_count()},
                          {"weight_bytes", m.weight_bytes()},
                          {"seed", c.seed}}
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
        << "\n";
  } else {
    out << "wrote " << c.dir << ": config.json, generation_config.json, model.safetensors (" << specs.size()
        << " tensors, " << with_commas(m.param_count()) << " parameters, " << with_commas(m.weight_bytes()) << " B, "
        << c.dtype << ", seed " << c.seed << ")\n";
  }
  return Status::ok();
}

}  // namespace mc::model
