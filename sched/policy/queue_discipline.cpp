#include "mc/sched/queue_discipline.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "mc/common/queue_order.hpp"

namespace mc::sched {

std::string_view queue_discipline_name(QueueDiscipline d) { return d == QueueDiscipline::kSlo ? "slo" : "fcfs"; }

Result<QueueDiscipline> parse_queue_discipline(std::string_view s) {
  if (s == "fcfs") return QueueDiscipline::kFcfs;
  if (s == "slo") return QueueDiscipline::kSlo;
  return error(Code::kInvalidArgument, "unknown queue discipline '" + std::string(s) + "': expected fcfs or slo");
}

QueueDiscipline default_queue_discipline(std::string_view policy) {
  return policy == "kvcache" ? QueueDiscipline::kSlo : QueueDiscipline::kFcfs;
}

namespace {

int64_t ms_to_ns(double ms) {
  const double ns = ms * 1e6;
  if (!(ns < 9e18)) return int64_t{9'000'000'000'000'000'000};
  return ns > 0 ? static_cast<int64_t>(ns) : 0;
}

}  // namespace

QueuePlacement place_job(const std::deque<PrefillJob>& queue, int64_t head_started_ns, int64_t now_ns,
                         double service_ms, double extra_ahead_ms, QueueDiscipline discipline,
                         const QueueConfig& config, int64_t not_before_key_ns, double head_chunk_ms) {
  QueuePlacement p;
  const double extra = std::max(0.0, extra_ahead_ms);
  const auto key_of = [](const PrefillJob& j) { return j.queue_key_ns; };
  p.key_ns = now_ns;
  if (discipline == QueueDiscipline::kSlo) {
    const int64_t aged = ms_to_ns(std::max(0.0, config.aging_weight) * std::max(0.0, service_ms));
    p.key_ns = now_ns + std::min(aged, kMaxQueueKeyNs - now_ns);
  }
  p.key_ns = std::max(p.key_ns, std::min(not_before_key_ns, kMaxQueueKeyNs));
  if (queue.empty()) {
    p.ahead_ms = extra;
    return p;
  }
  // Predicted finish (ms from now) of every queued job in the current order.
  std::vector<double> finish(queue.size());
  double t = extra;
  for (size_t i = 0; i < queue.size(); ++i) {
    double ms = queue[i].predicted_ms;
    if (i == 0) ms -= static_cast<double>(now_ns - head_started_ns) * 1e-6;
    t += std::max(0.0, ms);
    finish[i] = t;
  }
  const size_t pinned = config.preempt_chunk_tokens > 0 ? 0 : 1;  // the running head, unless it yields
  auto at = queue_insert_position(queue.begin(), queue.end(), p.key_ns, pinned, key_of);
  auto pos = static_cast<size_t>(at - queue.begin());
  if (discipline == QueueDiscipline::kSlo) {
    // The deadline guard: behind the last job this one would make late.
    const double guard_ms = std::max(0.0, config.guard_ms);
    for (size_t i = queue.size(); i-- > pos;) {
      const PrefillJob& j = queue[i];
      if (j.deadline_ns == INT64_MAX) continue;
      const double deadline_ms = static_cast<double>(j.deadline_ns - now_ns) * 1e-6 - guard_ms;
      if (finish[i] + std::max(0.0, service_ms) > deadline_ms) {
        p.key_ns = std::max(p.key_ns, j.queue_key_ns);
        at = queue_insert_position(queue.begin(), queue.end(), p.key_ns, pinned, key_of);
        const auto moved = static_cast<size_t>(at - queue.begin());
        p.kept_behind = moved - pos;
        pos = moved;
        break;
      }
    }
  }
  p.position = pos;
  // Ahead of a running head (preemption): it yields at its current chunk's end, half a chunk away on average.
  p.ahead_ms = pos == 0 ? extra + std::min(finish[0] - extra, 0.5 * std::max(0.0, head_chunk_ms)) : finish[pos - 1];
  return p;
}

double expected_overtake_ms(std::span<const QueueArrival> recent, int64_t now_ns, double service_ms,
                            QueueDiscipline discipline, const QueueConfig& config) {
  if (discipline != QueueDiscipline::kSlo || recent.empty() || !(service_ms > 0)) return 0;
  int64_t oldest = now_ns;
  for (const QueueArrival& a : recent) oldest = std::min(oldest, a.at_ns);
  const double span_ms = std::max(1'000.0, static_cast<double>(now_ns - oldest) * 1e-6);
  const double w = std::max(0.0, config.aging_weight);
  // n arrivals over the span are n - 1 gaps: each kind recurs at (n - 1) / (n x span); one arrival shows no rate.
  const double n = static_cast<double>(recent.size());
  const double per_arrival = (n - 1) / n;
  double sum = 0;
  for (const QueueArrival& a : recent) {
    if (!(a.service_ms < service_ms) || a.service_ms < 0) continue;
    // Its kind arrives at rate 1/span and overtakes when it comes within w x (service - its service) after now.
    sum += a.service_ms * w * (service_ms - a.service_ms) / span_ms;
  }
  return sum * per_arrival;
}

}  // namespace mc::sched
