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
  ns.model_id = backend.model().name;
  ns.model_revision = backend.kind() + "-seed" + std::to_string(weight_seed);
  ns.kv_dtype = backend.kind() == "ref" ? "fp32" : "sim" + std::to_string(backend.kv_bytes_per_token_layer()) + "B";
  ns.layout = "tp1-l" + std::to_string(backend.model().num_layers);
  ns.block_size = static_cast<uint32_t>(block_tokens);
  return ns;
}

Status validate_prefill(const ModelConfig& model, const KvBuffer& kv, const PrefillRequest& request) {
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

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  MC_RETURN_IF_ERROR(options.model.validate());
  if (options.kind == "ref") return make_ref_backend(options);
  if (options.kind == "sim") {
    if (!(options.time_scale > 0)) {
      return error(Code::kInvalidArgument,
                   "sim backend: --time-scale must be > 0 (got " + std::to_string(options.time_scale) + ")");
    }
    if (options.kv_bytes_per_token < 0) {
      return error(Code::kInvalidArgument, "sim backend: --kv-bytes-per-token must be >= 0 (0 = the model's)");
    }
    return make_sim_backend(options);
  }
  return error(Code::kInvalidArgument, "unknown backend '" + options.kind + "' (known: ref, sim)");
}

}  // namespace mc::infer
