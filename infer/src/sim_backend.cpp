// The `sim` backend: the cost model's time, real KV bytes, deterministic tokens (see backend.hpp).
//
// KV contents: token p of a sequence carries a running hash h_p = mix(h_{p-1}, token_p) (h_{-1} = seed ^
// lora_weight_seed(adapter)). Its K slot in every layer starts with h_p (8 bytes) followed by a splitmix64 stream
// seeded by h_p ^ layer; V likewise. So the bytes of a token depend on the whole prefix, a cache hit must deliver
// exactly the recomputed bytes, and a decode step continues the chain from the KV already in the buffer (a corrupted or
// missing transfer changes the generated tokens). The output token after position p is h_p mod vocab.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "backends.hpp"
#include "mc/common/splitmix.hpp"

namespace mc::infer {
namespace {

uint64_t mix(uint64_t h, uint32_t token) {
  uint64_t s = h ^ (static_cast<uint64_t>(token) * 0xff51afd7ed558ccdULL);
  return splitmix64(s);
}

class SimBackend final : public Backend {
 public:
  explicit SimBackend(const BackendOptions& o)
      : kind_("sim"), model_(o.model), gpu_(o.gpu), seed_(o.seed), time_scale_(o.time_scale) {
    bytes_per_token_layer_ = model::sim_kv_bytes_per_token(model_, o.kv_bytes_per_token) / model_.num_layers;
    // The hidden states between pipeline stages, scaled as the KV is (the model's hidden_size x dtype against its
    // KV bytes per token), at least the 8-byte hash.
    const double scale = static_cast<double>(bytes_per_token_layer_ * model_.num_layers) /
                         static_cast<double>(std::max<int64_t>(1, model_.kv_bytes_per_token()));
    const double bytes = static_cast<double>(model_.hidden_size * model_.dtype_bytes) * scale;
    hidden_floats_ = std::max<int64_t>(2, static_cast<int64_t>(std::ceil(bytes / 4)));
  }

  const std::string& kind() const override { return kind_; }
  const model::ModelConfig& model() const override { return model_; }
  int64_t kv_bytes_per_token_layer() const override { return bytes_per_token_layer_; }
  std::string kv_encoding() const override { return "sim" + std::to_string(bytes_per_token_layer_) + "B"; }

  Result<PrefillResult> prefill(KvBuffer& kv, const PrefillRequest& req, const LayerDoneFn& on_layer) override {
    MC_RETURN_IF_ERROR(validate_prefill(model_, kv, req));
    MC_RETURN_IF_ERROR(check_layout(kv));
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = static_cast<int64_t>(req.tokens.size());
    const int64_t chunk = req.chunk_tokens > 0 ? req.chunk_tokens : n;
    // Running hashes of the new tokens (the cached prefix's last hash is read back from the buffer).
    uint64_t h = req.cached_tokens > 0 ? read_hash(kv, req.block_table, req.cached_tokens - 1)
                                       : seed_ ^ lora_weight_seed(req.lora);
    std::vector<uint64_t> hashes(static_cast<size_t>(n - req.cached_tokens));
    for (int64_t p = req.cached_tokens; p < n; ++p) {
      h = mix(h, req.tokens[static_cast<size_t>(p)]);
      hashes[static_cast<size_t>(p - req.cached_tokens)] = h;
    }
    // Layer l of a chunk ends at (chunk start + (l + 1) x layer time): the deadlines are cumulative, so the
    // real work between layers (writing the KV, handing it to the layer callback) runs inside the modelled
    // time, as the GPU computes the next layer while the previous one streams out; only work longer than
    // the modelled time delays the prefill.
    auto chunk_start = std::chrono::steady_clock::now();
    for (int64_t begin = req.cached_tokens; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      const double layer_s =
          model::prefill_time_s(model_, gpu_, end - begin, begin) / static_cast<double>(model_.num_layers);
      for (int64_t l = 0; l < model_.num_layers; ++l) {
        const auto deadline = chunk_start + to_duration(layer_s * static_cast<double>(l + 1));
        for (int64_t p = begin; p < end; ++p) {
          write_token(kv, req.block_table, l, p, hashes[static_cast<size_t>(p - req.cached_tokens)]);
        }
        std::this_thread::sleep_until(deadline);
        if (on_layer) MC_RETURN_IF_ERROR(on_layer(l, begin, end));
      }
      chunk_start = std::max(chunk_start + to_duration(layer_s * static_cast<double>(model_.num_layers)),
                             std::chrono::steady_clock::now());
    }
    PrefillResult result;
    result.first_token = static_cast<uint32_t>(h % static_cast<uint64_t>(model_.vocab_size));
    result.computed_tokens = n - req.cached_tokens;
    result.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  }

