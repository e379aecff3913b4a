// The sampler (mc/infer/sampler.hpp): OpenAI's sampling parameters over a model's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "mc/infer/sampler.hpp"

using namespace mc;
using namespace mc::infer;

namespace MC_UNITY_ID {

// Logits whose softmax is {0.5, 0.25, 0.125, 0.125} over tokens 0..3 (then improbable tokens).
std::vector<float> halves(size_t vocab = 8) {
  std::vector<float> l(vocab, -40.0f);
  l[0] = std::log(0.5f);
  l[1] = std::log(0.25f);
  l[2] = std::log(0.125f);
  l[3] = std::log(0.125f);
  return l;
}

proto::SamplingParams sampling(double temperature, uint64_t seed = 7) {
  proto::SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

}  // namespace MC_UNITY_ID
using namespace MC_UNITY_ID;

TEST(Sampler, GreedyIsTheArgmaxWhateverTheSeed) {
  std::vector<float> l = halves();
  l[2] = 5.0f;
  for (uint64_t seed : {0u, 1u, 99u}) EXPECT_EQ(sample_token(l, sampling(0, seed), 3, nullptr).token, 2u);
  EXPECT_TRUE(sample_token(l, sampling(0), 3, nullptr).logprobs.empty());
}

TEST(Sampler, TheSameSeedAndIndexGiveTheSameTokenAndTheDrawFollowsTheDistribution) {
  const std::vector<float> l = halves();
  std::map<uint32_t, int> seen;
  constexpr int kDraws = 20'000;
  for (int i = 0; i < kDraws; ++i) {
    const uint32_t t = sample_token(l, sampling(1.0, 42), i, nullptr).token;
    EXPECT_EQ(t, sample_token(l, sampling(1.0, 42), i, nullptr).token);
    ++seen[t];
  }
  // 4-sigma bounds of a binomial count around the softmax's mass.
  const double expect[4] = {0.5, 0.25, 0.125, 0.125};
  for (uint32_t t = 0; t < 4; ++t) {
    const double mean = kDraws * expect[t], sd = std::sqrt(kDraws * expect[t] * (1 - expect[t]));
    EXPECT_NEAR(seen[t], mean, 4 * sd) << "token " << t;
  }
  EXPECT_LT(seen[4] + seen[5] + seen[6] + seen[7], 5);
  // Another seed gives another sequence.
  int differ = 0;
  for (int i = 0; i < 64; ++i) {
    differ +=
        sample_token(l, sampling(1.0, 42), i, nullptr).token != sample_token(l, sampling(1.0, 43), i, nullptr).token;
  }
  EXPECT_GT(differ, 10);
}

TEST(Sampler, TopKTopPAndMinPKeepOnlyTheLikelyTokens) {
  const std::vector<float> l = halves();
  for (int i = 0; i < 500; ++i) {
    proto::SamplingParams k1 = sampling(1.0, 5);
    k1.top_k = 1;
    EXPECT_EQ(sample_token(l, k1, i, nullptr).token, 0u);
    proto::SamplingParams p = sampling(1.0, 5);
    p.top_p = 0.7;  // {0} holds 0.5 < 0.7, {0, 1} holds 0.75
    EXPECT_LE(sample_token(l, p, i, nullptr).token, 1u);
    proto::SamplingParams m = sampling(1.0, 5);
    m.min_p = 0.3;  // tokens below 0.3 x 0.5 = 0.15: only 0 and 1 stay
    EXPECT_LE(sample_token(l, m, i, nullptr).token, 1u);
    proto::SamplingParams cold = sampling(0.01, 5);  // near greedy
    EXPECT_EQ(sample_token(l, cold, i, nullptr).token, 0u);
  }
}

TEST(Sampler, PenaltiesLowerTheTokensAlreadyGenerated) {
  std::vector<float> l(4, 0.0f);
  l[0] = 1.0f;
  proto::SamplingParams p = sampling(0);
  p.presence_penalty = 2.0;
  TokenCounts counts = {{0, 1}};
  EXPECT_EQ(sample_token(l, p, 1, nullptr).token, 0u);  // no counts: no penalty
  EXPECT_EQ(sample_token(l, p, 1, &counts).token, 1u);  // 1 - 2 < 0: the next best (lowest id of the ties)
  p.presence_penalty = 0;
  p.frequency_penalty = 0.4;
  counts[0] = 2;  // 1 - 0.8 > 0
  EXPECT_EQ(sample_token(l, p, 1, &counts).token, 0u);
  counts[0] = 3;  // 1 - 1.2 < 0
  EXPECT_EQ(sample_token(l, p, 1, &counts).token, 1u);
}

TEST(Sampler, LogprobsAreTheRawDistributionsMostLikelyFirst) {
  const std::vector<float> l = halves();
  proto::SamplingParams p = sampling(1.0, 9);
  p.logprobs = 3;
  const TokenChoice c = sample_token(l, p, 0, nullptr);
  ASSERT_EQ(c.logprobs.size(), 4u);
  EXPECT_EQ(c.logprobs[0].token, c.token);
  EXPECT_EQ(c.logprobs[1].token, 0u);
  EXPECT_NEAR(c.logprobs[1].logprob, std::log(0.5), 1e-5);
  EXPECT_NEAR(c.logprobs[2].logprob, std::log(0.25), 1e-5);
  EXPECT_EQ(c.logprobs[3].token, 2u);  // ties by id
  double mass = 0;
  for (size_t i = 1; i < c.logprobs.size(); ++i) mass += std::exp(c.logprobs[i].logprob);
  EXPECT_NEAR(mass, 0.875, 1e-5);
  // Greedy with logprobs: the token's own is the best alternative's.
  p.temperature = 0;
  const TokenChoice g = sample_token(l, p, 0, nullptr);
  EXPECT_EQ(g.token, 0u);
  EXPECT_EQ(g.logprobs[0].logprob, g.logprobs[1].logprob);
  // The first token: the backend's greedy token unless the parameters need the logits.
  EXPECT_EQ(choose_first_token(3, l, sampling(0)).token, 3u);
  EXPECT_EQ(choose_first_token(3, {}, sampling(1.0)).token, 3u);  // sim: no logits
}

TEST(Sampler, ParametersOutsideTheirBoundsAreNamed) {
  proto::SamplingParams p;
  EXPECT_EQ(proto::sampling_error(p), "");
  p.temperature = std::nan("");
  EXPECT_NE(proto::sampling_error(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(proto::sampling_error(p).find("top_p"), std::string::npos);
  p = {};
  p.logprobs = 21;
  EXPECT_NE(proto::sampling_error(p).find("logprobs"), std::string::npos);
  p = {};
  p.top_k = -1;
  EXPECT_NE(proto::sampling_error(p).find("top_k"), std::string::npos);
}
