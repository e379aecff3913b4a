// mc::infer::ModelConfig (library mc_model): the shape of a LLaMA-architecture decoder model (DESIGN.md §7).
//
// A ModelConfig fixes everything that decides KV-cache size and compute cost: layers, hidden size,
// attention heads, KV heads (grouped-query attention), head dimension, FFN (SwiGLU intermediate)
// size, vocabulary and the bytes of one stored element (dtype_bytes: 2 for BF16/FP16, 4 for FP32).
//
// Presets (model_preset):
//   tiny        4 layers, hidden 64, 4 heads, 2 KV heads, head dim 16, FFN 128, vocab 256, fp32.
//               A real model that the `ref` CPU backend runs in milliseconds (tests, e2e on 2 cores).
//   small       8 layers, hidden 256, 8 heads, 2 KV heads, head dim 32, FFN 704, vocab 1024, fp32.
//               For benchmarks of the `ref` backend where the linear term is not negligible.
//   llama3-8b   32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128, FFN 14336, vocab 128256, BF16.
//   llama3-70b  80 layers, hidden 8192, 64 heads, 8 KV heads, head dim 128, FFN 28672, vocab 128256, BF16.
//               (Meta Llama 3 model card / HF config.json of Meta-Llama-3-{8B,70B}.)
//
// Derived quantities:
//   kv_bytes_per_token = 2 (K and V) · layers · kv_heads · head_dim · dtype_bytes
//                        (llama3-70b BF16: 2·80·8·128·2 = 327,680 B; DESIGN.md §1)
//   kv_bytes_per_token_layer = kv_bytes_per_token / layers (one layer's K+V of one token)
//   param_count        = embedding (vocab·hidden) + lm_head (vocab·hidden)
//                        + layers · (q: hidden·heads·head_dim + k,v: 2·hidden·kv_heads·head_dim
//                                    + o: heads·head_dim·hidden + SwiGLU: 3·hidden·ffn + 2 RMSNorm: 2·hidden)
//                        + final RMSNorm (hidden)                       (llama3-70b: 70.55e9; llama3-8b: 8.03e9)
//   matmul_param_count = param_count − embedding − norms: the weights every token multiplies
//                        (the "2·params FLOPs per token" of the cost model counts these).
//
// Hugging Face checkpoints (issue 49; DESIGN.md §7 "Real models"): load_model(DIR) reads DIR/config.json and, when
// present, DIR/generation_config.json. The architectures understood (config.json "architectures"[0]):
//   LlamaForCausalLM    Llama 2, 3, 3.1, 3.2: optional "attention_bias", "rope_scaling" of type "llama3", tied
//                       embeddings ("tie_word_embeddings")
//   Qwen2ForCausalLM    q/k/v projections with biases (always)
//   Qwen3ForCausalLM    per-head RMSNorm of q and k before RoPE ("q_norm", "k_norm"); explicit "head_dim"
//   MistralForCausalLM  a "sliding_window" (when not null) caps the context at the window: mc computes full
//                       attention, which equals the windowed one only within it
// Anything else is refused naming what is supported; so are an activation other than SiLU ("hidden_act") and a
// rope_scaling of another type. These fields change what the forward pass computes and the parameter count:
//   param_count += layers · (heads·head_dim + 2·kv_heads·head_dim)   q/k/v biases (attention_bias)
//               += layers · 2·head_dim                               q and k norms (qk_norm)
//               −= vocab·hidden                                      lm_head is the embedding (tie_word_embeddings)
//
// Thread-safety: a plain value type. Errors: load/validate return kInvalidArgument naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::model {

// The forward pass a checkpoint needs (the header comment). Presets and JSON files without "architecture" are kLlama.
enum class Architecture { kLlama, kQwen2, kQwen3, kMistral };
// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM".
std::string_view architecture_name(Architecture a);

