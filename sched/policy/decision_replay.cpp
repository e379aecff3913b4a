#include "mc/sched/decision_replay.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "mc/sched/decision_json.hpp"
#include "mc/sched/policy.hpp"

namespace mc::sched {

namespace {

bool decode_side_reason(const std::string& reason) {
  return reason == reject_reason_name(RejectReason::kTbtSlo) ||
         reason == reject_reason_name(RejectReason::kKvCapacity) ||
         reason == reject_reason_name(RejectReason::kNoDecodeInstance);
}

}  // namespace

Result<LoggedDecision> logged_decision_from_json(const nlohmann::json& line) {
  if (!line.is_object() || !line.contains("request") || !line.contains("decision")) {
    return error(Code::kInvalidArgument, "not a decision record (expected {\"request\": ..., \"decision\": ...})");
  }
  LoggedDecision d;
  try {
    const nlohmann::json& req = line.at("request");
    const nlohmann::json& dec = line.at("decision");
    d.request.request_id = req.at("request_id").get<std::string>();
    d.request.input_tokens = req.at("input_tokens").get<int64_t>();
    d.request.output_tokens = req.at("output_tokens").get<int64_t>();
    d.request.slo_ttft_ms = req.value("slo_ttft_ms", 0.0);
    d.request.slo_tbt_ms = req.value("slo_tbt_ms", 0.0);
    d.policy = dec.at("policy").get<std::string>();
    d.accepted = dec.at("accepted").get<bool>();
    if (!d.accepted && dec.at("reject_reason").is_string())
      d.reject_reason = dec.at("reject_reason").get<std::string>();
    d.predicted_ttft_ms = dec.at("predicted_ttft_ms").get<double>();
    d.slo_ttft_ms = dec.value("slo_ttft_ms_applied", d.request.slo_ttft_ms);
    d.ttft_target_ms = dec.value("ttft_target_ms", d.slo_ttft_ms);
    if (!std::isfinite(d.ttft_target_ms) || d.ttft_target_ms < 0 || d.ttft_target_ms > d.slo_ttft_ms) {
      return error(Code::kInvalidArgument,
                   "decision field \"ttft_target_ms\" must be a finite number in [0, slo_ttft_ms_applied]");
    }
    d.early_reject = dec.value("early_reject", true);
    d.service_weight = dec.value("service_weight", 0.0);
    if (!std::isfinite(d.service_weight) || d.service_weight < 0) {
      return error(Code::kInvalidArgument, "decision field \"service_weight\" must be a finite number >= 0");
    }
    d.load_ratio = dec.value("load_ratio", 0.0);
    d.shed_limit = dec.value("shed_limit", 0.0);
    d.shed_slo_ms = dec.value("shed_slo_ms", d.slo_ttft_ms);
    if (!std::isfinite(d.shed_slo_ms) || d.shed_slo_ms < 0) {
      return error(Code::kInvalidArgument, "decision field \"shed_slo_ms\" must be a finite number >= 0");
    }
    if (!std::isfinite(d.load_ratio) || d.load_ratio < 0 || !std::isfinite(d.shed_limit) || d.shed_limit < 0) {
      return error(Code::kInvalidArgument,
                   "decision fields \"load_ratio\" and \"shed_limit\" must be finite numbers >= 0");
    }
    auto it = dec.find("estimates");
    if (it != dec.end()) {
      if (!it->is_array()) return error(Code::kInvalidArgument, "decision field \"estimates\" is not an array");
      for (const auto& e : *it) {
        Result<PrefillEstimate> pe = estimate_from_json(e);
        if (!pe.is_ok()) return pe.status().with_context("decision field \"estimates\"");
        d.estimates.push_back(std::move(pe).value());
      }
    }
    // The logged choice: the estimate the policy took (also on a TTFT rejection, which happens after choosing).
    if (!d.estimates.empty()) d.chosen_prefill = dec.at("prefill_estimate").at("instance").get<std::string>();
  } catch (const nlohmann::json::exception& ex) {
    return error(Code::kInvalidArgument, std::string("decision record: ") + ex.what());
  }
  return d;
}

Result<DecisionReplay> replay_decisions(std::span<const LoggedDecision> log, const std::vector<std::string>& policies,
                                        uint64_t seed) {
  if (policies.empty()) return error(Code::kInvalidArgument, "replay-decisions: no policy to replay");
  for (size_t i = 0; i < policies.size(); ++i) {
    if (std::find(policies.begin(), policies.begin() + static_cast<std::ptrdiff_t>(i), policies[i]) !=
        policies.begin() + static_cast<std::ptrdiff_t>(i)) {
      return error(Code::kInvalidArgument, "replay-decisions: policy '" + policies[i] + "' is named twice in --policy");
    }
  }
  DecisionReplay out;
  std::vector<std::unique_ptr<Policy>> runners;
  std::vector<std::vector<double>> diffs(policies.size());
  for (const auto& name : policies) {
    MC_ASSIGN_OR_RETURN(auto p, make_policy(name, seed));
    runners.push_back(std::move(p));
    out.policies.push_back(PolicyReplay{name});
  }
  for (const LoggedDecision& d : log) {
    ++out.logged;
    if (std::find(out.logged_policies.begin(), out.logged_policies.end(), d.policy) == out.logged_policies.end()) {
      out.logged_policies.push_back(d.policy);
    }
    if (d.estimates.empty()) continue;
    ++out.replayable;
    ++(d.accepted ? out.logged_accepted : out.logged_rejected);
    for (size_t p = 0; p < runners.size(); ++p) {
      PolicyReplay& r = out.policies[p];
      // The headroom is kvcache's (Scheduler::slo_headroom()): another policy is judged at the SLO itself.
      const double target_ms = runners[p]->name() == "kvcache" ? d.ttft_target_ms : d.slo_ttft_ms;
      const PlacementContext ctx{target_ms, d.service_weight, d.slo_ttft_ms};
      size_t i = runners[p]->choose(d.request, d.estimates, ctx);
      if (i >= d.estimates.size()) i = 0;  // as Scheduler::choose_prefill
      const PrefillEstimate& e = d.estimates[i];
      ++r.decisions;
      ++(e.instance_id == d.chosen_prefill ? r.same_choice : r.different_choice);
      // The chosen instance's prediction adds its overtaking estimate (Scheduler::choose_prefill), as logged.
      const double ttft_ms = e.ttft_ms + e.overtake_ms;
      diffs[p].push_back(ttft_ms - d.predicted_ttft_ms);
      const double wait_ms = e.queue_ms + e.overtake_ms;
      const bool over_slo = d.early_reject && !ttft_admissible(ttft_ms, wait_ms, d.slo_ttft_ms, target_ms);
      // Load shedding is kvcache's (Scheduler::shed_limit()), at the limit the log's Conductor applied.
      const bool shed = d.early_reject && runners[p]->name() == "kvcache" && d.shed_limit > 0 &&
                        d.load_ratio * (e.prefill_ms + e.transfer_ms) > d.shed_limit * d.shed_slo_ms;
      if (over_slo || shed) {
        ++r.rejected;
        ++(over_slo ? r.rejected_ttft : r.rejected_shed);
      } else if (!d.accepted && decode_side_reason(d.reject_reason)) {
        ++r.rejected;
      } else {
        ++r.accepted;
      }
    }
  }
  for (size_t p = 0; p < out.policies.size(); ++p) {
    std::vector<double>& v = diffs[p];
    if (v.empty()) continue;
    PolicyReplay& r = out.policies[p];
    double sum = 0;
    for (double& x : v) {
      sum += x;
      x = std::fabs(x);
    }
    r.mean_ttft_diff_ms = sum / static_cast<double>(v.size());
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(v.size())));
    r.p99_abs_ttft_diff_ms = v[std::clamp<size_t>(rank, 1, v.size()) - 1];
    r.max_abs_ttft_diff_ms = v.back();
  }
  return out;
}

}  // namespace mc::sched
