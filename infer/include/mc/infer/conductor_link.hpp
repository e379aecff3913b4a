// mc::infer::ConductorHeartbeat: a worker's registration with mc-conductor and its periodic load reports
// (protocol.hpp, conductor section: conductor.register, conductor.heartbeat).
//
// A background thread connects to the Conductor (retrying every second while it is unreachable), registers,
// then sends a heartbeat built by `load()` every heartbeat_interval_ms from the register reply, registering again
// when a reply says the Conductor forgot this worker. Failures are logged and retried, never fatal: a worker
// keeps serving jobs sent to it directly. stop() (or the destructor) ends the thread within ~100 ms.
// Thread-safety: `load` is called on the heartbeat thread and must be safe to call concurrently with the worker.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "mc/common/protocol.hpp"

namespace mc::infer {

struct ConductorOptions {
  std::string endpoint;     // mc-conductor RPC endpoint; empty: no registration
  std::string instance_id;  // unique name; empty: "<role>-<host>-<pid>"
  std::string host;         // empty: gethostname()
};

class ConductorHeartbeat {
 public:
  ConductorHeartbeat(ConductorOptions options, proto::ConductorRegisterRequest registration,
                     std::function<proto::ConductorHeartbeatRequest()> load);
  ~ConductorHeartbeat() { stop(); }
  void stop();
  uint64_t heartbeats_sent() const { return sent_.load(); }

 private:
  void run();
  ConductorOptions options_;
  proto::ConductorRegisterRequest registration_;
  std::function<proto::ConductorHeartbeatRequest()> load_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread thread_;
};

// Fills instance_id and host defaults of `options` for a worker of `role` ("prefill" | "decode").
ConductorOptions resolve_conductor_options(ConductorOptions options, const std::string& role);

}  // namespace mc::infer
