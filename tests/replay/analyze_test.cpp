#include "mc/replay/analyze.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace mc::replay {
namespace {

const std::string kTrace = MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl";

Result<TraceAnalysis> analyze_text(const std::string& text, AnalyzeOptions opt) {
  std::istringstream in(text);
  opt.reader.source_name = "t.jsonl";
  opt.reader.warn_on_stderr = false;
  trace::Reader reader(in, opt.reader);
  return analyze(reader, opt);
}

// The figures of /work/shared/traces/README.md (computed there independently of this code).
TEST(ReplayAnalyze, ConversationTraceMatchesPublishedFigures) {
  AnalyzeOptions opt;
  auto a = analyze_file(kTrace, opt);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->requests, 12031);
  EXPECT_EQ(a->skipped_rows, 0);
  EXPECT_NEAR(a->span_s, 3537.0, 0.05);
  EXPECT_NEAR(a->arrival_rate_rps, 3.40, 0.005);
  EXPECT_NEAR(a->input_tokens->mean, 12035, 0.5);
  EXPECT_NEAR(a->input_tokens->p50, 6909, 0.5);
  EXPECT_NEAR(a->input_tokens->p90, 27367, 0.5);
  EXPECT_NEAR(a->input_tokens->p99, 85400, 0.5);
  EXPECT_EQ(a->input_tokens->max, 126195);
  EXPECT_NEAR(a->output_tokens->mean, 342.6, 0.05);
  EXPECT_NEAR(a->output_tokens->p50, 350, 0.5);
  EXPECT_NEAR(a->output_tokens->p90, 597, 0.5);
  EXPECT_NEAR(a->output_tokens->p99, 1119, 0.5);
  EXPECT_EQ(a->output_tokens->max, 2000);
  EXPECT_NEAR(a->blocks_per_request->mean, 24.0, 0.05);
  EXPECT_NEAR(a->blocks_per_request->p50, 14, 0.5);
  EXPECT_NEAR(a->blocks_per_request->p99, 167, 0.5);
  EXPECT_EQ(a->total_blocks, 288500);
  EXPECT_EQ(a->distinct_blocks, 182790);
  EXPECT_NEAR(a->infinite.blocks, 0.366, 0.0005);
  EXPECT_NEAR(a->infinite.tokens, 0.374, 0.0005);
  EXPECT_DOUBLE_EQ(a->infinite.blocks, 1.0 - 182790.0 / 288500.0);
  EXPECT_LE(a->infinite.tokens_full_blocks, a->infinite.tokens);
  // LRU: the hit ratio grows with capacity and never exceeds the infinite cache's.
  ASSERT_EQ(a->lru.size(), 4u);
  for (size_t i = 1; i < a->lru.size(); ++i) EXPECT_GE(a->lru[i].hit.tokens, a->lru[i - 1].hit.tokens);
  EXPECT_LE(a->lru.back().hit.tokens, a->infinite.tokens + 1e-12);
  EXPECT_GT(a->lru.front().hit.tokens, 0.0);
  // 182,790 distinct blocks x 512 tokens = 93.6 M tokens: at 100 M nothing is ever evicted, so LRU
  // must equal the infinite cache exactly.
  AnalyzeOptions big;
  big.capacity_tokens = {100'000'000};
  auto b = analyze_file(kTrace, big);
  ASSERT_TRUE(b.is_ok());
  EXPECT_DOUBLE_EQ(b->lru[0].hit.tokens, b->infinite.tokens);
  EXPECT_DOUBLE_EQ(b->lru[0].hit.blocks, b->infinite.blocks);
}

TEST(ReplayAnalyze, HitCountingOnSmallTraces) {
  // r1 [0,1] 1000 tokens; r2 [0,1,2] 1100 tokens -> blocks 0,1 hit; tokens min(1024, 1100) = 1024;
  // full-block hit: r2 has 2 full blocks -> 1024; r3 [0,1] 1000 again: blocks hit 2, tokens
  // min(1024, 1000) = 1000, full blocks: only block 0 is complete -> 512.
  std::string t = R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]})"
                  "\n"
                  R"({"timestamp": 1000, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 2]})"
                  "\n"
                  R"({"timestamp": 3000, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]})"
                  "\n";
  AnalyzeOptions opt;
  opt.capacity_tokens = {1024};  // two blocks: r2 inserts 0,1,2 -> 0 evicted -> r3 misses at block 0
  auto a = analyze_text(t, opt);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->requests, 3);
  EXPECT_EQ(a->total_blocks, 7);
  EXPECT_EQ(a->distinct_blocks, 3);
  EXPECT_DOUBLE_EQ(a->infinite.blocks, 4.0 / 7);
  EXPECT_DOUBLE_EQ(a->infinite.tokens, (1024.0 + 1000.0) / 3100.0);
  EXPECT_DOUBLE_EQ(a->infinite.tokens_full_blocks, (1024.0 + 512.0) / 3100.0);
  EXPECT_DOUBLE_EQ(a->lru[0].hit.blocks, 2.0 / 7);  // r2 hits 0,1; r3: 0 evicted -> prefix miss
  // Distinct timestamps: every earlier row is visible, so the earlier-arrivals figure is the same.
  EXPECT_DOUBLE_EQ(a->infinite_earlier.blocks, a->infinite.blocks);
  EXPECT_DOUBLE_EQ(a->span_s, 3.0);
  EXPECT_DOUBLE_EQ(a->arrival_rate_rps, 1.0);

  // The window selects rows by trace time and count.
  AnalyzeOptions w;
  w.window.start_s = 1.0;
  w.window.duration_s = 1.5;
  auto aw = analyze_text(t, w);
  ASSERT_TRUE(aw.is_ok());
  EXPECT_EQ(aw->requests, 1);
  EXPECT_DOUBLE_EQ(aw->infinite.blocks, 0.0);
  AnalyzeOptions m;
  m.window.max_requests = 2;
  EXPECT_EQ(analyze_text(t, m)->requests, 2);

  AnalyzeOptions tiny;
  tiny.capacity_tokens = {100};
  auto bad = analyze_text(t, tiny);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("smaller than one block"), std::string::npos);
}

