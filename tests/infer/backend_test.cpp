// The compute backends: kernels against hand-computed values, the ref model against a naive forward pass,
// cached-prefix prefill ≡ full prefill, chunked ≡ unchunked, batched decode ≡ single decode, the sim backend.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "mc/infer/backend.hpp"
#include "mc/infer/ref_kernels.hpp"

namespace mc::infer {
namespace {

constexpr int64_t kBackendBlock = 8;

std::vector<uint32_t> prompt(int64_t n, uint32_t salt, int64_t vocab) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  uint64_t s = 0x1234 + salt;
  for (auto& x : t) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<uint32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

struct Fixture {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvBuffer> kv;
};

Fixture make(const std::string& kind, int64_t blocks = 64, int64_t block = kBackendBlock,
             int64_t kv_bytes_per_token = 0) {
  BackendOptions o;
  o.kind = kind;
  o.model = model::model_preset("tiny").value();
  o.seed = 7;
  o.time_scale = 1e6;  // sim: modelled time / 1e6, effectively no sleep
  o.kv_bytes_per_token = kv_bytes_per_token;
  auto b = make_backend(o);
  EXPECT_TRUE(b) << b.status().to_string();
  Fixture f;
  f.backend = std::move(b).value();
  auto kv = KvBuffer::create(f.backend->kv_layout(block), blocks);
  EXPECT_TRUE(kv) << kv.status().to_string();
  f.kv = std::move(kv).value();
  return f;
}

TEST(RefKernels, HandComputedValues) {
  const float x[2] = {3, 4}, w[2] = {1, 2};
  float y[2];
  ref::rms_norm(x, w, y, 2, 0.0f);  // rms = sqrt((9 + 16) / 2) = 3.5355339
  EXPECT_NEAR(y[0], 3 / 3.5355339f, 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 / 3.5355339f, 1e-6);

  float r[4] = {1, 2, 0, 0};  // head_dim 4: pairs (0,2) and (1,3)
  ref::rope(r, 1, 4, 0, 10000.0);
  EXPECT_FLOAT_EQ(r[0], 1);  // position 0: identity
  EXPECT_FLOAT_EQ(r[2], 0);
  float q[4] = {1, 1, 0, 0};
  ref::rope(q, 1, 4, 1, 100.0);  // pair 0: angle 1 rad; pair 1: angle 100^(-1/2) = 0.1 rad
  EXPECT_NEAR(q[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(q[2], std::sin(1.0), 1e-6);
  EXPECT_NEAR(q[1], std::cos(0.1), 1e-6);
  EXPECT_NEAR(q[3], std::sin(0.1), 1e-6);

  float s[3] = {0, std::log(2.0f), 0};
  ref::softmax(s, 2);
  EXPECT_NEAR(s[0], 1.0 / 3, 1e-6);
  EXPECT_NEAR(s[1], 2.0 / 3, 1e-6);
  EXPECT_FLOAT_EQ(ref::silu(0), 0);
  EXPECT_NEAR(ref::silu(1), 1 / (1 + std::exp(-1.0)), 1e-6);
}

// A plain-loop forward pass over the whole prompt with a contiguous KV cache: the independent reference.
struct NaiveOut {
  std::vector<float> logits;
  std::vector<std::vector<float>> k, v;  // [layer][pos · kv_heads · head_dim]
};
NaiveOut naive_forward(const model::ModelConfig& m, const ref::Weights& w, const std::vector<uint32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), h = m.hidden_size, hd = m.head_dim;
  const int64_t nh = m.num_heads, nkv = m.num_kv_heads, qd = nh * hd, kvd = nkv * hd;
  auto mat = [](const std::vector<float>& x, const std::vector<float>& W, int64_t in, int64_t out) {
    std::vector<float> y(static_cast<size_t>(out), 0.0f);
    for (int64_t j = 0; j < out; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(x[i]) * W[i * out + j];
      y[j] = static_cast<float>(acc);
    }
    return y;
  };
  NaiveOut out;
  out.k.assign(static_cast<size_t>(m.num_layers), std::vector<float>(static_cast<size_t>(n * kvd)));
  out.v = out.k;
  std::vector<std::vector<float>> x(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) x[p].assign(&w.embed[tokens[p] * h], &w.embed[tokens[p] * h] + h);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const auto& L = w.layers[l];
    std::vector<std::vector<float>> q(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) {
      std::vector<float> xn(static_cast<size_t>(h));
      ref::rms_norm(x[p].data(), L.attn_norm.data(), xn.data(), h, static_cast<float>(m.rms_norm_eps));
      q[p] = mat(xn, L.wq, h, qd);
      auto k = mat(xn, L.wk, h, kvd);
      auto v = mat(xn, L.wv, h, kvd);
      ref::rope(q[p].data(), nh, hd, p, m.rope_theta);
      ref::rope(k.data(), nkv, hd, p, m.rope_theta);
      std::copy(k.begin(), k.end(), out.k[l].begin() + p * kvd);
      std::copy(v.begin(), v.end(), out.v[l].begin() + p * kvd);
    }
    for (int64_t p = 0; p < n; ++p) {
      std::vector<float> attn(static_cast<size_t>(qd), 0.0f);
      for (int64_t head = 0; head < nh; ++head) {
        const int64_t g = head / (nh / nkv);
        std::vector<float> sc(static_cast<size_t>(p + 1));
        for (int64_t j = 0; j <= p; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += q[p][head * hd + d] * out.k[l][j * kvd + g * hd + d];
          sc[j] = static_cast<float>(dot / std::sqrt(static_cast<double>(hd)));
        }
        ref::softmax(sc.data(), p + 1);
        for (int64_t j = 0; j <= p; ++j) {
          for (int64_t d = 0; d < hd; ++d) attn[head * hd + d] += sc[j] * out.v[l][j * kvd + g * hd + d];
        }
      }
      auto o = mat(attn, L.wo, qd, h);
      for (int64_t i = 0; i < h; ++i) x[p][i] += o[i];
      std::vector<float> xn(static_cast<size_t>(h));
      ref::rms_norm(x[p].data(), L.ffn_norm.data(), xn.data(), h, static_cast<float>(m.rms_norm_eps));
      auto g1 = mat(xn, L.w1, h, m.ffn_size);
      auto u3 = mat(xn, L.w3, h, m.ffn_size);
      for (int64_t i = 0; i < m.ffn_size; ++i) g1[i] = ref::silu(g1[i]) * u3[i];
      auto d2 = mat(g1, L.w2, m.ffn_size, h);
      for (int64_t i = 0; i < h; ++i) x[p][i] += d2[i];
    }
  }
  std::vector<float> xn(static_cast<size_t>(h));
  ref::rms_norm(x[n - 1].data(), w.final_norm.data(), xn.data(), h, static_cast<float>(m.rms_norm_eps));
  out.logits = mat(xn, w.lm_head, h, m.vocab_size);
  return out;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

std::vector<int32_t> alloc(KvBuffer& kv, int64_t tokens) {
  return kv.allocate(kv.layout().blocks_for_tokens(tokens)).value();
}

// K (kv=0) or V (kv=1) floats of token `pos`, layer `layer`.
std::span<const float> token_floats(KvBuffer& kv, const std::vector<int32_t>& table, int64_t layer, int kvsel,
                                    int64_t pos) {
  const int64_t bs = kv.layout().block_size;
  const auto* p = reinterpret_cast<const float*>(kv.token_kv(table[pos / bs], layer, kvsel, pos % bs));
  return {p, static_cast<size_t>(kv.layout().bytes_per_token_layer / 2 / sizeof(float))};
}

TEST(RefBackend, MatchesNaiveForwardPass) {
  auto f = make("ref");
  const auto& m = f.backend->model();
  const auto tokens = prompt(37, 1, m.vocab_size);
  auto table = alloc(*f.kv, 37);
  auto r = f.backend->prefill(*f.kv, {tokens, 0, table, 0}, nullptr);
  ASSERT_TRUE(r) << r.status().to_string();
  const auto naive = naive_forward(m, ref::make_weights(m, 7), tokens);
  EXPECT_LE(max_abs_diff(r->last_logits, naive.logits), 1e-4);
  EXPECT_EQ(r->first_token, std::max_element(naive.logits.begin(), naive.logits.end()) - naive.logits.begin());
  const int64_t kvd = m.num_kv_heads * m.head_dim;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    for (int64_t p = 0; p < 37; ++p) {
      ASSERT_LE(max_abs_diff(token_floats(*f.kv, table, l, 0, p), {&naive.k[l][p * kvd], static_cast<size_t>(kvd)}),
                1e-4)
          << "K layer " << l << " pos " << p;
      ASSERT_LE(max_abs_diff(token_floats(*f.kv, table, l, 1, p), {&naive.v[l][p * kvd], static_cast<size_t>(kvd)}),
                1e-4)
          << "V layer " << l << " pos " << p;
    }
  }
}

// Greedy-decodes `steps` tokens after a prefill; returns first token + generated tokens.
std::vector<uint32_t> generate(Backend& b, KvBuffer& kv, std::vector<int32_t>& table, int64_t prompt_len,
                               uint32_t first, int steps) {
  std::vector<uint32_t> out = {first};
  std::vector<uint32_t> next;
  for (int s = 0; s < steps; ++s) {
    const int64_t pos = prompt_len + s;
    if (kv.layout().blocks_for_tokens(pos + 1) > static_cast<int64_t>(table.size())) {
      auto more = kv.allocate(1).value();
      table.push_back(more[0]);
    }
    DecodeSequence seq{out.back(), pos, table};
    EXPECT_TRUE(b.decode_step(kv, {&seq, 1}, next).is_ok());
    out.push_back(next.at(0));
  }
  return out;
}

// Prefill with the first `cached` tokens' KV copied block-wise from a full run (what a store hit delivers).
void check_cached_equals_full(const std::string& kind, int64_t n, int64_t cached, int64_t chunk) {
  SCOPED_TRACE(kind + " n=" + std::to_string(n) + " cached=" + std::to_string(cached) +
               " chunk=" + std::to_string(chunk));
  auto full = make(kind);
  auto hit = make(kind);
  const auto& m = full.backend->model();
  const auto tokens = prompt(n, 2, m.vocab_size);
  auto table_full = alloc(*full.kv, n);
  auto table_hit = alloc(*hit.kv, n);
  auto rf = full.backend->prefill(*full.kv, {tokens, 0, table_full, 0}, nullptr);
  ASSERT_TRUE(rf) << rf.status().to_string();
  ASSERT_EQ(cached % kBackendBlock, 0);
  for (int64_t b = 0; b < cached / kBackendBlock; ++b) {
    std::memcpy(hit.kv->block_span(table_hit[b]).data(), full.kv->block_span(table_full[b]).data(),
                full.kv->layout().block_bytes());
  }
  std::vector<std::pair<int64_t, int64_t>> seen;
  auto rh = hit.backend->prefill(*hit.kv, {tokens, cached, table_hit, chunk}, [&](int64_t layer, int64_t b, int64_t e) {
    if (layer == 0) seen.emplace_back(b, e);
    return Status::ok();
  });
  ASSERT_TRUE(rh) << rh.status().to_string();
  EXPECT_EQ(rh->computed_tokens, n - cached);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().first, cached);
  EXPECT_EQ(seen.back().second, n);
  EXPECT_EQ(rh->first_token, rf->first_token);
  EXPECT_LE(max_abs_diff(rh->last_logits, rf->last_logits), 1e-4);
  const int64_t elems = full.kv->layout().bytes_per_token_layer / 2;
  float kv_diff = 0;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    for (int64_t p = 0; p < n; ++p) {
      for (int s = 0; s < 2; ++s) {
        if (kind == "ref") {
          kv_diff = std::max(kv_diff, max_abs_diff(token_floats(*hit.kv, table_hit, l, s, p),
                                                   token_floats(*full.kv, table_full, l, s, p)));
        } else {
          ASSERT_EQ(0, std::memcmp(hit.kv->token_kv(table_hit[p / kBackendBlock], l, s, p % kBackendBlock),
                                   full.kv->token_kv(table_full[p / kBackendBlock], l, s, p % kBackendBlock), elems))
              << "sim KV bytes differ at layer " << l << " pos " << p;
        }
      }
    }
  }
  EXPECT_LE(kv_diff, 1e-4);
  const auto gen_hit = generate(*hit.backend, *hit.kv, table_hit, n, rh->first_token, 6);
  EXPECT_EQ(gen_hit, generate(*full.backend, *full.kv, table_full, n, rf->first_token, 6));
  EXPECT_GT(std::set<uint32_t>(gen_hit.begin(), gen_hit.end()).size(), 2u) << "degenerate token stream";
}

