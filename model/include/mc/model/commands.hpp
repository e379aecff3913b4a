// The commands behind mc-model's thin main (issue 49 item 5): `inspect` (what a model is, and whether a checkpoint's
// weights match its config) and `init` (a checkpoint with seeded random weights in the Hugging Face layout, for tests
// and demos). Each validates its options, runs, writes data to `out` (a table, or JSON with --json) and returns a
// Status the main maps to an exit code (0 ok, 1 runtime, 2 bad input).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "mc/common/status.hpp"

namespace mc::model {

struct InspectCommand {
  std::string model;           // a preset, a Hugging Face model directory or a JSON file (load_model)
  std::string gpu = "a800x8";  // for the fetch threshold (cost_model.hpp)
  bool json = false;
};
// Prints the model's shape, its parameter, weight and KV sizes, the bandwidth above which fetching a cached prefix
// beats recomputing it on `gpu` (the linear term of DESIGN.md §1), and for a directory holding weights their files,
// dtypes and bytes. The weights are checked against the architecture's tensors (checkpoint_layout.hpp): a missing
// tensor or a shape that disagrees with config.json is kInvalidArgument naming the tensor, both shapes and the file;
// tensors no supported architecture has are listed as ignored.
Status run_inspect_command(const InspectCommand& cmd, std::ostream& out);

struct InitCommand {
  std::string dir;                        // created; an existing config.json or weights file there is not overwritten
  std::string arch = "LlamaForCausalLM";  // model_config.hpp's four
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t ffn = 128;
  int64_t vocab = 256;
  int64_t max_position = 4096;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::string rope_scaling = "none";  // none | llama3 (Llama 3.1/3.2's: factor 32, low 1, high 4, original 8192)
  std::string dtype = "bf16";         // bf16 | fp32
  uint64_t seed = 1;
  bool force = false;  // overwrite what is there
  bool json = false;
};
// Writes DIR/config.json, DIR/generation_config.json and DIR/model.safetensors: every tensor of the architecture
// (checkpoint_layout.hpp) drawn uniformly from the seed, scaled by 1/sqrt(fan-in) (norms near 1), so the same flags
// always give the same bytes. At most 8 GiB of weights (a test or demo checkpoint). Prints what it wrote.
Status run_init_command(const InitCommand& cmd, std::ostream& out);

}  // namespace mc::model
