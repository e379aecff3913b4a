#include "mc/sim/cluster_config.hpp"

#include <gtest/gtest.h>

#include "mc/sim/commands.hpp"

namespace mc::sim {
namespace {

TEST(ClusterConfig, ParsesEveryKeyWithUnits) {
  auto doc = nlohmann::json::parse(R"({
    "model": "llama3-8b", "gpu": "h800x8", "prefill_instances": 10, "decode_instances": 6,
    "cache_capacity_tokens": "3M", "cache_mode": "local", "nic_bandwidth_bytes_per_s": "25GB",
    "policy": "cache_aware", "slo_ttft_ms": 10000, "slo_tbt_ms": 200, "early_rejection": false,
    "block_size": 256, "chunk_tokens": 8192, "decode_kv_capacity_tokens": 1000000,
    "decode_max_batch": 128, "max_context_tokens": 65536, "seed": 7, "preempt_chunk_tokens": 4096,
    "balancing_threshold": 2})");
  auto c = parse_cluster_config(doc, "c.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->model, "llama3-8b");
  EXPECT_EQ(c->gpu, "h800x8");
  EXPECT_EQ(c->prefill_instances, 10);
  EXPECT_EQ(c->cache_capacity_tokens, 3'000'000);
  EXPECT_EQ(c->cache_mode, CacheMode::kLocal);
  EXPECT_DOUBLE_EQ(c->nic_bandwidth_bytes_per_s, 25e9);
  EXPECT_EQ(c->policy, "cache_aware");
  EXPECT_FALSE(c->early_rejection);
  EXPECT_EQ(c->block_size, 256);
  EXPECT_EQ(c->chunk_tokens, 8192);
  EXPECT_EQ(c->decode_max_batch, 128);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->preempt_chunk_tokens, 4096);
  EXPECT_EQ(c->balancing_threshold, 2.0);
  // Round trip through to_json.
  auto again = parse_cluster_config(c->to_json(), "again");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->to_json(), c->to_json());
}

TEST(ClusterConfig, RejectsTyposAndBadValuesNamingTheKey) {
  struct Case {
    const char* json;
    const char* needle;
  } cases[] = {
      {R"({"prefil_instances": 4})", "prefil_instances"},
      {R"({"cache_mode": "shared"})", "cache_mode"},
      {R"({"policy": "fastest"})", "policy"},
      {R"({"prefill_instances": 0})", "prefill_instances"},
      {R"({"cache_capacity_tokens": -5})", "cache_capacity_tokens"},
      {R"({"nic_bandwidth_bytes_per_s": "fast"})", "nic_bandwidth_bytes_per_s"},
      {R"({"early_rejection": "yes"})", "early_rejection"},
      {R"({"slo_ttft_ms": 0})", "slo_ttft_ms"},
      {R"({"preempt_chunk_tokens": -5})", "preempt_chunk_tokens"},
      {R"({"balancing_threshold": 0.5})", "balancing_threshold"},
      {R"({"preempt_chunk_tokens": 99999999})", "preempt_chunk_tokens"},
      {R"([1, 2])", "object"},
  };
  for (const auto& c : cases) {
    auto r = parse_cluster_config(nlohmann::json::parse(c.json), "c.json");
    ASSERT_FALSE(r.is_ok()) << c.json;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("c.json"), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(load_cluster_config("/nonexistent/cluster.json").status().code(), Code::kInvalidArgument);
}

TEST(ClusterConfig, OverridesApplyOnTopAndAreValidated) {
  ClusterConfig c;
  ClusterOverrides o;
  o.policy = "random";
  o.cache_capacity_tokens = "50M";
  o.nic_bandwidth = "100GB";
  o.early_rejection = false;
  ASSERT_TRUE(o.apply(c).is_ok());
  EXPECT_EQ(c.policy, "random");
  EXPECT_EQ(c.cache_capacity_tokens, 50'000'000);
  EXPECT_DOUBLE_EQ(c.nic_bandwidth_bytes_per_s, 100e9);
  EXPECT_FALSE(c.early_rejection);
  o.cache_mode = "nowhere";
  EXPECT_EQ(o.apply(c).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace mc::sim
