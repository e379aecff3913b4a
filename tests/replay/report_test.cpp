#include "mc/report/report.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace mc::replay {
namespace {

TEST(ReplayTbt, PaperStatisticIsMeanOfLongestTenPercent) {
  // 20 gaps: 18 of 10 ms and two of 100/60 ms -> top 10 % = 2 gaps -> (100 + 60) / 2.
  std::vector<double> gaps(18, 10.0);
  gaps.push_back(100.0);
  gaps.push_back(60.0);
  auto s = tbt_stats(gaps);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->gaps, 20);
  EXPECT_DOUBLE_EQ(s->top10_mean_ms, 80.0);
  EXPECT_DOUBLE_EQ(s->max_ms, 100.0);
  EXPECT_DOUBLE_EQ(s->mean_ms, (18 * 10.0 + 160.0) / 20);
  // 11 gaps -> ceil(1.1) = 2 gaps; 3 gaps -> 1 gap.
  std::vector<double> eleven = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 50};
  EXPECT_DOUBLE_EQ(tbt_stats(eleven)->top10_mean_ms, 30.0);
  std::vector<double> three = {5, 7, 6};
  EXPECT_DOUBLE_EQ(tbt_stats(three)->top10_mean_ms, 7.0);
  EXPECT_FALSE(tbt_stats({}));
}

// Field report #16: output_length 128 requested, the server stops after 7 tokens; first token at
// 0.5 s, last at 1.1 s; the stream's final chunk carries completion_tokens = 7 without text.
TEST(ReplayRecord, TpotFromTokensActuallyProduced) {
  RequestRecord r;
  r.output_tokens_requested = 128;
  r.outcome = Outcome::kCompleted;
  std::vector<double> token_ms = {500, 600, 700, 800, 900, 1000, 1100};
  apply_token_times(r, token_ms, int64_t{7});
  ASSERT_TRUE(r.output_tokens);
  EXPECT_EQ(*r.output_tokens, 7);
  EXPECT_EQ(r.output_tokens_source, "usage");
  EXPECT_DOUBLE_EQ(*r.ttft_ms, 500.0);
  EXPECT_DOUBLE_EQ(*r.e2e_ms, 1100.0);
  EXPECT_NEAR(*r.tpot_ms, 100.0, 1e-9);
  EXPECT_EQ(r.output_tokens_requested, 128);

  // Step 2: a stream without usage -> counted, and flagged as counted.
  RequestRecord c;
  c.output_tokens_requested = 128;
  apply_token_times(c, token_ms, std::nullopt);
  EXPECT_EQ(*c.output_tokens, 7);
  EXPECT_EQ(c.output_tokens_source, "counted");
  EXPECT_NEAR(*c.tpot_ms, 100.0, 1e-9);

  // Usage wins over coalesced events: 7 tokens delivered as 4 events (first alone, last three at 1.1 s).
  RequestRecord b;
  std::vector<double> batched = {500, 700, 900, 1100};
  apply_token_times(b, batched, int64_t{7});
  EXPECT_EQ(*b.output_tokens, 7);
  EXPECT_NEAR(*b.tpot_ms, 100.0, 1e-9);
}

TEST(ReplayRecord, NeverMeasuredIsAbsentNotZero) {
  RequestRecord r;
  r.request_id = "r1";
  r.outcome = Outcome::kRejected;
  r.reason = "predicted TTFT 41000 ms > SLO 30000 ms";
  auto j = to_json(r);
  for (const char* key : {"ttft_ms", "e2e_ms", "tpot_ms", "tbt_top10_mean_ms", "output_tokens", "submit_ms"})
    EXPECT_FALSE(j.contains(key)) << key << " in " << j.dump();
  EXPECT_TRUE(j["ledger"].empty());
  EXPECT_EQ(j["outcome"], "rejected");

  // One token: TTFT and E2E exist; no gap, so no TBT and no TPOT.
  RequestRecord one;
  one.outcome = Outcome::kCompleted;
  std::vector<double> t = {42.0};
  apply_token_times(one, t, int64_t{1});
  auto j1 = to_json(one);
  EXPECT_EQ(j1["ttft_ms"], 42.0);
  EXPECT_FALSE(j1.contains("tpot_ms"));
  EXPECT_FALSE(j1.contains("tbt_gaps"));
}

