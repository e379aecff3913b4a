// The CPU engine on Hugging Face checkpoints, through the real binaries (issue 49): checkpoints that `mc-model init`
// makes for each architecture, run by `mc-model run` (the engine mc-prefill and mc-decode run), against an
// independent reference forward pass written with numpy (tests/infer/hf_reference.py, which shares no code with the
// engine and reads the same safetensors files). Prompts of 1, 17 and 300 tokens: the top logits of the last prompt
// token agree within kLogitTolerance (fp32 KV; kBf16KvTolerance with bf16 KV, both sides rounding K and V), and the
// greedy continuations agree token for token; a prefix computed first and reused (--cached-tokens) changes nothing.
// A bad checkpoint stops mc-prefill at start with an error naming the tensor.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mc/testkit/process.hpp"
#include "mc/testkit/scratch.hpp"

namespace mc::testing {
namespace MC_UNITY_ID {

namespace fs = std::filesystem;
const std::string kBin = MC_BINARY_DIR "/bin/";
const std::string kReference = MC_SOURCE_DIR "/tests/infer/hf_reference.py";

// Both sides compute in fp32 from the same bf16 weights; they differ in summation order only (observed: < 1e-6).
constexpr double kLogitTolerance = 1e-3;
// With bf16 KV a K or V value near a rounding boundary may round the other way on one side.
constexpr double kBf16KvTolerance = 2e-2;

using Shell = testkit::ShellResult;

Shell sh(const std::string& cmd, bool with_stderr = false) {
  return testkit::shell(cmd + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// A python3 with numpy: Debian's (/usr/bin/python3, where tools/install-deps.sh installs python3-numpy) first,
// then whichever python3 is on PATH; "" when none has numpy.
std::string numpy_python() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    if (sh(std::string(py) + " -c 'import numpy'").code == 0) return py;
  }
  return "";
}

std::string ids(size_t n, uint32_t seed, uint32_t vocab) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += (i ? "," : "") + std::to_string((seed + 37 * i + (i * i) % 11) % vocab);
  }
  return s;
}

struct Checkpoint {
  std::string name, init_flags, kv_dtype;
};
void PrintTo(const Checkpoint& c, std::ostream* os) {
  *os << c.name << " (" << c.init_flags << ", KV " << c.kv_dtype << ")";
}

nlohmann::json json_of(const Shell& r, const std::string& what) {
  EXPECT_EQ(r.code, 0) << what << ": " << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << what << ": " << r.out;
  return j.is_discarded() ? nlohmann::json::object() : j;
}

class HfEngine : public ::testing::TestWithParam<Checkpoint> {};

