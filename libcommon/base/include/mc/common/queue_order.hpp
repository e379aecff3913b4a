// The order of a prefill instance's job queue (DESIGN.md §10 "Queue discipline"), shared by the three places that
// keep such a queue: the Conductor's ledger (sched/policy cluster_state.hpp), the simulator's prefill instance
// (eval/sim instances.hpp) and the prefill daemon's queue (infer/ serve_prefill). The Conductor decides a queue
// key per job (Scheduler: FCFS gives the decision time, the SLO order the decision time plus the aging weight times
// the job's predicted service, pushed behind any queued job it would make late); every queue keeps its waiting jobs
// sorted by (key, arrival), the running job (the head) never preempted (but in the simulator's preemption what-if,
// DESIGN.md §10 "Preemption", where it takes part in the order: pinned = 0). Keys are nanoseconds on the Conductor's
// clock; only their order matters, so an instance never compares them with its own clock.
//
// Pure, header-only; thread-safety: none needed (functions of their arguments).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace mc {

// Largest queue key accepted from a peer (prefill_job's queue_key_ns): about 146 years of nanoseconds.
inline constexpr int64_t kMaxQueueKeyNs = int64_t{1} << 62;

// Where a job of queue key `key_ns` goes in [first, last): after every job whose key is <= key_ns (equal keys keep
// their arrival order) and never before the first `pinned` jobs (the running head). key_of(element) gives an
// element's key; the range past `pinned` must be sorted by it (every function here keeps it so).
template <typename It, typename KeyOf>
It queue_insert_position(It first, It last, int64_t key_ns, size_t pinned, KeyOf key_of) {
  const auto n = static_cast<size_t>(std::distance(first, last));
  It from = std::next(first, static_cast<std::ptrdiff_t>(std::min(pinned, n)));
  return std::upper_bound(from, last, key_ns, [&](int64_t k, const auto& e) { return k < key_of(e); });
}

}  // namespace mc
