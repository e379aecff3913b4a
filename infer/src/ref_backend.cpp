// The `ref` backend, the CPU engine: a decoder of the supported architectures (LLaMA, Qwen2, Qwen3, Mistral) on the
// CPU, with a checkpoint's weights in place or seeded random ones (see backend.hpp and cpu_kernels.hpp).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <utility>

#include <xxhash.h>

#include "backends.hpp"
#include "mc/infer/cpu_kernels.hpp"
#include "mc/infer/ref_kernels.hpp"
#include "mc/model/checkpoint_layout.hpp"

namespace mc::infer {

namespace ref {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

namespace {
// theta^(−2i/d) for i < d/2: RoPE's inverse frequencies before any scaling.
std::vector<double> theta_inv_freq(double theta, int64_t head_dim) {
  std::vector<double> f(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
  return f;
}
}  // namespace

void rope(float* x, int64_t heads, int64_t head_dim, int64_t pos, double theta) {
  rope(x, heads, head_dim, pos, theta_inv_freq(theta, head_dim).data());
}

std::vector<double> rope_inv_freq(const model::ModelConfig& m) {
  std::vector<double> f = theta_inv_freq(m.rope_theta, m.head_dim);
  const model::RopeScaling& rs = m.rope_scaling;
  if (rs.kind == model::RopeScaling::Kind::kLlama3) {
    // Llama 3.1's rule: wavelengths above original / low_freq_factor are divided by factor, below
    // original / high_freq_factor kept, and interpolated smoothly between (model_config.hpp RopeScaling).
    const double original = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = original / rs.low_freq_factor, high_wavelen = original / rs.high_freq_factor;
    for (double& x : f) {
      const double wavelen = 2.0 * M_PI / x;
      if (wavelen > low_wavelen) {
        x /= rs.factor;
      } else if (!(wavelen < high_wavelen)) {
        const double smooth = (original / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        x = (1.0 - smooth) * x / rs.factor + smooth * x;
      }
    }
  }
  return f;
}

void rope(float* x, int64_t heads, int64_t head_dim, int64_t pos, const double* inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq[i];
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + h * head_dim;
      const float a = p[i];
      const float b = p[i + half];
      p[i] = a * c - b * s;
      p[i + half] = a * s + b * c;
    }
  }
}

Weights make_weights(const model::ModelConfig& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Uniform in [-1, 1): the values of std::uniform_real_distribution<float>(-1, 1) on this engine, bit for bit
  // (BackendTest.WeightsAreTheSeededUniformValues checks it), without the two logarithms libstdc++'s
  // generate_canonical takes per draw (60 % of a sanitized test's time on the `small` preset). One 64-bit draw
  // scaled by 2^-64 (exact: a power of two), clamped below 1.
  auto u = [&rng] {
    float r = static_cast<float>(rng()) * 0x1p-64f;
    if (r >= 1.0f) r = std::nextafter(1.0f, 0.0f);
    return r * 2.0f + -1.0f;
  };
  auto fill = [&](std::vector<float>& v, int64_t rows, int64_t cols, float scale) {
    v.resize(static_cast<size_t>(rows * cols));
    for (float& x : v) x = u() * scale;
  };
  auto fill_norm = [&](std::vector<float>& v) {
    v.resize(static_cast<size_t>(m.hidden_size));
    for (float& x : v) x = 1.0f + 0.1f * u();
  };
  const int64_t h = m.hidden_size, qd = m.num_heads * m.head_dim, kvd = m.num_kv_heads * m.head_dim;
  const float sh = 1.0f / std::sqrt(static_cast<float>(h));
  Weights w;
  fill(w.embed, m.vocab_size, h, 1.0f);
  w.layers.resize(static_cast<size_t>(m.num_layers));
  for (auto& l : w.layers) {
    fill_norm(l.attn_norm);
    fill(l.wq, h, qd, sh);
    fill(l.wk, h, kvd, sh);
    fill(l.wv, h, kvd, sh);
    fill(l.wo, qd, h, 1.0f / std::sqrt(static_cast<float>(qd)));
    fill_norm(l.ffn_norm);
    fill(l.w1, h, m.ffn_size, sh);
    fill(l.w3, h, m.ffn_size, sh);
    fill(l.w2, m.ffn_size, h, 1.0f / std::sqrt(static_cast<float>(m.ffn_size)));
  }
  fill_norm(w.final_norm);
  fill(w.lm_head, h, m.vocab_size, 4.0f * sh);
  return w;
}

void softmax(float* x, int64_t n) { cpu::softmax(x, n); }

}  // namespace ref

namespace {

using cpu::WeightMatrix;
using cpu::WeightType;

// A LoRA adapter's delta for every layer: q += (x·aq)·bq, k += (x·ak)·bk, v += (x·av)·bv, rank kLoraRank.
struct LoraLayer {
  std::vector<float> aq, ak, av;  // hidden × rank
  std::vector<float> bq;          // rank × heads·head_dim
  std::vector<float> bk, bv;      // rank × kv_heads·head_dim
};
using LoraWeights = std::vector<LoraLayer>;

LoraWeights make_lora(const model::ModelConfig& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, int64_t rows, int64_t cols, float scale) {
    v.resize(static_cast<size_t>(rows * cols));
    for (float& x : v) x = u(rng) * scale;
  };
  const int64_t h = m.hidden_size, qd = m.num_heads * m.head_dim, kvd = m.num_kv_heads * m.head_dim;
  const float sa = 1.0f / std::sqrt(static_cast<float>(h));
  const float sb = 0.5f / std::sqrt(static_cast<float>(kLoraRank));
  LoraWeights w(static_cast<size_t>(m.num_layers));
  for (auto& l : w) {
    fill(l.aq, h, kLoraRank, sa);
    fill(l.bq, kLoraRank, qd, sb);
    fill(l.ak, h, kLoraRank, sa);
    fill(l.bk, kLoraRank, kvd, sb);
    fill(l.av, h, kLoraRank, sa);
    fill(l.bv, kLoraRank, kvd, sb);
  }
  return w;
}

// y (1×n) += (x (1×k) · a (k×rank)) · b (rank×n).
void add_lora_delta(const float* x, const std::vector<float>& a, const std::vector<float>& b, float* y, int64_t k,
                    int64_t n) {
  float t[kLoraRank] = {};
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < kLoraRank; ++j) t[j] += x[i] * a[static_cast<size_t>(i * kLoraRank + j)];
  }
  for (int64_t j = 0; j < kLoraRank; ++j) {
    const float* brow = &b[static_cast<size_t>(j * n)];
    for (int64_t c = 0; c < n; ++c) y[c] += t[j] * brow[c];
  }
}

