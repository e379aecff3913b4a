// The modelled node (DESIGN.md §16 "The modelled node", `mc-plan node`): what one server of a GPU preset holds
// for a model, in tokens, and the live sizes that hold the same number of tokens when the bytes of a token are
// scaled down so that one machine's memory holds a whole cluster of such nodes.
//
//   model_kv_bytes_per_token = 2 · layers · kv_heads · head_dim · dtype_bytes         (327,680 B for LLaMA3-70B)
//   decode_kv_tokens = floor(kKvHbmFraction · (gpu.hbm_bytes − model.weight_bytes)) / model_kv_bytes_per_token
//                      (the HBM left after the weights; kKvHbmFraction = 0.9, the rest is activations and
//                      fragmentation; also the simulator's default decode_kv_capacity_tokens)
//   pool_tokens      = floor(spare_dram_bytes / model_kv_bytes_per_token)               (one storage node)
//   live_kv_bytes_per_token = model_kv_bytes_per_token / scale, which must be a whole, even number of bytes per
//                      layer of at least 16 (the sim backend's layout: an 8-byte hash in K and in V), so that a
//                      live token is exactly 1/scale of a modelled one (scale 256 for LLaMA3-70B: 1,280 B)
//   live sizes in whole blocks of block_size tokens (an instance and a store node count whole blocks):
//     kv_buffer_bytes = floor(decode_kv_tokens / block_size) · block_size · live_kv_bytes_per_token
//     dram_bytes      = floor(pool_tokens / block_size) · block_size · live_kv_bytes_per_token
//   nic_mbit_live    = nic_mbit · time_scale / scale, at most nic_cap_mbit (0: no cap): a scaled token crosses
//                      the live link in the time the modelled one crosses the modelled NIC, in a cluster that
//                      runs time_scale times faster than the hardware.
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"

namespace mc::model {
struct ModelConfig;
struct GpuSpec;
}  // namespace mc::model

namespace mc::sim {

// The fraction of the HBM left after the weights that holds KV.
inline constexpr double kKvHbmFraction = 0.9;
// The sim backend's smallest KV bytes per token per layer (sim_backend.cpp: an 8-byte hash in K and in V).
inline constexpr int64_t kSimMinBytesPerTokenLayer = 16;

// decode_kv_tokens above; kInvalidArgument when the weights do not fit in the HBM.
Result<int64_t> decode_kv_capacity_tokens(const model::ModelConfig& model, const model::GpuSpec& gpu);

struct NodeCapacityOptions {
  std::string model = "llama3-70b";
  std::string gpu = "a800x8";
  int64_t spare_dram_bytes = 512ll << 30;  // DRAM one node lends to the pool
  int64_t nic_mbit = 1'600'000;            // the node's NICs together (8 × 200 Gbit/s)
  int64_t scale = 256;                     // modelled / live bytes per token
  double time_scale = 1;                   // the live cluster runs this many times faster
  int64_t nic_cap_mbit = 0;                // the most a live link is shaped to (0: no cap)
  int64_t block_size = 512;                // tokens per KV block
};

struct NodeCapacity {
  NodeCapacityOptions options;
  std::string model, gpu;  // the presets' names
  int64_t gpu_count = 0;
  int64_t hbm_bytes = 0, weight_bytes = 0;
  int64_t model_kv_bytes_per_token = 0;
  int64_t decode_kv_tokens = 0;  // one decode (or prefill) instance's HBM, modelled
  int64_t pool_tokens = 0;       // one storage node's spare DRAM, modelled
  int64_t live_kv_bytes_per_token = 0;
  int64_t kv_buffer_bytes = 0;    // live --kv-buffer-size per instance
  int64_t kv_buffer_tokens = 0;   // what it holds: decode_kv_tokens in whole blocks
  int64_t dram_bytes = 0;         // live --dram-bytes per storage node
  int64_t dram_tokens = 0;        // what it holds: pool_tokens in whole blocks
  int64_t nic_mbit_live = 0;      // live NIC, each direction (after the cap)
  int64_t nic_mbit_uncapped = 0;  // the same before the cap
};

// Errors (kInvalidArgument, naming the flag): an unknown preset, a scale that does not divide the model's bytes per
// token into whole, even bytes per layer of at least 16, a non-positive size, block size or time scale.
Result<NodeCapacity> node_capacity(const NodeCapacityOptions& options);
nlohmann::json to_json(const NodeCapacity& capacity);
// The figures with the formulas and their numbers, one per line.
void print_node_capacity(std::ostream& out, const NodeCapacity& capacity);

}  // namespace mc::sim