TEST(ReplayAnalyze, EarlierArrivalsOnlyIgnoresRowsOfTheSameTimestamp) {
  // r1 and r2 share a timestamp: r2 cannot reuse r1's blocks (they run concurrently); r3 arrives later
  // and hits [0,1] from either.
  std::string t = R"({"timestamp": 3000, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]})"
                  "\n"
                  R"({"timestamp": 3000, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]})"
                  "\n"
                  R"({"timestamp": 6000, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]})"
                  "\n";
  auto a = analyze_text(t, AnalyzeOptions{});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_DOUBLE_EQ(a->infinite.blocks, 4.0 / 7);          // r2: 2, r3: 2
  EXPECT_DOUBLE_EQ(a->infinite_earlier.blocks, 2.0 / 7);  // r3 only
  EXPECT_DOUBLE_EQ(a->infinite_earlier.tokens_full_blocks, 1024.0 / 3584.0);
  EXPECT_EQ(to_json(*a)["infinite_cache_earlier_arrivals"]["hit_ratio_blocks"], 2.0 / 7);
}

// A row's adapter and salt scope its blocks as the cluster keys them: equal hash ids in another scope are
// misses, in the same scope hits (the trial's 8 rows of equal tokens in 5 scopes were predicted at 87.5 %).
TEST(ReplayAnalyze, HitsOnlyWithinOneKeyScope) {
  std::string t;
  const char* const scopes[] = {
      "", R"(, "salt": "t1")", R"(, "lora_name": "a")", R"(, "lora_name": "a", "lora_version": "2")",
      "", R"(, "salt": "t1")"};
  int64_t ts = 0;
  for (const char* scope : scopes) {
    t += R"({"timestamp": )" + std::to_string(ts += 1000) +
         R"(, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1])" + scope + "}\n";
  }
  auto a = analyze_text(t, AnalyzeOptions{});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_DOUBLE_EQ(a->infinite.blocks, 4.0 / 12);  // rows 5 and 6 hit rows 1 and 2; rows 2-4 are new scopes
  EXPECT_EQ(a->distinct_blocks, 8);
}

TEST(ReplayAnalyze, EmptyAndOneRequestTraces) {
  auto e = analyze_text("", AnalyzeOptions{});
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->requests, 0);
  EXPECT_FALSE(e->input_tokens);
  EXPECT_DOUBLE_EQ(e->infinite.tokens, 0.0);
  std::ostringstream os;
  print_table(os, *e);
  EXPECT_NE(os.str().find("infinite"), std::string::npos);
  auto one = analyze_text(R"({"timestamp": 5, "input_length": 512, "output_length": 3, "hash_ids": [7]})", {});
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->requests, 1);
  EXPECT_DOUBLE_EQ(one->arrival_rate_rps, 0.0);
  auto j = to_json(*one, {{"tool", "x"}});
  EXPECT_EQ(j["requests"], 1);
  EXPECT_EQ(j["lru"].size(), 4u);
  EXPECT_EQ(j["infinite_cache"]["hit_ratio_tokens"], 0.0);
}

// Field report #18 through analyze: strict names line 2, lenient skips 3 rows.
TEST(ReplayAnalyze, MalformedLineStrictAndLenient) {
  std::string t = std::string(R"({"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]})") +
                  "\n" + R"({"timestamp": 0, "input_length": 17448, "output_length":2748 610, "hash_ids": []})" +
                  "\n\n" + R"({"timestamp": 0, "input_length": 512, "output_length": 1})" + "\n" +
                  R"({"timestamp": 0, "input_length": 512.5, "output_length": 1, "hash_ids": [0]})" + "\n" +
                  R"({"timestamp": 3000, "input_length": 512, "output_length": 5, "hash_ids": [0]})";
  auto s = analyze_text(t, AnalyzeOptions{});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("t.jsonl:2:"), std::string::npos);
  AnalyzeOptions l;
  l.reader.mode = trace::Mode::kLenient;
  auto a = analyze_text(t, l);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->requests, 2);
  EXPECT_EQ(a->skipped_rows, 3);
  EXPECT_EQ(a->output_tokens->max, 10);
}

}  // namespace
}  // namespace mc::replay
