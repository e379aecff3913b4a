#include "mc/sched/decision_json.hpp"

#include "mc/common/block_key.hpp"
#include "mc/sched/scheduler.hpp"

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
      {"overtake_ms", e.overtake_ms},
      {"pending_blocks", e.pending_blocks},
      {"queue_key_ns", e.queue_key_ns},
      {"queue_position", e.queue_position},
      {"kept_behind", e.kept_behind},
  };
}

nlohmann::json to_json(const DecodeEstimate& e) {
  return {
      {"instance", e.instance_id},
      {"tbt_ms", e.tbt_ms},
      {"batch_requests", e.batch_requests},
      {"kv_reserved_tokens", e.kv_reserved_tokens},
      {"kv_capacity_tokens", e.kv_capacity_tokens},
      {"fits_kv", e.fits_kv},
      {"meets_tbt", e.meets_tbt},
  };
}

Result<PrefillEstimate> estimate_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return error(Code::kInvalidArgument, "prefill estimate is not a JSON object");
  PrefillEstimate e;
  try {
    e.instance_id = j.at("instance").get<std::string>();
    e.queue_ms = j.at("queue_ms").get<double>();
    e.prefill_ms = j.at("prefill_ms").get<double>();
    e.transfer_ms = j.at("transfer_ms").get<double>();
    e.ttft_ms = j.at("ttft_ms").get<double>();
    e.reused_blocks = j.at("reused_blocks").get<int64_t>();
    e.blocks_by_class[0] = j.at("same_host_blocks").get<int64_t>();
    e.blocks_by_class[1] = j.at("remote_blocks").get<int64_t>();
    e.blocks_by_class[2] = j.at("ssd_blocks").get<int64_t>();
    e.longest_same_host_blocks = j.at("longest_same_host_blocks").get<int64_t>();
    e.longest_pool_blocks = j.at("longest_pool_blocks").get<int64_t>();
    e.transfer_bytes = j.at("transfer_bytes").get<int64_t>();
    e.load_known = j.at("load_known").get<bool>();
    e.overtake_ms = j.value("overtake_ms", 0.0);  // logs from before the queue discipline have none
    e.pending_blocks = j.value("pending_blocks", int64_t{0});
    if (e.pending_blocks < 0 || e.pending_blocks > e.reused_blocks) {
      return error(Code::kInvalidArgument, "prefill estimate: pending_blocks must be in [0, reused_blocks]");
    }
  } catch (const nlohmann::json::exception& ex) {
    return error(Code::kInvalidArgument, std::string("prefill estimate: ") + ex.what());
  }
  return e;
}

nlohmann::json decision_record(const Request& r, const Decision& d, std::span<const PrefillEstimate> estimates) {
  nlohmann::json hashes = nlohmann::json::array();
  for (uint64_t h : r.block_hashes) hashes.push_back(hash_hex(h));
  nlohmann::json req = {
      {"request_id", r.request_id}, {"input_tokens", r.input_tokens}, {"output_tokens", r.output_tokens},
      {"block_hashes", hashes},     {"slo_ttft_ms", r.slo_ttft_ms},   {"slo_tbt_ms", r.slo_tbt_ms},
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
      {"service_weight", d.service_weight},
      {"load_ratio", d.load_ratio},
      {"shed_limit", d.shed_limit},
      {"shed_slo_ms", d.shed_slo_ms},
      {"predicted_tbt_ms", d.accepted ? nlohmann::json(d.predicted_tbt_ms) : nlohmann::json(nullptr)},
      {"hit_tokens", d.hit_tokens},
      {"pool_prefix_tokens", d.pool_prefix_tokens},
      {"replicate_prefix", d.replicate_prefix},
      {"best_holder", d.best_holder_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.best_holder_id)},
      {"prefill_estimate", to_json(d.prefill)},
      {"decode_estimate", d.decode_id.empty() ? nlohmann::json(nullptr) : to_json(d.decode)},
      {"candidates", candidates},
      {"slo_ttft_ms_applied", d.slo_ttft_ms},
      {"ttft_target_ms", d.ttft_target_ms},
      {"early_reject", d.early_reject},
      {"queue", d.queue},
  };
  if (!d.stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (const StageEstimate& st : d.stages) {
      stages.push_back({{"instance", st.instance_id},
                        {"first_layer", st.first_layer},
                        {"layers", st.layers},
                        {"ready_ms", st.ready_ms},
                        {"end_ms", st.end_ms}});
    }
    dec["stages"] = std::move(stages);
    dec["single_ttft_ms"] = d.single_ttft_ms;
  } else if (!d.pipeline_declined.empty()) {
    dec["pipeline_declined"] = d.pipeline_declined;
    if (d.group_ttft_ms > 0) dec["group_ttft_ms"] = d.group_ttft_ms;
  }
  if (!estimates.empty()) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& e : estimates) all.push_back(to_json(e));
    dec["estimates"] = std::move(all);
  }
  return {{"request", req}, {"decision", dec}};
}

