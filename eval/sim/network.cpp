#include "mc/sim/network.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace mc::sim {

Network::Network(EventQueue& queue, std::vector<double> nic_bandwidth_bytes_per_s)
    : queue_(queue),
      bandwidth_(std::move(nic_bandwidth_bytes_per_s)),
      tx_count_(bandwidth_.size(), 0),
      rx_count_(bandwidth_.size(), 0),
      stats_(bandwidth_.size()),
      busy_since_ns_(bandwidth_.size(), -1) {}

uint64_t Network::start_flow(int src, int dst, int64_t bytes, FlowDone done) {
  uint64_t id = next_flow_++;
  if (bytes <= 0 || src == dst) {
    queue_.schedule_at(queue_.now_ns(), [done = std::move(done), this] { done(queue_.now_ns()); });
    return id;
  }
  advance();
  Flow f;
  f.src = src;
  f.dst = dst;
  f.remaining_bytes = static_cast<double>(bytes);
  f.done = std::move(done);
  flows_.emplace(id, std::move(f));
  for (int nic : {src, dst}) {
    if (tx_count_[nic] + rx_count_[nic] == 0) busy_since_ns_[nic] = queue_.now_ns();
  }
  ++tx_count_[src];
  ++rx_count_[dst];
  stats_[src].tx_bytes += bytes;
  stats_[dst].rx_bytes += bytes;
  reallocate();
  return id;
}

int Network::active_flows(int nic) const { return tx_count_[nic] + rx_count_[nic]; }

double Network::flow_rate_bytes_per_s(uint64_t flow) const {
  auto it = flows_.find(flow);
  return it == flows_.end() ? 0.0 : it->second.rate_bytes_per_s;
}

NicStats Network::stats(int nic) const {
  NicStats s = stats_[nic];
  if (busy_since_ns_[nic] >= 0) s.busy_ns += queue_.now_ns() - busy_since_ns_[nic];
  return s;
}

void Network::advance() {
  int64_t now = queue_.now_ns();
  double dt_s = static_cast<double>(now - last_update_ns_) * 1e-9;
  if (dt_s > 0) {
    for (auto& [id, f] : flows_) f.remaining_bytes -= f.rate_bytes_per_s * dt_s;
  }
  last_update_ns_ = now;
}

void Network::reallocate() {
  // Progressive filling over 2N resources (tx side i, rx side N+i).
  const size_t n = bandwidth_.size();
  std::vector<double> cap(2 * n);
  std::vector<int> unfrozen(2 * n, 0);
  for (size_t i = 0; i < n; ++i) cap[i] = cap[n + i] = bandwidth_[i];
  for (auto& [id, f] : flows_) {
    f.rate_bytes_per_s = -1;  // unfrozen
    ++unfrozen[f.src];
    ++unfrozen[n + f.dst];
  }
  size_t left = flows_.size();
  while (left > 0) {
    size_t best = 0;
    double best_share = std::numeric_limits<double>::infinity();
    for (size_t r = 0; r < 2 * n; ++r) {
      if (unfrozen[r] == 0) continue;
      double share = cap[r] / unfrozen[r];
      if (share < best_share) {
        best_share = share;
        best = r;
      }
    }
    for (auto& [id, f] : flows_) {
      if (f.rate_bytes_per_s >= 0) continue;
      if (static_cast<size_t>(f.src) != best && n + f.dst != best) continue;
      f.rate_bytes_per_s = best_share;
      cap[f.src] -= best_share;
      cap[n + f.dst] -= best_share;
      --unfrozen[f.src];
      --unfrozen[n + f.dst];
      --left;
    }
  }
  // Next completion.
  if (pending_event_ != 0) queue_.cancel(pending_event_);
  pending_event_ = 0;
  double soonest_s = std::numeric_limits<double>::infinity();
  for (auto& [id, f] : flows_) soonest_s = std::min(soonest_s, std::max(0.0, f.remaining_bytes) / f.rate_bytes_per_s);
  if (flows_.empty()) return;
  auto delay_ns = static_cast<int64_t>(std::ceil(soonest_s * 1e9));
  pending_event_ = queue_.schedule_after(delay_ns, [this] { on_completion_event(); });
}

void Network::on_completion_event() {
  pending_event_ = 0;
  advance();
  const int64_t now = queue_.now_ns();
  // A flow is done when less than one nanosecond of transfer remains (rounding of the ceil above).
  std::vector<std::pair<uint64_t, FlowDone>> done;
  for (auto it = flows_.begin(); it != flows_.end();) {
    Flow& f = it->second;
    if (f.remaining_bytes <= f.rate_bytes_per_s * 1e-9 + 1e-6) {
      --tx_count_[f.src];
      --rx_count_[f.dst];
      for (int nic : {f.src, f.dst}) {
        if (tx_count_[nic] + rx_count_[nic] == 0 && busy_since_ns_[nic] >= 0) {
          stats_[nic].busy_ns += now - busy_since_ns_[nic];
          busy_since_ns_[nic] = -1;
        }
      }
      done.emplace_back(it->first, std::move(f.done));
      it = flows_.erase(it);
    } else {
      ++it;
    }
  }
  reallocate();
  for (auto& [id, fn] : done) fn(now);
}

}  // namespace mc::sim