// One row of the forward pass: a token of sequence `seq` at absolute position `pos`.
struct Row {
  uint32_t token;
  int64_t pos;
  size_t seq;
};

// The weights one forward pass reads: matrices in place (a checkpoint's mapping, or the seeded fp32 vectors),
// norms and biases as fp32 copies.
struct EngineLayer {
  std::vector<float> attn_norm, ffn_norm, q_norm, k_norm;  // q_norm/k_norm: head_dim each (qk_norm) or empty
  std::vector<float> bq, bk, bv;                           // attention biases (attention_bias) or empty
  WeightMatrix wq, wk, wv, wo, gate, up, down;
};
struct EngineWeights {
  WeightMatrix embed;  // out_major: row t is token t's embedding (out = vocab, in = hidden)
  std::vector<EngineLayer> layers;
  std::vector<float> final_norm;
  WeightMatrix lm_head;
  std::string revision;  // what KV keys carry as the weights' identity (kv_namespace)
  // Owners of what the matrices point into.
  ref::Weights seeded;
  std::unique_ptr<model::Checkpoint> checkpoint;
  std::vector<std::vector<std::byte>> copies;  // tensors whose offsets are not aligned for their type
};

WeightMatrix seeded_matrix(const std::vector<float>& w, int64_t in, int64_t out) {
  return WeightMatrix{w.data(), WeightType::kF32, in, out, /*out_major=*/false, nullptr};
}

