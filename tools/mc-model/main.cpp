// mc-model: what a model is (`inspect`: its shape, sizes, fetch threshold, and whether a checkpoint's weights match
// its config), a checkpoint to test with (`init`: seeded random weights in the Hugging Face layout), and what the CPU
// engine computes for a prompt (`run`: greedy tokens and top logits). Issue 49.
#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/infer/model_run.hpp"
#include "mc/model/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-model: inspect a model (preset, Hugging Face directory or JSON), write a test checkpoint, or run a prompt"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-model");

  mc::model::InspectCommand in;
  auto* in_cmd = app.add_subcommand("inspect",
                                    "Architecture, parameters, layers, KV bytes per token, the fetch threshold, and "
                                    "a check of the checkpoint's weights against its config");
  in_cmd->add_option("model", in.model, "Preset, Hugging Face model directory or JSON file")->required();
  mc::cli::add_gpu_option(*in_cmd, in.gpu);
  mc::cli::add_json_flag(*in_cmd, in.json, "Print JSON instead of the lines");

  mc::model::InitCommand init;
  auto* init_cmd = app.add_subcommand("init",
                                      "Write DIR/config.json, generation_config.json and model.safetensors with "
                                      "seeded random weights (tests and demos; at most 8 GiB)");
  init_cmd->add_option("dir", init.dir, "Directory to write (created)")->required();
  init_cmd
      ->add_option("--arch", init.arch, "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or MistralForCausalLM")
      ->capture_default_str();
  init_cmd->add_option("--layers", init.layers, "Decoder layers")->capture_default_str()->check(CLI::Range(1, 1024));
  init_cmd->add_option("--hidden", init.hidden, "Hidden size")->capture_default_str()->check(CLI::Range(2, 65536));
  init_cmd->add_option("--heads", init.heads, "Attention heads")->capture_default_str()->check(CLI::Range(1, 1024));
  init_cmd->add_option("--kv-heads", init.kv_heads, "KV heads (grouped-query attention; divides --heads)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  init_cmd->add_option("--head-dim", init.head_dim, "Head size (0: hidden / heads)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  init_cmd->add_option("--ffn", init.ffn, "FFN (intermediate) size")
      ->capture_default_str()
      ->check(CLI::Range(1, 262144));
  init_cmd->add_option("--vocab", init.vocab, "Vocabulary size")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  init_cmd->add_option("--max-position", init.max_position, "Longest context, tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  init_cmd->add_option("--rope-theta", init.rope_theta, "RoPE base frequency")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  init_cmd->add_flag("--tie-word-embeddings", init.tie_word_embeddings, "lm_head is the embedding matrix");
  init_cmd->add_option("--rope-scaling", init.rope_scaling, "RoPE scaling: none or llama3 (Llama 3.1/3.2's)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "llama3"}));
  init_cmd->add_option("--dtype", init.dtype, "Weight type: bf16 or fp32")->capture_default_str();
  init_cmd->add_option("--seed", init.seed, "Seed of the weights (same flags, same bytes)")->capture_default_str();
  init_cmd->add_flag("--force", init.force, "Overwrite a checkpoint already in DIR");
  mc::cli::add_json_flag(*init_cmd, init.json, "Print JSON instead of the line");

  mc::infer::RunCommand run;
  auto* run_cmd = app.add_subcommand("run",
                                     "One prompt through the CPU engine alone: greedy tokens and the top logits of "
                                     "the last prompt token (for checking against a reference)");
  run_cmd->add_option("model", run.model, "Hugging Face model directory, preset or JSON file")->required();
  run_cmd->add_option("--prompt-ids", run.prompt_ids, "Prompt token ids, comma-separated (1,2,3)")->required();
  run_cmd->add_option("--steps", run.steps, "Greedy tokens to generate (0: only the prompt's logits)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  run_cmd->add_option("--top", run.top, "Logits of the last prompt token to print, largest first")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  run_cmd->add_option("--kv-dtype", run.kv_dtype, "KV element type: auto (the checkpoint's), fp32, bf16, fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}));
  run_cmd->add_option("--threads", run.threads, "Compute threads (all cores: $(nproc))")
      ->envname("MC_THREADS")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  run_cmd->add_option("--seed", run.seed, "Seed of the weights of a preset or JSON shape")->capture_default_str();
  run_cmd
      ->add_option("--cached-tokens", run.cached_tokens,
                   "Compute the first N prompt tokens first, then the rest over their KV (as a prefix-cache hit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  mc::cli::add_json_flag(*run_cmd, run.json, "Print JSON instead of the lines");

  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (run_cmd->parsed()) return mc::cli::report("mc-model run", mc::infer::run_model_command(run, std::cout), run.json);
  if (in_cmd->parsed())
    return mc::cli::report("mc-model inspect", mc::model::run_inspect_command(in, std::cout), in.json);
  return mc::cli::report("mc-model init", mc::model::run_init_command(init, std::cout), init.json);
}
