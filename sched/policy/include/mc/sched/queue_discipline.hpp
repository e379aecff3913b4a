// Queue discipline of the prefill instances (issue 24 item 1; DESIGN.md §10 "Queue discipline"), as pure functions
// of the ledger and the clock's value: the Scheduler prices and books with them, the simulator's and the daemons'
// queues follow the keys they give (mc/common/queue_order.hpp).
//
//   fcfs: a job's queue key is its decision time: it waits for everything queued before it (the paper's baselines).
//   slo:  shortest predicted prefill first, aged: key = now + aging_weight x service (service = the job's predicted
//         prefill + prefix transfer, ms). A job therefore overtakes only jobs queued less than aging_weight x (their
//         service - its service) before it, and is overtaken only by jobs queued less than aging_weight x its
//         service after it (the aging bound). Deadline guard: a job is never placed ahead of a queued job whose
//         predicted finish (head's rest + the work ahead of it in the order) would then pass its deadline minus
//         guard_ms; it goes behind the last such job instead (its key raised to that job's). So an order is never
//         the reason an admitted job misses its TTFT SLO, as far as the predictions hold.
//
// A request's predicted queue time under slo is the work ahead of it in that order (place_job) plus the work of the
// jobs expected to overtake it later (expected_overtake_ms: the instance's recent arrivals shorter than it, each
// arriving inside its aging window), the latter bounded by its own slack (the guard protects it from more).
//
// Units: ms (double) for work, ns (int64, the Scheduler's clock) for keys and deadlines. Thread-safety: none needed.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"
#include "mc/sched/cluster_state.hpp"

namespace mc::sched {

std::string_view queue_discipline_name(QueueDiscipline d);           // "fcfs" | "slo"
Result<QueueDiscipline> parse_queue_discipline(std::string_view s);  // kInvalidArgument for anything else
// The default of a policy: slo for kvcache, fcfs for the paper's baselines.
QueueDiscipline default_queue_discipline(std::string_view policy);

// Where a new job goes in a prefill instance's ledger queue (queue[0] runs since head_started_ns; the rest waits
// in key order) and what it waits for there. With preemption (config.preempt_chunk_tokens > 0) the running head is
// ordered with the rest: a job of a smaller key goes ahead of it, waiting for the rest of the head's current chunk
// (head_chunk_ms: half a chunk expected, bounded by the head's rest), and the deadline guard protects the head as it
// does a waiting job.
struct QueuePlacement {
  size_t position = 0;     // index it takes in the queue (0: the queue is empty, it runs at once)
  int64_t key_ns = 0;      // its queue key (the order every queue keeps)
  double ahead_ms = 0;     // predicted work before it: the head's rest and the jobs ahead of it in the order
  size_t kept_behind = 0;  // jobs the deadline guard kept it behind (0: its own key's place)
};
// extra_ahead_ms: work the instance reported beyond the ledger (it runs first: counted ahead of every job).
// not_before_key_ns: the job's key is at least this (it queues behind the job of that key: a pending prefix it
// reuses, Scheduler step 1b); INT64_MIN: no such bound. head_chunk_ms: with preemption, the predicted time of one
// chunk of config.preempt_chunk_tokens (ms; 0: none counted).
QueuePlacement place_job(const std::deque<PrefillJob>& queue, int64_t head_started_ns, int64_t now_ns,
                         double service_ms, double extra_ahead_ms, QueueDiscipline discipline,
                         const QueueConfig& config, int64_t not_before_key_ns = INT64_MIN, double head_chunk_ms = 0);

// One recent arrival at an instance: when it was decided and its predicted service (ms).
struct QueueArrival {
  int64_t at_ns = 0;
  double service_ms = 0;
};
// Expected work (ms) of the jobs that will reach the instance after now and overtake a job of `service_ms` under
// slo: each recent arrival shorter than it recurs at the rate the history shows (n arrivals, n - 1 gaps over the
// span from the oldest to now, at least 1 s) and overtakes when it arrives within aging_weight x (service_ms - its
// service):
//   (n - 1) / n x sum over recent a with a.service < service of a.service x aging_weight x (service - a.service) /
//   span.
// 0 for fcfs or a history of fewer than 2 arrivals (no rate). The caller bounds it by the job's slack (the guard
// protects it from more).
double expected_overtake_ms(std::span<const QueueArrival> recent, int64_t now_ns, double service_ms,
                            QueueDiscipline discipline, const QueueConfig& config);

}  // namespace mc::sched