TEST(RefBackend, CachedPrefixPrefillEqualsFullPrefill) {
  for (int64_t cached : {0, 8, 32, 56}) check_cached_equals_full("ref", 64, cached, 0);  // 56: all but one block
  check_cached_equals_full("ref", 61, 56, 0);  // every complete block cached, partial tail computed
}

TEST(RefBackend, ChunkedPrefillEqualsUnchunked) {
  for (int64_t chunk : {1, 7, 16, 100}) check_cached_equals_full("ref", 45, 0, chunk);
  check_cached_equals_full("ref", 45, 16, 5);
}

TEST(RefBackend, LayerCallbackOrderAndAbort) {
  auto f = make("ref");
  const auto tokens = prompt(20, 3, f.backend->model().vocab_size);
  auto table = alloc(*f.kv, 20);
  std::vector<std::tuple<int64_t, int64_t, int64_t>> calls;
  auto r = f.backend->prefill(*f.kv, {tokens, 0, table, 8}, [&](int64_t l, int64_t b, int64_t e) {
    calls.emplace_back(l, b, e);
    return Status::ok();
  });
  ASSERT_TRUE(r);
  const int64_t L = f.backend->model().num_layers;
  ASSERT_EQ(static_cast<int64_t>(calls.size()), 3 * L);  // chunks [0,8) [8,16) [16,20)
  EXPECT_EQ(calls[0], std::make_tuple(int64_t{0}, int64_t{0}, int64_t{8}));
  EXPECT_EQ(calls[L - 1], std::make_tuple(L - 1, int64_t{0}, int64_t{8}));
  EXPECT_EQ(calls.back(), std::make_tuple(L - 1, int64_t{16}, int64_t{20}));

  int count = 0;
  auto aborted = f.backend->prefill(*f.kv, {tokens, 0, table, 0}, [&](int64_t, int64_t, int64_t) {
    return ++count == 2 ? error(Code::kAborted, "receiver gone") : Status::ok();
  });
  ASSERT_FALSE(aborted);
  EXPECT_EQ(aborted.status().code(), Code::kAborted);
  EXPECT_EQ(count, 2);
}

