#include "mc/model/model_config.hpp"

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

namespace mc::infer {
namespace {

TEST(ModelConfig, Llama3_70bKvBytesPerTokenMatchesPaper) {
  auto m = model::model_preset("llama3-70b");
  ASSERT_TRUE(m) << m.status().to_string();
  EXPECT_EQ(m->kv_bytes_per_token(), 327680);  // 2·80·8·128·2 (DESIGN.md §1)
  EXPECT_EQ(m->kv_bytes_per_token_layer() * m->num_layers, m->kv_bytes_per_token());
}

TEST(ModelConfig, ParamCountsOfPublishedModels) {
  // Published sizes: Meta-Llama-3-8B 8.03e9, Meta-Llama-3-70B 70.55e9 parameters.
  auto m8 = model::model_preset("llama3-8b");
  ASSERT_TRUE(m8);
  EXPECT_EQ(m8->param_count(), 8030261248);
  auto m70 = model::model_preset("llama3-70b");
  ASSERT_TRUE(m70);
  EXPECT_EQ(m70->param_count(), 70553706496);
  // matmul params exclude the embedding table and the norms.
  EXPECT_EQ(m70->param_count() - m70->matmul_param_count(),
            m70->vocab_size * m70->hidden_size + m70->num_layers * 2 * m70->hidden_size + m70->hidden_size);
}

TEST(ModelConfig, TinyIsSmallAndValid) {
  auto m = model::model_preset("tiny");
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->validate().is_ok());
  EXPECT_EQ(m->kv_bytes_per_token(), 2 * 4 * 2 * 16 * 4);
  EXPECT_LT(m->param_count(), 1'000'000);
  for (const auto& name : model::model_preset_names()) {
    auto p = model::model_preset(name);
    ASSERT_TRUE(p) << name;
    EXPECT_TRUE(p->validate().is_ok()) << name << ": " << p->validate().to_string();
  }
}

TEST(ModelConfig, UnknownPresetListsKnownNames) {
  auto m = model::model_preset("gpt-5");
  ASSERT_FALSE(m);
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_NE(m.status().message().find("llama3-70b"), std::string::npos);
}

TEST(ModelConfig, JsonWithBaseAndOverrides) {
  auto m = model::model_from_json(R"({"base": "llama3-70b", "dtype_bytes": 1, "name": "70b-fp8"})");
  ASSERT_TRUE(m) << m.status().to_string();
  EXPECT_EQ(m->name, "70b-fp8");
  EXPECT_EQ(m->num_layers, 80);
  EXPECT_EQ(m->kv_bytes_per_token(), 163840);
}

TEST(ModelConfig, HuggingFaceConfigJson) {
  auto m = model::model_from_json(R"({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
      "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16",
      "rope_theta": 500000.0, "max_position_embeddings": 8192})");
  ASSERT_TRUE(m) << m.status().to_string();
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_EQ(m->dtype_bytes, 2);
  EXPECT_EQ(m->max_context_tokens, 8192);
  EXPECT_EQ(m->param_count(), model::model_preset("llama3-8b")->param_count());
}

TEST(ModelConfig, BadJsonIsAClearError) {
  EXPECT_EQ(model::model_from_json("{").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(model::model_from_json("[1]").status().code(), Code::kInvalidArgument);
  auto wrong_type = model::model_from_json(R"({"num_layers": "eighty"})");
  ASSERT_FALSE(wrong_type);
  EXPECT_NE(wrong_type.status().message().find("num_layers"), std::string::npos);
  auto gqa = model::model_from_json(R"({"num_heads": 6, "num_kv_heads": 4})");
  ASSERT_FALSE(gqa);
  EXPECT_NE(gqa.status().message().find("num_kv_heads"), std::string::npos);
  EXPECT_FALSE(model::model_from_json(R"({"num_layers": -1})"));
  EXPECT_FALSE(model::model_from_json(R"({"num_layers": 0})"));
  EXPECT_FALSE(model::model_from_json(R"({"dtype_bytes": 3})"));
  EXPECT_FALSE(model::model_from_json(R"({"torch_dtype": "int7"})"));
}

TEST(ModelConfig, LoadFromFileAndPreset) {
  const std::string path = testing::TempDir() + "/mc_model_test.json";
  {
    std::ofstream out(path);
    out << R"({"base": "tiny", "num_layers": 2})";
  }
  auto m = model::load_model(path);
  std::remove(path.c_str());
  ASSERT_TRUE(m) << m.status().to_string();
  EXPECT_EQ(m->num_layers, 2);
  EXPECT_TRUE(model::load_model("tiny"));
  auto missing = model::load_model("/nonexistent/model.json");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.json"), std::string::npos);
}

TEST(ModelConfig, ToJsonRoundTrips) {
  auto m = model::model_preset("llama3-8b");
  ASSERT_TRUE(m);
  auto back = model::model_from_json(m->to_json());
  ASSERT_TRUE(back) << back.status().to_string();
  EXPECT_EQ(back->name, "llama3-8b");
  EXPECT_EQ(back->param_count(), m->param_count());
  EXPECT_EQ(back->rope_theta, m->rope_theta);
}

}  // namespace
}  // namespace mc::infer
