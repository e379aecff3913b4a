// The tensors a Hugging Face checkpoint of a supported architecture holds (model_config.hpp), by name and shape: what
// `mc-model inspect` checks a checkpoint against, what `mc-model init` writes, and what a CPU engine loads (issue 49).
//
// Names and shapes (PyTorch's Linear stores [out_features, in_features]), with H = hidden_size, q = heads·head_dim,
// kv = kv_heads·head_dim, F = ffn_size (intermediate_size), V = vocab_size, i = 0 .. layers−1:
//   model.embed_tokens.weight                       [V, H]
//   model.layers.i.input_layernorm.weight           [H]
//   model.layers.i.self_attn.q_proj.weight          [q, H]    (+ .bias [q] with attention_bias)
//   model.layers.i.self_attn.k_proj.weight          [kv, H]   (+ .bias [kv])
//   model.layers.i.self_attn.v_proj.weight          [kv, H]   (+ .bias [kv])
//   model.layers.i.self_attn.o_proj.weight          [H, q]
//   model.layers.i.self_attn.q_norm.weight          [head_dim] (qk_norm: Qwen3)
//   model.layers.i.self_attn.k_norm.weight          [head_dim] (qk_norm)
//   model.layers.i.post_attention_layernorm.weight  [H]
//   model.layers.i.mlp.gate_proj.weight             [F, H]
//   model.layers.i.mlp.up_proj.weight               [F, H]
//   model.layers.i.mlp.down_proj.weight             [H, F]
//   model.norm.weight                               [H]
//   lm_head.weight                                  [V, H]    (absent with tie_word_embeddings: the embedding is used)
// The element count over all of them is ModelConfig::param_count() (a unit test holds the two together).
//
// Thread-safety: pure functions. Errors: expected_tensors has none (the config is validated before);
// open_checked_checkpoint's are listed at it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/model/model_config.hpp"
#include "mc/model/safetensors.hpp"

namespace mc::model {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Every tensor of `m`'s checkpoint, in the order above (layer by layer).
std::vector<TensorSpec> expected_tensors(const ModelConfig& m);

// A checkpoint opened and checked against the config it was read with: every tensor of expected_tensors(m) present,
// of its shape, of a float dtype (BF16, F16, F32). The views point into `checkpoint`'s mappings.
struct CheckedCheckpoint {
  std::unique_ptr<Checkpoint> checkpoint;
  std::map<std::string, TensorView, std::less<>> tensors;  // every expected tensor, by name
  std::vector<std::string> ignored;                        // tensors of the files no supported architecture has
  uint64_t bytes = 0;                                      // of the expected tensors
  std::map<std::string, int64_t> dtypes;                   // dtype name -> expected tensors of it
};
// Opens m.checkpoint_dir (Checkpoint::open's errors, kDataLoss for a truncated file) and checks it: a missing
// tensor, a shape that disagrees with config.json, a quantized dtype are kInvalidArgument naming the directory, the
// tensor and what the config wants.
Result<CheckedCheckpoint> open_checked_checkpoint(const ModelConfig& m);

}  // namespace mc::model
