#include "mc/report/report.hpp"

#include "mc/common/input_file.hpp"
#include "mc/common/report.hpp"
#include "mc/report/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <istream>
#include <numeric>
#include <sstream>

namespace mc::replay {

using json = nlohmann::json;

std::string_view outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kCompleted:
      return "completed";
    case Outcome::kRejected:
      return "rejected";
    case Outcome::kFailed:
      return "failed";
  }
  return "unknown";
}

Result<Outcome> parse_outcome(std::string_view name) {
  if (name == "completed") return Outcome::kCompleted;
  if (name == "rejected") return Outcome::kRejected;
  if (name == "failed") return Outcome::kFailed;
  return Status(Code::kInvalidArgument,
                "unknown outcome \"" + std::string(name) + "\" (expected completed, rejected or failed)");
}

std::optional<TbtStats> tbt_stats(std::span<const double> gaps_ms) {
  if (gaps_ms.empty()) return std::nullopt;
  std::vector<double> sorted(gaps_ms.begin(), gaps_ms.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  TbtStats s;
  s.gaps = static_cast<int64_t>(sorted.size());
  s.mean_ms = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(sorted.size());
  s.max_ms = sorted.front();
  // Longest 10 %, at least one gap: ceil(0.1 * n) computed in integers (0.1 is not exact in binary).
  size_t top = (sorted.size() + 9) / 10;
  s.top10_mean_ms = std::accumulate(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(top), 0.0) /
                    static_cast<double>(top);
  return s;
}

int64_t Ledger::hit_tokens() const {
  return hit_tokens_local.value_or(0) + hit_tokens_remote.value_or(0) + hit_tokens_ssd.value_or(0);
}

std::optional<double> tpot_ms(std::optional<double> ttft_ms, std::optional<double> e2e_ms, int64_t tokens) {
  if (!ttft_ms || !e2e_ms || tokens < 2) return std::nullopt;
  return (*e2e_ms - *ttft_ms) / static_cast<double>(tokens - 1);
}

void apply_token_times(RequestRecord& record, std::span<const double> token_ms,
                       std::optional<int64_t> reported_tokens) {
  if (reported_tokens) {
    record.output_tokens = *reported_tokens;
    record.output_tokens_source = "usage";
  } else {
    record.output_tokens = static_cast<int64_t>(token_ms.size());
    record.output_tokens_source = "counted";
  }
  if (token_ms.empty()) {
    record.ttft_ms.reset();
    record.e2e_ms.reset();
    record.tpot_ms.reset();
    record.tbt.reset();
    return;
  }
  record.ttft_ms = token_ms.front();
  record.e2e_ms = token_ms.back();
  std::vector<double> gaps;
  gaps.reserve(token_ms.size());
  for (size_t i = 1; i < token_ms.size(); ++i) gaps.push_back(token_ms[i] - token_ms[i - 1]);
  record.tbt = tbt_stats(gaps);
  record.tpot_ms = tpot_ms(record.ttft_ms, record.e2e_ms, *record.output_tokens);
}

// ---- JSON of one record ----

namespace {

template <typename T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

template <typename T>
Status get(const json& j, const char* key, std::optional<T>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  try {
    if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) throw std::invalid_argument("not a string");
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw std::invalid_argument("not true or false");
    } else {
      if (!it->is_number()) throw std::invalid_argument("not a number");
      if constexpr (std::is_integral_v<T>) {
        if (!it->is_number_integer()) throw std::invalid_argument("not an integer");
      }
      // No run lasts 31,000 years nor counts 1e15 of anything: such a value is a damaged or forged record, and
      // would swamp every mean and span of the report.
      const double v = it->get<double>();
      if (!std::isfinite(v) || std::abs(v) > 1e15) throw std::invalid_argument("outside +-1e15");
      // The request's own times are measured, never "unknown" (ledger fields use -1 for that).
      constexpr std::string_view kTimes[] = {"submit_ms", "end_ms",      "ttft_ms",    "e2e_ms",
                                             "tpot_ms",   "tbt_mean_ms", "tbt_max_ms", "tbt_top10_mean_ms"};
      if (v < 0 && std::find(std::begin(kTimes), std::end(kTimes), std::string_view(key)) != std::end(kTimes)) {
        throw std::invalid_argument("a negative time");
      }
    }
    out = it->get<T>();
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument,
                  std::string("record field \"") + key + "\" = " + it->dump() + ": " + e.what());
  }
  return Status::ok();
}

