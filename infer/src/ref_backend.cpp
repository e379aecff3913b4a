// The `ref` backend: a LLaMA-architecture decoder in fp32 on the CPU (see backend.hpp).
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

#include "backends.hpp"
#include "mc/infer/ref_kernels.hpp"

namespace mc::infer {

namespace ref {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void rope(float* x, int64_t heads, int64_t head_dim, int64_t pos, double theta) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double angle = static_cast<double>(pos) * freq;
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

void softmax(float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace ref

namespace {

// y (m×n) = x (m×k) · w (k×n), row-major.
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, x, static_cast<int>(k), w, static_cast<int>(n), 0.0f, y, static_cast<int>(n));
}

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

class RefBackend final : public Backend {
 public:
  explicit RefBackend(const BackendOptions& o) : kind_("ref"), model_(o.model), w_(ref::make_weights(o.model, o.seed)) {
    openblas_set_num_threads(std::max(1, o.threads));
  }

  const std::string& kind() const override { return kind_; }
  bool runs_stages() const override { return true; }
  const model::ModelConfig& model() const override { return model_; }
  int64_t kv_bytes_per_token_layer() const override {
    return 2 * model_.num_kv_heads * model_.head_dim * static_cast<int64_t>(sizeof(float));
  }

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
      result.first_token = argmax(logits.data());
      result.last_logits = std::move(logits);
    }
    return result;
  }

  Status decode_step(KvBuffer& kv, std::span<const DecodeSequence> batch, std::vector<uint32_t>& next) override {
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
      if (s.position < 0 ||
          kv.layout().blocks_for_tokens(s.position + 1) > static_cast<int64_t>(s.block_table.size())) {
        return error(Code::kInvalidArgument, "decode: block table of " + std::to_string(s.block_table.size()) +
                                                 " blocks does not cover position " + std::to_string(s.position));
      }
      rows.push_back({s.last_token, s.position, i});
      tables.push_back(s.block_table);
    }
    next.clear();
    if (rows.empty()) return Status::ok();
    std::vector<float> logits;
    MC_RETURN_IF_ERROR(forward(
        kv, rows, tables, loras, &logits, [](int64_t) { return Status::ok(); }, /*all_logits=*/true));
    for (size_t i = 0; i < rows.size(); ++i) {
      next.push_back(argmax(logits.data() + i * static_cast<size_t>(model_.vocab_size)));
    }
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

