#include "mc/sched/predictors.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mc::sched {

template <size_t N>
OnlineLeastSquares<N>::OnlineLeastSquares(Vec prior_weights, Vec scale, double lambda, double prior_var)
    : scale_(scale), lambda_(lambda), prior_var_(prior_var > 0 ? prior_var : 1.0) {
  for (size_t i = 0; i < N; ++i) {
    if (!(scale_[i] > 0)) scale_[i] = 1;
    w_[i] = prior_weights[i] * scale_[i];
    prior_w_[i] = w_[i];
  }
}

template <size_t N>
double OnlineLeastSquares<N>::predict(const Vec& x) const {
  double y = 0;
  for (size_t i = 0; i < N; ++i) y += w_[i] * (x[i] / scale_[i]);
  return y;
}

template <size_t N>
void OnlineLeastSquares<N>::observe(const Vec& x, double y) {
  if (!std::isfinite(y) || y < 0) return;
  Vec z;
  for (size_t i = 0; i < N; ++i) {
    z[i] = x[i] / scale_[i];
    if (!std::isfinite(z[i])) return;
  }
  for (size_t i = 0; i < N; ++i) {
    b_[i] = lambda_ * b_[i] + z[i] * y;
    for (size_t j = 0; j < N; ++j) a_[i][j] = lambda_ * a_[i][j] + z[i] * z[j];
  }
  ++samples_;
  // Solve (A + I/prior_var) w = b + prior_w/prior_var by Gaussian elimination with partial pivoting.
  std::array<std::array<double, N + 1>, N> m{};
  const double ridge = 1.0 / prior_var_;
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j < N; ++j) m[i][j] = a_[i][j] + (i == j ? ridge : 0.0);
    m[i][N] = b_[i] + ridge * prior_w_[i];
  }
  for (size_t col = 0; col < N; ++col) {
    size_t piv = col;
    for (size_t r = col + 1; r < N; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
    if (!(std::fabs(m[piv][col]) > 1e-300)) return;  // singular: keep the last weights
    std::swap(m[col], m[piv]);
    for (size_t r = 0; r < N; ++r) {
      if (r == col) continue;
      double f = m[r][col] / m[col][col];
      for (size_t c = col; c <= N; ++c) m[r][c] -= f * m[col][c];
    }
  }
  Vec w;
  for (size_t i = 0; i < N; ++i) {
    w[i] = m[i][N] / m[i][i];
    if (!std::isfinite(w[i])) return;
  }
  w_ = w;
}

template <size_t N>
typename OnlineLeastSquares<N>::Vec OnlineLeastSquares<N>::weights() const {
  Vec w;
  for (size_t i = 0; i < N; ++i) w[i] = w_[i] / scale_[i];
  return w;
}

template class OnlineLeastSquares<3>;

PrefillCostPrior PrefillCostPrior::from_hardware(double params, int64_t layers, int64_t d_model, double flops_per_s,
                                                 double fixed_ms) {
  PrefillCostPrior p;
  p.fixed_ms = fixed_ms;
  p.ms_per_token = 2.0 * params / flops_per_s * 1e3;
  p.ms_per_token_pair = 4.0 * static_cast<double>(layers) * static_cast<double>(d_model) / flops_per_s * 1e3;
  return p;
}

namespace {
constexpr std::array<double, 3> kPrefillScale = {1.0, 1e3, 1e7};
constexpr std::array<double, 3> kDecodeScale = {1.0, 10.0, 1e5};
constexpr double kPriorVar = 1e3;
}  // namespace

PrefillPredictor::PrefillPredictor(PrefillCostPrior prior, double lambda)
    : ls_({prior.fixed_ms, prior.ms_per_token, prior.ms_per_token_pair}, kPrefillScale, lambda, kPriorVar) {}

std::array<double, 3> PrefillPredictor::features(int64_t n, int64_t c) {
  auto nd = static_cast<double>(std::max<int64_t>(0, n));
  auto cd = static_cast<double>(std::max<int64_t>(0, c));
  return {1.0, nd, nd * (cd + (nd + 1.0) / 2.0)};
}

double PrefillPredictor::predict_ms(int64_t new_tokens, int64_t cached_tokens) const {
  if (new_tokens <= 0) return 0;
  return std::max(0.0, ls_.predict(features(new_tokens, cached_tokens)));
}

void PrefillPredictor::observe(int64_t new_tokens, int64_t cached_tokens, double actual_ms) {
  if (new_tokens <= 0) return;
  ls_.observe(features(new_tokens, cached_tokens), actual_ms);
}

double PrefillPredictor::ms_per_token() const {
  constexpr int64_t kRef = 2048;
  double per = (predict_ms(kRef, 0) - std::max(0.0, ls_.predict(features(0, 0)))) / kRef;
  return std::max(0.0, per);
}

