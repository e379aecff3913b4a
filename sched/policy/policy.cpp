#include "mc/sched/policy.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

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

// Equal predictions are broken by spreading, never by index (issue 52 item 3): among the candidates whose key ties
// with the best, the one this policy chose least recently (never chosen: first, in registration order). At low load
// every idle instance prices a prefix-less request the same, and index order sent 20 of 20 lone requests to
// instance 0, using one node's cache instead of the pool's. Keys tie when equal within 1e-9 relative (1 ns
// absolute), so two sums of the same terms in another order still tie. State: the decision counter when each
// instance was last chosen, pruned to the candidates seen when it outgrows them.
class Spreader {
 public:
  template <typename Key>
  size_t argmin(std::span<const PrefillEstimate> c, Key key, const std::vector<bool>* allowed = nullptr) const {
    size_t best = c.size();
    double best_key = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      if (allowed != nullptr && !(*allowed)[i]) continue;
      const double k = key(c[i]);
      const bool better =
          best == c.size() || (std::isnan(best_key) && !std::isnan(k)) || k < best_key - tolerance(best_key);
      const bool tie = !better && !std::isnan(k) && k <= best_key + tolerance(best_key);
      if (better || (tie && last_chosen(c[i]) < last_chosen(c[best]))) {
        best = i;
        best_key = better ? k : std::min(best_key, k);
      }
    }
    return best == c.size() ? 0 : best;
  }
  // argmin, recorded as the policy's choice.
  template <typename Key>
  size_t pick(std::span<const PrefillEstimate> c, Key key, const std::vector<bool>* allowed = nullptr) {
    return chose(c, argmin(c, key, allowed));
  }
  // Records the choice (the policy's pick, whatever the scheduler then does with it); i < c.size().
  size_t chose(std::span<const PrefillEstimate> c, size_t i) {
    last_[c[i].instance_id] = ++decisions_;
    if (last_.size() > 4 * c.size() + 64) {
      std::unordered_map<std::string, uint64_t> kept;
      for (const PrefillEstimate& e : c) {
        auto it = last_.find(e.instance_id);
        if (it != last_.end()) kept.insert(*it);
      }
      last_ = std::move(kept);
    }
    return i;
  }

 private:
  static double tolerance(double k) { return std::isfinite(k) ? std::max(1e-6, 1e-9 * std::abs(k)) : 0.0; }
  uint64_t last_chosen(const PrefillEstimate& e) const {
    auto it = last_.find(e.instance_id);
    return it == last_.end() ? 0 : it->second;
  }
  uint64_t decisions_ = 0;
  std::unordered_map<std::string, uint64_t> last_;
};

class LeastLoadedPolicy final : public Policy {
 public:
  std::string_view name() const override { return "least_loaded"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext&) override {
    return spread_.pick(c, [](const PrefillEstimate& e) { return e.queue_ms; });
  }

 private:
  Spreader spread_;
};

class CacheAwarePolicy final : public Policy {
 public:
  std::string_view name() const override { return "cache_aware"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext&) override {
    // The longest same-host prefix, then the smallest queue, then spreading.
    int64_t longest = 0;
    for (const PrefillEstimate& e : c) longest = std::max(longest, e.longest_same_host_blocks);
    std::vector<bool> holders(c.size());
    for (size_t i = 0; i < c.size(); ++i) holders[i] = c[i].longest_same_host_blocks == longest;
    return spread_.pick(
        c, [](const PrefillEstimate& e) { return e.queue_ms; }, &holders);
  }

 private:
  Spreader spread_;
};

class KvCachePolicy final : public Policy {
 public:
  std::string_view name() const override { return "kvcache"; }
  size_t choose(const Request&, std::span<const PrefillEstimate> c, const PlacementContext& ctx) override {
    const size_t fastest = spread_.argmin(c, [](const PrefillEstimate& e) { return e.ttft_ms; });
    const double w = std::isfinite(ctx.service_weight) ? std::max(0.0, ctx.service_weight) : 0.0;
    // Admissible there: the TTFT and the wait the request would see (the overtaking estimate included, as the chosen
    // one is predicted) under the admission rule with the target and the SLO (DESIGN.md §10 "SLO headroom").
    const double slo = ctx.admit_slo_ms > 0 ? std::max(ctx.admit_slo_ms, ctx.slo_ttft_ms) : ctx.slo_ttft_ms;
    const auto meets = [&](const PrefillEstimate& e) {
      return ctx.slo_ttft_ms <= 0 ||
             ttft_admissible(e.ttft_ms + e.overtake_ms, e.queue_ms + e.overtake_ms, slo, ctx.slo_ttft_ms);
    };
    // The paper's rule (w = 0): the fastest, unless it is not admissible and another is.
    if (w == 0 && meets(c[fastest])) return spread_.chose(c, fastest);
    std::vector<bool> admissible(c.size());
    bool any = false;
    for (size_t i = 0; i < c.size(); ++i) any |= (admissible[i] = meets(c[i]));
    // None meets the SLO: the fastest (early rejection judges it).
    if (!any) return spread_.chose(c, fastest);
    return spread_.pick(
        c, [w](const PrefillEstimate& e) { return e.ttft_ms + w * (e.prefill_ms + e.transfer_ms); }, &admissible);
  }

 private:
  Spreader spread_;
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