  uint32_t argmax(const float* logits) const {
    return static_cast<uint32_t>(std::max_element(logits, logits + model_.vocab_size) - logits);
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
    const int64_t qd = nh * hd, kvd = nkv * hd, group = nh / nkv, bs = kv.layout().block_size;
    const float eps = static_cast<float>(m.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const auto& t : tables) {
      for (int32_t b : t) MC_RETURN_IF_ERROR(kv.check_block(b));
    }

    std::vector<float> x(static_cast<size_t>(n * h)), xn(x.size()), q(static_cast<size_t>(n * qd)),
        k(static_cast<size_t>(n * kvd)), v(k.size()), attn(q.size()), o(x.size()),
        g(static_cast<size_t>(n * m.ffn_size)), up(g.size());
    if (hidden_in != nullptr) {
      std::memcpy(x.data(), hidden_in, sizeof(float) * x.size());
    } else {
      for (int64_t r = 0; r < n; ++r) {
        std::memcpy(&x[r * h], &w_.embed[static_cast<size_t>(rows[r].token) * h], sizeof(float) * h);
      }
    }
    if (layer_end < 0) layer_end = m.num_layers;
    std::vector<float> kctx, vctx, scores;
    for (int64_t l = layer_begin; l < layer_end; ++l) {
      const ref::LayerWeights& w = w_.layers[static_cast<size_t>(l)];
      for (int64_t r = 0; r < n; ++r) ref::rms_norm(&x[r * h], w.attn_norm.data(), &xn[r * h], h, eps);
      matmul(xn.data(), w.wq.data(), q.data(), n, h, qd);
      matmul(xn.data(), w.wk.data(), k.data(), n, h, kvd);
      matmul(xn.data(), w.wv.data(), v.data(), n, h, kvd);
      for (int64_t r = 0; r < n; ++r) {
        const LoraWeights* lora = loras[rows[r].seq];
        if (lora == nullptr) continue;
        const LoraLayer& d = (*lora)[static_cast<size_t>(l)];
        add_lora_delta(&xn[r * h], d.aq, d.bq, &q[r * qd], h, qd);
        add_lora_delta(&xn[r * h], d.ak, d.bk, &k[r * kvd], h, kvd);
        add_lora_delta(&xn[r * h], d.av, d.bv, &v[r * kvd], h, kvd);
      }
      for (int64_t r = 0; r < n; ++r) {
        ref::rope(&q[r * qd], nh, hd, rows[r].pos, m.rope_theta);
        ref::rope(&k[r * kvd], nkv, hd, rows[r].pos, m.rope_theta);
        const auto& table = tables[rows[r].seq];
        const int32_t block = table[static_cast<size_t>(rows[r].pos / bs)];
        std::memcpy(kv.token_kv(block, l, 0, rows[r].pos % bs), &k[r * kvd], sizeof(float) * kvd);
        std::memcpy(kv.token_kv(block, l, 1, rows[r].pos % bs), &v[r * kvd], sizeof(float) * kvd);
      }
      // Attention, one sequence (a contiguous run of rows) at a time.
      for (int64_t r0 = 0; r0 < n;) {
        int64_t r1 = r0 + 1;
        while (r1 < n && rows[r1].seq == rows[r0].seq) ++r1;
        const auto& table = tables[rows[r0].seq];
        const int64_t ctx = rows[r1 - 1].pos + 1;
        const int64_t mrows = r1 - r0;
        kctx.resize(static_cast<size_t>(ctx * hd));
        vctx.resize(kctx.size());
        scores.resize(static_cast<size_t>(mrows * ctx));
        for (int64_t kvh = 0; kvh < nkv; ++kvh) {
          for (int64_t j = 0; j < ctx; ++j) {
            const int32_t block = table[static_cast<size_t>(j / bs)];
            const auto* kp = reinterpret_cast<const float*>(kv.token_kv(block, l, 0, j % bs)) + kvh * hd;
            const auto* vp = reinterpret_cast<const float*>(kv.token_kv(block, l, 1, j % bs)) + kvh * hd;
            std::memcpy(&kctx[j * hd], kp, sizeof(float) * hd);
            std::memcpy(&vctx[j * hd], vp, sizeof(float) * hd);
          }
          for (int64_t qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
            // scores (mrows × ctx) = Q_h (mrows × hd, stride qd) · Kᵀ
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(mrows), static_cast<int>(ctx),
                        static_cast<int>(hd), scale, &q[r0 * qd + qh * hd], static_cast<int>(qd), kctx.data(),
                        static_cast<int>(hd), 0.0f, scores.data(), static_cast<int>(ctx));
            for (int64_t i = 0; i < mrows; ++i) {
              float* srow = &scores[i * ctx];
              const int64_t visible = rows[r0 + i].pos + 1;  // causal mask
              std::fill(srow + visible, srow + ctx, -std::numeric_limits<float>::infinity());
              ref::softmax(srow, visible);
              std::fill(srow + visible, srow + ctx, 0.0f);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(mrows), static_cast<int>(hd),
                        static_cast<int>(ctx), 1.0f, scores.data(), static_cast<int>(ctx), vctx.data(),
                        static_cast<int>(hd), 0.0f, &attn[r0 * qd + qh * hd], static_cast<int>(qd));
          }
        }
        r0 = r1;
      }
      matmul(attn.data(), w.wo.data(), o.data(), n, qd, h);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      for (int64_t r = 0; r < n; ++r) ref::rms_norm(&x[r * h], w.ffn_norm.data(), &xn[r * h], h, eps);
      matmul(xn.data(), w.w1.data(), g.data(), n, h, m.ffn_size);
      matmul(xn.data(), w.w3.data(), up.data(), n, h, m.ffn_size);
      for (size_t i = 0; i < g.size(); ++i) g[i] = ref::silu(g[i]) * up[i];
      matmul(g.data(), w.w2.data(), o.data(), n, m.ffn_size, h);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      MC_RETURN_IF_ERROR(layer_done(l));
    }
    if (hidden_out != nullptr) *hidden_out = x;
    if (logits != nullptr && layer_end == m.num_layers) {
      const int64_t first = all_logits ? 0 : n - 1;
      const int64_t count = n - first;
      for (int64_t r = first; r < n; ++r) ref::rms_norm(&x[r * h], w_.final_norm.data(), &xn[(r - first) * h], h, eps);
      logits->assign(static_cast<size_t>(count * m.vocab_size), 0.0f);
      matmul(xn.data(), w_.lm_head.data(), logits->data(), count, h, m.vocab_size);
    }
    return Status::ok();
  }

  std::string kind_;
  model::ModelConfig model_;
  ref::Weights w_;
  std::map<std::pair<std::string, std::string>, LoraWeights> lora_;  // (name, version) -> weights
};

}  // namespace

Result<std::unique_ptr<Backend>> make_ref_backend(const BackendOptions& options) {
  constexpr int64_t kMaxWeightBytes = 8LL << 30;
  const int64_t bytes = options.model.param_count() * static_cast<int64_t>(sizeof(float));
  if (bytes > kMaxWeightBytes) {
    return error(Code::kResourceExhausted, "ref backend: model '" + options.model.name + "' needs " +
                                               std::to_string(bytes >> 20) +
                                               " MiB of fp32 weights (limit 8 GiB); use a smaller model (tiny, small) "
                                               "or --backend sim");
  }
  return std::unique_ptr<Backend>(new RefBackend(options));
}

}  // namespace mc::infer