TEST(ReplayRecord, JsonRoundTrip) {
  RequestRecord r;
  r.request_id = "conv-000017";
  r.trace_line = 17;
  r.trace_timestamp_ms = 3000;
  r.submit_ms = 150.25;
  r.send_lag_ms = 0.4;
  r.input_tokens = 6758;
  r.output_tokens_requested = 500;
  r.outcome = Outcome::kCompleted;
  r.prefill_instance = "prefill-0";
  r.decode_instance = "decode-1";
  std::vector<double> token_ms = {812.5, 850, 890, 960};
  apply_token_times(r, token_ms, int64_t{4});
  r.ledger.prompt_tokens = 6758;
  r.ledger.hit_tokens_local = 512;
  r.ledger.hit_tokens_remote = 1024;
  r.ledger.hit_tokens_ssd = 0;
  r.ledger.avoided_prefill_tokens = 1536;
  r.ledger.transfer_bytes = 1536LL * 327680;
  r.ledger.transfer_ms = 12.5;
  r.ledger.queue_ms = 3;
  r.ledger.prefill_ms = 700;
  r.ledger.decision = "fetch";
  r.ledger.predicted_ttft_ms = 790;
  r.ledger.planned_hit_tokens = 1536;
  r.ledger.pool_prefix_tokens = 2048;
  auto j = to_json(r);
  auto back = record_from_json(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(to_json(*back), j);
  EXPECT_EQ(back->ledger.hit_tokens(), 1536);
  EXPECT_EQ(j["ledger"]["planned_hit_tokens"], 1536);
  EXPECT_EQ(j["ledger"]["pool_prefix_tokens"], 2048);

  auto bad = record_from_json(nlohmann::json{{"request_id", "x"}});
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("trace_line"), std::string::npos);
  auto j2 = j;
  j2["ttft_ms"] = "fast";
  auto bad2 = record_from_json(j2);
  EXPECT_FALSE(bad2.is_ok());
  EXPECT_NE(bad2.status().message().find("ttft_ms"), std::string::npos);
  j2 = j;
  j2["outcome"] = "maybe";
  EXPECT_FALSE(record_from_json(j2).is_ok());
  // Impossible values (a damaged or forged record) are refused, naming the field: they would swamp every mean.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"ttft_ms", -5.0}, {"ttft_ms", 1e308}, {"submit_ms", 1e300}, {"e2e_ms", -1}, {"input_tokens", 1e18}}) {
    j2 = j;
    j2[key] = value;
    auto refused = record_from_json(j2);
    EXPECT_FALSE(refused.is_ok()) << key << " = " << value.dump();
    if (!refused.is_ok()) {
      EXPECT_NE(refused.status().message().find(key), std::string::npos);
    }
  }
  j2 = j;
  j2["ledger"]["queue_ms"] = -1;  // a ledger's "not measured" stays accepted
  EXPECT_TRUE(record_from_json(j2).is_ok());
}

TEST(ReplaySummary, QuantilesInterpolateLinearly) {
  std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile_sorted(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile_sorted(v, 0.9), 3.7);
  auto d = distribution({4, 1, 3, 2});
  ASSERT_TRUE(d);
  EXPECT_DOUBLE_EQ(d->mean, 2.5);
  EXPECT_DOUBLE_EQ(d->p99, 3.97);
  EXPECT_DOUBLE_EQ(d->max, 4);
  EXPECT_FALSE(distribution({}));
}

