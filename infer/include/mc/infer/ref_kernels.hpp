// The numeric kernels of the `ref` backend, exposed so unit tests can check them against hand-computed values.
// All fp32 row-major, in place where stated. Pure functions; thread-safe.
//   rms_norm:  y = x / sqrt(mean(x²) + eps) · w                      (Zhang & Sennrich 2019; LLaMA)
//   rope:      rotates pairs (x[i], x[i + d/2]) of each head by angle pos · theta^(−2i/d)   (Su et al. 2021,
//              the "rotate_half" form used by the Hugging Face LLaMA code)
//   silu:      x · sigmoid(x)                                         (SwiGLU: silu(x W1) ⊙ (x W3), then W2)
//   softmax:   in place over n values, max-subtracted (the engine's cpu::softmax, cpu_kernels.hpp)
#pragma once

#include <cstdint>
#include <vector>

#include "mc/model/model_config.hpp"

namespace mc::infer::ref {

// The weights of the ref model, row-major, "x · W" orientation (W is in × out).
struct LayerWeights {
  std::vector<float> attn_norm;  // hidden
  std::vector<float> wq;         // hidden × heads·head_dim
  std::vector<float> wk, wv;     // hidden × kv_heads·head_dim
  std::vector<float> wo;         // heads·head_dim × hidden
  std::vector<float> ffn_norm;   // hidden
  std::vector<float> w1, w3;     // hidden × ffn (gate, up)
  std::vector<float> w2;         // ffn × hidden (down)
};
struct Weights {
  std::vector<float> embed;  // vocab × hidden
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // hidden
  std::vector<float> lm_head;     // hidden × vocab
};
// Deterministic weights: std::mt19937_64(seed), uniform(-1, 1) scaled by 1/sqrt(fan_in) (embedding: 1; lm_head: 4×
// wider so greedy choices are far from ties; norms 1 ± 0.1), drawn in the order of the fields above.
Weights make_weights(const model::ModelConfig& model, uint64_t seed);

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// x: `heads` heads of `head_dim` floats each (contiguous), rotated in place for position `pos`.
void rope(float* x, int64_t heads, int64_t head_dim, int64_t pos, double theta);
// The same with the head_dim/2 inverse frequencies given (angle = pos · inv_freq[i], in double, then cos/sin cast).
void rope(float* x, int64_t heads, int64_t head_dim, int64_t pos, const double* inv_freq);
// The model's inverse frequencies theta^(−2i/d), i < head_dim/2, with its rope_scaling applied (llama3: Meta's
// Llama 3.1 rule, model_config.hpp RopeScaling).
std::vector<double> rope_inv_freq(const model::ModelConfig& m);
inline float silu(float x);
void softmax(float* x, int64_t n);

}  // namespace mc::infer::ref

#include <cmath>
inline float mc::infer::ref::silu(float x) { return x / (1.0f + std::exp(-x)); }
