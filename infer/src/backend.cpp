#include "mc/infer/backend.hpp"

#include "backends.hpp"

namespace mc::infer {

uint64_t lora_weight_seed(const LoraAdapter& adapter) {
  if (adapter.is_base()) return 0;
  KeyNamespace scope;  // only the adapter set: chain_seed() is XXH3 of its canonical bytes
  scope.lora_name = adapter.name;
  scope.lora_version = adapter.version;
  return scope.chain_seed();
}

KeyNamespace kv_namespace(const Backend& backend, int64_t block_tokens, uint64_t weight_seed) {
  KeyNamespace ns;
  // A checkpoint is named by its architecture here (its digest, in the revision, identifies it): its directory's
  // name may differ from host to host.
  const model::ModelConfig& m = backend.model();
  ns.model_id = m.checkpoint_dir.empty() ? m.name : std::string(model::architecture_name(m.architecture));
  ns.model_revision = backend.weights_revision(weight_seed);
  ns.kv_dtype = backend.kv_encoding();
  ns.layout = "tp1-l" + std::to_string(backend.model().num_layers);
  ns.block_size = static_cast<uint32_t>(block_tokens);
  return ns;
}

Status validate_prefill(const model::ModelConfig& model, const KvBuffer& kv, const PrefillRequest& request) {
  const int64_t n = static_cast<int64_t>(request.tokens.size());
  if (n == 0) return error(Code::kInvalidArgument, "prefill: empty prompt (input_length must be > 0)");
  if (n > model.max_context_tokens) {
    return error(Code::kInvalidArgument, "prefill: input too long: " + std::to_string(n) + " tokens > max context " +
                                             std::to_string(model.max_context_tokens));
  }
  if (request.cached_tokens < 0 || request.cached_tokens >= n) {
    return error(Code::kInvalidArgument, "prefill: cached_tokens " + std::to_string(request.cached_tokens) +
                                             " outside [0, " + std::to_string(n) +
                                             "): at least the last prompt token must be computed");
  }
  if (request.chunk_tokens < 0) return error(Code::kInvalidArgument, "prefill: chunk_tokens must be >= 0");
  for (size_t i = 0; i < request.tokens.size(); ++i) {
    if (request.tokens[i] >= static_cast<uint64_t>(model.vocab_size)) {
      return error(Code::kInvalidArgument, "prefill: token " + std::to_string(request.tokens[i]) + " at position " +
                                               std::to_string(i) + " >= vocab size " +
                                               std::to_string(model.vocab_size));
    }
  }
  const int64_t need = kv.layout().blocks_for_tokens(n);
  if (static_cast<int64_t>(request.block_table.size()) < need) {
    return error(Code::kInvalidArgument, "prefill: block table has " + std::to_string(request.block_table.size()) +
                                             " blocks, " + std::to_string(n) + " tokens need " + std::to_string(need));
  }
  for (int32_t b : request.block_table) MC_RETURN_IF_ERROR(kv.check_block(b));
  return Status::ok();
}

Status validate_stage(const model::ModelConfig& model, const KvBuffer& kv, const StageRequest& req,
                      int64_t hidden_floats) {
  const auto n = static_cast<int64_t>(req.tokens.size());
  if (req.first_layer < 0 || req.first_layer >= model.num_layers || req.num_layers < 1 ||
      req.num_layers > model.num_layers - req.first_layer) {
    return error(Code::kInvalidArgument, "prefill stage: layers [" + std::to_string(req.first_layer) + ", +" +
                                             std::to_string(req.num_layers) + ") outside the model's " +
                                             std::to_string(model.num_layers));
  }
  if (req.token_begin < 0 || req.token_end <= req.token_begin || req.token_end > n) {
    return error(Code::kInvalidArgument, "prefill stage: tokens [" + std::to_string(req.token_begin) + ", " +
                                             std::to_string(req.token_end) + ") outside the prompt of " +
                                             std::to_string(n));
  }
  const int64_t rows = req.token_end - req.token_begin;
  const bool embeds = req.first_layer == 0;
  if (embeds ? !req.hidden_in.empty() : static_cast<int64_t>(req.hidden_in.size()) != rows * hidden_floats) {
    return error(Code::kInvalidArgument, "prefill stage: hidden_in holds " + std::to_string(req.hidden_in.size()) +
                                             " floats, " +
                                             (embeds ? std::string("none expected at layer 0")
                                                     : std::to_string(rows * hidden_floats) + " expected (tokens x " +
                                                           std::to_string(hidden_floats) + ")"));
  }
  if (kv.layout().blocks_for_tokens(req.token_end) > static_cast<int64_t>(req.block_table.size())) {
    return error(Code::kInvalidArgument, "prefill stage: block table of " + std::to_string(req.block_table.size()) +
                                             " blocks does not cover " + std::to_string(req.token_end) + " tokens");
  }
  for (int32_t b : req.block_table) MC_RETURN_IF_ERROR(kv.check_block(b));
  for (int64_t p = req.token_begin; p < req.token_end; ++p) {
    if (req.tokens[static_cast<size_t>(p)] >= static_cast<uint64_t>(model.vocab_size)) {
      return error(Code::kInvalidArgument, "prefill stage: token " +
                                               std::to_string(req.tokens[static_cast<size_t>(p)]) + " >= vocab " +
                                               std::to_string(model.vocab_size));
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  MC_RETURN_IF_ERROR(options.model.validate());
  if (options.kv_dtype != "auto" && options.kv_dtype != "fp32" && options.kv_dtype != "bf16" &&
      options.kv_dtype != "fp16") {
    return error(Code::kInvalidArgument, "--kv-dtype '" + options.kv_dtype + "' is not one of auto, fp32, bf16, fp16");
  }
  if (options.kind == "ref") {
    // Seeded weights are drawn for a plain LLaMA only: the traits below need a checkpoint's tensors.
    const model::ModelConfig& m = options.model;
    if (m.checkpoint_dir.empty() && (m.architecture != model::Architecture::kLlama || m.attention_bias || m.qk_norm ||
                                     m.tie_word_embeddings || m.rope_scaling.kind != model::RopeScaling::Kind::kNone)) {
      return error(Code::kInvalidArgument,
                   "ref backend: model '" + m.name + "' (" + std::string(model::architecture_name(m.architecture)) +
                       ") needs biases, q/k norms, tied embeddings or RoPE scaling, which only a checkpoint's "
                       "weights give: point --model at a Hugging Face directory (mc-model init makes one), give a "
                       "plain LLaMA shape, or --backend sim");
    }
    if (options.threads < 1 || options.threads > 256) {
      return error(Code::kInvalidArgument,
                   "ref backend: --threads " + std::to_string(options.threads) + " outside [1, 256]");
    }
    return make_ref_backend(options);
  }
  if (options.kind == "sim") {
    if (!(options.time_scale > 0)) {
      return error(Code::kInvalidArgument,
                   "sim backend: --time-scale must be > 0 (got " + std::to_string(options.time_scale) + ")");
    }
    if (options.kv_dtype != "auto") {
      return error(Code::kInvalidArgument, "sim backend: --kv-dtype " + options.kv_dtype +
                                               " is for the ref backend; the sim backend's KV size is "
                                               "--kv-bytes-per-token");
    }
    if (options.kv_bytes_per_token < 0) {
      return error(Code::kInvalidArgument, "sim backend: --kv-bytes-per-token must be >= 0 (0 = the model's)");
    }
    return make_sim_backend(options);
  }
  return error(Code::kInvalidArgument, "unknown backend '" + options.kind + "' (known: ref, sim)");
}

}  // namespace mc::infer