EngineWeights seeded_weights(const model::ModelConfig& m, uint64_t seed) {
  EngineWeights e;
  e.seeded = ref::make_weights(m, seed);
  const ref::Weights& w = e.seeded;
  const int64_t h = m.hidden_size, qd = m.num_heads * m.head_dim, kvd = m.num_kv_heads * m.head_dim;
  e.embed = WeightMatrix{w.embed.data(), WeightType::kF32, h, m.vocab_size, true, nullptr};
  for (const ref::LayerWeights& l : w.layers) {
    EngineLayer el;
    el.attn_norm = l.attn_norm;
    el.ffn_norm = l.ffn_norm;
    el.wq = seeded_matrix(l.wq, h, qd);
    el.wk = seeded_matrix(l.wk, h, kvd);
    el.wv = seeded_matrix(l.wv, h, kvd);
    el.wo = seeded_matrix(l.wo, qd, h);
    el.gate = seeded_matrix(l.w1, h, m.ffn_size);
    el.up = seeded_matrix(l.w3, h, m.ffn_size);
    el.down = seeded_matrix(l.w2, m.ffn_size, h);
    e.layers.push_back(std::move(el));
  }
  e.final_norm = w.final_norm;
  e.lm_head = seeded_matrix(w.lm_head, h, m.vocab_size);
  e.revision = "ref-seed" + std::to_string(seed);
  return e;
}

WeightType weight_type_of(model::Dtype d) {
  return d == model::Dtype::kBF16 ? WeightType::kBF16 : d == model::Dtype::kF16 ? WeightType::kF16 : WeightType::kF32;
}

// The checkpoint's weights, checked against the config (open_checked_checkpoint), matrices in place.
Result<EngineWeights> checkpoint_weights(const model::ModelConfig& m) {
  MC_ASSIGN_OR_RETURN(model::CheckedCheckpoint ck, model::open_checked_checkpoint(m));
  EngineWeights e;
  // The identity of the weights: XXH3 of the model's config and of every tensor's name, dtype and bytes — not of
  // where the directory is or what it is called, so two hosts holding the same checkpoint at different paths agree.
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return error(Code::kResourceExhausted, "ref backend: out of memory (checkpoint digest)");
  XXH3_64bits_reset(state);
  model::ModelConfig canonical = m;
  canonical.name.clear();
  canonical.checkpoint_dir.clear();
  const std::string config = canonical.to_json();
  XXH3_64bits_update(state, config.data(), config.size());
  auto view = [&](const std::string& name) -> const model::TensorView& { return ck.tensors.at(name); };
  auto matrix = [&](const std::string& name) -> WeightMatrix {
    const model::TensorView& v = view(name);
    const WeightType t = weight_type_of(v.dtype);
    const void* data = v.data;
    if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(cpu::weight_type_bytes(t)) != 0) {
      e.copies.emplace_back(v.data, v.data + v.size_bytes);
      data = e.copies.back().data();
    }
    return WeightMatrix{data, t, v.shape[1], v.shape[0], true, nullptr};
  };
  auto floats = [&](const std::string& name) {
    const model::TensorView& v = view(name);
    std::vector<float> out(static_cast<size_t>(v.element_count));
    cpu::to_fp32(v.data, weight_type_of(v.dtype), v.element_count, out.data());
    return out;
  };
  for (const auto& [name, v] : ck.tensors) {
    XXH3_64bits_update(state, name.data(), name.size());
    const std::string_view dt = model::dtype_name(v.dtype);
    XXH3_64bits_update(state, dt.data(), dt.size());
    XXH3_64bits_update(state, v.data, v.size_bytes);
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(digest));
  e.revision = std::string("ckpt-") + hex;

  e.embed = matrix("model.embed_tokens.weight");
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    EngineLayer l;
    l.attn_norm = floats(p + "input_layernorm.weight");
    l.ffn_norm = floats(p + "post_attention_layernorm.weight");
    l.wq = matrix(p + "self_attn.q_proj.weight");
    l.wk = matrix(p + "self_attn.k_proj.weight");
    l.wv = matrix(p + "self_attn.v_proj.weight");
    l.wo = matrix(p + "self_attn.o_proj.weight");
    if (m.attention_bias) {
      l.bq = floats(p + "self_attn.q_proj.bias");
      l.bk = floats(p + "self_attn.k_proj.bias");
      l.bv = floats(p + "self_attn.v_proj.bias");
    }
    if (m.qk_norm) {
      l.q_norm = floats(p + "self_attn.q_norm.weight");
      l.k_norm = floats(p + "self_attn.k_norm.weight");
    }
    l.gate = matrix(p + "mlp.gate_proj.weight");
    l.up = matrix(p + "mlp.up_proj.weight");
    l.down = matrix(p + "mlp.down_proj.weight");
    e.layers.push_back(std::move(l));
  }
  // The biases point into the layer's own vectors: set once the layers stopped moving.
  for (EngineLayer& l : e.layers) {
    if (!l.bq.empty()) {
      l.wq.bias = l.bq.data();
      l.wk.bias = l.bk.data();
      l.wv.bias = l.bv.data();
    }
  }
  e.final_norm = floats("model.norm.weight");
  e.lm_head = m.tie_word_embeddings ? e.embed : matrix("lm_head.weight");
  e.checkpoint = std::move(ck.checkpoint);
  return e;
}

