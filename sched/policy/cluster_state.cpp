#include "mc/sched/cluster_state.hpp"

#include <algorithm>

#include "mc/common/queue_order.hpp"

namespace mc::sched {

bool placeable(const Instance& inst, int64_t now_ns, int64_t timeout_ms) {
  return !inst.draining && now_ns - inst.last_seen_ns <= timeout_ms * 1'000'000;
}

Status ClusterState::set_draining(const std::string& id, int64_t now_ns) {
  Instance* inst = find(id);
  if (inst == nullptr) {
    return error(Code::kNotFound, "drain: instance '" + id + "' is not registered (nothing is placed on it)");
  }
  if (!inst->draining) {
    inst->draining = true;
    inst->draining_since_ns = now_ns;
  }
  return Status::ok();
}

Status ClusterState::register_instance(const InstanceInfo& info, int64_t now_ns) {
  if (info.id.empty()) return error(Code::kInvalidArgument, "register: empty instance id");
  if (info.host.empty()) return error(Code::kInvalidArgument, "register: instance '" + info.id + "' has an empty host");
  if (info.role == Role::kDecode && info.kv_capacity_tokens <= 0) {
    return error(Code::kInvalidArgument, "register: decode instance '" + info.id +
                                             "' declares no KV capacity (kv_capacity_tokens must be > 0)");
  }
  auto it = by_id_.find(info.id);
  Instance* inst;
  if (it == by_id_.end()) {
    auto owned = std::make_unique<Instance>();
    inst = owned.get();
    by_id_.emplace(info.id, std::move(owned));
    order_.push_back(info.id);
    inst->registered_ns = now_ns;
  } else {
    inst = it->second.get();
  }
  inst->info = info;
  if (inst->info.backend_id.empty()) inst->info.backend_id = info.id;
  inst->host_index = host_index(info.host);
  inst->last_seen_ns = now_ns;
  rebuild_role_lists();
  return Status::ok();
}

Status ClusterState::remove_instance(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return error(Code::kNotFound, "instance '" + id + "' is not registered");
  by_id_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  rebuild_role_lists();
  return Status::ok();
}

Status ClusterState::heartbeat(const std::string& id, const LoadReport& load, int64_t now_ns) {
  Instance* inst = find(id);
  if (inst == nullptr) {
    return error(Code::kNotFound, "heartbeat from unregistered instance '" + id + "': register first");
  }
  inst->last_seen_ns = now_ns;
  inst->load_known = true;
  inst->reported = load;
  update_excess(*inst);
  return Status::ok();
}

void ClusterState::update_excess(Instance& inst) {
  int64_t ledger_tokens = 0;
  for (const auto& j : inst.prefill_queue) ledger_tokens += j.tokens;
  int64_t ledger_running = 0, ledger_kv = 0, ledger_ctx = 0;
  for (const auto& j : inst.decode_jobs) {
    ledger_kv += kv_reservation_tokens(j.input_tokens + j.output_tokens);  // reserved at dispatch, until done
    if (j.predicted_end_ns <= inst.last_seen_ns) continue;                 // predicted to have finished
    if (j.start_ns > inst.last_seen_ns) continue;                          // not in the batch yet at report time
    ++ledger_running;
    ledger_ctx += j.input_tokens;
  }
  inst.reported_excess.queued_prefill_tokens =
      std::max<int64_t>(0, inst.reported.queued_prefill_tokens - ledger_tokens);
  inst.reported_excess.queued_prefill_jobs =
      std::max<int64_t>(0, inst.reported.queued_prefill_jobs - static_cast<int64_t>(inst.prefill_queue.size()));
  inst.reported_excess.running_requests = std::max<int64_t>(0, inst.reported.running_requests - ledger_running);
  inst.reported_excess.kv_reserved_tokens = std::max<int64_t>(0, inst.reported.kv_reserved_tokens - ledger_kv);
  inst.reported_excess.context_tokens = std::max<int64_t>(0, inst.reported.context_tokens - ledger_ctx);
}

std::vector<std::string> ClusterState::expire(int64_t now_ns, int64_t timeout_ms) {
  std::vector<std::string> dead;
  for (const auto& id : order_) {
    const Instance& inst = *by_id_.at(id);
    if (now_ns - inst.last_seen_ns > timeout_ms * 1'000'000) dead.push_back(id);
  }
  for (const auto& id : dead) (void)remove_instance(id);
  return dead;
}

void ClusterState::excuse_silence(int64_t stall_ns, int64_t now_ns) {
  if (stall_ns <= 0) return;
  for (auto& [id, inst] : by_id_) inst->last_seen_ns = std::min(now_ns, inst->last_seen_ns + stall_ns);
}

uint32_t ClusterState::host_index(const std::string& host) {
  auto it = host_ids_.find(host);
  if (it != host_ids_.end()) return it->second;
  auto idx = static_cast<uint32_t>(hosts_.size());
  hosts_.push_back(host);
  host_ids_.emplace(host, idx);
  return idx;
}

std::optional<uint32_t> ClusterState::find_host(const std::string& host) const {
  auto it = host_ids_.find(host);
  if (it == host_ids_.end()) return std::nullopt;
  return it->second;
}

const std::string& ClusterState::host_name(uint32_t index) const {
  static const std::string kUnknown = "?";
  return index < hosts_.size() ? hosts_[index] : kUnknown;
}

void ClusterState::assign_prefill(const std::string& id, PrefillJob job, int64_t now_ns) {
  Instance* inst = find(id);
  if (inst == nullptr) return;
  auto& q = inst->prefill_queue;
  if (q.empty()) inst->head_started_ns = now_ns;
  auto at = queue_insert_position(q.begin(), q.end(), job.queue_key_ns, preemptive_ ? 0 : 1,
                                  [](const PrefillJob& j) { return j.queue_key_ns; });
  if (at == q.begin() && !q.empty()) {  // preempts the head: it has run since head_started_ns
    PrefillJob& head = q.front();
    head.predicted_ms = std::max(0.0, head.predicted_ms - static_cast<double>(now_ns - inst->head_started_ns) * 1e-6);
    inst->head_started_ns = now_ns;
  }
  q.insert(at, std::move(job));
}

void ClusterState::finish_prefill(const std::string& id, const std::string& request_id, int64_t now_ns) {
  Instance* inst = find(id);
  if (inst == nullptr) return;
  auto& q = inst->prefill_queue;
  auto it = std::find_if(q.begin(), q.end(), [&](const PrefillJob& j) { return j.request_id == request_id; });
  if (it == q.end()) return;
  bool was_head = it == q.begin();
  q.erase(it);
  if (was_head) inst->head_started_ns = now_ns;
}

void ClusterState::assign_decode(const std::string& id, DecodeJob job) {
  Instance* inst = find(id);
  if (inst == nullptr) return;
  inst->decode_jobs.push_back(std::move(job));
}

void ClusterState::start_decode(const std::string& id, const std::string& request_id, int64_t start_ns,
                                double step_ms) {
  Instance* inst = find(id);
  if (inst == nullptr) return;
  for (auto& j : inst->decode_jobs) {
    if (j.request_id != request_id) continue;
    j.start_ns = start_ns;
    j.predicted_end_ns = start_ns + static_cast<int64_t>(static_cast<double>(j.output_tokens) * step_ms * 1e6);
  }
}

void ClusterState::finish_decode(const std::string& id, const std::string& request_id) {
  Instance* inst = find(id);
  if (inst == nullptr) return;
  auto& v = inst->decode_jobs;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const DecodeJob& j) { return j.request_id == request_id; }), v.end());
}

double ClusterState::prefill_queue_ms(const Instance& inst, int64_t now_ns, double ms_per_token) const {
  double total = 0;
  bool head = true;
  for (const auto& j : inst.prefill_queue) {
    double ms = j.predicted_ms;
    if (head) {
      ms -= static_cast<double>(now_ns - inst.head_started_ns) * 1e-6;
      head = false;
    }
    total += std::max(0.0, ms);
  }
  // Work the Conductor did not dispatch (left from before its restart, or a forged report) counts for at most
  // kMaxUnledgeredQueueMs: it cannot make an instance look busy for hours.
  total += std::min(kMaxUnledgeredQueueMs,
                    static_cast<double>(inst.reported_excess.queued_prefill_tokens) * std::max(0.0, ms_per_token));
  return total;
}

const Instance* ClusterState::find(const std::string& id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

Instance* ClusterState::find(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

void ClusterState::rebuild_role_lists() {
  prefill_.clear();
  decode_.clear();
  for (const auto& id : order_) {
    Instance* inst = by_id_.at(id).get();
    (inst->info.role == Role::kPrefill ? prefill_ : decode_).push_back(inst);
  }
}

}  // namespace mc::sched
