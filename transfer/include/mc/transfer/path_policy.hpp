// Path selection and quarantine: the pure policy behind multi-path spraying and failover.
//
// A path is one (local device/address, remote endpoint) pair of one transport. Each slice goes to the
// usable path with the smallest (bytes in flight + slice length) / weight, so a slow path (bytes pile up)
// gets fewer slices and a preferred path (weight 1.0 vs 0.5, topology.hpp) gets more. A path on which a
// slice fails is quarantined: unusable for a backoff that starts at initial_backoff_ms and doubles on each
// further failure up to max_backoff_ms; once the backoff has passed it must be probed (the engine connects
// and pings) before slices go to it again. A successful probe or slice resets the backoff.
//
// Failover across devices (issue 3): a slice retried after a failure goes first to a path that shares
// neither the failed path's local device nor its remote device, then to one that shares only one of them,
// and to the failed path itself only when nothing else is usable. A failure the transport attributes to the
// local side (Code::kLocalDeviceDown: the local address or device is gone) quarantines every path of that
// local device at once, so the engine switches the local device, not only the remote one.
//
// Thread-safety: none; the engine serialises calls. Time comes from the injected Clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/common/clock.hpp"

namespace mc::transfer {

// A path of at most this weight is a fallback (e.g. the tcp paths an rdma segment carries): it takes a
// slice only when no regular path is usable, whatever the device ranking below says.
inline constexpr double kFallbackPathWeight = 1e-6;

struct QuarantinePolicy {
  int64_t initial_backoff_ms = 200;
  int64_t max_backoff_ms = 5000;
};

enum class PathHealth : uint8_t { kHealthy, kQuarantined, kProbing };
const char* health_name(PathHealth h);

struct PathState {
  std::string label;
  std::string local_device;   // topology device of the local side ("" = unknown: shares with nothing)
  std::string remote_device;  // the peer's device or endpoint ("" = unknown: shares with nothing)
  double weight = 1.0;
  PathHealth health = PathHealth::kHealthy;
  uint64_t bytes_in_flight = 0;
  uint64_t slices_in_flight = 0;
  uint64_t bytes_done = 0;  // bytes of successful slices
  uint64_t slices_done = 0;
  uint64_t failures = 0;              // failed slices and probes
  uint32_t consecutive_failures = 0;  // since the last success (slice or probe); 0 when it works
  int64_t backoff_ms = 0;             // current backoff (0 when healthy)
  int64_t retry_at_ns = 0;            // quarantined until this time
};

class PathSelector {
 public:
  PathSelector(const Clock& clock, QuarantinePolicy policy) : clock_(&clock), policy_(policy) {}

  // Adds a path; returns its index. weight > 0. The devices name the two ends for failover ("" = unknown).
  int add_path(std::string label, double weight, std::string local_device = "", std::string remote_device = "");

  // Index of the path for a slice of `length` bytes, or -1 when no path is usable now. With `avoid` (a path
  // the slice just failed on), paths sharing fewer devices with it come first (see above); among equals, the
  // smallest (bytes in flight + length) / weight. A path already carrying max_in_flight_bytes or more (0 =
  // no limit) is not usable now (the slice waits for a completion).
  int pick(uint64_t length, int avoid = -1, uint64_t max_in_flight_bytes = 0) const;

  void on_post(int path, uint64_t length);
  // A slice finished on `path`. ok=false with path_fault quarantines the path (or lengthens its quarantine);
  // path_fault=false is a refusal by the peer (out of range, ...) that says nothing about the path.
  // local_fault: the transport says the local side failed (device or address gone): every healthy path of
  // the same local device is quarantined with it (a path without a local device name: only itself).
  void on_done(int path, uint64_t length, bool ok, bool path_fault = true, bool local_fault = false);

  // Quarantined paths whose backoff has passed; the caller probes each and reports with on_probe.
  std::vector<int> due_for_probe();
  void on_probe(int path, bool ok);

  // True when some path is healthy (quarantined ones may come back after a probe).
  bool any_healthy() const;
  // True when every path has failed at least `n` times in a row: the peer is unreachable (no path left).
  bool all_failed_at_least(uint32_t n) const;

  size_t size() const { return paths_.size(); }
  const PathState& path(int i) const { return paths_[static_cast<size_t>(i)]; }
  const std::vector<PathState>& paths() const { return paths_; }

 private:
  void quarantine(PathState& p);
  const Clock* clock_;
  QuarantinePolicy policy_;
  std::vector<PathState> paths_;
};

}  // namespace mc::transfer
