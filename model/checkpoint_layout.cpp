#include "mc/model/checkpoint_layout.hpp"

namespace mc::model {

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

}  // namespace mc::model