template <typename T>
Status get_required(const json& j, const char* key, T& out) {
  std::optional<T> v;
  MC_RETURN_IF_ERROR(get(j, key, v));
  if (!v) return Status(Code::kInvalidArgument, std::string("record is missing \"") + key + "\"");
  out = *v;
  return Status::ok();
}

}  // namespace

json to_json(const RequestRecord& r) {
  json j = json::object();
  j["request_id"] = r.request_id;
  j["trace_line"] = r.trace_line;
  j["trace_timestamp_ms"] = r.trace_timestamp_ms;
  put(j, "submit_ms", r.submit_ms);
  put(j, "end_ms", r.end_ms);
  put(j, "send_lag_ms", r.send_lag_ms);
  put(j, "end_unix_ms", r.end_unix_ms);
  j["input_tokens"] = r.input_tokens;
  j["output_tokens_requested"] = r.output_tokens_requested;
  put(j, "output_tokens", r.output_tokens);
  if (!r.output_tokens_source.empty()) j["output_tokens_source"] = r.output_tokens_source;
  j["outcome"] = outcome_name(r.outcome);
  if (!r.reason.empty()) j["reason"] = r.reason;
  put(j, "accepted", r.accepted);
  if (!r.prefill_instance.empty()) j["prefill_instance"] = r.prefill_instance;
  if (!r.decode_instance.empty()) j["decode_instance"] = r.decode_instance;
  put(j, "ttft_ms", r.ttft_ms);
  put(j, "e2e_ms", r.e2e_ms);
  put(j, "tpot_ms", r.tpot_ms);
  if (r.tbt) {
    j["tbt_gaps"] = r.tbt->gaps;
    j["tbt_mean_ms"] = r.tbt->mean_ms;
    j["tbt_max_ms"] = r.tbt->max_ms;
    j["tbt_top10_mean_ms"] = r.tbt->top10_mean_ms;
  }
  if (!r.output_token_ids.empty()) j["output_token_ids"] = r.output_token_ids;
  json l = json::object();
  const Ledger& g = r.ledger;
  put(l, "prompt_tokens", g.prompt_tokens);
  put(l, "hit_tokens_local", g.hit_tokens_local);
  put(l, "hit_tokens_remote", g.hit_tokens_remote);
  put(l, "hit_tokens_ssd", g.hit_tokens_ssd);
  put(l, "avoided_prefill_tokens", g.avoided_prefill_tokens);
  put(l, "transfer_bytes", g.transfer_bytes);
  put(l, "transfer_ms", g.transfer_ms);
  put(l, "queue_ms", g.queue_ms);
  put(l, "prefill_ms", g.prefill_ms);
  put(l, "decision", g.decision);
  put(l, "predicted_ttft_ms", g.predicted_ttft_ms);
  put(l, "planned_hit_tokens", g.planned_hit_tokens);
  put(l, "pool_prefix_tokens", g.pool_prefix_tokens);
  put(l, "predicted_tbt_ms", g.predicted_tbt_ms);
  put(l, "pipeline_stages", g.pipeline_stages);
  put(l, "single_ttft_ms", g.single_ttft_ms);
  j["ledger"] = std::move(l);
  return j;
}

