#include "mc/model/checkpoint_layout.hpp"

#include <algorithm>
#include <span>

namespace mc::model {

namespace {

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& m) {
  const int64_t h = m.hidden_size, q = m.num_heads * m.head_dim, kv = m.num_kv_heads * m.head_dim;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {m.vocab_size, h}});
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {h}});
    for (const auto& [proj, rows] : {std::pair<const char*, int64_t>{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}}) {
      t.push_back({p + "self_attn." + proj + ".weight", {rows, h}});
      if (m.attention_bias) t.push_back({p + "self_attn." + proj + ".bias", {rows}});
    }
    t.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (m.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", {m.head_dim}});
      t.push_back({p + "self_attn.k_norm.weight", {m.head_dim}});
    }
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    t.push_back({p + "mlp.gate_proj.weight", {m.ffn_size, h}});
    t.push_back({p + "mlp.up_proj.weight", {m.ffn_size, h}});
    t.push_back({p + "mlp.down_proj.weight", {h, m.ffn_size}});
  }
  t.push_back({"model.norm.weight", {h}});
  if (!m.tie_word_embeddings) t.push_back({"lm_head.weight", {m.vocab_size, h}});
  return t;
}

Result<CheckedCheckpoint> open_checked_checkpoint(const ModelConfig& m) {
  CheckedCheckpoint r;
  MC_ASSIGN_OR_RETURN(r.checkpoint, Checkpoint::open(m.checkpoint_dir));
  // Count before naming: a config of 2^31 layers must not make 2^35 names first.
  const int64_t per_layer = 9 + (m.attention_bias ? 3 : 0) + (m.qk_norm ? 2 : 0);
  const int64_t want = 2 + (m.tie_word_embeddings ? 0 : 1) + m.num_layers * per_layer;
  const auto held = static_cast<int64_t>(r.checkpoint->tensor_names().size());
  if (want > held) {
    return error(Code::kInvalidArgument, "checkpoint '" + m.checkpoint_dir + "' holds " + std::to_string(held) +
                                             " tensors, but config.json's " + std::to_string(m.num_layers) +
                                             " layers need " + std::to_string(want) +
                                             ": the weights are of another model");
  }
  const std::vector<TensorSpec> specs = expected_tensors(m);
  const std::string arch(architecture_name(m.architecture));
  for (const TensorSpec& t : specs) {
    Result<TensorView> v = r.checkpoint->tensor(t.name);
    if (!v) {
      return error(Code::kInvalidArgument, "checkpoint '" + m.checkpoint_dir + "' lacks tensor '" + t.name + "' " +
                                               shape_text(t.shape) + ", which " + arch +
                                               " with its config.json needs (" + v.status().message() + ")");
    }
    if (!std::equal(v->shape.begin(), v->shape.end(), t.shape.begin(), t.shape.end())) {
      return error(Code::kInvalidArgument, "checkpoint '" + m.checkpoint_dir + "': tensor '" + t.name + "' has shape " +
                                               shape_text(v->shape) + " but config.json gives " + shape_text(t.shape) +
                                               ": the weights are of another model");
    }
    if (!dtype_is_float(v->dtype)) {
      return error(Code::kInvalidArgument,
                   "checkpoint '" + m.checkpoint_dir + "': tensor '" + t.name + "' is " +
                       std::string(dtype_name(v->dtype)) +
                       " (mc computes BF16, F16 or F32 weights; quantized and other types are not supported)");
    }
    r.bytes += v->size_bytes;
    r.dtypes[std::string(dtype_name(v->dtype))] += 1;
    r.tensors.emplace(t.name, *v);
  }
  for (const std::string& name : r.checkpoint->tensor_names()) {
    if (r.tensors.count(name) == 0) r.ignored.push_back(name);
  }
  return r;
}

}  // namespace mc::model