TEST(RefBackend, BadInputIsAnError) {
  auto f = make("ref", 4);
  const int64_t vocab = f.backend->model().vocab_size;
  auto table = alloc(*f.kv, 16);
  std::vector<uint32_t> bad = {1, 2, static_cast<uint32_t>(vocab)};
  EXPECT_EQ(f.backend->prefill(*f.kv, {bad, 0, table, 0}, nullptr).status().code(), Code::kInvalidArgument);
  std::vector<uint32_t> empty;
  EXPECT_EQ(f.backend->prefill(*f.kv, {empty, 0, table, 0}, nullptr).status().code(), Code::kInvalidArgument);
  auto ok = prompt(10, 4, vocab);
  EXPECT_FALSE(f.backend->prefill(*f.kv, {ok, 10, table, 0}, nullptr));  // nothing left to compute
  EXPECT_FALSE(f.backend->prefill(*f.kv, {ok, -1, table, 0}, nullptr));
  std::vector<int32_t> short_table = {table[0]};
  EXPECT_FALSE(f.backend->prefill(*f.kv, {ok, 0, short_table, 0}, nullptr));
  std::vector<int32_t> wild = {table[0], 99};
  EXPECT_EQ(f.backend->prefill(*f.kv, {ok, 0, wild, 0}, nullptr).status().code(), Code::kOutOfRange);
  auto long_prompt = prompt(f.backend->model().max_context_tokens + 9, 5, vocab);
  auto too_long = f.backend->prefill(*f.kv, {long_prompt, 0, table, 0}, nullptr);
  EXPECT_NE(too_long.status().message().find("input too long"), std::string::npos);
}

