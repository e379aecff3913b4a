// `mc-trace-replay gen` (gen.hpp, issue 23): deterministic by seed, a valid Mooncake trace, sessions whose turns
// share their history, shared system prompts, Poisson and bursty session starts, bad options refused.
#include "mc/replay/gen.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>

#include "mc/replay/analyze.hpp"
#include "mc/trace/trace.hpp"

namespace mc::replay {
namespace {

std::string generate(const GenOptions& o) {
  std::ostringstream out;
  auto st = generate_trace(o, out);
  EXPECT_TRUE(st.is_ok()) << st.status().message();
  return out.str();
}

std::vector<trace::Request> read(const std::string& text, int64_t block_size = 512) {
  std::istringstream in(text);
  trace::ReaderOptions ro;
  ro.block_size = block_size;
  ro.source_name = "gen.jsonl";
  trace::Reader reader(in, ro);
  std::vector<trace::Request> rows;
  while (true) {
    auto r = reader.next();
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    if (!r.is_ok() || !r->has_value()) break;
    rows.push_back(**r);
  }
  return rows;
}

TEST(Gen, DeterministicBySeed) {
  GenOptions o;
  o.sessions = 50;
  o.seed = 7;
  const std::string a = generate(o);
  EXPECT_EQ(a, generate(o));
  o.seed = 8;
  EXPECT_NE(a, generate(o));
  o.arrival = "bursty";
  EXPECT_EQ(generate(o), generate(o));
}

TEST(Gen, AValidTraceWithSessionsAndSharedPrompts) {
  GenOptions o;
  o.sessions = 200;
  o.session_rate = 2;
  o.turns_mean = 4;
  o.think_s = 10;
  o.system_prompts = 4;
  o.block_size = 64;
  o.seed = 1;
  const std::vector<trace::Request> rows = read(generate(o), 64);  // the strict reader accepts every row
  ASSERT_GT(rows.size(), 400u);                                    // about 4 turns per session
  int64_t last = 0;
  int64_t longest = 0;
  for (const auto& r : rows) {
    EXPECT_GE(r.timestamp_ms, last);
    last = r.timestamp_ms;
    longest = std::max(longest, r.input_length);
  }
  EXPECT_LE(longest, o.max_input_tokens);
  // Turns reuse their session's history and system prompts are shared: a high hit ratio; without both, none.
  auto hit = [](const std::vector<trace::Request>& rs) {
    PrefixCacheModel cache(0, 64);
    for (const auto& r : rs) cache.add(r);
    return cache.ratios().blocks;
  };
  const double shared = hit(rows);
  EXPECT_GT(shared, 0.5) << shared;
  o.system_prompts = 0;
  o.turns_mean = 1;
  const std::vector<trace::Request> single = read(generate(o), 64);
  EXPECT_EQ(single.size(), 200u);  // one turn each
  EXPECT_EQ(hit(single), 0.0);
  // Four system prompts: at most four distinct first blocks among first turns (each prompt is >= 512 tokens).
  o.system_prompts = 4;
  std::set<uint64_t> firsts;
  for (const auto& r : read(generate(o), 64)) firsts.insert(r.hash_ids.front());
  EXPECT_LE(firsts.size(), 4u);
}

TEST(Gen, FirstPromptCutLaterPromptsEndTheSession) {
  // A cap below the system prompt: every session's first prompt is cut to it (one row each), and the second turn,
  // longer still, ends the session (the man page's --max-input-tokens).
  GenOptions o{.sessions = 30,
               .turns_mean = 5,
               .system_prompts = 2,
               .system_tokens = 1024,
               .max_input_tokens = 100,
               .block_size = 16};
  const std::vector<trace::Request> rows = read(generate(o), 16);
  ASSERT_EQ(rows.size(), 30u);
  for (const auto& r : rows) EXPECT_EQ(r.input_length, 100);
  o.max_input_tokens = 1;
  const std::vector<trace::Request> one = read(generate(o), 16);
  ASSERT_EQ(one.size(), 30u);
  for (const auto& r : one) EXPECT_EQ(r.hash_ids.size(), 1u);
}

TEST(Gen, ManySessionsOpenAtOnce) {
  // Every session open until its last turn (a high rate, long think times): rows in arrival order, each session's
  // turns all written.
  const GenOptions o{.sessions = 20000,
                     .session_rate = 1000,
                     .turns_mean = 3,
                     .think_s = 600,
                     .system_prompts = 0,
                     .user_tokens = 20,
                     .output_tokens = 20,
                     .block_size = 64};
  std::ostringstream out;
  auto stats = generate_trace(o, out);
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_EQ(stats->sessions, 20000);
  EXPECT_GT(stats->rows, 40000);
  const std::vector<trace::Request> rows = read(out.str(), 64);
  EXPECT_EQ(static_cast<int64_t>(rows.size()), stats->rows);
}

TEST(Gen, PoissonAndBurstyStarts) {
  GenOptions o;
  o.sessions = 3000;
  o.turns_mean = 1;
  o.session_rate = 10;
  o.block_size = 512;
  o.user_tokens = 50;
  o.system_prompts = 0;
  auto gaps_cv = [&](const std::vector<trace::Request>& rows, double& span) {
    std::vector<double> gaps;
    for (size_t i = 1; i < rows.size(); ++i)
      gaps.push_back(static_cast<double>(rows[i].timestamp_ms - rows[i - 1].timestamp_ms));
    double mean = 0, var = 0;
    for (double g : gaps) mean += g;
    mean /= static_cast<double>(gaps.size());
    for (double g : gaps) var += (g - mean) * (g - mean);
    var /= static_cast<double>(gaps.size());
    span = static_cast<double>(rows.back().timestamp_ms) / 1000;
    return std::sqrt(var) / mean;
  };
  double span = 0;
  const double poisson_cv = gaps_cv(read(generate(o)), span);
  EXPECT_NEAR(span, 300, 30);       // 3000 sessions at 10/s
  EXPECT_NEAR(poisson_cv, 1, 0.1);  // exponential gaps
  o.arrival = "bursty";
  o.burst_cv = 4;
  const double bursty_cv = gaps_cv(read(generate(o)), span);
  EXPECT_GT(bursty_cv, 2.5);
  EXPECT_NEAR(span, 300, 150);  // the same mean rate, noisier
}

TEST(Gen, BadOptionsNameTheFlag) {
  struct Case {
    GenOptions o;
    const char* flag;
  };
  std::vector<Case> cases(6);
  cases[0].o.sessions = 0, cases[0].flag = "--sessions";
  cases[1].o.session_rate = std::nan(""), cases[1].flag = "--session-rate";
  cases[2].o.arrival = "uniform", cases[2].flag = "--arrival";
  cases[3].o.turns_mean = 0.5, cases[3].flag = "--turns-mean";
  cases[4].o.length_sigma = -1, cases[4].flag = "--length-sigma";
  cases[5].o.max_input_tokens = int64_t{1} << 30, cases[5].flag = "--max-input-tokens";
  for (const Case& c : cases) {
    Status s = c.o.validate();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.flag;
    EXPECT_NE(s.message().find(c.flag), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace mc::replay