Result<RequestRecord> record_from_json(const json& j) {
  if (!j.is_object()) return Status(Code::kInvalidArgument, "record is not a JSON object");
  RequestRecord r;
  MC_RETURN_IF_ERROR(get_required(j, "request_id", r.request_id));
  MC_RETURN_IF_ERROR(get_required(j, "trace_line", r.trace_line));
  MC_RETURN_IF_ERROR(get_required(j, "trace_timestamp_ms", r.trace_timestamp_ms));
  MC_RETURN_IF_ERROR(get(j, "submit_ms", r.submit_ms));
  MC_RETURN_IF_ERROR(get(j, "end_ms", r.end_ms));
  MC_RETURN_IF_ERROR(get(j, "send_lag_ms", r.send_lag_ms));
  MC_RETURN_IF_ERROR(get(j, "end_unix_ms", r.end_unix_ms));
  MC_RETURN_IF_ERROR(get_required(j, "input_tokens", r.input_tokens));
  MC_RETURN_IF_ERROR(get_required(j, "output_tokens_requested", r.output_tokens_requested));
  MC_RETURN_IF_ERROR(get(j, "output_tokens", r.output_tokens));
  std::optional<std::string> s;
  MC_RETURN_IF_ERROR(get(j, "output_tokens_source", s));
  r.output_tokens_source = s.value_or("");
  std::string outcome;
  MC_RETURN_IF_ERROR(get_required(j, "outcome", outcome));
  MC_ASSIGN_OR_RETURN(r.outcome, parse_outcome(outcome));
  MC_RETURN_IF_ERROR(get(j, "accepted", r.accepted));
  s.reset();
  MC_RETURN_IF_ERROR(get(j, "reason", s));
  r.reason = s.value_or("");
  s.reset();
  MC_RETURN_IF_ERROR(get(j, "prefill_instance", s));
  r.prefill_instance = s.value_or("");
  s.reset();
  MC_RETURN_IF_ERROR(get(j, "decode_instance", s));
  r.decode_instance = s.value_or("");
  MC_RETURN_IF_ERROR(get(j, "ttft_ms", r.ttft_ms));
  MC_RETURN_IF_ERROR(get(j, "e2e_ms", r.e2e_ms));
  MC_RETURN_IF_ERROR(get(j, "tpot_ms", r.tpot_ms));
  if (j.contains("tbt_gaps")) {
    TbtStats t;
    MC_RETURN_IF_ERROR(get_required(j, "tbt_gaps", t.gaps));
    MC_RETURN_IF_ERROR(get_required(j, "tbt_mean_ms", t.mean_ms));
    MC_RETURN_IF_ERROR(get_required(j, "tbt_max_ms", t.max_ms));
    MC_RETURN_IF_ERROR(get_required(j, "tbt_top10_mean_ms", t.top10_mean_ms));
    r.tbt = t;
  }
  if (auto t = j.find("output_token_ids"); t != j.end()) {
    try {
      r.output_token_ids = t->get<std::vector<uint32_t>>();
    } catch (const std::exception& e) {
      return Status(Code::kInvalidArgument, std::string("record field \"output_token_ids\": ") + e.what());
    }
  }
  auto lit = j.find("ledger");
  if (lit != j.end()) {
    if (!lit->is_object()) return Status(Code::kInvalidArgument, "record field \"ledger\" is not an object");
    const json& l = *lit;
    Ledger& g = r.ledger;
    MC_RETURN_IF_ERROR(get(l, "prompt_tokens", g.prompt_tokens));
    MC_RETURN_IF_ERROR(get(l, "hit_tokens_local", g.hit_tokens_local));
    MC_RETURN_IF_ERROR(get(l, "hit_tokens_remote", g.hit_tokens_remote));
    MC_RETURN_IF_ERROR(get(l, "hit_tokens_ssd", g.hit_tokens_ssd));
    MC_RETURN_IF_ERROR(get(l, "avoided_prefill_tokens", g.avoided_prefill_tokens));
    MC_RETURN_IF_ERROR(get(l, "transfer_bytes", g.transfer_bytes));
    MC_RETURN_IF_ERROR(get(l, "transfer_ms", g.transfer_ms));
    MC_RETURN_IF_ERROR(get(l, "queue_ms", g.queue_ms));
    MC_RETURN_IF_ERROR(get(l, "prefill_ms", g.prefill_ms));
    MC_RETURN_IF_ERROR(get(l, "decision", g.decision));
    MC_RETURN_IF_ERROR(get(l, "predicted_ttft_ms", g.predicted_ttft_ms));
    MC_RETURN_IF_ERROR(get(l, "planned_hit_tokens", g.planned_hit_tokens));
    MC_RETURN_IF_ERROR(get(l, "pool_prefix_tokens", g.pool_prefix_tokens));
    MC_RETURN_IF_ERROR(get(l, "predicted_tbt_ms", g.predicted_tbt_ms));
    MC_RETURN_IF_ERROR(get(l, "pipeline_stages", g.pipeline_stages));
    MC_RETURN_IF_ERROR(get(l, "single_ttft_ms", g.single_ttft_ms));
  }
  return r;
}