TEST(RefBackend, BatchedDecodeEqualsSingleDecode) {
  auto batched = make("ref");
  auto single = make("ref");
  const int64_t vocab = batched.backend->model().vocab_size;
  const std::vector<std::vector<uint32_t>> prompts = {prompt(11, 10, vocab), prompt(19, 11, vocab),
                                                      prompt(3, 12, vocab)};
  std::vector<std::vector<int32_t>> tb, ts;
  std::vector<uint32_t> last_b, last_s;
  for (const auto& p : prompts) {
    tb.push_back(alloc(*batched.kv, 40));
    ts.push_back(alloc(*single.kv, 40));
    last_b.push_back(batched.backend->prefill(*batched.kv, {p, 0, tb.back(), 0}, nullptr)->first_token);
    last_s.push_back(single.backend->prefill(*single.kv, {p, 0, ts.back(), 0}, nullptr)->first_token);
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<DecodeSequence> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      batch.push_back({last_b[i], static_cast<int64_t>(prompts[i].size()) + step, tb[i]});
    }
    std::vector<uint32_t> next;
    ASSERT_TRUE(batched.backend->decode_step(*batched.kv, batch, next).is_ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      DecodeSequence one{last_s[i], static_cast<int64_t>(prompts[i].size()) + step, ts[i]};
      std::vector<uint32_t> n1;
      ASSERT_TRUE(single.backend->decode_step(*single.kv, {&one, 1}, n1).is_ok());
      EXPECT_EQ(next[i], n1[0]) << "sequence " << i << " step " << step;
      last_s[i] = n1[0];
    }
    last_b = next;
  }
}

