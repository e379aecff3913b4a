// mc::infer::ConductorHeartbeat: a worker's registration with mc-conductor and its periodic load reports
// (protocol.hpp, conductor section: conductor.register, conductor.heartbeat).
//
// A background thread connects to the Conductor (retrying every second while it is unreachable), registers,
// then sends a heartbeat built by `load()` every heartbeat_interval_ms from the register reply, registering again
// when a reply says the Conductor forgot this worker. Failures are logged and retried, never fatal once
// registered: a worker keeps serving jobs sent to it directly. At start the daemons wait (wait_registered,
// bounded by ConductorHeartbeatOptions::start_wait_ms) for the first registration and exit when it does not come.
// stop() (or the destructor) ends the thread within ~100 ms. request_drain() sends conductor.drain at once.
// Thread-safety: `load` is called on the heartbeat thread and must be safe to call concurrently with the worker.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "mc/common/status.hpp"
#include "mc/proto/conductor.hpp"

namespace mc::infer {

struct ConductorHeartbeatOptions {
  std::string endpoint;     // mc-conductor RPC endpoint; empty: no registration
  std::string instance_id;  // unique name; empty: "<role>-<host>-<pid>"
  std::string host;         // empty: gethostname()
  // At start, how long the daemon retries to reach and register with the Conductor before it exits (ms).
  int64_t start_wait_ms = 30000;
};

// kInvalidArgument naming the flag when `options.endpoint` is not empty and not a ZeroMQ endpoint
// (tcp://host:port, ipc://path).
Status validate_heartbeat_options(const ConductorHeartbeatOptions& options);

class ConductorHeartbeat {
 public:
  ConductorHeartbeat(ConductorHeartbeatOptions options, proto::ConductorRegisterRequest registration,
                     std::function<proto::ConductorHeartbeatRequest()> load);
  ~ConductorHeartbeat() { stop(); }
  void stop();
  uint64_t heartbeats_sent() const { return sent_.load(); }
  // Blocks until the first registration succeeded (ok at once without an endpoint); kUnavailable naming the
  // endpoint, the time waited and the last failure when it has not within timeout_ms; kFailedPrecondition at once
  // when the Conductor refused the registration itself (kInvalidArgument or kPermissionDenied: a block size or
  // model that differs, a key it does not accept), which no retry can change.
  Status wait_registered(int64_t timeout_ms);
  // Drain (DESIGN.md §10 "Drain"): sends conductor.drain at once (retried until answered, and again after every
  // re-registration), so the Conductor places nothing new here; heartbeats go on. Never blocks.
  void request_drain();
  // Whether the Conductor answered the drain notice (true at once without an endpoint).
  bool drain_acknowledged();

 private:
  void run();
  void set_state(bool registered, std::string last_error, bool refused = false);
  void set_drain_acknowledged();
  ConductorHeartbeatOptions options_;
  std::mutex state_mu_;
  std::condition_variable state_cv_;
  bool registered_once_ = false;
  bool refused_ = false;  // the last registration was refused by the Conductor (not a transport failure)
  bool drain_acknowledged_ = false;
  std::atomic<bool> drain_{false};
  std::string last_error_ = "no answer yet";
  proto::ConductorRegisterRequest registration_;
  std::function<proto::ConductorHeartbeatRequest()> load_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread thread_;
};

// mc::infer::ConductorJobReporter: sends conductor.job_report (first_token / done / failed) for requests a worker
// serves, so the Conductor measures TTFT where it predicted it and frees its decode ledger entry at once.
// report() never blocks: reports go to a queue (at most kMaxQueued; beyond that they are dropped and counted, as
// reports are optional to the Conductor) drained by a background thread, one RpcClient, 2 s per call; a failed
// call drops that report and reconnects for the next. With an empty endpoint, report() does nothing.
// Thread-safety: report() may be called from any thread; stop() (or the destructor) sends what is queued for at
// most ~2 s, then ends the thread.
class ConductorJobReporter {
 public:
  static constexpr size_t kMaxQueued = 4096;
  explicit ConductorJobReporter(ConductorHeartbeatOptions options);
  ~ConductorJobReporter() { stop(); }
  void report(proto::ConductorJobReportRequest report);
  void stop();
  uint64_t sent() const { return sent_.load(); }
  uint64_t dropped() const { return dropped_.load(); }

 private:
  void run();
  ConductorHeartbeatOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<proto::ConductorJobReportRequest> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

// Fills instance_id and host defaults of `options` for a worker of `role` ("prefill" | "decode").
ConductorHeartbeatOptions resolve_conductor_options(ConductorHeartbeatOptions options, const std::string& role);

}  // namespace mc::infer