Result<std::vector<RequestRecord>> read_records_jsonl(std::istream& in, const std::string& source_name) {
  std::vector<RequestRecord> out;
  std::string line;
  int64_t line_no = 0;
  for (LineRead got; (got = read_line_bounded(in, line)) != LineRead::kEnd;) {
    ++line_no;
    if (got == LineRead::kTooLong) {
      return Status(Code::kInvalidArgument, source_name + ":" + std::to_string(line_no) + ": a line longer than " +
                                                std::to_string(kMaxInputLineBytes >> 20) +
                                                " MiB: not a record (one JSON object per line)");
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large ("1e999")
      return Status(Code::kInvalidArgument,
                    source_name + ":" + std::to_string(line_no) + ": not valid JSON (" + e.what() + ")");
    }
    auto r = record_from_json(j);
    if (!r.is_ok()) return r.status().with_context(source_name + ":" + std::to_string(line_no));
    out.push_back(std::move(r).value());
  }
  return out;
}

// ---- summary ----

double quantile_sorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) return 0;
  if (sorted.size() == 1) return sorted.front();
  double pos = q * static_cast<double>(sorted.size() - 1);
  auto lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

std::optional<Distribution> distribution(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = quantile_sorted(values, 0.50);
  d.p90 = quantile_sorted(values, 0.90);
  d.p99 = quantile_sorted(values, 0.99);
  d.max = values.back();
  return d;
}

double CacheSummary::ratio(int64_t tokens) const {
  return prompt_tokens > 0 ? static_cast<double>(tokens) / static_cast<double>(prompt_tokens) : 0.0;
}
double CacheSummary::hit_ratio() const { return ratio(hit_tokens_local + hit_tokens_remote + hit_tokens_ssd); }

namespace {

// Measured-vs-predicted pairs of one figure, summarised into a PredictionSummary.
class PredictionAccumulator {
 public:
  void add(double measured, double predicted) {
    const double err = measured - predicted;
    err_sum_ += err;
    abs_err_.push_back(std::abs(err));
    if (measured > 0) pct_err_.push_back(std::abs(err) / measured);
  }
  PredictionSummary summary() const {
    PredictionSummary p;
    if (abs_err_.empty()) return p;
    auto d = distribution(abs_err_);
    p.count = d->count;
    p.mean_abs_error_ms = d->mean;
    p.p90_abs_error_ms = d->p90;
    p.mean_error_ms = err_sum_ / static_cast<double>(abs_err_.size());
    if (!pct_err_.empty())
      p.mean_abs_pct_error =
          std::accumulate(pct_err_.begin(), pct_err_.end(), 0.0) / static_cast<double>(pct_err_.size());
    return p;
  }

 private:
  std::vector<double> abs_err_, pct_err_;
  double err_sum_ = 0;
};

}  // namespace

