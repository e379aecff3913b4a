#include "mc/transfer/path_policy.hpp"

#include <algorithm>
#include <limits>

namespace mc::transfer {

const char* health_name(PathHealth h) {
  switch (h) {
    case PathHealth::kHealthy:
      return "healthy";
    case PathHealth::kQuarantined:
      return "quarantined";
    case PathHealth::kProbing:
      return "probing";
  }
  return "unknown";
}

int PathSelector::add_path(std::string label, double weight, std::string local_device, std::string remote_device) {
  PathState p;
  p.label = std::move(label);
  p.local_device = std::move(local_device);
  p.remote_device = std::move(remote_device);
  p.weight = weight > 0 ? weight : 1e-3;
  paths_.push_back(std::move(p));
  return static_cast<int>(paths_.size()) - 1;
}

int PathSelector::pick(uint64_t length, int avoid, uint64_t max_in_flight_bytes) const {
  const PathState* failed =
      avoid >= 0 && static_cast<size_t>(avoid) < paths_.size() ? &paths_[static_cast<size_t>(avoid)] : nullptr;
  // 0: shares no device with the failed path, 1: shares one, 2: shares both, 3: the failed path itself.
  auto shared = [&](size_t i) -> int {
    if (failed == nullptr) return 0;
    if (static_cast<int>(i) == avoid) return 3;
    const PathState& p = paths_[i];
    return (!p.local_device.empty() && p.local_device == failed->local_device ? 1 : 0) +
           (!p.remote_device.empty() && p.remote_device == failed->remote_device ? 1 : 0);
  };
  // Order: regular paths before fallback ones, then fewer shared devices, then the smallest cost.
  int best = -1;
  int best_rank = std::numeric_limits<int>::max();
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < paths_.size(); ++i) {
    const PathState& p = paths_[i];
    if (p.health != PathHealth::kHealthy) continue;
    if (max_in_flight_bytes > 0 && p.bytes_in_flight > 0 && p.bytes_in_flight >= max_in_flight_bytes) continue;
    const int rank = (p.weight <= kFallbackPathWeight ? 10 : 0) + shared(i);
    const double cost = static_cast<double>(p.bytes_in_flight + length) / p.weight;
    if (rank < best_rank || (rank == best_rank && cost < best_cost)) {
      best_rank = rank;
      best_cost = cost;
      best = static_cast<int>(i);
    }
  }
  return best;
}

void PathSelector::on_post(int path, uint64_t length) {
  PathState& p = paths_[static_cast<size_t>(path)];
  p.bytes_in_flight += length;
  p.slices_in_flight += 1;
}

void PathSelector::quarantine(PathState& p) {
  p.backoff_ms = p.backoff_ms == 0 ? policy_.initial_backoff_ms : std::min(policy_.max_backoff_ms, p.backoff_ms * 2);
  p.health = PathHealth::kQuarantined;
  p.retry_at_ns = clock_->now_ns() + p.backoff_ms * 1'000'000;
}

void PathSelector::on_done(int path, uint64_t length, bool ok, bool path_fault, bool local_fault) {
  PathState& p = paths_[static_cast<size_t>(path)];
  p.bytes_in_flight -= std::min(p.bytes_in_flight, length);
  if (p.slices_in_flight > 0) p.slices_in_flight -= 1;
  if (ok) {
    p.bytes_done += length;
    p.slices_done += 1;
    p.consecutive_failures = 0;
    return;
  }
  if (!path_fault) return;
  p.failures += 1;
  p.consecutive_failures += 1;
  // Several slices in flight on a broken path fail together: count the path once per quarantine.
  if (p.health == PathHealth::kHealthy) quarantine(p);
  if (!local_fault || p.local_device.empty()) return;
  // The local device is gone: its other paths would fail the same way, whatever the remote end.
  for (PathState& q : paths_) {
    if (&q == &p || q.local_device != p.local_device || q.health != PathHealth::kHealthy) continue;
    q.failures += 1;
    q.consecutive_failures += 1;
    quarantine(q);
  }
}

std::vector<int> PathSelector::due_for_probe() {
  std::vector<int> due;
  const int64_t now = clock_->now_ns();
  for (size_t i = 0; i < paths_.size(); ++i) {
    PathState& p = paths_[i];
    if (p.health == PathHealth::kQuarantined && now >= p.retry_at_ns) {
      p.health = PathHealth::kProbing;
      due.push_back(static_cast<int>(i));
    }
  }
  return due;
}

void PathSelector::on_probe(int path, bool ok) {
  PathState& p = paths_[static_cast<size_t>(path)];
  if (ok) {
    p.health = PathHealth::kHealthy;
    p.backoff_ms = 0;
    p.retry_at_ns = 0;
    p.consecutive_failures = 0;
  } else {
    p.failures += 1;
    p.consecutive_failures += 1;
    quarantine(p);
  }
}

bool PathSelector::any_healthy() const {
  return std::any_of(paths_.begin(), paths_.end(), [](const PathState& p) { return p.health == PathHealth::kHealthy; });
}

}  // namespace mc::transfer

namespace mc::transfer {
bool PathSelector::all_failed_at_least(uint32_t n) const {
  return !paths_.empty() && std::all_of(paths_.begin(), paths_.end(), [n](const PathState& p) {
    return p.health != PathHealth::kHealthy && p.consecutive_failures >= n;
  });
}
}  // namespace mc::transfer
