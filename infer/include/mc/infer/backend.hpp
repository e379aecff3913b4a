// mc::infer::Backend: the compute interface of prefill and decode instances (DESIGN.md §7).
//
//   prefill(kv, request, on_layer) : computes the KV of prompt tokens [cached_tokens, n) into the request's block
//       table — the KV of tokens [0, cached_tokens) must already be there (fetched from the store) — calling
//       on_layer(layer, token_begin, token_end) as soon as a layer's KV of those tokens is final (layer-wise
//       streaming), and returns the first output token (greedy argmax of the last prompt token's logits).
//       With chunk_tokens > 0 the new tokens are processed in chunks of that many tokens (chunked prefill): the
//       callback then fires once per (chunk, layer), with that chunk's token range.
//   decode_step(kv, batch, next) : one continuous-batching step. Each sequence contributes its last token at
//       `position` (= tokens whose KV is already cached); the step writes that token's KV at `position` and
//       returns the next token of every sequence.
//
// Backends:
//   ref  the CPU engine (cpu_kernels.hpp): a decoder of the supported architectures (model_config.hpp: LLaMA,
//        Qwen2 with q/k/v biases, Qwen3 with q/k norms, Mistral; RMSNorm, RoPE with llama3 scaling, GQA, SwiGLU,
//        tied embeddings) on all cores. Its weights are the checkpoint's when the model was read from a Hugging
//        Face directory (ModelConfig::checkpoint_dir; bf16, fp16 or fp32, memory-mapped and used in place, fp32
//        arithmetic), else seeded random ones (fp32; presets and JSON shapes of plain LLaMA only). KV element type
//        kv_dtype: fp32, bf16 or fp16 (auto: the checkpoint's type; fp32 for seeded weights), so
//        kv_bytes_per_token_layer = 2 · kv_heads · head_dim · element bytes.
//        A LoRA adapter (LoraAdapter, per sequence) adds a rank-kLoraRank delta A·B to the Q, K and V
//        projections of every layer, A and B drawn from lora_weight_seed(adapter): deterministic in name and
//        version, so two adapters give different KV and tokens for equal prompts, and one adapter the same
//        everywhere. Adapter weights are made on first use and cached (at most kMaxLoraAdapters; the cache is
//        emptied when a call needs more, and a batch of more distinct adapters fails with kResourceExhausted).
//   sim  the cost model of cost_model.hpp: sleeps the modelled time / time_scale (prefill: 1/L of it per layer),
//        writes deterministic KV bytes of the configured size, and generates deterministic tokens (a hash of the
//        prompt), so cache hits can still be checked byte for byte. An adapter changes the hash chain's start
//        (seed ^ lora_weight_seed), so its KV bytes and tokens differ too.
//
// Errors: kInvalidArgument for a token id ≥ vocab, an empty prompt, cached_tokens out of [0, n), a block table
// too short for the tokens; a non-ok Status from on_layer aborts the prefill and is returned (nothing after that
// layer is computed). Thread-safety: one call at a time per Backend object (a worker owns its backend).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"
#include "mc/infer/kv_buffer.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"

namespace mc::infer {

// The LoRA adapter a sequence runs with (block_key.hpp RequestKeyScope's lora_name / lora_version).
struct LoraAdapter {
  std::string name;  // empty: the base model
  std::string version;
  bool is_base() const { return name.empty(); }
};
// The seed of an adapter's weights: 0 for the base model, else XXH3 of the (name, version) key scope.
uint64_t lora_weight_seed(const LoraAdapter& adapter);
inline constexpr int64_t kLoraRank = 4;
inline constexpr size_t kMaxLoraAdapters = 64;

struct PrefillRequest {
  std::span<const uint32_t> tokens;      // the whole prompt
  int64_t cached_tokens = 0;             // KV of tokens [0, cached_tokens) already in the block table
  std::span<const int32_t> block_table;  // at least blocks_for_tokens(tokens.size()) blocks of the KvBuffer
  int64_t chunk_tokens = 0;              // 0: one chunk
  LoraAdapter lora{};                    // the adapter the prompt runs with (default: the base model)
};

struct PrefillResult {
  uint32_t first_token = 0;
  std::vector<float> last_logits;  // logits of the last prompt token (ref); empty for sim
  int64_t computed_tokens = 0;     // = tokens.size() - cached_tokens
  double compute_s = 0;            // wall time inside the backend
};

// Called after a layer's KV of tokens [token_begin, token_end) is final. A non-ok Status aborts the prefill.
using LayerDoneFn = std::function<Status(int64_t layer, int64_t token_begin, int64_t token_end)>;

// One stage of a chunked-pipeline-parallel prefill (DESIGN.md §18): the model's layers [first_layer, first_layer +
// num_layers) over one chunk, the new prompt tokens [token_begin, token_end). This stage's layers of the tokens
// before token_begin must already have their KV in the block table (earlier chunks, or a cached prefix fetched by
// this stage for its own layers); the chunk's KV of these layers is written there.
struct StageRequest {
  std::span<const uint32_t> tokens;      // the whole prompt
  std::span<const int32_t> block_table;  // covers token_end tokens
  int64_t token_begin = 0;
  int64_t token_end = 0;
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  // The hidden states entering first_layer: (token_end - token_begin) x Backend::stage_hidden_floats() floats, row
  // per token. Empty when first_layer is 0 (the stage embeds the tokens itself).
  std::span<const float> hidden_in;
  LoraAdapter lora{};
};

struct StageResult {
  // The hidden states after the stage's last layer, (token_end - token_begin) x Backend::stage_hidden_floats():
  // what crosses to the next stage. Empty when the stage ends with the model's last layer.
  std::vector<float> hidden_out;
  // The last stage, on the chunk holding the prompt's last token: the first output token (greedy) and its logits.
  uint32_t first_token = 0;
  std::vector<float> last_logits;
};

struct DecodeSequence {
  uint32_t last_token = 0;
  int64_t position = 0;                  // tokens already in the KV cache; last_token goes to this position
  std::span<const int32_t> block_table;  // must cover position + 1 tokens
  LoraAdapter lora{};                    // the adapter its prefill ran with
};

struct BackendOptions {
  std::string kind = "ref";  // "ref" | "sim"
  model::ModelConfig model;
  std::string kv_dtype = "auto";   // ref: "auto" | "fp32" | "bf16" | "fp16" (sim: "auto" only)
  uint64_t seed = 0;               // ref: weights; sim: token stream
  int threads = 1;                 // ref: threads of the engine's pool (the caller's counts)
  model::GpuSpec gpu;              // sim
  double time_scale = 1.0;         // sim: sleeps modelled time / time_scale (> 0)
  int64_t kv_bytes_per_token = 0;  // sim: KV bytes per token (all layers) actually stored; 0 = the model's
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const std::string& kind() const = 0;
  virtual const model::ModelConfig& model() const = 0;
  // K+V bytes of one token in one layer as this backend stores them (sizes the KvBuffer).
  virtual int64_t kv_bytes_per_token_layer() const = 0;
  // The identity of the weights KV keys carry (kv_namespace): ref: "ckpt-" and 16 hex digits of XXH3 over the
  // model's config and every tensor's name, dtype and bytes, or "ref-seed<seed>"; sim: "sim-seed<seed>".
  virtual std::string weights_revision(uint64_t seed) const { return kind() + "-seed" + std::to_string(seed); }
  // The KV encoding KV keys carry: ref: "fp32", "bf16" or "fp16"; sim: "sim<bytes per token and layer>B".
  virtual std::string kv_encoding() const = 0;