Summary summarize(std::span<const RequestRecord> records, const SummaryOptions& options) {
  Summary s;
  std::vector<double> ttft, tbt, tpot, e2e;
  PredictionAccumulator ttft_pred, tbt_pred;
  std::optional<double> first_submit, last_end;
  for (const RequestRecord& r : records) {
    ++s.offered;
    switch (r.outcome) {
      case Outcome::kCompleted:
        ++s.accepted;
        ++s.completed;
        break;
      case Outcome::kFailed:
        ++s.failed;
        if (r.accepted.value_or(true)) {
          ++s.accepted;
        } else {
          ++s.submit_failed;
        }
        break;
      case Outcome::kRejected:
        ++s.rejected;
        break;
    }
    if (r.outcome != Outcome::kCompleted) {
      const std::string reason = r.reason.empty() ? "(no reason given)" : r.reason;
      s.reasons[reason]++;
      // The kind is the text before the first ": " (a colon inside an endpoint, tcp://host:port, is not a cut).
      auto& [count, example] = s.reason_kinds[reason.substr(0, reason.find(": "))];
      if (count++ == 0) example = reason;
    }
    if (r.send_lag_ms) {
      if (*r.send_lag_ms > options.late_send_threshold_ms) ++s.late_sends;
      s.max_send_lag_ms = std::max(s.max_send_lag_ms.value_or(*r.send_lag_ms), *r.send_lag_ms);
    }
    if (r.submit_ms) {
      first_submit = std::min(first_submit.value_or(*r.submit_ms), *r.submit_ms);
      double end = *r.submit_ms + r.e2e_ms.value_or(0.0);
      last_end = std::max(last_end.value_or(end), end);
    }
    const Ledger& g = r.ledger;
    if (g.prompt_tokens) {
      ++s.cache.requests_with_ledger;
      s.cache.prompt_tokens += *g.prompt_tokens;
      s.cache.hit_tokens_local += g.hit_tokens_local.value_or(0);
      s.cache.hit_tokens_remote += g.hit_tokens_remote.value_or(0);
      s.cache.hit_tokens_ssd += g.hit_tokens_ssd.value_or(0);
    }
    s.cache.avoided_prefill_tokens += g.avoided_prefill_tokens.value_or(0);
    s.cache.transfer_bytes += g.transfer_bytes.value_or(0);
    if (r.outcome != Outcome::kCompleted) continue;
    s.output_tokens_requested += r.output_tokens_requested;
    s.output_tokens += r.output_tokens.value_or(0);
    if (r.output_tokens_source == "counted") ++s.output_tokens_counted;
    if (r.ttft_ms) ttft.push_back(*r.ttft_ms);
    if (r.tbt) tbt.push_back(r.tbt->top10_mean_ms);
    if (r.tpot_ms) tpot.push_back(*r.tpot_ms);
    if (r.e2e_ms) e2e.push_back(*r.e2e_ms);
    if (r.ttft_ms && g.predicted_ttft_ms) ttft_pred.add(*r.ttft_ms, *g.predicted_ttft_ms);
    if (r.tbt && g.predicted_tbt_ms) tbt_pred.add(r.tbt->mean_ms, *g.predicted_tbt_ms);
  }
  s.ttft_ms = distribution(std::move(ttft));
  s.tbt_ms = distribution(std::move(tbt));
  s.tpot_ms = distribution(std::move(tpot));
  s.e2e_ms = distribution(std::move(e2e));
  s.prediction = ttft_pred.summary();
  s.tbt_prediction = tbt_pred.summary();
  s.span_s = options.span_s > 0           ? options.span_s
             : (first_submit && last_end) ? (*last_end - *first_submit) / 1000.0
                                          : 0.0;
  for (double ttft_limit : options.slo_ttft_ms) {
    for (double tbt_limit : options.slo_tbt_ms) {
      SloResult slo;
      slo.ttft_ms = ttft_limit;
      slo.tbt_ms = tbt_limit;
      for (const RequestRecord& r : records) {
        if (r.outcome != Outcome::kCompleted || !r.ttft_ms) continue;
        if (*r.ttft_ms > ttft_limit) continue;
        if (r.tbt && r.tbt->top10_mean_ms > tbt_limit) continue;
        ++slo.met;
      }
      if (s.offered > 0) slo.attainment = static_cast<double>(slo.met) / static_cast<double>(s.offered);
      if (s.accepted > 0) slo.attainment_accepted = static_cast<double>(slo.met) / static_cast<double>(s.accepted);
      if (s.span_s > 0) slo.goodput_rps = static_cast<double>(slo.met) / s.span_s;
      s.slo.push_back(slo);
    }
  }
  return s;
}

// ---- rendering ----

using mc::report::fixed;
using mc::report::pct;

