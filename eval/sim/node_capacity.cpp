#include "mc/sim/node_capacity.hpp"

#include <algorithm>

#include "mc/common/report.hpp"
#include "mc/common/units.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"

namespace mc::sim {

using mc::report::fixed;

Result<int64_t> decode_kv_capacity_tokens(const model::ModelConfig& model, const model::GpuSpec& gpu) {
  const int64_t free_bytes = gpu.hbm_bytes - model.weight_bytes();
  if (free_bytes <= 0) {
    return error(Code::kInvalidArgument, "model " + model.name + " (" + std::to_string(model.weight_bytes()) +
                                             " B of weights) does not fit in " + gpu.name + "'s HBM");
  }
  return static_cast<int64_t>(kKvHbmFraction * static_cast<double>(free_bytes)) / model.kv_bytes_per_token();
}

Result<NodeCapacity> node_capacity(const NodeCapacityOptions& o) {
  if (o.spare_dram_bytes < 0) return error(Code::kInvalidArgument, "--spare-dram-bytes must be >= 0");
  if (o.nic_mbit < 0 || o.nic_cap_mbit < 0) {
    return error(Code::kInvalidArgument, "--nic-mbit and --nic-cap-mbit must be >= 0");
  }
  if (o.scale < 1) return error(Code::kInvalidArgument, "--scale must be >= 1");
  if (!(o.time_scale > 0)) return error(Code::kInvalidArgument, "--time-scale must be > 0");
  if (o.block_size < 1) return error(Code::kInvalidArgument, "--block-size must be >= 1 token");
  MC_ASSIGN_OR_RETURN(model::ModelConfig m, model::load_model(o.model));
  MC_ASSIGN_OR_RETURN(model::GpuSpec g, model::gpu_preset(o.gpu));
  NodeCapacity c;
  c.options = o;
  c.model = m.name;
  c.gpu = g.name;
  c.gpu_count = g.gpu_count;
  c.hbm_bytes = g.hbm_bytes;
  c.weight_bytes = m.weight_bytes();
  c.model_kv_bytes_per_token = m.kv_bytes_per_token();
  MC_ASSIGN_OR_RETURN(c.decode_kv_tokens, decode_kv_capacity_tokens(m, g));
  c.pool_tokens = o.spare_dram_bytes / c.model_kv_bytes_per_token;

  // A live token is exactly 1/scale of a modelled one only when the sim backend's layout (even bytes per layer,
  // at least 16) needs no rounding.
  const int64_t per_layer_model = m.kv_bytes_per_token_layer();
  const int64_t per_layer = per_layer_model / o.scale;
  if (per_layer_model % o.scale != 0 || per_layer % 2 != 0 || per_layer < kSimMinBytesPerTokenLayer) {
    int64_t largest = 1;
    for (int64_t s = 1; per_layer_model / s >= kSimMinBytesPerTokenLayer; ++s) {
      if (per_layer_model % s == 0 && (per_layer_model / s) % 2 == 0) largest = s;
    }
    return error(Code::kInvalidArgument,
                 "--scale " + std::to_string(o.scale) + ": " + m.name + "'s " + std::to_string(per_layer_model) +
                     " B per token and layer / scale must be a whole, even number of bytes >= " +
                     std::to_string(kSimMinBytesPerTokenLayer) +
                     " (the sim backend's layout); the largest such scale is " + std::to_string(largest));
  }
  c.live_kv_bytes_per_token = per_layer * m.num_layers;
  c.kv_buffer_tokens = c.decode_kv_tokens / o.block_size * o.block_size;
  c.kv_buffer_bytes = c.kv_buffer_tokens * c.live_kv_bytes_per_token;
  c.dram_tokens = c.pool_tokens / o.block_size * o.block_size;
  c.dram_bytes = c.dram_tokens * c.live_kv_bytes_per_token;
  c.nic_mbit_uncapped =
      static_cast<int64_t>(static_cast<double>(o.nic_mbit) * o.time_scale / static_cast<double>(o.scale));
  c.nic_mbit_live = o.nic_cap_mbit > 0 ? std::min(c.nic_mbit_uncapped, o.nic_cap_mbit) : c.nic_mbit_uncapped;
  return c;
}

nlohmann::json to_json(const NodeCapacity& c) {
  const NodeCapacityOptions& o = c.options;
  return {{"model", c.model},
          {"gpu", c.gpu},
          {"gpu_count", c.gpu_count},
          {"hbm_bytes", c.hbm_bytes},
          {"weight_bytes", c.weight_bytes},
          {"kv_hbm_fraction", kKvHbmFraction},
          {"model_kv_bytes_per_token", c.model_kv_bytes_per_token},
          {"decode_kv_tokens", c.decode_kv_tokens},
          {"spare_dram_bytes", o.spare_dram_bytes},
          {"pool_tokens", c.pool_tokens},
          {"nic_mbit", o.nic_mbit},
          {"scale", o.scale},
          {"time_scale", o.time_scale},
          {"block_size", o.block_size},
          {"live",
           {{"kv_bytes_per_token", c.live_kv_bytes_per_token},
            {"kv_buffer_bytes", c.kv_buffer_bytes},
            {"kv_buffer_tokens", c.kv_buffer_tokens},
            {"dram_bytes", c.dram_bytes},
            {"dram_tokens", c.dram_tokens},
            {"nic_mbit", c.nic_mbit_live},
            {"nic_mbit_uncapped", c.nic_mbit_uncapped},
            {"nic_cap_mbit", o.nic_cap_mbit}}}};
}

void print_node_capacity(std::ostream& out, const NodeCapacity& c) {
  const NodeCapacityOptions& o = c.options;
  out << "node: " << c.model << " on " << c.gpu << " (" << c.gpu_count << " GPUs)\n"
      << "  KV per token (modelled)   " << c.model_kv_bytes_per_token << " B\n"
      << "  decode KV (HBM)           floor(" << fixed(kKvHbmFraction, 1) << " x (" << units::format_bytes(c.hbm_bytes)
      << " HBM - " << units::format_bytes(c.weight_bytes) << " weights)) / " << c.model_kv_bytes_per_token
      << " B = " << c.decode_kv_tokens << " tokens\n"
      << "  DRAM pool (per node)      " << units::format_bytes(o.spare_dram_bytes) << " spare DRAM / "
      << c.model_kv_bytes_per_token << " B = " << c.pool_tokens << " tokens\n"
      << "  NIC                       " << o.nic_mbit << " Mbit/s\n"
      << "live, at scale " << o.scale << " and time scale " << fixed(o.time_scale, 2) << ":\n"
      << "  KV per token              " << c.model_kv_bytes_per_token << " / " << o.scale << " = "
      << c.live_kv_bytes_per_token << " B\n"
      << "  --kv-buffer-size          " << c.kv_buffer_bytes << " B (" << units::format_bytes(c.kv_buffer_bytes) << ": "
      << c.kv_buffer_tokens << " tokens in blocks of " << o.block_size << ")\n"
      << "  --dram-bytes              " << c.dram_bytes << " B (" << units::format_bytes(c.dram_bytes) << ": "
      << c.dram_tokens << " tokens)\n"
      << "  nic_mbit                  " << o.nic_mbit << " x " << fixed(o.time_scale, 2) << " / " << o.scale << " = "
      << c.nic_mbit_uncapped;
  if (c.nic_mbit_live != c.nic_mbit_uncapped) out << ", capped at " << c.nic_mbit_live;
  out << " Mbit/s\n";
}

}  // namespace mc::sim