TEST_P(HfEngine, AgreesWithTheNumpyReference) {
  const std::string py = numpy_python();
  if (py.empty()) GTEST_SKIP() << "needs python3 with numpy for the reference (tools/install-deps.sh installs it)";
  const Checkpoint& c = GetParam();
  testkit::Scratch s("hf_engine");
  const std::string dir = s.path(c.name);
  const Shell init = sh(kBin + "mc-model init " + dir + " --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 " +
                            "--vocab 256 --seed 7 " + c.init_flags,
                        true);
  ASSERT_EQ(init.code, 0) << init.out;
  const double tolerance = c.kv_dtype == "bf16" ? kBf16KvTolerance : kLogitTolerance;
  for (size_t n : {size_t{1}, size_t{17}, size_t{300}}) {
    SCOPED_TRACE(c.name + ", " + std::to_string(n) + " prompt tokens, KV " + c.kv_dtype);
    const std::string prompt = ids(n, static_cast<uint32_t>(n) * 13 + 5, 256);
    const std::string args = " --prompt-ids " + prompt + " --steps 6 --top 5 --kv-dtype " + c.kv_dtype + " --json";
    const nlohmann::json engine = json_of(sh(kBin + "mc-model run " + dir + args + " --threads 2"), "mc-model run");
    const nlohmann::json ref = json_of(sh(py + " " + kReference + " " + dir + args), "hf_reference.py");
    ASSERT_TRUE(engine.contains("top") && ref.contains("top"));
    ASSERT_EQ(engine["top"].size(), 5u);
    ASSERT_EQ(ref["top"].size(), 5u);
    // The reference's top logits, each found in the engine's logits within the tolerance (ids may swap places only
    // where two logits are closer than the tolerance).
    for (size_t i = 0; i < 5; ++i) {
      const double want = ref["top"][i][1].get<double>();
      const double got = engine["top"][i][1].get<double>();
      EXPECT_NEAR(got, want, tolerance) << "logit rank " << i;
      if (std::fabs(want - (i + 1 < 5 ? ref["top"][i + 1][1].get<double>() : -1e9)) > 2 * tolerance &&
          (i == 0 || std::fabs(want - ref["top"][i - 1][1].get<double>()) > 2 * tolerance)) {
        EXPECT_EQ(engine["top"][i][0], ref["top"][i][0]) << "logit rank " << i;
      }
    }
    EXPECT_EQ(engine["tokens"], ref["tokens"]) << "greedy continuation";
    if (n > 16) {
      // The first 16 tokens' KV computed first and reused: a prefix-cache hit computes the same.
      const nlohmann::json cached = json_of(sh(kBin + "mc-model run " + dir + args + " --threads 2 --cached-tokens 16"),
                                            "mc-model run --cached-tokens");
      EXPECT_EQ(cached["tokens"], engine["tokens"]) << "with 16 tokens cached";
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_NEAR(cached["top"][i][1].get<double>(), engine["top"][i][1].get<double>(), 1e-4) << "cached rank " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, HfEngine,
    ::testing::Values(Checkpoint{"llama", "--arch LlamaForCausalLM", "fp32"},
                      Checkpoint{"qwen2", "--arch Qwen2ForCausalLM", "fp32"},
                      Checkpoint{"qwen3", "--arch Qwen3ForCausalLM --head-dim 32", "fp32"},
                      Checkpoint{"mistral", "--arch MistralForCausalLM", "fp32"},
                      Checkpoint{"llama32", "--arch LlamaForCausalLM --rope-scaling llama3 --tie-word-embeddings",
                                 "fp32"},
                      Checkpoint{"qwen2_fp32_weights", "--arch Qwen2ForCausalLM --dtype fp32", "fp32"},
                      Checkpoint{"qwen3_bf16_kv", "--arch Qwen3ForCausalLM", "bf16"}),
    [](const ::testing::TestParamInfo<Checkpoint>& info) { return info.param.name; });

// A checkpoint whose weights disagree with its config stops mc-prefill at start: exit 2, naming the tensor.
TEST(HfEngineErrors, AWrongShapeStopsTheWorkerNamingTheTensor) {
  testkit::Scratch s("hf_engine_shapes");
  const std::string a = s.path("a"), b = s.path("b");
  ASSERT_EQ(sh(kBin + "mc-model init " + a + " --hidden 64 --ffn 128").code, 0);
  ASSERT_EQ(sh(kBin + "mc-model init " + b + " --hidden 64 --ffn 96").code, 0);
  fs::copy_file(b + "/model.safetensors", a + "/model.safetensors", fs::copy_options::overwrite_existing);
  const Shell r = sh(kBin + "mc-prefill --backend ref --model " + a + " --listen tcp://127.0.0.1:0 --store none", true);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("mlp.gate_proj.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config.json gives"), std::string::npos) << r.out;
  // Truncated: the file shorter than its header says.
  fs::resize_file(b + "/model.safetensors", fs::file_size(b + "/model.safetensors") - 100);
  const Shell t = sh(kBin + "mc-decode --backend ref --model " + b + " --listen tcp://127.0.0.1:0", true);
  EXPECT_NE(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("model.safetensors"), std::string::npos) << t.out;
}

// Hostile checkpoints end in clear errors, at once: NaN weights fail the prompt instead of answering token 0; a FIFO
// where a file should be does not block; a config.json of 2^31 - 1 layers is refused before 2^35 tensor names are
// made; DIR/config.json names the checkpoint (its weights), not a bare shape for seeded ones.
TEST(HfEngineErrors, HostileCheckpointsEndInClearErrors) {
  if (sh("command -v python3").code != 0) GTEST_SKIP() << "needs python3 to edit the checkpoint";
  testkit::Scratch s("hf_engine_hostile");
  const std::string dir = s.path("m");
  ASSERT_EQ(sh(kBin + "mc-model init " + dir + " --dtype fp32").code, 0);
  const std::string run = kBin + "mc-model run " + dir + " --prompt-ids 1,2,3 --steps 2";
  // DIR/config.json: the checkpoint's weights (the revision is the checkpoint's digest).
  const Shell by_file = sh(kBin + "mc-model run " + dir + "/config.json --prompt-ids 1,2,3 --steps 2", true);
  EXPECT_EQ(by_file.code, 0) << by_file.out;
  EXPECT_NE(by_file.out.find("ckpt-"), std::string::npos) << by_file.out;
  // NaN in model.norm.weight (fp32): every logit is NaN.
  const std::string poison =
      "python3 -c \"import json,struct,sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); "
      "n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n]); o=h['model.norm.weight']"
      "['data_offsets']; b[8+n+o[0]:8+n+o[0]+4]=struct.pack('<f',float('nan')); "
      "open(p,'wb').write(b)\" " +
      dir + "/model.safetensors";
  ASSERT_EQ(sh(poison, true).code, 0);
  const Shell nan = sh(run, true);
  EXPECT_EQ(nan.code, 1) << nan.out;
  EXPECT_NE(nan.out.find("non-finite logit"), std::string::npos) << nan.out;
  // 2^31 - 1 layers.
  ASSERT_EQ(sh("sed -i 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 2147483647/' " + dir + "/config.json").code,
            0);
  const Shell layers = sh("timeout 60 " + run, true);
  EXPECT_EQ(layers.code, 2) << layers.out;
  EXPECT_NE(layers.out.find("tensors, but config.json"), std::string::npos) << layers.out;
  // A FIFO as the weights file.
  fs::remove(dir + "/model.safetensors");
  ASSERT_EQ(sh("mkfifo " + dir + "/model.safetensors").code, 0);
  ASSERT_EQ(sh("sed -i 's/\"num_hidden_layers\": 2147483647/\"num_hidden_layers\": 2/' " + dir + "/config.json").code,
            0);
  const Shell fifo = sh("timeout 60 " + run, true);
  EXPECT_EQ(fifo.code, 2) << fifo.out;
  EXPECT_NE(fifo.out.find("not a regular file"), std::string::npos) << fifo.out;
}

}  // namespace MC_UNITY_ID
}  // namespace mc::testing