json to_json(const Summary& s, const RunInfo& info) {
  json j = json::object();
  j["config"] = mc::report::run_info_json(info);
  j["requests"] = {{"offered", s.offered},      {"accepted", s.accepted}, {"rejected", s.rejected},
                   {"completed", s.completed},  {"failed", s.failed},     {"submit_failed", s.submit_failed},
                   {"late_sends", s.late_sends}};
  if (s.max_send_lag_ms) j["requests"]["max_send_lag_ms"] = *s.max_send_lag_ms;
  j["acceptance_rate"] = s.offered > 0 ? static_cast<double>(s.accepted) / static_cast<double>(s.offered) : 0.0;
  j["reasons"] = s.reasons;
  j["reason_kinds"] = json::object();
  for (const auto& [kind, ce] : s.reason_kinds) j["reason_kinds"][kind] = {{"count", ce.first}, {"example", ce.second}};
  j["span_s"] = s.span_s;
  j["output_tokens"] = {{"requested", s.output_tokens_requested},
                        {"produced", s.output_tokens},
                        {"requests_counted_not_reported", s.output_tokens_counted}};
  j["ttft_ms"] = format::distribution_json(s.ttft_ms);
  j["tbt_ms"] = format::distribution_json(s.tbt_ms);
  j["tpot_ms"] = format::distribution_json(s.tpot_ms);
  j["e2e_ms"] = format::distribution_json(s.e2e_ms);
  json slo = json::array();
  for (const SloResult& r : s.slo) {
    slo.push_back({{"ttft_ms", r.ttft_ms},
                   {"tbt_ms", r.tbt_ms},
                   {"met", r.met},
                   {"attainment", r.attainment},
                   {"attainment_accepted", r.attainment_accepted},
                   {"goodput_rps", r.goodput_rps}});
  }
  j["slo"] = std::move(slo);
  const CacheSummary& c = s.cache;
  j["cache"] = {{"requests_with_ledger", c.requests_with_ledger},
                {"prompt_tokens", c.prompt_tokens},
                {"hit_tokens_local", c.hit_tokens_local},
                {"hit_tokens_remote", c.hit_tokens_remote},
                {"hit_tokens_ssd", c.hit_tokens_ssd},
                {"hit_ratio", c.hit_ratio()},
                {"hit_ratio_local", c.ratio(c.hit_tokens_local)},
                {"hit_ratio_remote", c.ratio(c.hit_tokens_remote)},
                {"hit_ratio_ssd", c.ratio(c.hit_tokens_ssd)},
                {"avoided_prefill_tokens", c.avoided_prefill_tokens},
                {"transfer_bytes", c.transfer_bytes}};
  auto prediction_json = [](const PredictionSummary& p) {
    return json{{"count", p.count},
                {"mean_abs_error_ms", p.mean_abs_error_ms},
                {"mean_error_ms", p.mean_error_ms},
                {"p90_abs_error_ms", p.p90_abs_error_ms},
                {"mean_abs_pct_error", p.mean_abs_pct_error}};
  };
  j["prediction"] = prediction_json(s.prediction);
  j["tbt_prediction"] = prediction_json(s.tbt_prediction);
  return j;
}

