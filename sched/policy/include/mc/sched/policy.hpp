// Prefill placement policies (--policy). The Scheduler prices every live prefill instance for the
// request (PrefillEstimate: queue, cheapest prefix plan, transfer, prefill, TTFT) and a Policy picks
// one of them. Pricing is shared, so every policy reuses whatever prefix the pool offers its choice;
// they differ only in where the prefill runs (as in the paper's comparison, §8.?):
//   random       uniform over live instances (seeded: deterministic)
//   round_robin  registration order, cycling
//   least_loaded smallest predicted queue_ms
//   cache_aware  longest prefix in memory on the instance's host, then the smallest queue_ms
//   kvcache      smallest predicted TTFT = queue + prefill(uncached) + transfer (paper §6, Alg. 1), load-priced:
//                among the candidates the admission rule takes (ttft_admissible with the SLO and its target:
//                DESIGN.md §10 "SLO headroom"), the smallest TTFT + w x service, where service = prefill + transfer
//                (the GPU time the placement spends) and w = PlacementContext::service_weight (0 when the cluster
//                is idle: the paper's rule; DESIGN.md §10 "Load-priced placement"); when none is admissible, the
//                smallest TTFT (early rejection then judges it)
// Ties (least_loaded, cache_aware, kvcache): equal keys (within 1e-9 relative) go to the candidate the policy chose
// least recently, never by index, so idle instances share the load and their caches (issue 52 item 3).
// Thread-safety: none. A policy may keep state (counter, RNG); choose() is its only mutation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

// What the Scheduler knows of the cluster when a policy chooses (DESIGN.md §10 "Load-priced placement").
struct PlacementContext {
  // The TTFT target (ms): the request's SLO less the SLO headroom (Decision::ttft_target_ms); <= 0: none (every
  // candidate is admissible).
  double slo_ttft_ms = 0;
  // ms of other requests' queueing that one ms of prefill service placed now costs: the load weight times the mean
  // predicted queue of the candidates over the mean service of recent jobs (Scheduler::service_weight); >= 0.
  double service_weight = 0;
  // The request's TTFT SLO itself (ms), for the admission rule's second clause (ttft_admissible); <= 0: the target
  // (no headroom).
  double admit_slo_ms = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // Index into `candidates` (non-empty, registration order) of the chosen prefill instance.
  virtual size_t choose(const Request& request, std::span<const PrefillEstimate> candidates,
                        const PlacementContext& context) = 0;
};

// The admission rule on TTFT with SLO headroom (DESIGN.md §10 "SLO headroom"): a request predicted to reach its
// first token at ttft_ms after waiting wait_ms (queue and overtaking, before its prefill starts) is admitted when
// ttft_ms <= target_ms, or when ttft_ms <= slo_ms and wait_ms <= slo_ms - target_ms (a request whose own prefill is
// longer than the target is not turned away from a short queue). target_ms == slo_ms is the paper's rule. All in ms;
// a NaN TTFT is never admitted (a NaN wait only through the first clause).
bool ttft_admissible(double ttft_ms, double wait_ms, double slo_ms, double target_ms);

// The policy of that name; kInvalidArgument naming the valid ones otherwise.
Result<std::unique_ptr<Policy>> make_policy(std::string_view name, uint64_t seed);
// "random", "round_robin", "least_loaded", "cache_aware", "kvcache".
const std::vector<std::string>& policy_names();

}  // namespace mc::sched