class RefBackend final : public Backend {
 public:
  RefBackend(const BackendOptions& o, EngineWeights w, WeightType kv_type)
      : kind_("ref"),
        model_(o.model),
        w_(std::move(w)),
        kv_type_(kv_type),
        inv_freq_(ref::rope_inv_freq(o.model)),
        pool_(std::max(1, o.threads)) {
    // The pool runs every parallel part; OpenBLAS runs single-threaded inside its tasks (cpu_kernels.hpp).
    openblas_set_num_threads(1);
  }

  const std::string& kind() const override { return kind_; }
  bool runs_stages() const override { return true; }
  const model::ModelConfig& model() const override { return model_; }
  int64_t kv_bytes_per_token_layer() const override {
    return 2 * model_.num_kv_heads * model_.head_dim * cpu::weight_type_bytes(kv_type_);
  }
  std::string weights_revision(uint64_t) const override { return w_.revision; }
  std::string kv_encoding() const override { return cpu::weight_type_name(kv_type_); }

  Result<PrefillResult> prefill(KvBuffer& kv, const PrefillRequest& req, const LayerDoneFn& on_layer) override {
    MC_RETURN_IF_ERROR(validate_prefill(model_, kv, req));
    MC_RETURN_IF_ERROR(check_layout(kv));
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = static_cast<int64_t>(req.tokens.size());
    const int64_t chunk = req.chunk_tokens > 0 ? req.chunk_tokens : n;
    PrefillResult result;
    std::vector<std::span<const int32_t>> tables = {req.block_table};
    std::vector<float> logits;
    std::vector<const LoraWeights*> loras;
    MC_RETURN_IF_ERROR(adapters(std::span<const LoraAdapter>(&req.lora, 1), loras));
    for (int64_t begin = req.cached_tokens; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      std::vector<Row> rows;
      rows.reserve(static_cast<size_t>(end - begin));
      for (int64_t p = begin; p < end; ++p) rows.push_back({req.tokens[static_cast<size_t>(p)], p, 0});
      const bool last_chunk = end == n;
      MC_RETURN_IF_ERROR(forward(kv, rows, tables, loras, last_chunk ? &logits : nullptr,
                                 [&](int64_t layer) { return on_layer ? on_layer(layer, begin, end) : Status::ok(); }));
    }
    MC_RETURN_IF_ERROR(check_finite(logits.data(), 1));
    result.first_token = argmax(logits.data());
    result.last_logits = std::move(logits);
    result.computed_tokens = n - req.cached_tokens;
    result.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  }

  Result<StageResult> prefill_stage(KvBuffer& kv, const StageRequest& req, const LayerDoneFn& on_layer) override {
    MC_RETURN_IF_ERROR(check_layout(kv));
    const auto& m = model_;
    MC_RETURN_IF_ERROR(validate_stage(m, kv, req, m.hidden_size));
    const auto n = static_cast<int64_t>(req.tokens.size());
    const int64_t rows_n = req.token_end - req.token_begin;
    const bool embeds = req.first_layer == 0;
    std::vector<const LoraWeights*> loras;
    MC_RETURN_IF_ERROR(adapters(std::span<const LoraAdapter>(&req.lora, 1), loras));
    std::vector<Row> rows;
    rows.reserve(static_cast<size_t>(rows_n));
    for (int64_t p = req.token_begin; p < req.token_end; ++p)
      rows.push_back({req.tokens[static_cast<size_t>(p)], p, 0});
    std::vector<std::span<const int32_t>> tables = {req.block_table};
    const int64_t last = req.first_layer + req.num_layers;
    const bool ends_model = last == m.num_layers;
    StageResult result;
    std::vector<float> logits;
    MC_RETURN_IF_ERROR(forward(
        kv, rows, tables, loras, ends_model && req.token_end == n ? &logits : nullptr,
        [&](int64_t layer) { return on_layer ? on_layer(layer, req.token_begin, req.token_end) : Status::ok(); },
        /*all_logits=*/false, req.first_layer, last, embeds ? nullptr : req.hidden_in.data(),
        ends_model ? nullptr : &result.hidden_out));
    if (!logits.empty()) {
      MC_RETURN_IF_ERROR(check_finite(logits.data(), 1));
      result.first_token = argmax(logits.data());
      result.last_logits = std::move(logits);
    }
    return result;
  }