// RoPE frequency scaling ("rope_scaling" of config.json). kLlama3: Llama 3.1's rule (wavelengths longer than
// original_max_position_embeddings / low_freq_factor are divided by factor, shorter than .../high_freq_factor kept,
// smoothly interpolated between; Meta's Llama 3.1 reference code, apply_scaling).
struct RopeScaling {
  enum class Kind { kNone, kLlama3 } kind = Kind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string name = "tiny";
  int64_t num_layers = 4;
  int64_t hidden_size = 64;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t ffn_size = 128;
  int64_t vocab_size = 256;
  int64_t dtype_bytes = 4;      // bytes of one stored KV/weight element
  double rope_theta = 10000.0;  // RoPE base frequency
  double rms_norm_eps = 1e-5;
  int64_t max_context_tokens = 32768;  // longest prompt + output accepted (DESIGN.md §13.14)
  Architecture architecture = Architecture::kLlama;
  bool attention_bias = false;       // q, k, v projections carry biases (Qwen2; Llama's "attention_bias")
  bool qk_norm = false;              // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool tie_word_embeddings = false;  // lm_head is the embedding matrix
  RopeScaling rope_scaling;
  int64_t sliding_window_tokens = 0;   // Mistral's attention window (0: none); max_context_tokens is capped to it
  int64_t bos_token_id = -1;           // -1: none given
  std::vector<int64_t> eos_token_ids;  // config.json, then generation_config.json ("eos_token_id": int or list)
  std::string checkpoint_dir;          // the Hugging Face directory it was read from ("" for presets and files)

  // 2 · layers · kv_heads · head_dim · dtype_bytes.
  int64_t kv_bytes_per_token() const { return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes; }
  // K+V bytes of one token in one layer: 2 · kv_heads · head_dim · dtype_bytes.
  int64_t kv_bytes_per_token_layer() const { return 2 * num_kv_heads * head_dim * dtype_bytes; }
  // All parameters (see the formula above).
  int64_t param_count() const;
  // Parameters that every token multiplies (all weight matrices incl. lm_head; no embedding, no norms).
  int64_t matmul_param_count() const;
  // Weight bytes at dtype_bytes per parameter.
  int64_t weight_bytes() const { return param_count() * dtype_bytes; }

  // Checks positivity, heads % kv_heads == 0, the dtype size (1, 2 or 4). kInvalidArgument names the field.
  Status validate() const;
  // Compact JSON object with the fields above (keys as in from_json) plus the derived kv_bytes_per_token.
  std::string to_json() const;
};

// Names accepted by model_preset, in a stable order.
std::vector<std::string> model_preset_names();

// A preset by name (see the header comment); kInvalidArgument lists the known names.
Result<ModelConfig> model_preset(std::string_view name);

// Parses a JSON object. Keys (all optional; missing keys keep the `tiny` default unless "base" names a preset):
//   "base": preset to start from, "name", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
//   "ffn_size", "vocab_size", "dtype_bytes", "rope_theta", "rms_norm_eps", "max_context_tokens".
// Hugging Face config.json keys are accepted too: num_hidden_layers, num_attention_heads, num_key_value_heads,
// intermediate_size, max_position_embeddings, torch_dtype ("bfloat16"/"float16" -> 2, "float32" -> 4);
// head_dim defaults to hidden_size / num_heads when absent; also "architectures" (or mc's "architecture"),
// "hidden_act", "attention_bias", "tie_word_embeddings", "rope_scaling", "sliding_window" (with Qwen's
// "use_sliding_window"), "bos_token_id", "eos_token_id" and "dtype" (the newer name of torch_dtype), as the header
// comment describes. The result is validated.
Result<ModelConfig> model_from_json(std::string_view json_text);

// KV bytes per token (all layers) the sim backend stores when asked for `requested` (0: the model's): per layer
// ceil(requested / layers), rounded up to an even count of at least 16 (room for the 8-byte hash in K and in V),
// times the layers. E.g. LLaMA3-70B (80 layers) asked for 1,024 stores 1,280. The sim backend and mc-sim --cluster
// both use it, so a description's kv_bytes_per_token means the same bytes in both.
int64_t sim_kv_bytes_per_token(const ModelConfig& model, int64_t requested);

// `spec` is a preset name, a Hugging Face model directory (config.json, optional generation_config.json: the header
// comment), or a path to a JSON file (anything else containing '/' or ending in ".json"). Errors name the file.
Result<ModelConfig> load_model(std::string_view spec);

}  // namespace mc::model
