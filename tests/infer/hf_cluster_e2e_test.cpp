// A Hugging Face checkpoint served by a whole cluster (issue 49): for each architecture, `mc-model init` writes a
// small bf16 checkpoint, examples/local-cluster.sh starts a store master and node, mc-conductor, one mc-prefill and
// one mc-decode on it (--backend ref --model DIR, blocks of 16 tokens, the workers' --kv-dtype given), and a client in
// this test submits prompts of known token ids to the Conductor and receives the decode instance's token events:
//   * a prompt A of 400 tokens, then a prompt B sharing A's first 384 (24 blocks) and going on with 40 others;
//   * each answer's greedy tokens are those `mc-model run DIR --prompt-ids ... --kv-dtype (the workers')` computes
//     alone (the same engine in one process, the whole prompt at once);
//   * with --prefix-cache store, B is served from A's blocks in the store: the Conductor finds the 384-token prefix
//     in the pool, plans to reuse some of it (a few prompts first teach its predictor this CPU's prefill speed; the
//     fetch-or-recompute choice is its pricing, so B is sent again, at most kAttempts times, until one is planned as
//     a hit), and the prefill instance reads exactly the planned tokens from the store (its hit-token counter);
//   * with --prefix-cache none nothing is cached or read, and the tokens are the same.
// Every wait is bounded; the cluster (its own process group) is stopped on the way out, also when an assertion fails.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/proto/conductor.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/testkit/client_endpoint.hpp"
#include "mc/testkit/local_cluster.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc {
namespace MC_UNITY_ID {

using json = nlohmann::json;
using testkit::Stream;

const std::string kModelTool = MC_BINARY_DIR "/bin/mc-model";
constexpr int64_t kBlock = 16;
constexpr int64_t kOutput = 8;     // tokens generated per request, the first (prefill's) included
constexpr int64_t kPromptA = 400;  // 25 complete blocks
constexpr int64_t kShared = 384;   // B's prefix equal to A's: 24 blocks
constexpr int64_t kPromptB = 424;  // kShared + 40 tokens of its own
constexpr int kAttempts = 5;       // B sent at most this often until the Conductor plans a hit
constexpr int64_t kTerminalMs = 120'000;

// The architectures, each with what its checkpoint adds to the default shape (2 layers, hidden 64, 4 heads, 2 KV
// heads, FFN 128, vocabulary 256, bf16 weights) and the workers' KV type. No tied embeddings: random weights that
// share the embedding with the output repeat one token for ever, which would tell little about the KV.
struct Arch {
  std::string name;
  std::vector<std::string> init_flags;
  std::string kv_dtype;
};
const Arch kLlama{"LlamaForCausalLM", {"--rope-scaling", "llama3", "--seed", "2"}, "bf16"};  // Mistral's weights else
const Arch kQwen2{"Qwen2ForCausalLM", {}, "fp16"};
const Arch kQwen3{"Qwen3ForCausalLM", {"--head-dim", "32"}, "auto"};  // head size apart from hidden / heads
const Arch kMistral{"MistralForCausalLM", {}, "fp32"};

// n token ids of the vocabulary, a sequence of its own per `salt` (different first tokens: no common block).
std::vector<uint32_t> tokens(int64_t n, uint32_t step, uint32_t salt) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (static_cast<uint32_t>(i) * step + salt) % 256u;
  return t;
}

