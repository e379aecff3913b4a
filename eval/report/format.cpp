#include "mc/report/format.hpp"

namespace mc::replay::format {

nlohmann::json distribution_json(const std::optional<Distribution>& d) {
  if (!d) return nlohmann::json::object({{"count", 0}});
  return {{"count", d->count}, {"mean", d->mean}, {"p50", d->p50}, {"p90", d->p90}, {"p99", d->p99}, {"max", d->max}};
}

}  // namespace mc::replay::format
