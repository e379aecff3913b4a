// mc::infer::WorkerDrain: the drain of a worker daemon on SIGTERM (DESIGN.md §10 "Drain"), one state machine for
// mc-prefill and mc-decode (serve_prefill, serve_decode).
//
// The first stop signal starts the drain: the daemon tells the Conductor (its heartbeat asks to drain). New work is
// refused once the Conductor acknowledged the notice, or 1 s after the start (a Conductor that is down places nothing
// here either). At the drain deadline (start + timeout_s), or at a second stop signal, the work still held is ended.
// The daemon's loop ends when it holds nothing more (the daemon's own test).
//
// Pure: the caller passes the time and the signals at each turn of its loop, so the same steps run in a unit test.
// Units: nanoseconds of a monotonic clock (steady_ns()). Thread-safety: none; one loop owns it.
#pragma once

#include <cstdint>

namespace mc::infer {

class WorkerDrain {
 public:
  // How long the work held at the start may still take (s, >= 0).
  explicit WorkerDrain(int64_t timeout_s) : timeout_s_(timeout_s) {}

  // What changed at one turn of the daemon's loop: each flag is true at the one turn it happens.
  struct Turn {
    bool started = false;  // the drain began: tell the Conductor, log what is held
    bool refuse = false;   // refuse new work from now on (also at the turn `end` happens, if not refusing yet)
    bool end = false;      // end what is still held (the deadline passed, or a second signal came)
  };
  // `stop_requested`: a first stop signal came (daemon::stop_requested); `stop_now_requested`: a second one;
  // `acknowledged`: the Conductor took the drain notice (ConductorHeartbeat::drain_acknowledged).
  Turn step(int64_t now_ns, bool stop_requested, bool stop_now_requested, bool acknowledged);

  bool draining() const { return draining_; }
  bool refusing() const { return refusing_; }
  bool ended() const { return ended_; }
  // Whether the end came from a second signal (else from the deadline); meaningful once ended().
  bool ended_by_signal() const { return ended_by_signal_; }
  int64_t started_ns() const { return started_ns_; }
  int64_t ended_ns() const { return ended_ns_; }
  int64_t timeout_s() const { return timeout_s_; }

  // Work is refused at the latest this long after the start when the Conductor does not answer.
  static constexpr int64_t kRefuseAfterNs = 1'000'000'000;

 private:
  int64_t timeout_s_;
  bool draining_ = false, refusing_ = false, ended_ = false, ended_by_signal_ = false;
  int64_t started_ns_ = 0, ended_ns_ = 0;
};

}  // namespace mc::infer