  virtual Result<PrefillResult> prefill(KvBuffer& kv, const PrefillRequest& request, const LayerDoneFn& on_layer) = 0;
  // One continuous-batching step (the top of this file): `next` gets each sequence's greedy token. With `logits`
  // non-null, a backend with a distribution (ref) also leaves there the batch.size() x vocab_size logits it chose
  // from, row per sequence, for a sampler (sampler.hpp); one without (sim) leaves it empty.
  virtual Status decode_step(KvBuffer& kv, std::span<const DecodeSequence> batch, std::vector<uint32_t>& next,
                             std::vector<float>* logits) = 0;
  Status decode_step(KvBuffer& kv, std::span<const DecodeSequence> batch, std::vector<uint32_t>& next) {
    return decode_step(kv, batch, next, nullptr);
  }
  // One pipeline stage over one chunk (StageRequest). The ref backend computes exactly what prefill() computes for
  // those layers and tokens (DESIGN.md §18); on_layer fires per layer with the chunk's range. kUnimplemented from a
  // backend that does not run stages; kInvalidArgument for a layer range outside the model, a token range
  // outside the prompt, a hidden_in of the wrong size (or missing after layer 0), a block table too short.
  virtual Result<StageResult> prefill_stage(KvBuffer& kv, const StageRequest& request, const LayerDoneFn& on_layer) {
    (void)kv;
    (void)request;
    (void)on_layer;
    return error(Code::kUnimplemented, "backend '" + kind() + "' does not run chunked-pipeline prefill stages");
  }

  // Whether prefill_stage() is implemented (a prefill instance refuses stage jobs otherwise).
  virtual bool runs_stages() const { return false; }
  // Floats per token of the hidden states that cross between stages: the model's hidden_size (ref: fp32 rows); the
  // sim backend's are scaled like its KV (its kv_bytes_per_token against the model's), at least 2 (its hash).
  virtual int64_t stage_hidden_floats() const { return model().hidden_size; }

  // The KvLayout a buffer for this backend needs at `block_size` tokens per block.
  KvLayout kv_layout(int64_t block_size) const {
    return KvLayout{model().num_layers, block_size, kv_bytes_per_token_layer()};
  }
};

// Builds a backend (validates the options: kInvalidArgument names the bad one).
Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);

// The base key namespace of a worker's KV blocks (block_key.hpp): model name, the weights' identity
// (Backend::weights_revision: a checkpoint's digest, or the backend and weight seed), the KV encoding
// (Backend::kv_encoding), the layout and block size. Workers that must share cache
// entries must agree on all of these; anything else never hits. A request's namespace adds its key scope.
KeyNamespace kv_namespace(const Backend& backend, int64_t block_tokens, uint64_t weight_seed);

// Checks a prefill request against the model and buffer (shared by the backends).
Status validate_prefill(const model::ModelConfig& model, const KvBuffer& kv, const PrefillRequest& request);
// The checks every backend's prefill_stage makes (kInvalidArgument naming the field): the layer range inside the
// model, the token range inside the prompt, hidden_in of tokens x hidden_floats floats (none at layer 0), a block
// table covering token_end tokens with valid blocks, every token of the chunk inside the vocabulary.
Status validate_stage(const model::ModelConfig& model, const KvBuffer& kv, const StageRequest& request,
                      int64_t hidden_floats);

}  // namespace mc::infer
