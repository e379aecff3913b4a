#include "mc/infer/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mc/common/splitmix.hpp"

namespace mc::infer {

double sampling_uniform(uint64_t seed, int64_t index) {
  uint64_t state = seed;
  const uint64_t a = splitmix64(state);
  state = a ^ static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ULL;
  const uint64_t b = splitmix64(state);
  return static_cast<double>(b >> 11) * 0x1.0p-53;  // 53 random bits
}

namespace {

uint32_t argmax(std::span<const float> v) {
  return static_cast<uint32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// log_softmax of the raw logits at the chosen token and the top_n most likely tokens.
std::vector<proto::TokenLogprob> logprobs_of(std::span<const float> logits, uint32_t chosen, int32_t top_n) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - m));
  const double log_z = static_cast<double>(m) + std::log(sum);
  auto lp = [&](uint32_t t) { return static_cast<float>(static_cast<double>(logits[t]) - log_z); };
  std::vector<proto::TokenLogprob> out;
  out.push_back({chosen, lp(chosen)});
  if (top_n > 0) {
    std::vector<uint32_t> ids(logits.size());
    for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
    const size_t k = std::min(ids.size(), static_cast<size_t>(top_n));
    // Most likely first; equal logits by id, so the list is deterministic.
    std::partial_sort(
        ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
        [&](uint32_t a, uint32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (size_t i = 0; i < k; ++i) out.push_back({ids[i], lp(ids[i])});
  }
  return out;
}

}  // namespace

TokenChoice sample_token(std::span<const float> logits, const proto::SamplingParams& p, int64_t index,
                         const TokenCounts* counts) {
  TokenChoice choice;
  if (logits.empty()) return choice;
  std::span<const float> scores = logits;
  std::vector<float> penalized;
  if (p.needs_counts() && counts != nullptr && !counts->empty()) {
    penalized.assign(logits.begin(), logits.end());
    for (const auto& [token, n] : *counts) {
      if (token < penalized.size() && n > 0) {
        penalized[token] -= static_cast<float>(p.presence_penalty + p.frequency_penalty * n);
      }
    }
    scores = penalized;
  }
  if (p.greedy()) {
    choice.token = argmax(scores);
  } else {
    // Candidates: (scaled logit, id), trimmed by top_k, then probabilities, min_p and top_p, then one draw.
    const double inv_t = 1.0 / p.temperature;
    std::vector<std::pair<float, uint32_t>> c;
    c.reserve(scores.size());
    for (uint32_t i = 0; i < scores.size(); ++i) c.push_back({static_cast<float>(scores[i] * inv_t), i});
    auto more_likely = [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) {
      std::nth_element(c.begin(), c.begin() + p.top_k, c.end(), more_likely);
      c.resize(static_cast<size_t>(p.top_k));
    }
    float m = -std::numeric_limits<float>::infinity();
    for (const auto& e : c) m = std::max(m, e.first);
    std::vector<double> w(c.size());
    double total = 0;
    for (size_t i = 0; i < c.size(); ++i) total += (w[i] = std::exp(static_cast<double>(c[i].first - m)));
    if (p.min_p > 0) {
      // The most likely candidate has weight 1 (its scaled logit is m).
      size_t kept = 0;
      total = 0;
      for (size_t i = 0; i < c.size(); ++i) {
        if (w[i] >= p.min_p) {
          c[kept] = c[i];
          w[kept] = w[i];
          total += w[kept++];
        }
      }
      c.resize(kept);
      w.resize(kept);
    }
    if (p.top_p < 1) {
      std::vector<size_t> order(c.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return more_likely(c[a], c[b]); });
      double mass = 0;
      size_t keep = 0;
      while (keep < order.size() && mass < p.top_p * total) mass += w[order[keep++]];
      std::vector<std::pair<float, uint32_t>> c2;
      std::vector<double> w2;
      for (size_t i = 0; i < std::max<size_t>(keep, 1); ++i) {
        c2.push_back(c[order[i]]);
        w2.push_back(w[order[i]]);
      }
      c.swap(c2);
      w.swap(w2);
      total = mass > 0 ? mass : w[0];
    }
    // The draw: the candidates in id order, so the outcome depends on the distribution alone.
    std::vector<size_t> by_id(c.size());
    for (size_t i = 0; i < by_id.size(); ++i) by_id[i] = i;
    if (p.top_k > 0 || p.top_p < 1) {  // otherwise the candidates are still in id order
      std::sort(by_id.begin(), by_id.end(), [&](size_t a, size_t b) { return c[a].second < c[b].second; });
    }
    const double u = sampling_uniform(p.seed, index) * total;
    double acc = 0;
    choice.token = c[by_id.back()].second;
    for (size_t i : by_id) {
      acc += w[i];
      if (u < acc) {
        choice.token = c[i].second;
        break;
      }
    }
  }
  if (p.logprobs >= 0)
    choice.logprobs = logprobs_of(logits, choice.token, std::min(p.logprobs, proto::kMaxTopLogprobs));
  return choice;
}

TokenChoice choose_first_token(uint32_t greedy_token, std::span<const float> last_logits,
                               const proto::SamplingParams& params) {
  if (!params.needs_logits() || last_logits.empty()) return TokenChoice{greedy_token, {}};
  return sample_token(last_logits, params, 0, nullptr);
}

}  // namespace mc::infer