std::vector<RequestRecord> sample_run() {
  std::vector<RequestRecord> rs;
  auto completed = [&](double submit, double ttft, double gap, int tokens, int64_t prompt, int64_t local,
                       int64_t remote, double predicted) {
    RequestRecord r;
    r.request_id = "r" + std::to_string(rs.size());
    r.submit_ms = submit;
    r.send_lag_ms = 0.5;
    r.outcome = Outcome::kCompleted;
    r.output_tokens_requested = tokens + 10;
    std::vector<double> t;
    for (int i = 0; i < tokens; ++i) t.push_back(ttft + gap * i);
    apply_token_times(r, t, int64_t{tokens});
    r.ledger.prompt_tokens = prompt;
    r.ledger.hit_tokens_local = local;
    r.ledger.hit_tokens_remote = remote;
    r.ledger.hit_tokens_ssd = 0;
    r.ledger.avoided_prefill_tokens = local + remote;
    r.ledger.transfer_bytes = remote * 100;
    r.ledger.predicted_ttft_ms = predicted;
    rs.push_back(r);
  };
  completed(0, 1000, 50, 11, 1000, 500, 0, 900);        // meets 30 s / 100 ms
  completed(1000, 2000, 150, 11, 2000, 0, 1000, 2100);  // TBT 150: meets only 200 and 300
  completed(2000, 40000, 50, 21, 1000, 0, 0, 40000);    // TTFT too long; ends at 2000 + 41000
  RequestRecord rej;
  rej.request_id = "r3";
  rej.submit_ms = 3000;
  rej.send_lag_ms = 25;  // late
  rej.outcome = Outcome::kRejected;
  rej.reason = "no instance meets the TTFT SLO";
  rs.push_back(rej);
  RequestRecord fail;
  fail.request_id = "r4";
  fail.submit_ms = 4000;
  fail.outcome = Outcome::kFailed;
  fail.reason = "prefill aborted";
  rs.push_back(fail);
  return rs;
}

TEST(ReplaySummary, CountsSloGoodputCacheAndPrediction) {
  auto rs = sample_run();
  Summary s = summarize(rs, SummaryOptions{});
  EXPECT_EQ(s.offered, 5);
  EXPECT_EQ(s.accepted, 4);
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.late_sends, 1);
  EXPECT_DOUBLE_EQ(*s.max_send_lag_ms, 25);
  EXPECT_EQ(s.reasons.at("prefill aborted"), 1);
  EXPECT_EQ(s.reasons.at("no instance meets the TTFT SLO"), 1);
  EXPECT_DOUBLE_EQ(s.span_s, 43.0);  // 0 -> 2000 + 41000 ms
  ASSERT_TRUE(s.ttft_ms);
  EXPECT_EQ(s.ttft_ms->count, 3);
  EXPECT_DOUBLE_EQ(s.ttft_ms->p50, 2000);
  EXPECT_DOUBLE_EQ(s.tpot_ms->max, 150);
  EXPECT_EQ(s.output_tokens, 43);
  EXPECT_EQ(s.output_tokens_requested, 73);
  ASSERT_EQ(s.slo.size(), 3u);
  EXPECT_EQ(s.slo[0].tbt_ms, 100);
  EXPECT_EQ(s.slo[0].met, 1);
  EXPECT_EQ(s.slo[1].met, 2);
  EXPECT_EQ(s.slo[2].met, 2);
  EXPECT_DOUBLE_EQ(s.slo[1].attainment, 2.0 / 5);
  EXPECT_DOUBLE_EQ(s.slo[1].attainment_accepted, 2.0 / 4);
  EXPECT_DOUBLE_EQ(s.slo[1].goodput_rps, 2.0 / 43);
  EXPECT_EQ(s.cache.prompt_tokens, 4000);
  EXPECT_DOUBLE_EQ(s.cache.hit_ratio(), 1500.0 / 4000);
  EXPECT_DOUBLE_EQ(s.cache.ratio(s.cache.hit_tokens_remote), 0.25);
  EXPECT_EQ(s.cache.avoided_prefill_tokens, 1500);
  EXPECT_EQ(s.cache.transfer_bytes, 100000);
  EXPECT_EQ(s.prediction.count, 3);
  EXPECT_DOUBLE_EQ(s.prediction.mean_abs_error_ms, 200.0 / 3);
  EXPECT_DOUBLE_EQ(s.prediction.mean_error_ms, 0.0);

  SummaryOptions o;
  o.slo_ttft_ms = {1500, 30000};
  o.slo_tbt_ms = {200};
  o.span_s = 10;
  Summary s2 = summarize(rs, o);
  ASSERT_EQ(s2.slo.size(), 2u);
  EXPECT_EQ(s2.slo[0].met, 1);
  EXPECT_EQ(s2.slo[1].met, 2);
  EXPECT_DOUBLE_EQ(s2.slo[1].goodput_rps, 0.2);
}