PrefillCostPrior PrefillPredictor::current() const {
  auto w = ls_.weights();
  return PrefillCostPrior{w[0], w[1], w[2]};
}

DecodePredictor::DecodePredictor(DecodeCostPrior prior, double lambda, double envelope_factor)
    : prior_(prior),
      envelope_factor_(envelope_factor),
      ls_({prior.fixed_ms, prior.ms_per_request, prior.ms_per_context_token}, kDecodeScale, lambda, kPriorVar) {}

double DecodePredictor::envelope_ms(int64_t batch_requests, int64_t context_tokens) const {
  if (envelope_factor_ <= 0) return std::numeric_limits<double>::infinity();
  const double prior = std::max(0.0, prior_.fixed_ms + prior_.ms_per_request * static_cast<double>(batch_requests) +
                                         prior_.ms_per_context_token * static_cast<double>(context_tokens));
  return std::max(envelope_factor_ * prior, prior + kEnvelopeSlackMs);
}

double DecodePredictor::step_ms(int64_t batch_requests, int64_t context_tokens) const {
  const double fit =
      std::max(0.0, ls_.predict({1.0, static_cast<double>(batch_requests), static_cast<double>(context_tokens)}));
  return std::min(fit, envelope_ms(batch_requests, context_tokens));
}

bool DecodePredictor::observe(int64_t batch_requests, int64_t context_tokens, double actual_step_ms) {
  if (batch_requests <= 0) return false;
  if (actual_step_ms > envelope_ms(batch_requests, context_tokens)) return false;
  ls_.observe({1.0, static_cast<double>(batch_requests), static_cast<double>(context_tokens)}, actual_step_ms);
  return true;
}

DecodeCostPrior DecodePredictor::current() const {
  auto w = ls_.weights();
  return DecodeCostPrior{w[0], w[1], w[2]};
}

BandwidthEstimator::BandwidthEstimator(BandwidthPriors priors, double alpha) : priors_(priors), alpha_(alpha) {
  bw_ = {priors.same_host_bytes_per_s, priors.remote_bytes_per_s, priors.ssd_bytes_per_s};
}

double BandwidthEstimator::transfer_ms(PathClass cls, int64_t bytes) const {
  if (cls == PathClass::kRecompute || bytes <= 0) return 0;
  auto c = static_cast<size_t>(cls);
  return priors_.fixed_ms[c] + static_cast<double>(bytes) / bw_[c] * 1e3;
}

void BandwidthEstimator::observe(PathClass cls, int64_t bytes, int64_t elapsed_ns) {
  if (cls == PathClass::kRecompute || bytes <= 0 || elapsed_ns <= 0) return;
  auto c = static_cast<size_t>(cls);
  double sample = static_cast<double>(bytes) / (static_cast<double>(elapsed_ns) * 1e-9);
  // The first measurement replaces the prior outright; later ones move the average.
  bw_[c] = samples_[c] == 0 ? sample : (1 - alpha_) * bw_[c] + alpha_ * sample;
  ++samples_[c];
}

double BandwidthEstimator::bytes_per_s(PathClass cls) const {
  if (cls == PathClass::kRecompute) return 0;
  return bw_[static_cast<size_t>(cls)];
}

double BandwidthEstimator::fixed_ms(PathClass cls) const {
  if (cls == PathClass::kRecompute) return 0;
  return priors_.fixed_ms[static_cast<size_t>(cls)];
}

uint64_t BandwidthEstimator::samples(PathClass cls) const {
  if (cls == PathClass::kRecompute) return 0;
  return samples_[static_cast<size_t>(cls)];
}

namespace {
constexpr uint32_t kNoHostIndex = UINT32_MAX;  // = kUnknownHost (prefix_index.hpp)
uint64_t path_key(uint32_t src, uint32_t dst) { return (static_cast<uint64_t>(src) << 32) | dst; }
}  // namespace

void BandwidthEstimator::observe_path(uint32_t src_host, uint32_t dst_host, int64_t bytes, int64_t elapsed_ns,
                                      int64_t now_ns) {
  if (bytes <= 0 || elapsed_ns <= 0 || src_host == kNoHostIndex || dst_host == kNoHostIndex) return;
  const double sample = static_cast<double>(bytes) / (static_cast<double>(elapsed_ns) * 1e-9);
  if (!std::isfinite(sample) || sample <= 0) return;
  PathEstimate& p = paths_[path_key(src_host, dst_host)];
  dst_hosts_.insert(dst_host);
  if (p.samples == 0) {
    p.src_host = src_host;
    p.dst_host = dst_host;
    p.bytes_per_s = sample;
  } else {
    // Average in log space from the estimate as it stands now (decayed since the last sample).
    const double now_bw = path_bytes_per_s(src_host, dst_host, now_ns);
    p.bytes_per_s = std::exp((1 - priors_.path_alpha) * std::log(now_bw) + priors_.path_alpha * std::log(sample));
  }
  ++p.samples;
  p.last_sample_ns = now_ns;
}

