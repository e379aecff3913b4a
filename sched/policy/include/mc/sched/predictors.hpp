// Predictors of the Conductor (paper §5 and §7; DESIGN.md §3 step 2):
//   prefill_ms(new_tokens n, cached_tokens c) = w0 + w1*n + w2*n*(c + (n+1)/2)
//     -- the terms of a GPU cost model: a fixed launch/step cost, the linear layers' FLOPs (2*params
//        per token) and causal attention over the cached prefix plus the new tokens (one query-key
//        pair costs ~4*layers*d_model FLOPs). The weights start from the backend's cost model (the
//        worker sends them at registration, or PrefillCostPrior::from_hardware) and are refitted
//        online from the workers' job reports by recursive least squares with forgetting.
//   decode_step_ms(batch b, context tokens t) = v0 + v1*b + v2*t
//     -- a memory-bound decode step: read the weights once, a per-sequence overhead, read every
//        cached KV token once. Refitted the same way from decode step reports.
//   transfer_ms(class, bytes) = bytes / bandwidth(class), bandwidth an exponential moving average of
//     observed transfers per path class (same host / remote / SSD), starting from configured priors;
//     remote fetches also per (source host, destination host) path (BandwidthEstimator below).
// Pure, deterministic; thread-safety: none.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mc/sched/types.hpp"

namespace mc::sched {

// Recursive least squares over N features with exponential forgetting (lambda in (0,1]; 1 = plain
// least squares). Features are divided by `scale` before fitting so the problem stays well
// conditioned (features span 1 .. 1e9). Starts at `prior` weights with covariance prior_var * I
// (small = trust the prior longer). observe() ignores non-finite or negative targets.
template <size_t N>
class OnlineLeastSquares {
 public:
  using Vec = std::array<double, N>;
  OnlineLeastSquares(Vec prior_weights, Vec scale, double lambda = 0.995, double prior_var = 1.0);
  double predict(const Vec& x) const;
  void observe(const Vec& x, double y);
  Vec weights() const;  // in unscaled feature units
  uint64_t samples() const { return samples_; }

 private:
  // Exponentially weighted normal equations, solved afresh on each observation: (A + I/prior_var) w =
  // b + prior_w/prior_var, i.e. ridge regression pulled toward the prior. Unlike the covariance update of
  // textbook recursive least squares this cannot lose positive-definiteness over many updates.
  Vec w_{};        // in scaled units
  Vec prior_w_{};  // in scaled units
  Vec scale_{};
  std::array<std::array<double, N>, N> a_{};  // sum of lambda^age * z z^T
  Vec b_{};                                   // sum of lambda^age * z y
  double lambda_;
  double prior_var_ = 1.0;
  uint64_t samples_ = 0;
};
extern template class OnlineLeastSquares<3>;

// Prior coefficients of the prefill model, in ms.
struct PrefillCostPrior {
  double fixed_ms = 5.0;
  double ms_per_token = 0.112;        // 2*70e9 FLOP / (8 * 312 TFLOP/s * 0.5 MFU)
  double ms_per_token_pair = 2.1e-6;  // 4*80*8192 FLOP / same
  // From model and hardware: params, layers, d_model, sustained FLOP/s (peak * MFU).
  static PrefillCostPrior from_hardware(double params, int64_t layers, int64_t d_model, double flops_per_s,
                                        double fixed_ms = 5.0);
};

struct DecodeCostPrior {
  double fixed_ms = 12.5;  // 140 GB of weights / (8 * 2 TB/s * 0.7)
  double ms_per_request = 0.05;
  double ms_per_context_token = 2.9e-5;  // 327,680 B / (8 * 2 TB/s * 0.7)
};

// Priors read off a cost model (the compute backends' one, mc/model/cost_model.hpp), given as functions in ms,
// so the Conductor and the simulator start from the same coefficients. prefill_ms(new, cached) must have
// the predictor's form w0 + w1*n + w2*n*(c + (n+1)/2): evaluated at (1,0), (2,0) and (1,10'000) it gives
// the three weights exactly. step_ms(batch, context): the per-context-token term from (1,0) and
// (1,1'000'000); the per-request term as the secant to a batch of 257 (the compute-bound branch of large
// batches); the rest is fixed. Every coefficient is clamped at >= 0.
using CostFn = std::function<double(int64_t, int64_t)>;
PrefillCostPrior prefill_prior_from_cost_model(const CostFn& prefill_ms);
DecodeCostPrior decode_prior_from_cost_model(const CostFn& step_ms);

class PrefillPredictor {
 public:
  explicit PrefillPredictor(PrefillCostPrior prior = {}, double lambda = 0.995);
  // ms to prefill `new_tokens` with `cached_tokens` of reused prefix; >= 0.
  double predict_ms(int64_t new_tokens, int64_t cached_tokens) const;
  // A measured prefill (job report): refits.
  void observe(int64_t new_tokens, int64_t cached_tokens, double actual_ms);
  // Marginal ms per new token at an empty cache (prices queued token counts from load reports).
  double ms_per_token() const;
  PrefillCostPrior current() const;
  uint64_t samples() const { return ls_.samples(); }