  bool runs_stages() const override { return true; }
  int64_t stage_hidden_floats() const override { return hidden_floats_; }

  // One stage over one chunk (DESIGN.md §18): the same bytes and first token as prefill() for these layers and tokens,
  // the modelled time of these layers. A token's hidden state carries its running hash (the first 8 bytes of its
  // row; the rest zeros): stage 0 computes the hashes as prefill() does, a later stage reads them from hidden_in.
  Result<StageResult> prefill_stage(KvBuffer& kv, const StageRequest& req, const LayerDoneFn& on_layer) override {
    MC_RETURN_IF_ERROR(check_layout(kv));
    MC_RETURN_IF_ERROR(validate_stage(model_, kv, req, hidden_floats_));
    const auto n = static_cast<int64_t>(req.tokens.size());
    const int64_t L = model_.num_layers;
    const int64_t rows = req.token_end - req.token_begin;
    const bool embeds = req.first_layer == 0;
    std::vector<uint64_t> hashes(static_cast<size_t>(rows));
    if (embeds) {
      uint64_t h = req.token_begin > 0 ? read_hash(kv, req.block_table, req.token_begin - 1)
                                       : seed_ ^ lora_weight_seed(req.lora);
      for (int64_t p = req.token_begin; p < req.token_end; ++p) {
        h = mix(h, req.tokens[static_cast<size_t>(p)]);
        hashes[static_cast<size_t>(p - req.token_begin)] = h;
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(&hashes[static_cast<size_t>(r)], req.hidden_in.data() + r * hidden_floats_, sizeof(uint64_t));
      }
    }
    // This chunk's layers of the modelled prefill time; deadlines cumulative as in prefill().
    const double layer_s = model::prefill_time_s(model_, gpu_, rows, req.token_begin) / static_cast<double>(L);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < req.num_layers; ++k) {
      const int64_t l = req.first_layer + k;
      const auto deadline = start + to_duration(layer_s * static_cast<double>(k + 1));
      for (int64_t p = req.token_begin; p < req.token_end; ++p) {
        write_token(kv, req.block_table, l, p, hashes[static_cast<size_t>(p - req.token_begin)]);
      }
      std::this_thread::sleep_until(deadline);
      if (on_layer) MC_RETURN_IF_ERROR(on_layer(l, req.token_begin, req.token_end));
    }
    StageResult out;
    if (req.first_layer + req.num_layers < L) {
      out.hidden_out.assign(static_cast<size_t>(rows * hidden_floats_), 0.0F);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(out.hidden_out.data() + r * hidden_floats_, &hashes[static_cast<size_t>(r)], sizeof(uint64_t));
      }
    } else if (req.token_end == n) {
      out.first_token = static_cast<uint32_t>(hashes.back() % static_cast<uint64_t>(model_.vocab_size));
    }
    return out;
  }