bool BandwidthEstimator::cap_path(uint32_t src_host, uint32_t dst_host, double bound_bytes_per_s, int64_t now_ns) {
  if (src_host == kNoHostIndex || dst_host == kNoHostIndex || !std::isfinite(bound_bytes_per_s) ||
      bound_bytes_per_s <= 0 || path_bytes_per_s(src_host, dst_host, now_ns) <= bound_bytes_per_s) {
    return false;
  }
  PathEstimate& p = paths_[path_key(src_host, dst_host)];
  dst_hosts_.insert(dst_host);
  p.src_host = src_host;
  p.dst_host = dst_host;
  p.bytes_per_s = bound_bytes_per_s;
  p.last_sample_ns = now_ns;
  return true;
}

double BandwidthEstimator::path_bytes_per_s(uint32_t src_host, uint32_t dst_host, int64_t now_ns) const {
  const double cls = bw_[static_cast<size_t>(PathClass::kRemote)];
  if (paths_.empty() || src_host == kNoHostIndex || dst_host == kNoHostIndex) return cls;
  auto it = paths_.find(path_key(src_host, dst_host));
  if (it == paths_.end()) return cls;
  const PathEstimate& p = it->second;
  const double age_ms = std::max(0.0, static_cast<double>(now_ns - p.last_sample_ns) * 1e-6);
  const double keep = priors_.path_half_life_ms > 0 ? std::exp2(-age_ms / priors_.path_half_life_ms) : 1.0;
  return std::exp(std::log(cls) + keep * (std::log(p.bytes_per_s) - std::log(cls)));
}

std::vector<BandwidthEstimator::PathEstimate> BandwidthEstimator::paths() const {
  std::vector<PathEstimate> out;
  out.reserve(paths_.size());
  for (const auto& [key, p] : paths_) out.push_back(p);
  return out;
}

void PredictionErrorStats::add(double predicted_ms, double actual_ms) {
  if (!std::isfinite(predicted_ms) || !std::isfinite(actual_ms)) return;
  double d = predicted_ms - actual_ms;
  if (abs_.size() < window_) {
    abs_.push_back(std::fabs(d));
    signed_.push_back(d);
  } else {
    abs_[next_] = std::fabs(d);
    signed_[next_] = d;
    next_ = (next_ + 1) % window_;
  }
  ++count_;
}

double PredictionErrorStats::mean_abs_error_ms() const {
  if (abs_.empty()) return 0;
  return std::accumulate(abs_.begin(), abs_.end(), 0.0) / static_cast<double>(abs_.size());
}

double PredictionErrorStats::mean_signed_error_ms() const {
  if (signed_.empty()) return 0;
  return std::accumulate(signed_.begin(), signed_.end(), 0.0) / static_cast<double>(signed_.size());
}

double PredictionErrorStats::p90_abs_error_ms() const {
  if (abs_.empty()) return 0;
  std::vector<double> v = abs_;
  // nearest-rank p90
  size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank - 1), v.end());
  return v[rank - 1];
}

PrefillCostPrior prefill_prior_from_cost_model(const CostFn& prefill_ms) {
  constexpr double kCached = 10'000;
  const double t10 = prefill_ms(1, 0);
  const double t20 = prefill_ms(2, 0);
  const double t1c = prefill_ms(1, static_cast<int64_t>(kCached));
  PrefillCostPrior p;
  p.ms_per_token_pair = std::max(0.0, (t1c - t10) / kCached);           // w2
  p.ms_per_token = std::max(0.0, t20 - t10 - 2 * p.ms_per_token_pair);  // w1: (w1 + 2 w2) - ...
  p.fixed_ms = std::max(0.0, t10 - p.ms_per_token - p.ms_per_token_pair);
  return p;
}

DecodeCostPrior decode_prior_from_cost_model(const CostFn& step_ms) {
  constexpr double kContext = 1'000'000;
  const double s10 = step_ms(1, 0);
  DecodeCostPrior p;
  p.ms_per_context_token = std::max(0.0, (step_ms(1, static_cast<int64_t>(kContext)) - s10) / kContext);
  p.ms_per_request = std::max(0.0, (step_ms(257, 0) - s10) / 256.0);
  p.fixed_ms = std::max(0.0, s10 - p.ms_per_request);
  return p;
}

}  // namespace mc::sched
