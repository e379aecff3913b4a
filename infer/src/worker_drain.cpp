#include "mc/infer/worker_drain.hpp"

namespace mc::infer {

WorkerDrain::Turn WorkerDrain::step(int64_t now_ns, bool stop_requested, bool stop_now_requested, bool acknowledged) {
  Turn t;
  if (!draining_) {
    if (!stop_requested && !stop_now_requested) return t;
    draining_ = true;
    started_ns_ = now_ns;
    t.started = true;
  }
  if (!refusing_ && (acknowledged || now_ns - started_ns_ > kRefuseAfterNs)) {
    refusing_ = true;
    t.refuse = true;
  }
  if (!ended_ && (now_ns - started_ns_ > timeout_s_ * 1'000'000'000 || stop_now_requested)) {
    ended_ = true;
    ended_by_signal_ = stop_now_requested;
    ended_ns_ = now_ns;
    t.end = true;
    if (!refusing_) {
      refusing_ = true;
      t.refuse = true;
    }
  }
  return t;
}

}  // namespace mc::infer