  Status decode_step(KvBuffer& kv, std::span<const DecodeSequence> batch, std::vector<uint32_t>& next,
                     std::vector<float>* logits_out) override {
    MC_RETURN_IF_ERROR(check_layout(kv));
    std::vector<Row> rows;
    std::vector<std::span<const int32_t>> tables;
    std::vector<LoraAdapter> wanted;
    for (const auto& s : batch) wanted.push_back(s.lora);
    std::vector<const LoraWeights*> loras;
    MC_RETURN_IF_ERROR(adapters(wanted, loras));
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& s = batch[i];
      if (s.last_token >= static_cast<uint64_t>(model_.vocab_size)) {
        return error(Code::kInvalidArgument, "decode: token " + std::to_string(s.last_token) + " >= vocab " +
                                                 std::to_string(model_.vocab_size));
      }
      if (s.position < 0 || s.position >= model_.max_context_tokens ||
          kv.layout().blocks_for_tokens(s.position + 1) > static_cast<int64_t>(s.block_table.size())) {
        return error(Code::kInvalidArgument, "decode: block table of " + std::to_string(s.block_table.size()) +
                                                 " blocks does not cover position " + std::to_string(s.position) +
                                                 " (or it is past the model's context of " +
                                                 std::to_string(model_.max_context_tokens) + ")");
      }
      rows.push_back({s.last_token, s.position, i});
      tables.push_back(s.block_table);
    }
    next.clear();
    if (logits_out != nullptr) logits_out->clear();
    if (rows.empty()) return Status::ok();
    std::vector<float> logits;
    MC_RETURN_IF_ERROR(forward(
        kv, rows, tables, loras, &logits, [](int64_t) { return Status::ok(); }, /*all_logits=*/true));
    MC_RETURN_IF_ERROR(check_finite(logits.data(), static_cast<int64_t>(rows.size())));
    for (size_t i = 0; i < rows.size(); ++i) {
      next.push_back(argmax(logits.data() + i * static_cast<size_t>(model_.vocab_size)));
    }
    if (logits_out != nullptr) *logits_out = std::move(logits);
    return Status::ok();
  }

 private:
  Status check_layout(const KvBuffer& kv) const {
    if (kv.layout().bytes_per_token_layer != kv_bytes_per_token_layer() ||
        kv.layout().num_layers != model_.num_layers) {
      return error(Code::kInvalidArgument, "ref backend: KV buffer layout (" + std::to_string(kv.layout().num_layers) +
                                               " layers, " + std::to_string(kv.layout().bytes_per_token_layer) +
                                               " B/token/layer) does not match the model (" +
                                               std::to_string(model_.num_layers) + " layers, " +
                                               std::to_string(kv_bytes_per_token_layer()) + " B)");
    }
    return Status::ok();
  }

  // The weights of each adapter in `wanted` (nullptr for the base model), made on first use. The cache holds
  // at most kMaxLoraAdapters; when a call needs more than fit, it is emptied first (the weights are
  // deterministic, so a re-made adapter is the same).
  Status adapters(std::span<const LoraAdapter> wanted, std::vector<const LoraWeights*>& out) {
    std::set<std::pair<std::string, std::string>> missing;
    for (const auto& a : wanted) {
      if (!a.is_base() && lora_.count({a.name, a.version}) == 0) missing.insert({a.name, a.version});
    }
    if (lora_.size() + missing.size() > kMaxLoraAdapters) {
      lora_.clear();
      missing.clear();
      for (const auto& a : wanted) {
        if (!a.is_base()) missing.insert({a.name, a.version});
      }
      if (missing.size() > kMaxLoraAdapters) {
        return error(Code::kResourceExhausted, "ref backend: one batch needs " + std::to_string(missing.size()) +
                                                   " LoRA adapters, at most " + std::to_string(kMaxLoraAdapters) +
                                                   " are held at once (lower --max-batch)");
      }
    }
    for (const auto& key : missing) {
      lora_.emplace(key, make_lora(model_, lora_weight_seed(LoraAdapter{key.first, key.second})));
    }
    out.clear();
    for (const auto& a : wanted) out.push_back(a.is_base() ? nullptr : &lora_.at({a.name, a.version}));
    return Status::ok();
  }

  // Non-finite logits (NaN or Inf weights in a checkpoint, or an overflow) have no greedy token: the request fails
  // with an error naming the cause instead of answering token 0.
  Status check_finite(const float* logits, int64_t rows) const {
    const int64_t n = rows * model_.vocab_size;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(logits[i])) {
        return error(Code::kDataLoss, "ref backend: model '" + model_.name + "' computed a non-finite logit (" +
                                          std::to_string(logits[i]) + " for token " +
                                          std::to_string(i % model_.vocab_size) +
                                          "): its weights hold NaN or Inf values, or overflow fp32; check the "
                                          "checkpoint");
      }
    }
    return Status::ok();
  }

  uint32_t argmax(const float* logits) const {
    return static_cast<uint32_t>(std::max_element(logits, logits + model_.vocab_size) - logits);
  }

  // Calls fn(r0, r1) over [0, n) in about pool-size-times-4 contiguous ranges, in parallel.
  template <typename Fn>
  void rows_parallel(int64_t n, Fn&& fn) {
    const int64_t parts = std::min<int64_t>(n, 4 * pool_.size());
    if (parts <= 1) {
      fn(int64_t{0}, n);
      return;
    }
    const int64_t per = (n + parts - 1) / parts;
    pool_.run((n + per - 1) / per, [&](int64_t t, int) { fn(t * per, std::min(n, (t + 1) * per)); });
  }

  // Attention of the rows [r0, r1) of one sequence (contiguous, increasing positions) whose KV, and that of every
  // earlier position, is in the buffer: attn rows = softmax(Q Kᵀ / sqrt(d), causal) V per query head. Tasks over
  // (KV head, block of query rows); each gathers its KV head's context (converted to fp32) once for the query heads
  // of its group, and only the positions its rows can see.
  void attention(KvBuffer& kv, const std::vector<Row>& rows, int64_t r0, int64_t r1, std::span<const int32_t> table,
                 int64_t layer, const float* q, float* attn) {
    const auto& m = model_;
    const int64_t hd = m.head_dim, nh = m.num_heads, nkv = m.num_kv_heads, qd = nh * hd, group = nh / nkv;
    const int64_t bs = kv.layout().block_size;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int64_t mrows = r1 - r0;
    constexpr int64_t kQueryBlock = 128;
    const int64_t qblocks = (mrows + kQueryBlock - 1) / kQueryBlock;
    pool_.run(nkv * qblocks, [&](int64_t task, int worker) {
      const int64_t kvh = task / qblocks, qb = task % qblocks;
      const int64_t b0 = r0 + qb * kQueryBlock, b1 = std::min(r1, b0 + kQueryBlock), brows = b1 - b0;
      const int64_t ctx = rows[b1 - 1].pos + 1;  // positions the block's last row sees
      float* kctx = pool_.scratch(worker, 1, static_cast<size_t>(ctx * hd));
      float* vctx = pool_.scratch(worker, 2, static_cast<size_t>(ctx * hd));
      float* scores = pool_.scratch(worker, 3, static_cast<size_t>(brows * ctx));
      const int64_t elem = cpu::weight_type_bytes(kv_type_);
      for (int64_t j = 0; j < ctx; ++j) {
        const int32_t block = table[static_cast<size_t>(j / bs)];
        cpu::to_fp32(kv.token_kv(block, layer, 0, j % bs) + kvh * hd * elem, kv_type_, hd, &kctx[j * hd]);
        cpu::to_fp32(kv.token_kv(block, layer, 1, j % bs) + kvh * hd * elem, kv_type_, hd, &vctx[j * hd]);
      }
      for (int64_t qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
        // scores (brows × ctx) = Q_h (brows × hd, stride qd) · Kᵀ
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(brows), static_cast<int>(ctx),
                    static_cast<int>(hd), scale, &q[b0 * qd + qh * hd], static_cast<int>(qd), kctx,
                    static_cast<int>(hd), 0.0f, scores, static_cast<int>(ctx));
        for (int64_t i = 0; i < brows; ++i) {
          float* srow = &scores[i * ctx];
          const int64_t visible = rows[b0 + i].pos + 1;  // causal mask
          cpu::softmax(srow, visible);
          std::fill(srow + visible, srow + ctx, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(brows), static_cast<int>(hd),
                    static_cast<int>(ctx), 1.0f, scores, static_cast<int>(ctx), vctx, static_cast<int>(hd), 0.0f,
                    &attn[b0 * qd + qh * hd], static_cast<int>(qd));
      }
    });
  }

  // Runs all layers over `rows`. Rows of one sequence must be contiguous and in increasing position; every
  // earlier position of that sequence must already have its KV in the buffer. Writes the rows' KV, calls
  // layer_done(l) after each layer, and fills `logits` for the last row (or every row when all_logits).
  // loras[seq] is the adapter of sequence seq (nullptr: the base model).
  // A pipeline stage runs layers [layer_begin, layer_end) only: its input is hidden_in (rows x hidden_size) instead
  // of the embeddings when given, and hidden_out receives the hidden states after layer_end - 1 when given; logits
  // need layer_end = num_layers (the default: every layer).
  template <typename LayerDone>
  Status forward(KvBuffer& kv, const std::vector<Row>& rows, const std::vector<std::span<const int32_t>>& tables,
                 const std::vector<const LoraWeights*>& loras, std::vector<float>* logits, LayerDone&& layer_done,
                 bool all_logits = false, int64_t layer_begin = 0, int64_t layer_end = -1,
                 const float* hidden_in = nullptr, std::vector<float>* hidden_out = nullptr) {
    const auto& m = model_;
    const int64_t n = static_cast<int64_t>(rows.size());
    const int64_t h = m.hidden_size, hd = m.head_dim, nh = m.num_heads, nkv = m.num_kv_heads;
    const int64_t qd = nh * hd, kvd = nkv * hd, bs = kv.layout().block_size, ffn = m.ffn_size;
    const float eps = static_cast<float>(m.rms_norm_eps);
    for (const auto& t : tables) {
      for (int32_t b : t) MC_RETURN_IF_ERROR(kv.check_block(b));
    }

    std::vector<float> x(static_cast<size_t>(n * h)), xn(x.size()), q(static_cast<size_t>(n * qd)),
        k(static_cast<size_t>(n * kvd)), v(k.size()), attn(q.size()), o(x.size()), g(static_cast<size_t>(n * ffn)),
        up(g.size());
    if (hidden_in != nullptr) {
      std::memcpy(x.data(), hidden_in, sizeof(float) * x.size());
    } else {
      const auto* embed = static_cast<const std::byte*>(w_.embed.data);
      const int64_t row_bytes = h * cpu::weight_type_bytes(w_.embed.type);
      for (int64_t r = 0; r < n; ++r) {
        cpu::to_fp32(embed + static_cast<int64_t>(rows[r].token) * row_bytes, w_.embed.type, h, &x[r * h]);
      }
    }
    if (layer_end < 0) layer_end = m.num_layers;
    for (int64_t l = layer_begin; l < layer_end; ++l) {
      const EngineLayer& w = w_.layers[static_cast<size_t>(l)];
      rows_parallel(n, [&](int64_t a, int64_t b) {
        for (int64_t r = a; r < b; ++r) ref::rms_norm(&x[r * h], w.attn_norm.data(), &xn[r * h], h, eps);
      });
      cpu::linear(pool_, xn.data(), n, w.wq, q.data());
      cpu::linear(pool_, xn.data(), n, w.wk, k.data());
      cpu::linear(pool_, xn.data(), n, w.wv, v.data());
      for (int64_t r = 0; r < n; ++r) {
        const LoraWeights* lora = loras[rows[r].seq];
        if (lora == nullptr) continue;
        const LoraLayer& d = (*lora)[static_cast<size_t>(l)];
        add_lora_delta(&xn[r * h], d.aq, d.bq, &q[r * qd], h, qd);
        add_lora_delta(&xn[r * h], d.ak, d.bk, &k[r * kvd], h, kvd);
        add_lora_delta(&xn[r * h], d.av, d.bv, &v[r * kvd], h, kvd);
      }
      rows_parallel(n, [&](int64_t a, int64_t b) {
        for (int64_t r = a; r < b; ++r) {
          if (!w.q_norm.empty()) {  // Qwen3: RMSNorm of each head of q and k, before RoPE
            for (int64_t i = 0; i < nh; ++i)
              ref::rms_norm(&q[r * qd + i * hd], w.q_norm.data(), &q[r * qd + i * hd], hd, eps);
            for (int64_t i = 0; i < nkv; ++i)
              ref::rms_norm(&k[r * kvd + i * hd], w.k_norm.data(), &k[r * kvd + i * hd], hd, eps);
          }
          ref::rope(&q[r * qd], nh, hd, rows[r].pos, inv_freq_.data());
          ref::rope(&k[r * kvd], nkv, hd, rows[r].pos, inv_freq_.data());
          const auto& table = tables[rows[r].seq];
          const int32_t block = table[static_cast<size_t>(rows[r].pos / bs)];
          cpu::from_fp32(&k[r * kvd], kvd, kv_type_, kv.token_kv(block, l, 0, rows[r].pos % bs));
          cpu::from_fp32(&v[r * kvd], kvd, kv_type_, kv.token_kv(block, l, 1, rows[r].pos % bs));
        }
      });
      // Attention, one sequence (a contiguous run of rows) at a time.
      for (int64_t r0 = 0; r0 < n;) {
        int64_t r1 = r0 + 1;
        while (r1 < n && rows[r1].seq == rows[r0].seq) ++r1;
        attention(kv, rows, r0, r1, tables[rows[r0].seq], l, q.data(), attn.data());
        r0 = r1;
      }
      cpu::linear(pool_, attn.data(), n, w.wo, o.data());
      rows_parallel(n, [&](int64_t a, int64_t b) {
        for (int64_t r = a; r < b; ++r) {
          for (int64_t i = r * h; i < (r + 1) * h; ++i) x[i] += o[i];
          ref::rms_norm(&x[r * h], w.ffn_norm.data(), &xn[r * h], h, eps);
        }
      });
      cpu::linear(pool_, xn.data(), n, w.gate, g.data());
      cpu::linear(pool_, xn.data(), n, w.up, up.data());
      rows_parallel(n, [&](int64_t a, int64_t b) {
        for (int64_t i = a * ffn; i < b * ffn; ++i) g[i] = ref::silu(g[i]) * up[i];
      });
      cpu::linear(pool_, g.data(), n, w.down, o.data());
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      MC_RETURN_IF_ERROR(layer_done(l));
    }
    if (hidden_out != nullptr) *hidden_out = x;
    if (logits != nullptr && layer_end == m.num_layers) {
      const int64_t first = all_logits ? 0 : n - 1;
      const int64_t count = n - first;
      for (int64_t r = first; r < n; ++r) ref::rms_norm(&x[r * h], w_.final_norm.data(), &xn[(r - first) * h], h, eps);
      logits->assign(static_cast<size_t>(count * m.vocab_size), 0.0f);
      cpu::linear(pool_, xn.data(), count, w_.lm_head, logits->data());
    }
    return Status::ok();
  }

  std::string kind_;
  model::ModelConfig model_;
  EngineWeights w_;
  WeightType kv_type_;
  std::vector<double> inv_freq_;
  cpu::ThreadPool pool_;
  std::map<std::pair<std::string, std::string>, LoraWeights> lora_;  // (name, version) -> weights
};

}  // namespace