TEST(RefBackend, SeedChangesWeightsDeterministically) {
  const auto m = model::model_preset("tiny").value();
  EXPECT_EQ(ref::make_weights(m, 1).lm_head, ref::make_weights(m, 1).lm_head);
  EXPECT_NE(ref::make_weights(m, 1).lm_head, ref::make_weights(m, 2).lm_head);
}

// make_weights draws its uniform values without std::uniform_real_distribution (whose libstdc++ implementation takes
// two logarithms a draw); they are the distribution's values bit for bit, in the same order, so every model, test and
// figure made with the seeded weights before stays the same.
TEST(RefBackend, WeightsAreTheSeededUniformValues) {
  const auto m = model::model_preset("tiny").value();
  const ref::Weights w = ref::make_weights(m, 11);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float sh = 1.0f / std::sqrt(static_cast<float>(m.hidden_size));
  for (float x : w.embed) ASSERT_EQ(x, u(rng) * 1.0f);
  for (float x : w.layers.at(0).attn_norm) ASSERT_EQ(x, 1.0f + 0.1f * u(rng));
  for (float x : w.layers.at(0).wq) ASSERT_EQ(x, u(rng) * sh);
}

TEST(RefBackend, RefusesHugeModels) {
  BackendOptions o;
  o.model = model::model_preset("llama3-70b").value();
  auto b = make_backend(o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("--backend sim"), std::string::npos);
}

