#include "mc/sched/decision_json.hpp"

#include "mc/common/block_key.hpp"

namespace mc::sched {

nlohmann::json to_json(const PrefillEstimate& e) {
  return {
      {"instance", e.instance_id},
      {"queue_ms", e.queue_ms},
      {"prefill_ms", e.prefill_ms},
      {"transfer_ms", e.transfer_ms},
      {"ttft_ms", e.ttft_ms},
      {"reused_blocks", e.reused_blocks},
      {"same_host_blocks", e.blocks_by_class[0]},
      {"remote_blocks", e.blocks_by_class[1]},
      {"ssd_blocks", e.blocks_by_class[2]},
      {"longest_same_host_blocks", e.longest_same_host_blocks},
      {"longest_pool_blocks", e.longest_pool_blocks},
      {"transfer_bytes", e.transfer_bytes},
      {"load_known", e.load_known},
  };
}

nlohmann::json to_json(const DecodeEstimate& e) {
  return {
      {"instance", e.instance_id},          {"tbt_ms", e.tbt_ms},
      {"batch_requests", e.batch_requests}, {"kv_reserved_tokens", e.kv_reserved_tokens},
      {"kv_capacity_tokens", e.kv_capacity_tokens}, {"fits_kv", e.fits_kv},
      {"meets_tbt", e.meets_tbt},
  };
}

nlohmann::json decision_record(const Request& r, const Decision& d) {
  nlohmann::json hashes = nlohmann::json::array();
  for (uint64_t h : r.block_hashes) hashes.push_back(hash_hex(h));
  nlohmann::json req = {
      {"request_id", r.request_id},   {"input_tokens", r.input_tokens}, {"output_tokens", r.output_tokens},
      {"block_hashes", hashes},       {"slo_ttft_ms", r.slo_ttft_ms},   {"slo_tbt_ms", r.slo_tbt_ms},
  };
  nlohmann::json candidates = nlohmann::json::array();
  for (const auto& c : d.candidates) candidates.push_back(to_json(c));
  nlohmann::json dec = {
      {"accepted", d.accepted},
      {"reject_reason", d.accepted ? nullptr : nlohmann::json(std::string(reject_reason_name(d.reject_reason)))},
      {"reason", d.reason},
      {"policy", d.policy},
      {"decided_at_ns", d.decided_at_ns},
      {"prefill", d.prefill_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.prefill_id)},
      {"decode", d.decode_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.decode_id)},
      {"predicted_ttft_ms", d.predicted_ttft_ms},
      {"predicted_tbt_ms", d.accepted ? nlohmann::json(d.predicted_tbt_ms) : nlohmann::json(nullptr)},
      {"hit_tokens", d.hit_tokens},
      {"replicate_prefix", d.replicate_prefix},
      {"best_holder", d.best_holder_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.best_holder_id)},
      {"prefill_estimate", to_json(d.prefill)},
      {"decode_estimate", d.decode_id.empty() ? nlohmann::json(nullptr) : to_json(d.decode)},
      {"candidates", candidates},
  };
  return {{"request", req}, {"decision", dec}};
}

}  // namespace mc::sched
