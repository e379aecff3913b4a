// mc-model through the binary (issue 49 items 1 and 5): `init` writes a checkpoint of each supported architecture that
// `inspect` reads back as matching its config, with the parameter count of the config; an independent reader (Python's
// standard library, no mc code) finds the file laid out as the safetensors format's reference implementation requires
// (8-byte aligned header, tensors tiling the data section in order without gaps, the expected names and shapes); and
// bad checkpoints (truncated, a 100 MB header length, an unknown dtype, weights of another shape) exit 2 naming the
// file or the tensor.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "mc/testkit/process.hpp"
#include "mc/testkit/scratch.hpp"

namespace mc::testing {
namespace MC_UNITY_ID {

namespace fs = std::filesystem;
const std::string kModelTool = MC_BINARY_DIR "/bin/mc-model";

using ModelRun = testkit::ShellResult;

// Runs a shell command; stdout and stderr together.
ModelRun sh(const std::string& cmd) { return testkit::shell(cmd + " 2>&1"); }

// Python's standard library reads the file as the reference implementation lays it out; prints "ok N" (tensors).
constexpr const char* kIndependentReader = R"PY(
import json, struct, sys
path = sys.argv[1]
data = open(path, 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
assert (8 + n) % 8 == 0, 'header not padded to 8 bytes'
header = json.loads(data[8:8 + n].decode('utf-8'))
meta = header.pop('__metadata__', {})
assert meta.get('format') == 'pt', meta
sizes = {'BF16': 2, 'F16': 2, 'F32': 4}
end = 0
for name, t in sorted(header.items(), key=lambda kv: kv[1]['data_offsets'][0]):
    begin, stop = t['data_offsets']
    assert begin == end, 'gap or overlap before ' + name
    count = 1
    for d in t['shape']:
        count *= d
    assert stop - begin == count * sizes[t['dtype']], name
    end = stop
assert 8 + n + end == len(data), 'trailing bytes'
shapes = {k: v['shape'] for k, v in header.items()}
print('ok', len(header), json.dumps(shapes))
)PY";

TEST(ModelTool, InitWritesEachArchitectureThatInspectAndAnIndependentReaderAccept) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs python3 for the independent reader (tools/install-deps.sh installs it)";
  }
  testkit::Scratch s("model_tool");
  const std::string reader = s.path("read.py");
  std::ofstream(reader) << kIndependentReader;
  struct Case {
    const char* arch;
    const char* extra;
    const char* trait;  // a tensor only this architecture has ("" for none)
  };
  for (const Case& c : {Case{"LlamaForCausalLM", "", ""},
                        Case{"Qwen2ForCausalLM", "--tie-word-embeddings", "model.layers.1.self_attn.v_proj.bias"},
                        Case{"Qwen3ForCausalLM", "--head-dim 32", "model.layers.0.self_attn.k_norm.weight"},
                        Case{"MistralForCausalLM", "--dtype fp32", ""}}) {
    SCOPED_TRACE(c.arch);
    const std::string dir = s.path(c.arch);
    ModelRun init =
        sh(kModelTool + " init " + dir + " --arch " + c.arch +
           " --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 --seed 5 --json " + c.extra);
    ASSERT_EQ(init.code, 0) << init.out;
    auto written = nlohmann::json::parse(init.out);
    ModelRun inspect = sh(kModelTool + " inspect " + dir + " --json");
    ASSERT_EQ(inspect.code, 0) << inspect.out;
    auto j = nlohmann::json::parse(inspect.out);
    EXPECT_EQ(j["model"]["architecture"], c.arch);
    EXPECT_EQ(j["model"]["param_count"], written["parameters"]);
    EXPECT_EQ(j["weights"]["match"], true);
    EXPECT_EQ(j["weights"]["tensors"], written["tensors"]);
    EXPECT_EQ(j["weights"]["bytes"], written["weight_bytes"]);
    EXPECT_TRUE(j["weights"]["ignored"].empty()) << j.dump();
    ModelRun py = sh("python3 " + reader + " " + dir + "/model.safetensors");
    ASSERT_EQ(py.code, 0) << py.out;
    ASSERT_EQ(py.out.rfind("ok ", 0), 0u) << py.out;
    std::istringstream fields(py.out.substr(3));
    int64_t tensors = 0;
    fields >> tensors;
    EXPECT_EQ(tensors, written["tensors"].get<int64_t>());
    std::string rest;
    std::getline(fields, rest);
    auto shapes = nlohmann::json::parse(rest);
    EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{300, 64}));
    EXPECT_EQ(shapes.contains("lm_head.weight"), std::string(c.extra) != "--tie-word-embeddings");
    if (*c.trait != '\0') EXPECT_TRUE(shapes.contains(c.trait)) << c.trait;
    // The same flags, the same bytes.
    const std::string again = dir + "-again";
    ASSERT_EQ(sh(kModelTool + " init " + again + " --arch " + c.arch +
                 " --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 --seed 5 " + c.extra)
                  .code,
              0);
    EXPECT_EQ(sh("cmp " + dir + "/model.safetensors " + again + "/model.safetensors").code, 0);
  }
}