  Status decode_step(KvBuffer& kv, std::span<const DecodeSequence> batch, std::vector<uint32_t>& next,
                     std::vector<float>* logits) override {
    MC_RETURN_IF_ERROR(check_layout(kv));
    next.clear();
    if (logits != nullptr) logits->clear();  // no distribution: its tokens are hashes (the top of backend.hpp)
    int64_t context = 0;
    for (const auto& s : batch) {
      if (s.last_token >= static_cast<uint64_t>(model_.vocab_size) || s.position < 0 ||
          kv.layout().blocks_for_tokens(s.position + 1) > static_cast<int64_t>(s.block_table.size())) {
        return error(Code::kInvalidArgument, "sim decode: bad sequence (token " + std::to_string(s.last_token) +
                                                 ", position " + std::to_string(s.position) + ", " +
                                                 std::to_string(s.block_table.size()) + " blocks)");
      }
      context += s.position + 1;
    }
    const auto deadline =
        std::chrono::steady_clock::now() +
        to_duration(model::decode_step_time_s(model_, gpu_, static_cast<int64_t>(batch.size()), context));
    for (const auto& s : batch) {
      for (int32_t b : s.block_table) MC_RETURN_IF_ERROR(kv.check_block(b));
      const uint64_t prev =
          s.position > 0 ? read_hash(kv, s.block_table, s.position - 1) : seed_ ^ lora_weight_seed(s.lora);
      const uint64_t h = mix(prev, s.last_token);
      for (int64_t l = 0; l < model_.num_layers; ++l) write_token(kv, s.block_table, l, s.position, h);
      next.push_back(static_cast<uint32_t>(h % static_cast<uint64_t>(model_.vocab_size)));
    }
    std::this_thread::sleep_until(deadline);
    return Status::ok();
  }

 private:
  std::chrono::nanoseconds to_duration(double modelled_s) const {
    return std::chrono::nanoseconds(static_cast<int64_t>(modelled_s / time_scale_ * 1e9));
  }

  Status check_layout(const KvBuffer& kv) const {
    if (kv.layout().bytes_per_token_layer != bytes_per_token_layer_ || kv.layout().num_layers != model_.num_layers) {
      return error(Code::kInvalidArgument, "sim backend: KV buffer layout does not match (" +
                                               std::to_string(bytes_per_token_layer_) + " B/token/layer, " +
                                               std::to_string(model_.num_layers) + " layers expected)");
    }
    return Status::ok();
  }

  uint64_t read_hash(KvBuffer& kv, std::span<const int32_t> table, int64_t pos) const {
    const int64_t bs = kv.layout().block_size;
    uint64_t h = 0;
    std::memcpy(&h, kv.token_kv(table[static_cast<size_t>(pos / bs)], 0, 0, pos % bs), sizeof(h));
    return h;
  }

  void write_token(KvBuffer& kv, std::span<const int32_t> table, int64_t layer, int64_t pos, uint64_t h) const {
    const int64_t bs = kv.layout().block_size;
    const int32_t block = table[static_cast<size_t>(pos / bs)];
    const int64_t half = bytes_per_token_layer_ / 2;
    for (int which = 0; which < 2; ++which) {
      std::byte* p = kv.token_kv(block, layer, which, pos % bs);
      std::memcpy(p, &h, sizeof(h));
      uint64_t state = h ^ (static_cast<uint64_t>(layer) << 1 | static_cast<uint64_t>(which));
      for (int64_t off = 8; off < half; off += 8) {
        const uint64_t r = splitmix64(state);
        std::memcpy(p + off, &r, static_cast<size_t>(std::min<int64_t>(8, half - off)));
      }
    }
  }

  std::string kind_;
  model::ModelConfig model_;
  model::GpuSpec gpu_;
  uint64_t seed_;
  double time_scale_;
  int64_t bytes_per_token_layer_ = 16;
  int64_t hidden_floats_ = 2;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_sim_backend(const BackendOptions& options) {
  return std::unique_ptr<Backend>(new SimBackend(options));
}

}  // namespace mc::infer