TEST(ReplaySummary, JsonAndTableRender) {
  auto rs = sample_run();
  Summary s = summarize(rs, SummaryOptions{});
  auto j = to_json(s, {{"tool", "mc-trace-replay"}, {"speed", "10"}});
  EXPECT_EQ(j["requests"]["offered"], 5);
  EXPECT_EQ(j["config"]["speed"], "10");
  EXPECT_EQ(j["slo"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["cache"]["hit_ratio"].get<double>(), 0.375);
  EXPECT_EQ(j["ttft_ms"]["count"], 3);
  std::ostringstream os;
  print_table(os, s, {{"tool", "mc-trace-replay"}});
  std::string t = os.str();
  for (const char* want : {"tool=mc-trace-replay", "offered", "TTFT", "mean_ms", "p99_ms", "attainment_%",
                           "goodput_req/s", "hit_%", "ssd_%", "avoided_prefill_tokens", "mean_abs_err_ms"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;

  Summary empty = summarize({}, SummaryOptions{});
  std::ostringstream os2;
  print_table(os2, empty);
  EXPECT_NE(os2.str().find("offered"), std::string::npos);
  EXPECT_EQ(to_json(empty)["ttft_ms"]["count"], 0);
}

// The table names each kind of reason once, with a count and an example (a run rejects hundreds of
// requests, each message with its own numbers); --json keeps every distinct reason too.
TEST(ReplaySummary, ReasonsAreGroupedByKind) {
  std::vector<RequestRecord> rs;
  for (const char* why : {"kv_capacity: no decode instance can reserve 5973 KV tokens",
                          "kv_capacity: no decode instance can reserve 103270 KV tokens",
                          "ttft_slo: predicted 30598 ms", "kv_capacity: no decode instance can reserve 5973 KV tokens",
                          "prefill aborted", "instance 'd0' closed its connection at tcp://127.0.0.1:44127 (killed)"}) {
    RequestRecord r;
    r.request_id = "r" + std::to_string(rs.size());
    r.outcome = Outcome::kRejected;
    r.reason = why;
    rs.push_back(r);
  }
  Summary s = summarize(rs, SummaryOptions{});
  EXPECT_EQ(s.reasons.size(), 5u);
  ASSERT_EQ(s.reason_kinds.size(), 4u);
  // A colon inside an endpoint does not cut the kind.
  EXPECT_EQ(s.reason_kinds.count("instance 'd0' closed its connection at tcp://127.0.0.1:44127 (killed)"), 1u);
  EXPECT_EQ(s.reason_kinds.at("kv_capacity").first, 3);
  EXPECT_EQ(s.reason_kinds.at("kv_capacity").second, "kv_capacity: no decode instance can reserve 5973 KV tokens");
  EXPECT_EQ(s.reason_kinds.at("ttft_slo").first, 1);
  EXPECT_EQ(s.reason_kinds.at("prefill aborted").first, 1);
  std::ostringstream os;
  print_table(os, s);
  const std::string t = os.str();
  EXPECT_NE(t.find("  3 x kv_capacity  (e.g. no decode instance can reserve 5973 KV tokens)\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("  1 x ttft_slo  (e.g. predicted 30598 ms)\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  1 x prefill aborted\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("103270"), std::string::npos) << "one line per kind\n" << t;
  auto j = to_json(s);
  EXPECT_EQ(j["reason_kinds"]["kv_capacity"]["count"], 3);
  EXPECT_EQ(j["reasons"].size(), 5u);
}

TEST(ReplayRecords, JsonlReadBack) {
  auto rs = sample_run();
  std::string text;
  for (const auto& r : rs) text += to_json(r).dump() + "\n";
  std::istringstream in(text + "\n");
  auto back = read_records_jsonl(in, "run.jsonl");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), rs.size());
  EXPECT_EQ(to_json(summarize(*back, {})), to_json(summarize(rs, {})));
  std::istringstream bad(text + "{oops\n");
  auto b = read_records_jsonl(bad, "run.jsonl");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("run.jsonl:6"), std::string::npos) << b.status().message();
  // Regression (tests/fuzz/fuzz_trace): a number too large for a double made the JSON parser throw
  // out_of_range past the reader (std::terminate); it is an invalid line naming its number.
  std::istringstream overflow(text + "{\"input_tokens\": 1111111e111111}\n");
  auto o = read_records_jsonl(overflow, "run.jsonl");
  ASSERT_FALSE(o.is_ok());
  EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
  EXPECT_NE(o.status().message().find("run.jsonl:6"), std::string::npos) << o.status().message();
}

}  // namespace
}  // namespace mc::replay
