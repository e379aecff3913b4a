// NICs with contention: every flow moves bytes from one NIC's transmit side to another NIC's receive
// side, and concurrent flows share each side max-min fairly (progressive filling: the most contended
// side splits its bandwidth equally among its unfrozen flows, those flows freeze at that rate, the
// rest repeat on what is left). This is the steady state of fair per-flow congestion control (and of
// the transfer engine spraying 16 KiB slices over its NICs); setup latency is ignored because the
// transfers that matter are hundreds of MB to GB (a 12 K-token llama3-70b prefix is ~3.9 GB).
//
// Each NIC is full duplex: bandwidth_bytes_per_s in each direction. A flow from a NIC to itself is
// not a network transfer: it completes at once, like a flow of 0 bytes.
// Rates are recomputed whenever a flow starts or ends, so a flow's finish time reflects every other
// flow that overlapped it. Units: bytes, bytes/s, ns of virtual time.
// Thread-safety: none (one simulation per thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "mc/sim/event_queue.hpp"

namespace mc::sim {

struct NicStats {
  int64_t tx_bytes = 0;
  int64_t rx_bytes = 0;
  int64_t busy_ns = 0;  // time with at least one flow in either direction
};

class Network {
 public:
  // Called once when the flow's last byte arrives, with the virtual finish time.
  using FlowDone = std::function<void(int64_t finish_ns)>;

  // One NIC per entry; `queue` is not owned and must outlive the network.
  Network(EventQueue& queue, std::vector<double> nic_bandwidth_bytes_per_s);

  // Starts moving `bytes` from NIC `src` to NIC `dst` (both in [0, nic_count())). A flow of <= 0
  // bytes or with src == dst completes at once (its callback runs from the event queue at the
  // current time, never from inside this call).
  // Returns the flow id.
  uint64_t start_flow(int src, int dst, int64_t bytes, FlowDone done);

  size_t nic_count() const { return bandwidth_.size(); }
  double bandwidth_bytes_per_s(int nic) const { return bandwidth_[nic]; }
  // Flows currently using NIC `nic` (either direction).
  int active_flows(int nic) const;
  // Current rate of a flow in bytes/s (0 when finished or unknown).
  double flow_rate_bytes_per_s(uint64_t flow) const;
  // Stats up to now (busy time counted up to the current virtual time).
  NicStats stats(int nic) const;

 private:
  struct Flow {
    int src = 0;
    int dst = 0;
    double remaining_bytes = 0;
    double rate_bytes_per_s = 0;
    FlowDone done;
  };
  // Charges progress since last_update_ns_ at the current rates.
  void advance();
  // Max-min fair rates of all active flows, then (re)schedules the next completion.
  void reallocate();
  void on_completion_event();

  EventQueue& queue_;
  std::vector<double> bandwidth_;
  std::map<uint64_t, Flow> flows_;  // ordered by id: deterministic allocation and completion order
  std::vector<int> tx_count_, rx_count_;
  std::vector<NicStats> stats_;
  std::vector<int64_t> busy_since_ns_;  // -1 when idle
  uint64_t next_flow_ = 1;
  int64_t last_update_ns_ = 0;
  EventId pending_event_ = 0;
};

}  // namespace mc::sim