// A checkpoint's config (or a shape with what the ref backend does not compute) is refused by the ref backend rather
// than answered with another model's tokens; the sim backend models its speed.
TEST(RefBackend, RefusesACheckpointItCannotCompute) {
  BackendOptions o;
  o.model = model::model_preset("tiny").value();
  o.model.checkpoint_dir = "/models/Qwen2.5-0.5B";
  auto b = make_backend(o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("/models/Qwen2.5-0.5B"), std::string::npos) << b.status().message();
  o.model.checkpoint_dir.clear();
  o.model.qk_norm = true;
  auto qk = make_backend(o);
  ASSERT_FALSE(qk);
  EXPECT_NE(qk.status().message().find("--backend sim"), std::string::npos) << qk.status().message();
  o.kind = "sim";
  EXPECT_TRUE(make_backend(o)) << "the sim backend prices any shape";
}

TEST(SimBackend, CachedPrefixAndChunkedGiveIdenticalBytes) {
  for (int64_t cached : {0, 8, 56}) check_cached_equals_full("sim", 64, cached, 0);
  check_cached_equals_full("sim", 45, 16, 7);
}

TEST(SimBackend, ScaledKvSizeAndDeterministicTokens) {
  auto f = make("sim", 16, kBackendBlock, 1000);  // 1000 B/token over 4 layers -> 250 per layer
  EXPECT_EQ(f.backend->kv_bytes_per_token_layer(), 250);
  EXPECT_EQ(f.kv->layout().bytes_per_token(), 1000);
  auto tiny = make("sim", 16, kBackendBlock, 1);
  EXPECT_EQ(tiny.backend->kv_bytes_per_token_layer(), 16);  // room for the chain hash in K and V
  auto llama = [] {
    BackendOptions o;
    o.kind = "sim";
    o.model = model::model_preset("llama3-70b").value();
    return make_backend(o).value();
  }();
  EXPECT_EQ(llama->kv_bytes_per_token_layer() * 80, 327680);
  BackendOptions bad;
  bad.kind = "sim";
  bad.time_scale = 0;
  EXPECT_EQ(make_backend(bad).status().code(), Code::kInvalidArgument);
  bad.kind = "cuda";
  bad.time_scale = 1;
  EXPECT_FALSE(make_backend(bad));
}

TEST(KvBuffer, LayoutAndAllocation) {
  KvLayout layout{3, 4, 32};
  auto kv = KvBuffer::create(layout, 5).value();
  EXPECT_EQ(layout.layer_block_bytes(), 128);
  EXPECT_EQ(layout.block_bytes(), 384);
  EXPECT_EQ(kv->size_bytes(), 5 * 384);
  EXPECT_EQ(kv->layer_block_offset(2, 1), 2 * 384 + 128);
  // K and V of every slot stay inside its layer block (one contiguous transfer).
  EXPECT_EQ(kv->token_kv(2, 1, 1, 3) + 16, kv->data() + kv->layer_block_offset(2, 2));
  auto a = kv->allocate(3).value();
  EXPECT_EQ(kv->free_blocks(), 2);
  EXPECT_EQ(kv->allocate(3).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(kv->free_blocks(), 2);  // all or none
  kv->free(a);
  kv->free(a);  // idempotent
  EXPECT_EQ(kv->free_blocks(), 5);
  EXPECT_FALSE(KvBuffer::create(KvLayout{1, 4, 3}, 2));  // odd bytes per token
  EXPECT_FALSE(KvBuffer::create(layout, 0));
}

}  // namespace
}  // namespace mc::infer
