// The cluster description (docs/DESIGN.md §16, examples/clusters/*.json): hosts in racks, each host's NIC
// and the daemons it runs. examples/cluster.sh starts it as a live cluster; `mc-sim --cluster FILE` reads it
// here and simulates the same cluster. parse_cluster_description validates the rules cluster.sh enforces
// (exactly one store master and one Conductor, at least one storage node, prefill and decode instance, at most
// one gateway; racks and hosts named with letters, digits, _ and -, each name once; every host in a named
// rack; counts and Mbit/s whole numbers; the client a host). Keys it does not use (comment, ssh, address,
// args) are read by the launcher only.
//
// sim_config_from_description derives the simulator's ClusterConfig:
//   prefill_instances / decode_instances = the sum of daemons.prefill / daemons.decode over the hosts;
//   live_kv_bytes_per_token = defaults.kv_bytes_per_token (backend sim; default 1024, 0 = the model's), or
//                             the model's own bytes per token (backend ref: real KV is stored);
//   scale = model.kv_bytes_per_token / live_kv_bytes_per_token  (the sim moves the model's real bytes);
//   pool tokens = daemons.store (summed) × floor(defaults.dram_bytes / live_kv_bytes_per_token)
//                 — the tokens the live cluster's storage nodes hold;
//   cache_capacity_tokens = floor(pool tokens / prefill_instances)  (the sim's pool is the union of the prefill
//                 instances' caches);
//   an instance's NIC = its host's nic_mbit × 1e6 / 8 × scale bytes/s (a token crosses it in the time it
//                 takes in the live cluster); nic_mbit 0 or absent: the simulator's default (87 GB/s);
//   nic_bandwidth_bytes_per_s (the Conductor's remote-bandwidth prior) = the slowest instance NIC;
//   model, gpu, policy, block_size, pipeline_group, pipeline_chunk_tokens, pipeline_reserve_factor = defaults.*.
// Not modelled by the simulator: rack uplinks and NIC latency (its network is NICs only, every pair of
// instances one hop apart), and placement beyond the NIC (each instance is its own host there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"
#include "mc/sim/cluster_config.hpp"

namespace mc::sim {

struct DescribedRack {
  std::string name;
  int64_t uplink_mbit = 0;  // 0: unshaped
};

struct DescribedHost {
  std::string name;
  std::string rack;
  int64_t nic_mbit = 0;  // 0: unshaped
  int64_t nic_latency_us = 0;
  int64_t master = 0, conductor = 0, store = 0, prefill = 0, decode = 0, gateway = 0;
};

struct ClusterDescription {
  std::string source;  // the file it was read from
  std::string name;    // "name" (the file's stem when absent)
  // defaults.* with cluster.sh's defaults.
  std::string backend = "sim";
  std::string model;  // default: tiny for backend ref, llama3-70b otherwise
  std::string gpu = "a800x8";
  std::string policy = "kvcache";
  std::string queue;  // defaults.queue: prefill queue discipline fcfs | slo ("": the policy's default; DESIGN.md §10)
  std::string pending_prefix;            // defaults.pending_prefix: on | off ("": the policy's default; DESIGN.md §10)
  double placement_load_weight = 1.0;    // defaults.placement_load_weight: kvcache's load pricing, 0 to 1000
  double slo_headroom = 0.2;             // defaults.slo_headroom: kvcache's share of the TTFT SLO kept free, 0 to 0.9
  double shed_limit = 5.0;               // defaults.shed_limit: kvcache's load shedding, x the TTFT SLO, 0 to 1000
  int64_t pipeline_group = 1;            // defaults.pipeline_group: chunked pipeline parallelism (DESIGN.md §18)
  int64_t pipeline_chunk_tokens = 8192;  // defaults.pipeline_chunk_tokens: tokens of one chunk of a group's prefill
  double pipeline_reserve_factor = 2.0;  // defaults.pipeline_reserve_factor: about-free instances, x the group size
  int64_t block_size = 512;
  int64_t kv_bytes_per_token = 1024;  // the live cluster's (scaled) bytes per token; 0: the model's
  int64_t dram_bytes = 256ll << 20;   // per storage node
  int64_t kv_buffer_size = 256ll << 20;
  int64_t nic_mbit = 0;  // each host's NIC unless the host names its own (0: unshaped)
  double time_scale = 1;
  std::vector<DescribedRack> racks;  // at least one (rack0 when the file names none)
  std::vector<DescribedHost> hosts;
  std::string client;  // a host name; default: the Conductor's host

  int64_t total(int64_t DescribedHost::*role) const;
  // "two-racks: 4 hosts in 2 racks (rack0: h0 h1; rack1: h2 h3)"
  std::string summary() const;
};

// Parses a description document; `source` names it in messages.
Result<ClusterDescription> parse_cluster_description(const nlohmann::json& doc, const std::string& source);
// Reads and parses a file (kInvalidArgument naming the file, the field and the remedy).
Result<ClusterDescription> parse_cluster_description(const std::string& path);

// The simulated cluster of a description (formulas in the header comment); validated.
struct DescribedSimCluster {
  ClusterConfig config;
  int64_t live_kv_bytes_per_token = 0;
  int64_t model_kv_bytes_per_token = 0;
  double scale = 1;  // model / live bytes per token
  int64_t pool_tokens = 0;
  std::vector<std::string> instance_hosts;  // prefill instances first, then decode (host order)
};
Result<DescribedSimCluster> sim_config_from_description(const ClusterDescription& d);

}  // namespace mc::sim