TEST(ModelTool, BadCheckpointsExitTwoNamingTheFileOrTheTensor) {
  testkit::Scratch s("model_tool");
  const std::string good = s.path("good");
  ASSERT_EQ(
      sh(kModelTool + " init " + good + " --layers 1 --hidden 32 --heads 2 --kv-heads 1 --ffn 64 --vocab 64").code, 0);
  const std::string weights = good + "/model.safetensors";
  std::string bytes;
  {
    std::ifstream in(weights, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  auto variant = [&](const std::string& name, const std::string& file_bytes, const std::string& config_edit) {
    const std::string dir = s.path(name);
    fs::create_directories(dir);
    std::ofstream(dir + "/model.safetensors", std::ios::binary) << file_bytes;
    std::string config;
    {
      std::ifstream in(good + "/config.json");
      std::stringstream ss;
      ss << in.rdbuf();
      config = ss.str();
    }
    if (!config_edit.empty()) {
      auto j = nlohmann::json::parse(config);
      j.merge_patch(nlohmann::json::parse(config_edit));
      config = j.dump();
    }
    std::ofstream(dir + "/config.json") << config;
    return sh(kModelTool + " inspect " + dir);
  };
  // Truncated: the file ends before its last tensor does.
  ModelRun truncated = variant("truncated", bytes.substr(0, bytes.size() - 100), "");
  EXPECT_EQ(truncated.code, 2) << truncated.out;
  EXPECT_NE(truncated.out.find("truncated/model.safetensors"), std::string::npos) << truncated.out;
  // A header length of 100 MB.
  std::string huge = bytes;
  const uint64_t n = 100'000'000;
  for (int i = 0; i < 8; ++i) huge[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  ModelRun big = variant("huge_header", huge, "");
  EXPECT_EQ(big.code, 2) << big.out;
  EXPECT_NE(big.out.find("huge_header/model.safetensors"), std::string::npos) << big.out;
  // An unknown dtype (the header's "BF16" of the first tensor renamed in place, same length).
  std::string odd = bytes;
  const size_t at = odd.find("\"BF16\"");
  ASSERT_NE(at, std::string::npos);
  odd.replace(at, 6, "\"BX16\"");
  ModelRun dtype = variant("unknown_dtype", odd, "");
  EXPECT_EQ(dtype.code, 2) << dtype.out;
  EXPECT_NE(dtype.out.find("BX16"), std::string::npos) << dtype.out;
  // Weights of another shape than config.json's: the FFN said to be wider.
  ModelRun shape = variant("other_shape", bytes, R"({"intermediate_size": 128})");
  EXPECT_EQ(shape.code, 2) << shape.out;
  EXPECT_NE(shape.out.find("mlp.gate_proj.weight"), std::string::npos) << shape.out;
  EXPECT_NE(shape.out.find("[128, 32]"), std::string::npos) << shape.out;
  // An architecture mc does not compute, from init and from inspect.
  ModelRun arch = sh(kModelTool + " init " + s.path("gpt2") + " --arch GPT2LMHeadModel");
  EXPECT_EQ(arch.code, 2) << arch.out;
  EXPECT_NE(arch.out.find("Qwen2ForCausalLM"), std::string::npos) << arch.out;
  ModelRun gpt2 = variant("gpt2_config", bytes, R"({"architectures": ["GPT2LMHeadModel"]})");
  EXPECT_EQ(gpt2.code, 2) << gpt2.out;
  EXPECT_NE(gpt2.out.find("GPT2LMHeadModel"), std::string::npos) << gpt2.out;
  // A directory with a config and no weights is described as such.
  fs::remove(weights);
  ModelRun config_only = sh(kModelTool + " inspect " + good);
  EXPECT_EQ(config_only.code, 0) << config_only.out;
  EXPECT_NE(config_only.out.find("none in the directory"), std::string::npos) << config_only.out;
}

}  // namespace MC_UNITY_ID
}  // namespace mc::testing
