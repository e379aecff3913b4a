#include "mc/model/model_config.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mc/model/checkpoint_layout.hpp"

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
  // A config from a downloaded directory is bounded before it is parsed: 100,000 nested arrays are refused.
  auto deep = model::model_from_json(std::string(100'000, '['));
  ASSERT_FALSE(deep);
  EXPECT_NE(deep.status().message().find("model config"), std::string::npos) << deep.status().message();
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

// Hugging Face config.json files of the four supported architectures (the published shapes, written out for the
// test): the architecture, what it changes in the forward pass, and the parameter count the model cards give.
constexpr const char* kLlama32_1b = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})";
constexpr const char* kQwen25_05b = R"({"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
  "vocab_size": 151936})";
constexpr const char* kQwen3_06b = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 16,
  "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936})";
constexpr const char* kMistral7b_v03 = R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32768})";

TEST(ModelConfig, TheFourArchitecturesAndTheirPublishedParameterCounts) {
  struct Case {
    const char* json;
    model::Architecture arch;
    bool bias, qk_norm, tied;
    int64_t params;
  };
  for (const Case& c : {Case{kLlama32_1b, model::Architecture::kLlama, false, false, true, 1'235'814'400},
                        Case{kQwen25_05b, model::Architecture::kQwen2, true, false, true, 494'032'768},
                        Case{kQwen3_06b, model::Architecture::kQwen3, false, true, true, 596'049'920},
                        Case{kMistral7b_v03, model::Architecture::kMistral, false, false, false, 7'248'023'552}}) {
    auto m = model::model_from_json(c.json);
    ASSERT_TRUE(m) << m.status().to_string();
    SCOPED_TRACE(std::string(model::architecture_name(c.arch)));
    EXPECT_EQ(m->architecture, c.arch);
    EXPECT_EQ(m->attention_bias, c.bias);
    EXPECT_EQ(m->qk_norm, c.qk_norm);
    EXPECT_EQ(m->tie_word_embeddings, c.tied);
    EXPECT_EQ(m->param_count(), c.params);
    EXPECT_EQ(m->sliding_window_tokens, 0);  // Qwen's switch is off, Mistral v0.3's window null
    ASSERT_EQ(m->eos_token_ids.size(), 1u);
    // The JSON of the config reads back the same (mc-conductor and mc-sim pass models as JSON).
    auto back = model::model_from_json(m->to_json());
    ASSERT_TRUE(back) << back.status().to_string();
    EXPECT_EQ(back->param_count(), c.params);
    EXPECT_EQ(back->architecture, c.arch);
  }
  auto llama = model::model_from_json(kLlama32_1b);
  ASSERT_TRUE(llama);
  EXPECT_EQ(llama->head_dim, 64);
  EXPECT_EQ(llama->rope_scaling.kind, model::RopeScaling::Kind::kLlama3);
  EXPECT_EQ(llama->rope_scaling.factor, 32.0);
  EXPECT_EQ(llama->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(llama->bos_token_id, 128000);
  auto qwen3 = model::model_from_json(kQwen3_06b);
  ASSERT_TRUE(qwen3);
  EXPECT_EQ(qwen3->head_dim, 128);  // explicit: not hidden / heads (64)
  EXPECT_EQ(qwen3->kv_bytes_per_token(), 2 * 28 * 8 * 128 * 2);
}

TEST(ModelConfig, WhatTheEngineCannotComputeIsRefusedByName) {
  auto with = [](const char* base, const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(base);
    j[key] = nlohmann::json::parse(value);
    return model::model_from_json(j.dump());
  };
  auto gpt2 = with(kLlama32_1b, "architectures", R"(["GPT2LMHeadModel"])");
  ASSERT_FALSE(gpt2);
  EXPECT_NE(gpt2.status().message().find("GPT2LMHeadModel"), std::string::npos) << gpt2.status().message();
  EXPECT_NE(gpt2.status().message().find("Qwen3ForCausalLM"), std::string::npos) << gpt2.status().message();
  auto gelu = with(kLlama32_1b, "hidden_act", R"("gelu")");
  ASSERT_FALSE(gelu);
  EXPECT_NE(gelu.status().message().find("hidden_act"), std::string::npos);
  auto yarn = with(kQwen25_05b, "rope_scaling", R"({"type": "yarn", "factor": 4.0})");
  ASSERT_FALSE(yarn);
  EXPECT_NE(yarn.status().message().find("yarn"), std::string::npos);
  auto swa = with(kQwen25_05b, "use_sliding_window", "true");
  ASSERT_FALSE(swa);
  EXPECT_NE(swa.status().message().find("use_sliding_window"), std::string::npos);
  EXPECT_FALSE(with(kLlama32_1b, "mlp_bias", "true"));
  EXPECT_FALSE(with(kLlama32_1b, "eos_token_id", R"("</s>")"));
  EXPECT_FALSE(with(kLlama32_1b, "rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})"));
  // Mistral v0.1's 4,096-token window caps the context (mc computes full attention: equal within the window).
  auto v01 = with(kMistral7b_v03, "sliding_window", "4096");
  ASSERT_TRUE(v01) << v01.status().to_string();
  EXPECT_EQ(v01->sliding_window_tokens, 4096);
  EXPECT_EQ(v01->max_context_tokens, 4096);
  // A list of end tokens (Llama 3.x instruct models).
  auto instruct = with(kLlama32_1b, "eos_token_id", "[128001, 128008, 128009]");
  ASSERT_TRUE(instruct);
  EXPECT_EQ(instruct->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
}

// The checkpoint's tensors (checkpoint_layout.hpp) hold exactly param_count() elements, for every architecture and its
// options; a tied model has no lm_head, a Qwen2 one has q/k/v biases, a Qwen3 one q/k norms.
TEST(CheckpointLayout, TheTensorsOfEachArchitectureHoldItsParameters) {
  for (const char* json : {kLlama32_1b, kQwen25_05b, kQwen3_06b, kMistral7b_v03}) {
    auto m = model::model_from_json(json);
    ASSERT_TRUE(m) << m.status().to_string();
    SCOPED_TRACE(std::string(model::architecture_name(m->architecture)));
    int64_t elements = 0;
    std::map<std::string, std::vector<int64_t>> by_name;
    for (const model::TensorSpec& t : model::expected_tensors(*m)) {
      elements += t.elements();
      EXPECT_TRUE(by_name.emplace(t.name, t.shape).second) << t.name << " twice";
    }
    EXPECT_EQ(elements, m->param_count());
    EXPECT_EQ(by_name.count("lm_head.weight"), m->tie_word_embeddings ? 0u : 1u);
    EXPECT_EQ(by_name.count("model.layers.0.self_attn.q_proj.bias"), m->attention_bias ? 1u : 0u);
    EXPECT_EQ(by_name.count("model.layers.0.self_attn.q_norm.weight"), m->qk_norm ? 1u : 0u);
    const std::string last = "model.layers." + std::to_string(m->num_layers - 1) + ".mlp.down_proj.weight";
    ASSERT_EQ(by_name.count(last), 1u);
    EXPECT_EQ(by_name[last], (std::vector<int64_t>{m->hidden_size, m->ffn_size}));
    EXPECT_EQ(by_name["model.layers.0.self_attn.k_proj.weight"],
              (std::vector<int64_t>{m->num_kv_heads * m->head_dim, m->hidden_size}));
  }
}

// load_model(DIR): a Hugging Face model directory, its generation_config.json's token ids winning.
TEST(ModelConfig, AModelDirectoryIsReadWithItsGenerationConfig) {
  const std::string dir = testing::TempDir() + "/mc_model_dir_test_" + std::to_string(::getpid()) + "/Qwen2.5-0.5B";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << kQwen25_05b;
  std::ofstream(dir + "/generation_config.json") << R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})";
  auto m = model::load_model(dir);
  ASSERT_TRUE(m) << m.status().to_string();
  EXPECT_EQ(m->name, "Qwen2.5-0.5B");
  EXPECT_EQ(m->checkpoint_dir, dir);
  EXPECT_EQ(m->architecture, model::Architecture::kQwen2);
  EXPECT_EQ(m->eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(m->bos_token_id, 151643);
  std::ofstream(dir + "/generation_config.json") << "not json";
  auto bad_gen = model::load_model(dir);
  ASSERT_FALSE(bad_gen);
  EXPECT_NE(bad_gen.status().message().find("generation_config.json"), std::string::npos);
  std::filesystem::remove(dir + "/generation_config.json");
  std::filesystem::remove(dir + "/config.json");
  auto none = model::load_model(dir);
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find(dir + "/config.json"), std::string::npos) << none.status().message();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

}  // namespace
}  // namespace mc::infer