Result<std::unique_ptr<Backend>> make_ref_backend(const BackendOptions& options) {
  const model::ModelConfig& m = options.model;
  WeightType kv_type = WeightType::kF32;
  if (options.kv_dtype == "bf16") kv_type = WeightType::kBF16;
  if (options.kv_dtype == "fp16") kv_type = WeightType::kF16;
  if (!m.checkpoint_dir.empty()) {
    Result<EngineWeights> loaded = checkpoint_weights(m);
    if (!loaded) {
      return Status(loaded.status().code(), "ref backend: " + loaded.status().message() +
                                                " (--backend sim models the checkpoint's speed without its weights)");
    }
    EngineWeights w = std::move(loaded).value();
    // auto: the KV in the checkpoint's own type (that of its embedding), as serving engines do.
    if (options.kv_dtype == "auto") kv_type = w.embed.type;
    return std::unique_ptr<Backend>(new RefBackend(options, std::move(w), kv_type));
  }
  constexpr int64_t kMaxWeightBytes = 8LL << 30;
  const int64_t bytes = m.param_count() * static_cast<int64_t>(sizeof(float));
  if (bytes > kMaxWeightBytes) {
    return error(Code::kResourceExhausted, "ref backend: model '" + m.name + "' needs " + std::to_string(bytes >> 20) +
                                               " MiB of fp32 weights (limit 8 GiB); use a smaller model (tiny, small) "
                                               "or --backend sim");
  }
  return std::unique_ptr<Backend>(new RefBackend(options, seeded_weights(m, options.seed), kv_type));
}

}  // namespace mc::infer
