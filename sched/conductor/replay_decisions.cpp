// `mc-conductor replay-decisions FILE`: reads a decision log and prints what each policy would have chosen
// (decision_replay.hpp). The re-run itself is mc_sched's; this file reads the log and renders the result.
#include <fstream>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "mc/common/input_file.hpp"
#include "mc/common/report.hpp"
#include "mc/conductor/conductor.hpp"
#include "mc/sched/decision_replay.hpp"

namespace mc::sched {

namespace {

Result<std::vector<LoggedDecision>> read_decision_log(const std::string& path) {
  MC_ASSIGN_OR_RETURN(std::ifstream in,
                      open_input_file(path, "decision log", "write one with mc-conductor serve --decisions FILE"));
  std::vector<LoggedDecision> log;
  std::string line;
  int64_t n = 0;
  for (LineRead got; (got = read_line_bounded(in, line)) != LineRead::kEnd;) {
    ++n;
    if (got == LineRead::kTooLong) {
      return error(Code::kInvalidArgument, path + ":" + std::to_string(n) + ": a line longer than " +
                                               std::to_string(kMaxInputLineBytes >> 20) +
                                               " MiB: not a decision (one JSON object per line)");
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      return error(Code::kInvalidArgument, path + ":" + std::to_string(n) +
                                               ": not JSON (a decision log has one "
                                               "JSON object per line)");
    }
    Result<LoggedDecision> d = logged_decision_from_json(j);
    if (!d.is_ok()) return d.status().with_context(path + ":" + std::to_string(n));
    log.push_back(std::move(d).value());
  }
  if (log.empty()) {  // the same mistake as an empty trace, the same exit code (issue 17 item 6)
    return error(Code::kInvalidArgument,
                 "decision log '" + path + "' holds no decision (write one with mc-conductor serve --decisions FILE)");
  }
  return log;
}

nlohmann::json to_json(const DecisionReplay& r, const std::string& path) {
  nlohmann::json pols = nlohmann::json::array();
  for (const PolicyReplay& p : r.policies) {
    pols.push_back({{"policy", p.policy},
                    {"decisions", p.decisions},
                    {"same_choice", p.same_choice},
                    {"different_choice", p.different_choice},
                    {"same_choice_ratio",
                     p.decisions > 0 ? static_cast<double>(p.same_choice) / static_cast<double>(p.decisions) : 0.0},
                    {"accepted", p.accepted},
                    {"rejected", p.rejected},
                    {"rejected_ttft_slo", p.rejected_ttft},
                    {"rejected_load_shed", p.rejected_shed},
                    {"mean_ttft_diff_ms", p.mean_ttft_diff_ms},
                    {"p99_abs_ttft_diff_ms", p.p99_abs_ttft_diff_ms},
                    {"max_abs_ttft_diff_ms", p.max_abs_ttft_diff_ms}});
  }
  return {{"log", path},
          {"logged", r.logged},
          {"replayable", r.replayable},
          {"skipped", r.logged - r.replayable},
          {"logged_policies", r.logged_policies},
          {"logged_accepted", r.logged_accepted},
          {"logged_rejected", r.logged_rejected},
          {"policies", std::move(pols)}};
}

}  // namespace

Status print_decision_replay(const std::string& path, const std::vector<std::string>& policies, uint64_t seed,
                             bool json, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(std::vector<LoggedDecision> log, read_decision_log(path));
  MC_ASSIGN_OR_RETURN(DecisionReplay r, replay_decisions(log, policies, seed));
  if (json) {
    out << to_json(r, path).dump(2) << '\n';
    return Status::ok();
  }
  using mc::report::fixed;
  std::string logged;
  for (const auto& p : r.logged_policies) logged += (logged.empty() ? "" : ",") + p;
  out << "decision log " << path << ": " << r.logged << " decisions by " << (logged.empty() ? "-" : logged) << ", "
      << r.replayable << " re-run (" << r.logged_accepted << " accepted, " << r.logged_rejected << " rejected), "
      << r.logged - r.replayable << " skipped (rejected before placement, or logged without estimates)\n\n";
  std::vector<std::vector<std::string>> rows = {{"policy", "decisions", "same", "different", "same_%", "accepted",
                                                 "rejected", "ttft_slo", "load_shed", "mean_ttft_diff_ms",
                                                 "p99_abs_ttft_diff_ms", "max_abs_ttft_diff_ms"}};
  for (const PolicyReplay& p : r.policies) {
    rows.push_back(
        {p.policy, std::to_string(p.decisions), std::to_string(p.same_choice), std::to_string(p.different_choice),
         mc::report::pct(p.decisions > 0 ? static_cast<double>(p.same_choice) / static_cast<double>(p.decisions) : 0.0),
         std::to_string(p.accepted), std::to_string(p.rejected), std::to_string(p.rejected_ttft),
         std::to_string(p.rejected_shed), fixed(p.mean_ttft_diff_ms, 1), fixed(p.p99_abs_ttft_diff_ms, 1),
         fixed(p.max_abs_ttft_diff_ms, 1)});
  }
  mc::report::print_table(out, rows);
  return Status::ok();
}

}  // namespace mc::sched