std::string ids_text(const std::vector<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

std::vector<uint32_t> values(const Stream& st) {
  std::vector<uint32_t> v;
  for (const auto& [index, token] : st.values) v.push_back(token);
  return v;
}

class HfClusterE2E : public testkit::LocalClusterFixture {
 protected:
  HfClusterE2E() : LocalClusterFixture("hf_cluster_e2e") {}

  void TearDown() override {
    LocalClusterFixture::TearDown();  // the cluster first: its decode instance may still send to the client
    client_.reset();
  }

  // `mc-model init` of `arch` into the scratch directory.
  void make_checkpoint(const Arch& arch) {
    if (::access(kModelTool.c_str(), X_OK) != 0) GTEST_SKIP() << kModelTool << " is not built";
    dir_ = s_.path("model-" + arch.name);
    std::vector<std::string> argv = {kModelTool, "init", dir_,      "--arch", arch.name, "--layers", "2",
                                     "--hidden", "64",   "--vocab", "256",    "--dtype", "bf16"};
    argv.insert(argv.end(), arch.init_flags.begin(), arch.init_flags.end());
    const testkit::RunResult r = testkit::run(argv, 60'000);
    ASSERT_EQ(r.exit_code, 0) << "mc-model init " << arch.name << ": " << r.out;
    ASSERT_TRUE(std::filesystem::exists(dir_ + "/model.safetensors")) << r.out;
  }

  // The greedy tokens of `prompt` from the engine alone: `mc-model run` with the workers' KV type.
  std::vector<uint32_t> engine_tokens(const std::vector<uint32_t>& prompt, const std::string& kv_dtype) {
    const testkit::RunResult r =
        testkit::run({kModelTool, "run", dir_, "--prompt-ids", ids_text(prompt), "--steps", std::to_string(kOutput),
                      "--kv-dtype", kv_dtype, "--threads", "1", "--json"},
                     60'000);
    EXPECT_EQ(r.exit_code, 0) << "mc-model run: " << r.out;
    const json j = json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("tokens")) << "mc-model run printed: " << r.out;
    if (!j.is_object() || !j.contains("tokens")) return {};
    return j["tokens"].get<std::vector<uint32_t>>();
  }

  // The same tokens from the independent numpy reference (tests/infer/hf_reference.py), when a python3 with numpy is
  // here (tools/install-deps.sh installs it; else only the engine is the reference): the cluster's tokens are then
  // checked against a forward pass that shares no code with the engine.
  void expect_reference_tokens(const std::vector<uint32_t>& prompt, const std::string& kv_dtype,
                               const std::vector<uint32_t>& want) {
    std::string py;
    for (const char* candidate : {"/usr/bin/python3", "python3"}) {
      if (testkit::run({"/bin/sh", "-c", std::string(candidate) + " -c 'import numpy' 2>/dev/null"}, 30'000)
              .exit_code == 0) {
        py = candidate;
        break;
      }
    }
    if (py.empty()) return;
    const testkit::RunResult r = testkit::run(
        {py, MC_SOURCE_DIR "/tests/infer/hf_reference.py", dir_, "--prompt-ids", ids_text(prompt), "--steps",
         std::to_string(kOutput), "--kv-dtype", kv_dtype == "auto" ? "bf16" : kv_dtype, "--json"},
        120'000);
    ASSERT_EQ(r.exit_code, 0) << "hf_reference.py: " << r.out;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("tokens")) << "hf_reference.py printed: " << r.out;
    EXPECT_EQ(j["tokens"].get<std::vector<uint32_t>>(), want) << "the numpy reference's greedy tokens";
  }

  // The cluster on the checkpoint: 1 storage node, 1 prefill and 1 decode instance, the ref backend.
  void start(const Arch& arch, const std::string& prefix_cache) {
    ASSERT_NO_FATAL_FAILURE(start_cluster({"--backend",        "ref",         "--model",        dir_,
                                           "--kv-dtype",       arch.kv_dtype, "--threads",      "1",
                                           "--store-nodes",    "1",           "--prefill",      "1",
                                           "--decode",         "1",           "--block-size",   std::to_string(kBlock),
                                           "--kv-buffer-size", "16MiB",       "--prefix-cache", prefix_cache},
                                          {"master", "conductor", "prefill0", "decode0"}));
    if (IsSkipped()) return;
    client_ = std::make_unique<testkit::ClientEndpoint>();
  }

  // Submits `prompt` as request `id` and waits for its last token; the Conductor's reply in `reply`.
  Stream generate(const std::string& id, const std::vector<uint32_t>& prompt, proto::ConductorSubmitReply* reply) {
    proto::ConductorSubmitRequest r;
    r.request_id = id;
    r.tokens = prompt;
    r.input_tokens = static_cast<int64_t>(prompt.size());
    r.output_tokens = kOutput;
    r.slo_ttft_ms = 600'000;  // a sanitizer build on a loaded machine: never rejected for time
    r.slo_tbt_ms = 600'000;
    r.client_endpoint = client_->endpoint();
    *reply = call("conductor", r);
    EXPECT_TRUE(reply->accepted) << id << ": " << reply->reject_reason << " " << reply->reason;
    if (!reply->accepted) return {};
    testkit::wait_until(
        [&] {
          const Stream st = client_->get(id);
          return st.done || st.error.has_value();
        },
        kTerminalMs, 20);
    const Stream st = client_->get(id);
    EXPECT_FALSE(st.error.has_value()) << id << ": " << (st.error ? st.error->message : "");
    EXPECT_TRUE(st.done) << id << ": no request_done in " << kTerminalMs << " ms";
    return st;
  }

  // A counter of the prefill instance's stat reply (0 when never incremented).
  int64_t prefill_counter(const std::string& name) {
    const json m = json::parse(call("prefill0", proto::StatRequest{}).metrics_json, nullptr, false);
    if (!m.is_object() || !m.contains("counters") || !m["counters"].contains(name)) return 0;
    return m["counters"][name].get<int64_t>();
  }

  // Waits until nothing is queued or dispatching (the prefill's job reply comes after it stored the new blocks) and
  // the Conductor's prefix index holds at least `blocks` blocks (the store's KV events reached it).
  bool wait_settled(int64_t blocks, json* last) {
    return testkit::wait_until(
        [&] {
          *last = conductor_status();
          if (!last->is_object()) return false;
          bool idle = last->value("requests_dispatching", 1) == 0;
          for (const json& inst : last->value("instances", json::array())) {
            idle = idle && inst.value("queue_ms", 0.0) == 0.0;
          }
          return idle && (*last)["index"].value("blocks", int64_t{0}) >= blocks;
        },
        40'000, 100);
  }

  void run_case(const Arch& arch, bool store) {
    ASSERT_NO_FATAL_FAILURE(make_checkpoint(arch));
    if (IsSkipped()) return;
    const std::vector<uint32_t> a = tokens(kPromptA, 37, 5);
    std::vector<uint32_t> b(a.begin(), a.begin() + kShared);
    for (uint32_t t : tokens(kPromptB - kShared, 11, 3)) b.push_back(t);
    const std::vector<uint32_t> want_a = engine_tokens(a, arch.kv_dtype);
    const std::vector<uint32_t> want_b = engine_tokens(b, arch.kv_dtype);
    ASSERT_EQ(want_a.size(), static_cast<size_t>(kOutput));
    ASSERT_EQ(want_b.size(), static_cast<size_t>(kOutput));
    ASSERT_NO_FATAL_FAILURE(expect_reference_tokens(a, arch.kv_dtype, want_a));
    ASSERT_NO_FATAL_FAILURE(expect_reference_tokens(b, arch.kv_dtype, want_b));
    ASSERT_NO_FATAL_FAILURE(start(arch, store ? "store" : "none"));
    if (IsSkipped()) return;

    int64_t indexed = 0;  // complete blocks of the distinct prompts sent so far (each starts with its own token)
    proto::ConductorSubmitReply reply;
    if (store) {
      // The Conductor's prior is a GPU's: a few prefills of several lengths teach it this CPU's speed (its refit),
      // so that reusing a long prefix is priced below recomputing it.
      for (int64_t n : {50, 120, 200, 300, 420}) {
        const Stream st = generate("warm" + std::to_string(n), tokens(n, 7, static_cast<uint32_t>(n + 1)), &reply);
        ASSERT_TRUE(st.done) << "warm-up of " << n << " tokens";
        indexed += n / kBlock;
      }
    }
    const Stream sa = generate("a", a, &reply);
    ASSERT_TRUE(sa.done);
    EXPECT_EQ(values(sa), want_a) << arch.name << ": prompt A through the cluster";
    EXPECT_EQ(reply.hit_tokens, 0) << reply.reason;
    if (store) indexed += kPromptA / kBlock;
    json st;
    ASSERT_TRUE(wait_settled(indexed, &st))
        << "the Conductor's index did not reach " << indexed << " blocks, or work is still queued: " << st.dump();

    // B, sent again while the Conductor prices recomputing its cached prefix below reading it.
    int64_t planned = 0;
    int64_t read = 0;
    for (int attempt = 1; attempt <= kAttempts; ++attempt) {
      const std::string id = "b" + std::to_string(attempt);
      const int64_t hits_before = prefill_counter("mc_prefill_hit_tokens_total");
      const Stream sb = generate(id, b, &reply);
      ASSERT_TRUE(sb.done);
      EXPECT_EQ(values(sb), want_b) << arch.name << ": prompt B (" << id << ", " << reply.hit_tokens
                                    << " tokens planned from the store) through the cluster";
      ASSERT_TRUE(wait_settled(indexed, &st)) << st.dump();
      planned = reply.hit_tokens;
      read = prefill_counter("mc_prefill_hit_tokens_total") - hits_before;
      // The prefill instance read what the Conductor planned, no more and no less.
      EXPECT_EQ(read, planned) << id << ": " << reply.reason;
      if (!store) {
        EXPECT_EQ(reply.pool_prefix_tokens, 0) << reply.reason;
        break;
      }
      // The whole shared prefix is in the pool, whatever part of it the plan reuses (from the second attempt on also
      // the blocks of B the first one stored).
      if (attempt == 1) {
        EXPECT_EQ(reply.pool_prefix_tokens, kShared) << id << ": " << reply.reason;
      } else {
        EXPECT_GE(reply.pool_prefix_tokens, kShared) << id << ": " << reply.reason;
      }
      EXPECT_LE(planned, reply.pool_prefix_tokens) << id << ": " << reply.reason;
      if (planned > 0) break;
      std::fprintf(stderr, "%s: %s recomputed its cached prefix (%s); again\n", arch.name.c_str(), id.c_str(),
                   reply.reason.c_str());
    }
    if (store) {
      EXPECT_GT(read, 0) << "B was never served from the store in " << kAttempts << " attempts: " << reply.reason;
      EXPECT_EQ(read % kBlock, 0) << "whole blocks only";
    } else {
      EXPECT_EQ(prefill_counter("mc_prefill_hit_tokens_total"), 0);
      EXPECT_EQ(prefill_counter("mc_prefill_stored_blocks_total"), 0);
    }
  }

  std::string dir_;
  std::unique_ptr<testkit::ClientEndpoint> client_;
};

TEST_F(HfClusterE2E, LlamaTokensWithTheStoreCacheAreTheEngines) { run_case(kLlama, /*store=*/true); }
TEST_F(HfClusterE2E, LlamaTokensWithoutACacheAreTheEngines) { run_case(kLlama, /*store=*/false); }
TEST_F(HfClusterE2E, Qwen2TokensWithTheStoreCacheAreTheEngines) { run_case(kQwen2, /*store=*/true); }
TEST_F(HfClusterE2E, Qwen2TokensWithoutACacheAreTheEngines) { run_case(kQwen2, /*store=*/false); }
TEST_F(HfClusterE2E, Qwen3TokensWithTheStoreCacheAreTheEngines) { run_case(kQwen3, /*store=*/true); }
TEST_F(HfClusterE2E, Qwen3TokensWithoutACacheAreTheEngines) { run_case(kQwen3, /*store=*/false); }
TEST_F(HfClusterE2E, MistralTokensWithTheStoreCacheAreTheEngines) { run_case(kMistral, /*store=*/true); }
TEST_F(HfClusterE2E, MistralTokensWithoutACacheAreTheEngines) { run_case(kMistral, /*store=*/false); }

}  // namespace MC_UNITY_ID
}  // namespace mc