void print_table(std::ostream& out, const Summary& s, const RunInfo& info) {
  mc::report::print_run_header(out, info);

  double accept = s.offered > 0 ? static_cast<double>(s.accepted) / static_cast<double>(s.offered) : 0.0;
  mc::report::print_table(out, {{"requests", "offered", "accepted", "rejected", "completed", "failed", "submit_failed",
                                 "accepted_%", "late_sends", "span_s"},
                                {"", std::to_string(s.offered), std::to_string(s.accepted), std::to_string(s.rejected),
                                 std::to_string(s.completed), std::to_string(s.failed), std::to_string(s.submit_failed),
                                 pct(accept), std::to_string(s.late_sends), fixed(s.span_s, 1)}});
  // One line per kind of reason (a run can reject hundreds of requests, each message with its own numbers);
  // --json has every distinct reason.
  for (const auto& [kind, ce] : s.reason_kinds) {
    out << "  " << ce.first << " x " << kind;
    if (ce.second != kind) {
      const size_t from = ce.second.find_first_not_of(' ', kind.size() + 1);
      out << "  (e.g. " << (from == std::string::npos ? ce.second : ce.second.substr(from)) << ")";
    }
    out << "\n";
  }
  out << "\n";

  std::vector<std::vector<std::string>> lat = {{"latency", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms"}};
  auto row = [&](const char* name, const std::optional<Distribution>& d) {
    if (!d) {
      lat.push_back({name, "0", "-", "-", "-", "-", "-"});
      return;
    }
    lat.push_back({name, std::to_string(d->count), fixed(d->mean, 1), fixed(d->p50, 1), fixed(d->p90, 1),
                   fixed(d->p99, 1), fixed(d->max, 1)});
  };
  row("TTFT", s.ttft_ms);
  row("TBT (top-10% mean)", s.tbt_ms);
  row("TPOT", s.tpot_ms);
  row("E2E", s.e2e_ms);
  mc::report::print_table(out, lat);
  out << "output tokens: " << s.output_tokens << " produced of " << s.output_tokens_requested << " requested";
  if (s.output_tokens_counted > 0)
    out << " (" << s.output_tokens_counted << " requests without a server count: tokens counted)";
  out << "\n\n";

  std::vector<std::vector<std::string>> slo = {
      {"SLO", "ttft_ms", "tbt_ms", "met", "attainment_%", "of_accepted_%", "goodput_req/s"}};
  for (const SloResult& r : s.slo)
    slo.push_back({"", fixed(r.ttft_ms, 0), fixed(r.tbt_ms, 0), std::to_string(r.met), pct(r.attainment),
                   pct(r.attainment_accepted), fixed(r.goodput_rps, 3)});
  mc::report::print_table(out, slo);
  out << "\n";

  const CacheSummary& c = s.cache;
  mc::report::print_table(
      out,
      {{"cache", "prompt_tokens", "hit_%", "local_%", "remote_%", "ssd_%", "avoided_prefill_tokens", "transfer_bytes"},
       {"", std::to_string(c.prompt_tokens), pct(c.hit_ratio()), pct(c.ratio(c.hit_tokens_local)),
        pct(c.ratio(c.hit_tokens_remote)), pct(c.ratio(c.hit_tokens_ssd)), std::to_string(c.avoided_prefill_tokens),
        std::to_string(c.transfer_bytes)}});
  out << "\n";
  std::vector<std::vector<std::string>> pred = {
      {"prediction", "count", "mean_abs_err_ms", "mean_err_ms", "p90_abs_err_ms", "mean_abs_err_%"}};
  for (const auto& [name, p] : {std::pair<const char*, const PredictionSummary&>{"TTFT", s.prediction},
                                std::pair<const char*, const PredictionSummary&>{"TBT (mean gap)", s.tbt_prediction}}) {
    pred.push_back({name, std::to_string(p.count), fixed(p.mean_abs_error_ms, 1), fixed(p.mean_error_ms, 1),
                    fixed(p.p90_abs_error_ms, 1), pct(p.mean_abs_pct_error)});
  }
  mc::report::print_table(out, pred);
}

std::vector<std::vector<std::string>> comparison_rows(const std::vector<std::pair<std::string, Summary>>& runs) {
  std::string slo_head = "slo_%";
  if (!runs.empty() && !runs.front().second.slo.empty()) {
    const SloResult& f = runs.front().second.slo.front();
    slo_head = "slo_" + fixed(f.ttft_ms, 0) + "ms/" + fixed(f.tbt_ms, 0) + "ms_%";
  }
  std::vector<std::vector<std::string>> rows = {{"run", "offered", "accepted_%", "completed", "ttft_mean_ms",
                                                 "ttft_p90_ms", "tbt_p90_ms", slo_head, "goodput_req/s", "hit_%",
                                                 "avoided_prefill_tokens"}};
  auto d = [](const std::optional<Distribution>& x, double Distribution::*f) {
    return x ? fixed((*x).*f, 1) : std::string("-");
  };
  for (const auto& [name, s] : runs) {
    double accept = s.offered > 0 ? static_cast<double>(s.accepted) / static_cast<double>(s.offered) : 0.0;
    const SloResult* f = s.slo.empty() ? nullptr : &s.slo.front();
    rows.push_back({name, std::to_string(s.offered), pct(accept), std::to_string(s.completed),
                    d(s.ttft_ms, &Distribution::mean), d(s.ttft_ms, &Distribution::p90),
                    d(s.tbt_ms, &Distribution::p90), f ? pct(f->attainment) : "-", f ? fixed(f->goodput_rps, 3) : "-",
                    pct(s.cache.hit_ratio()), std::to_string(s.cache.avoided_prefill_tokens)});
  }
  return rows;
}

void print_comparison(std::ostream& out, const std::vector<std::pair<std::string, Summary>>& runs) {
  mc::report::print_table(out, comparison_rows(runs));
}

}  // namespace mc::replay