 private:
  static std::array<double, 3> features(int64_t n, int64_t c);
  OnlineLeastSquares<3> ls_;
};

// The envelope (issue 17 item 5): what workers report may move the model only within a band around the cost
// model's prior: a step slower than max(kEnvelopeFactor x prior, prior + kEnvelopeSlackMs) at its (batch,
// context) is not a decode step of this hardware but a fault or a forgery: observe() refuses it, and step_ms()
// never predicts beyond that band either, so no run of reports, however long, can price every decode step out
// of the TBT SLO. Inside the band the model follows the measurements (a machine up to 4x slower than modelled,
// or 50 ms a step more, is learnt). envelope_factor 0: no envelope (a backend the cost model does not describe).
class DecodePredictor {
 public:
  static constexpr double kEnvelopeFactor = 4.0;
  static constexpr double kEnvelopeSlackMs = 50.0;

  explicit DecodePredictor(DecodeCostPrior prior = {}, double lambda = 0.995, double envelope_factor = kEnvelopeFactor);
  double step_ms(int64_t batch_requests, int64_t context_tokens) const;
  // False (and nothing refitted) for a step above the envelope.
  bool observe(int64_t batch_requests, int64_t context_tokens, double actual_step_ms);
  // The most a step of (batch, context) may take: max(factor x prior, prior + kEnvelopeSlackMs); +inf without.
  double envelope_ms(int64_t batch_requests, int64_t context_tokens) const;
  DecodeCostPrior current() const;
  uint64_t samples() const { return ls_.samples(); }

