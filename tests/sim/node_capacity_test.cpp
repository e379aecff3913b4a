// node_capacity (mc-plan node): the modelled node's KV capacities in tokens and the live sizes at a byte scale.
#include "mc/sim/node_capacity.hpp"

#include <gtest/gtest.h>

#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"

namespace mc::sim {
namespace {

TEST(NodeCapacity, LlamaOnA800HoldsTheFormulasTokens) {
  NodeCapacityOptions o;  // llama3-70b on a800x8, 512 GiB spare DRAM, scale 256
  o.time_scale = 4;
  o.nic_cap_mbit = 10'000;
  auto c = node_capacity(o);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->model_kv_bytes_per_token, 327'680);  // 2 x 80 layers x 8 KV heads x 128 x 2 B
  const int64_t free_bytes = c->hbm_bytes - c->weight_bytes;
  EXPECT_EQ(c->hbm_bytes, 8LL * 80 * (1LL << 30));
  EXPECT_EQ(c->decode_kv_tokens, static_cast<int64_t>(0.9 * static_cast<double>(free_bytes)) / 327'680);
  EXPECT_GT(c->decode_kv_tokens, 1'400'000);  // about 1.5M tokens on an 8xA800 node
  EXPECT_LT(c->decode_kv_tokens, 1'600'000);
  EXPECT_EQ(c->pool_tokens, (512LL << 30) / 327'680);
  EXPECT_EQ(c->live_kv_bytes_per_token, 1'280);  // 16 B per layer, the sim backend's smallest
  EXPECT_EQ(c->kv_buffer_tokens % 512, 0);
  EXPECT_LE(c->kv_buffer_tokens, c->decode_kv_tokens);
  EXPECT_GT(c->kv_buffer_tokens, c->decode_kv_tokens - 512);
  EXPECT_EQ(c->kv_buffer_bytes, c->kv_buffer_tokens * 1'280);
  EXPECT_EQ(c->dram_bytes, c->dram_tokens * 1'280);
  EXPECT_EQ(c->nic_mbit_uncapped, 25'000);  // 1.6 Tbit/s x 4 / 256
  EXPECT_EQ(c->nic_mbit_live, 10'000);

  // The simulator's default decode capacity is the same figure.
  auto m = model::load_model("llama3-70b");
  auto g = model::gpu_preset("a800x8");
  ASSERT_TRUE(m.is_ok() && g.is_ok());
  auto sim = decode_kv_capacity_tokens(*m, *g);
  ASSERT_TRUE(sim.is_ok());
  EXPECT_EQ(*sim, c->decode_kv_tokens);
}

TEST(NodeCapacity, RefusesAScaleTheSimLayoutCannotHold) {
  NodeCapacityOptions o;
  o.scale = 512;  // 8 B per token and layer: below the sim backend's 16
  auto c = node_capacity(o);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("the largest such scale is 256"), std::string::npos) << c.status().message();
  o.scale = 3;  // 4096 / 3 is not whole
  EXPECT_FALSE(node_capacity(o).is_ok());
  o.scale = 128;
  auto ok = node_capacity(o);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->live_kv_bytes_per_token, 2'560);
  EXPECT_EQ(ok->nic_mbit_live, 12'500);  // no cap: 1.6 Tbit/s / 128
}

}  // namespace
}  // namespace mc::sim
