#include "mc/sched/policy.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace mc::sched {
namespace {

class RandomPolicy final : public Policy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed) {}
  std::string_view name() const override { return "random"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext&) override {
    return rng_() % c.size();
  }

 private:
  std::mt19937_64 rng_;  // fully specified by the standard: same sequence everywhere for a seed
};

class RoundRobinPolicy final : public Policy {
 public:
  std::string_view name() const override { return "round_robin"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext&) override {
    return next_++ % c.size();
  }

 private:
  uint64_t next_ = 0;
};

// Picks the first candidate minimising `key` (strictly smaller wins: ties keep registration order).
template <typename Key>
size_t argmin(std::span<const PrefillEstimate> c, Key key) {
  size_t best = 0;
  auto best_key = key(c[0]);
  for (size_t i = 1; i < c.size(); ++i) {
    auto k = key(c[i]);
    if (k < best_key) {
      best = i;
      best_key = k;
    }
  }
  return best;
}

class LeastLoadedPolicy final : public Policy {
 public:
  std::string_view name() const override { return "least_loaded"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext&) override {
    return argmin(c, [](const PrefillEstimate& e) { return e.queue_ms; });
  }
};

class CacheAwarePolicy final : public Policy {
 public:
  std::string_view name() const override { return "cache_aware"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext&) override {
    return argmin(c, [](const PrefillEstimate& e) { return std::pair(-e.longest_same_host_blocks, e.queue_ms); });
  }
};

class KvCachePolicy final : public Policy {
 public:
  std::string_view name() const override { return "kvcache"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext& ctx) override {
    const size_t fastest = argmin(c, [](const PrefillEstimate& e) { return e.ttft_ms; });
    const double w = std::isfinite(ctx.service_weight) ? std::max(0.0, ctx.service_weight) : 0.0;
    // Admissible there: the TTFT and the wait the request would see (the overtaking estimate included, as the chosen
    // one is predicted) under the admission rule with the target and the SLO (DESIGN.md §10 "SLO headroom").
    const double slo = ctx.admit_slo_ms > 0 ? std::max(ctx.admit_slo_ms, ctx.slo_ttft_ms) : ctx.slo_ttft_ms;
    const auto meets = [&](const PrefillEstimate& e) {
      return ctx.slo_ttft_ms <= 0 ||
             ttft_admissible(e.ttft_ms + e.overtake_ms, e.queue_ms + e.overtake_ms, slo, ctx.slo_ttft_ms);
    };
    // The paper's rule (w = 0): the fastest, unless it is not admissible and another is.
    if (w == 0 && meets(c[fastest])) return fastest;
    size_t best = fastest;
    double best_cost = INFINITY;
    for (size_t i = 0; i < c.size(); ++i) {
      if (!meets(c[i])) continue;
      const double cost = c[i].ttft_ms + w * (c[i].prefill_ms + c[i].transfer_ms);
      if (cost < best_cost) {  // strictly: ties keep registration order
        best = i;
        best_cost = cost;
      }
    }
    return best;  // none meets the SLO: the fastest (early rejection judges it)
  }
};

}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> kNames = {"random", "round_robin", "least_loaded", "cache_aware", "kvcache"};
  return kNames;
}

Result<std::unique_ptr<Policy>> make_policy(std::string_view name, uint64_t seed) {
  if (name == "random") return std::unique_ptr<Policy>(new RandomPolicy(seed));
  if (name == "round_robin") return std::unique_ptr<Policy>(new RoundRobinPolicy());
  if (name == "least_loaded") return std::unique_ptr<Policy>(new LeastLoadedPolicy());
  if (name == "cache_aware") return std::unique_ptr<Policy>(new CacheAwarePolicy());
  if (name == "kvcache") return std::unique_ptr<Policy>(new KvCachePolicy());
  std::string valid;
  for (const auto& n : policy_names()) valid += (valid.empty() ? "" : ", ") + n;
  return error(Code::kInvalidArgument, "unknown policy '" + std::string(name) + "': expected one of " + valid);
}

bool ttft_admissible(double ttft_ms, double wait_ms, double slo_ms, double target_ms) {
  if (ttft_ms <= target_ms) return true;
  return ttft_ms <= slo_ms && wait_ms <= slo_ms - target_ms;
}

}  // namespace mc::sched