 private:
  DecodeCostPrior prior_;
  double envelope_factor_;
  OnlineLeastSquares<3> ls_;
};

struct BandwidthPriors {
  // Decimal bytes/s. same host: DRAM -> GPU over PCIe 4 x16 (~25 GB/s per GPU); remote: 4x200 Gbps
  // RDMA at the transfer engine's 87 GB/s shared by 8 GPUs (~11 GB/s, DESIGN.md §6); ssd: NVMe read.
  double same_host_bytes_per_s = 25e9;
  double remote_bytes_per_s = 11e9;
  double ssd_bytes_per_s = 3e9;
  double fixed_ms[kNumTransferClasses] = {0.05, 0.2, 0.5};  // per fetch (setup, first-byte latency)
  // Per-path estimates (BandwidthEstimator): the log-space weight of a new sample, and the half-life (ms) of a
  // path's deviation from the remote class's estimate since its last sample (0: no decay).
  double path_alpha = 0.5;
  double path_half_life_ms = 10'000;
};

// Fetch bandwidth, learnt from the workers' job reports (DESIGN.md §16 "Bandwidth decides, live").
//
// Per path class: an exponential moving average (alpha) of measured bytes/s, starting from the prior.
// Per path (remote class only): one estimate per (source host, destination host) pair, measured by fetches that
// read every remote byte from one source host. A path's estimate is a moving average in log space
// (BandwidthPriors::path_alpha, 0.5: one sample 100x off moves it 10x), so a link shaped down mid-run is believed
// after a sample or two. It decays back towards the remote class's estimate with half-life
// BandwidthPriors::path_half_life_ms (10 s) since its last sample (in log space: at age a the deviation is scaled by
// 2^(-a / half-life)); a path measured slow is therefore tried again once its decayed estimate makes a fetch look worth
// it, and the fetch that tries it measures the link again: a recovered link is found, a still-slow one is pushed back
// down. Hosts are ClusterState host indices; kUnknownHost (prefix_index.hpp) on either end means "no path estimate":
// the class estimate. Thread-safety: none (the Scheduler owns it).
class BandwidthEstimator {
 public:
  explicit BandwidthEstimator(BandwidthPriors priors = {}, double alpha = 0.2);
  // ms to move `bytes` over `cls` (0 for kRecompute or 0 bytes).
  double transfer_ms(PathClass cls, int64_t bytes) const;
  // A measured transfer; ignored when bytes <= 0 or elapsed_ns <= 0.
  void observe(PathClass cls, int64_t bytes, int64_t elapsed_ns);
  double bytes_per_s(PathClass cls) const;
  uint64_t samples(PathClass cls) const;
  // The per-fetch fixed cost of a class (ms; 0 for kRecompute).
  double fixed_ms(PathClass cls) const;

  // A measured remote fetch from src_host to dst_host at now_ns (the clock's); ignored when bytes <= 0,
  // elapsed_ns <= 0 or either host is unknown. Does not touch the class estimate (call observe() for that).
  void observe_path(uint32_t src_host, uint32_t dst_host, int64_t bytes, int64_t elapsed_ns, int64_t now_ns);
  // The remote bandwidth from src_host to dst_host at now_ns (bytes/s): the path's decayed estimate, else the
  // remote class's.
  double path_bytes_per_s(uint32_t src_host, uint32_t dst_host, int64_t now_ns) const;
  // A fetch over the path has been running for a while: the path moves at most bound_bytes_per_s. Lowers its
  // estimate (as it stands at now_ns) to the bound, as if sampled now; true when it did.
  bool cap_path(uint32_t src_host, uint32_t dst_host, double bound_bytes_per_s, int64_t now_ns);
  // True when some path has been measured (the per-destination pricing is needed); into dst_host.
  bool has_paths() const { return !paths_.empty(); }
  bool has_paths_to(uint32_t dst_host) const { return dst_hosts_.count(dst_host) != 0; }
  struct PathEstimate {
    uint32_t src_host = 0, dst_host = 0;
    double bytes_per_s = 0;  // the last sample's average, before decay
    uint64_t samples = 0;
    int64_t last_sample_ns = 0;
  };
  // Every measured path, unordered.
  std::vector<PathEstimate> paths() const;

 private:
  BandwidthPriors priors_;
  double alpha_;
  std::array<double, kNumTransferClasses> bw_{};
  std::array<uint64_t, kNumTransferClasses> samples_{};
  std::unordered_map<uint64_t, PathEstimate> paths_;  // key: src_host << 32 | dst_host
  std::unordered_set<uint32_t> dst_hosts_;            // the dst_host of every path
};

// Predicted vs actual (e.g. TTFT) absolute errors over the last `window` samples.
class PredictionErrorStats {
 public:
  explicit PredictionErrorStats(size_t window = 4096) : window_(window) {}
  void add(double predicted_ms, double actual_ms);
  uint64_t count() const { return count_; }  // all samples ever
  double mean_abs_error_ms() const;          // over the window; 0 when empty
  double p90_abs_error_ms() const;
  double mean_signed_error_ms() const;  // predicted - actual: > 0 means pessimistic

 private:
  size_t window_;
  std::vector<double> abs_, signed_;
  size_t next_ = 0;
  uint64_t count_ = 0;
};

}  // namespace mc::sched