nlohmann::json scheduler_status(const Scheduler& s, bool with_instances) {
  const int64_t now = s.clock().now_ns();
  const SchedulerConfig& cfg = s.config();
  nlohmann::json out;
  out["policy"] = cfg.policy;
  out["slo"] = {{"ttft_ms", cfg.slo.ttft_ms}, {"tbt_ms", cfg.slo.tbt_ms}, {"early_reject", cfg.slo.early_reject}};
  out["kv"] = {{"kv_bytes_per_token", cfg.kv.kv_bytes_per_token}, {"block_size_tokens", cfg.kv.block_size_tokens}};
  out["heartbeat_timeout_ms"] = cfg.heartbeat_timeout_ms;
  out["queue"] = {{"discipline", std::string(queue_discipline_name(s.queue_discipline()))},
                  {"aging_weight", cfg.queue.aging_weight},
                  {"guard_ms", cfg.queue.guard_ms}};
  out["placement"] = {{"pending_prefix", s.pending_prefix()},
                      {"load_weight", s.placement_load_weight()},
                      {"slo_headroom", s.slo_headroom()},
                      {"shed_limit", s.shed_limit()},
                      {"balancing_threshold", s.config().balancing_threshold}};
  if (with_instances) {
    nlohmann::json insts = nlohmann::json::array();
    for (Role role : {Role::kPrefill, Role::kDecode}) {
      for (const Instance* i : s.cluster().instances(role)) {
        nlohmann::json j = {
            {"id", i->info.id},
            {"role", std::string(role_name(role))},
            {"host", i->info.host},
            {"endpoint", i->info.endpoint},
            {"state", i->draining     ? "draining"
                      : i->load_known ? "live"
                                      : "unknown"},
            {"last_seen_ms_ago", static_cast<double>(now - i->last_seen_ns) * 1e-6},
        };
        if (role == Role::kPrefill) {
          j["queue_ms"] = s.queue_ms(*i);
          j["queued_jobs"] = i->prefill_queue.size();
          j["reported_queued_prefill_tokens"] = i->reported.queued_prefill_tokens;
        } else {
          int64_t reserved = 0;
          int64_t running = 0;
          for (const auto& d : i->decode_jobs) {
            reserved += s.cluster().kv_reservation_tokens(d.input_tokens + d.output_tokens);  // until done
            if (d.predicted_end_ns <= now) continue;
            ++running;
          }
          j["requests"] = running;
          j["kv_reserved_tokens"] = reserved + i->reported_excess.kv_reserved_tokens;
          j["kv_capacity_tokens"] = i->info.kv_capacity_tokens;
          j["reported_running_requests"] = i->reported.running_requests;
        }
        insts.push_back(std::move(j));
      }
    }
    out["instances"] = std::move(insts);
  }
  const IndexCounters& ic = s.index().counters();
  out["index"] = {{"blocks", s.index().blocks()},
                  {"holder_entries", s.index().holder_entries()},
                  {"backends", s.index().backends()},
                  {"events_applied", ic.events_applied},
                  {"events_duplicate", ic.events_duplicate},
                  {"gaps", ic.gaps},
                  {"resyncs", ic.resyncs},
                  {"resync_failures", ic.resync_failures},
                  {"bad_events", ic.bad_events},
                  {"publisher_restarts", ic.publisher_restarts},
                  {"resync_stale_replicas", ic.resync_stale_replicas},
                  {"resync_missing_replicas", ic.resync_missing_replicas},
                  {"offline_backends", s.index().offline_backends()},
                  {"backends_parked", ic.backends_parked},
                  {"backends_returned", ic.backends_returned}};
  const SchedulerCounters& c = s.counters();
  nlohmann::json rejected = nlohmann::json::object();
  for (int r = 1; r <= static_cast<int>(kLastRejectReason); ++r) {
    rejected[std::string(reject_reason_name(static_cast<RejectReason>(r)))] = c.rejected[r];
  }
  out["decisions"] = {{"total", c.decisions},
                      {"accepted", c.accepted},
                      {"fetch", c.fetch},
                      {"recompute", c.recompute},
                      {"fetch_remote", c.fetch_remote},
                      {"recompute_cached", c.recompute_cached},
                      {"fetch_pending", c.fetch_pending},
                      {"path_samples", c.path_samples},
                      {"path_caps", c.path_caps},
                      {"replicate", c.replicate},
                      {"rejected", rejected},
                      {"expired_instances", c.expired_instances},
                      {"refused_decode_steps", c.refused_decode_steps},
                      {"in_flight", s.in_flight()}};
  PrefillCostPrior p = s.prefill_predictor().current();
  DecodeCostPrior d = s.decode_predictor().current();
  out["predictors"] = {
      {"prefill",
       {{"fixed_ms", p.fixed_ms},
        {"ms_per_token", p.ms_per_token},
        {"ms_per_token_pair", p.ms_per_token_pair},
        {"samples", s.prefill_predictor().samples()}}},
      {"decode",
       {{"fixed_ms", d.fixed_ms},
        {"ms_per_request", d.ms_per_request},
        {"ms_per_context_token", d.ms_per_context_token},
        {"samples", s.decode_predictor().samples()}}},
      {"bandwidth_bytes_per_s",
       {{"same_host", s.bandwidth().bytes_per_s(PathClass::kSameHost)},
        {"remote", s.bandwidth().bytes_per_s(PathClass::kRemote)},
        {"ssd", s.bandwidth().bytes_per_s(PathClass::kSsd)}}},
      {"bandwidth_samples",
       {{"same_host", s.bandwidth().samples(PathClass::kSameHost)},
        {"remote", s.bandwidth().samples(PathClass::kRemote)},
        {"ssd", s.bandwidth().samples(PathClass::kSsd)}}},
  };
  // Measured paths (DESIGN.md §16 "Bandwidth decides, live"): the estimate now (decayed) and the send backlogs.
  const int64_t now_ns = s.clock().now_ns();
  nlohmann::json paths = nlohmann::json::array();
  for (const BandwidthEstimator::PathEstimate& pe : s.bandwidth().paths()) {
    paths.push_back({{"from", s.cluster().host_name(pe.src_host)},
                     {"to", s.cluster().host_name(pe.dst_host)},
                     {"bytes_per_s", s.bandwidth().path_bytes_per_s(pe.src_host, pe.dst_host, now_ns)},
                     {"measured_bytes_per_s", pe.bytes_per_s},
                     {"samples", pe.samples},
                     {"age_ms", static_cast<double>(now_ns - pe.last_sample_ns) * 1e-6},
                     {"send_backlog_bytes", s.send_backlog_bytes(pe.src_host, now_ns)}});
  }
  out["predictors"]["bandwidth_paths"] = std::move(paths);
  auto error_json = [](const PredictionErrorStats& e) {
    return nlohmann::json{{"samples", e.count()},
                          {"mean_abs_ms", e.mean_abs_error_ms()},
                          {"p90_abs_ms", e.p90_abs_error_ms()},
                          {"mean_signed_ms", e.mean_signed_error_ms()}};
  };
  out["ttft_error"] = error_json(s.ttft_error());
  out["decode_step_error"] = error_json(s.decode_step_error());
  return out;
}

}  // namespace mc::sched
