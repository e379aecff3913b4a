// CLUSTER.json: the simulated cluster. One JSON object; every key optional (defaults below), unknown
// keys are an error (a typo must not silently fall back to a default).
//
//   {
//     "model": "llama3-70b",                 // model preset of the cost model (infer/)
//     "gpu": "a800x8",                       // GPU preset of one instance (one 8-GPU node)
//     "prefill_instances": 8,
//     "decode_instances": 8,
//     "cache_capacity_tokens": 3000000,      // DRAM KV cache of each prefill instance ("3M" accepted)
//     "cache_mode": "global",                // "global": one pool over every instance's DRAM, fetched
//                                            // over the NICs; "local": each instance hits only its own
//     "nic_bandwidth_bytes_per_s": 87e9,     // per instance, each direction ("87GB" accepted)
//     "policy": "kvcache",                   // random | round_robin | least_loaded | cache_aware | kvcache
//     "slo_ttft_ms": 30000,
//     "slo_tbt_ms": 100,
//     "early_rejection": true,               // reject at arrival what is predicted to miss an SLO
//     "queue": "",                           // prefill queue discipline: fcfs | slo ("": the policy's
//                                            // default, slo for kvcache, fcfs for the baselines)
//     "queue_aging_weight": 4,               // slo: a job's key = decision time + this x its predicted
//                                            // prefill (mc/sched/queue_discipline.hpp)
//     "queue_guard_ms": 3000,                // slo: slack kept before each queued job's TTFT deadline
//     "preempt_chunk_tokens": 0,             // a prefill instance yields to a job of a smaller queue key after
//                                            // each chunk of this many tokens (0: off; DESIGN.md §10)
//     "pending_prefix": "",                  // on | off: a prefix an accepted request is computing counts as
//                                            // cached where it runs ("": on for kvcache, off for the baselines)
//     "placement_load_weight": 1,            // kvcache: weight of a placement's prefill service against its
//                                            // TTFT, x mean queue / mean service (0: smallest TTFT, the paper)
//     "slo_headroom": 0.2,                   // kvcache: fraction of the TTFT SLO kept free; it schedules to
//                                            // (1 - this) x SLO (0: admit up to the SLO, the paper; 0 to 0.9)
//     "balancing_threshold": 1,              // a remote prefix read only past this x the same-host prefix
//     "shed_limit": 5,                       // kvcache: turn away a request whose prefill delays the ones after
//                                            // it by more than this x the TTFT SLO (0: off, the paper; 0-1000)
//     "block_size": 512,                     // tokens per hash block (the traces' 512)
//     "chunk_tokens": 0,                     // chunked prefill chunk size (0: one pass)
//     "pipeline_group": 1,                   // prefill instances a long prompt may pipeline over (chunked
//                                            // pipeline parallelism, DESIGN.md §18; 1: off)
//     "pipeline_chunk_tokens": 8192,         // a pipelined prefill's chunk (the activations cross per chunk)
//     "pipeline_reserve_factor": 2,          // instances about free to form a group, x its size (1: the members)
//     "pipeline_min_gain": 0.3,              // fraction of one instance's TTFT a group must save (0 to 1)
//     "decode_kv_capacity_tokens": 0,        // HBM KV capacity of a decode instance (0: from the presets)
//     "decode_max_batch": 0,                 // requests per decode step (0: bounded by KV capacity only)
//     "max_context_tokens": 131072,          // longer prompts are rejected before any work (report #14)
//     "seed": 1,                             // the random policy's seed
//     "instance_nic_bandwidth_bytes_per_s": []  // one NIC per instance, prefill first, then decode
//                                            // (empty: every NIC nic_bandwidth_bytes_per_s); set by
//                                            // `mc-sim --cluster` (cluster_description.hpp)
//   }
//
// Units are in the key names; byte and token quantities accept numbers or the strings of
// mc/common/units.hpp. Errors: kInvalidArgument naming the file, the key and the accepted values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"

namespace mc::sim {

enum class CacheMode { kGlobal, kLocal };

struct ClusterConfig {
  std::string model = "llama3-70b";
  std::string gpu = "a800x8";
  int64_t prefill_instances = 8;
  int64_t decode_instances = 8;
  int64_t cache_capacity_tokens = 3'000'000;
  CacheMode cache_mode = CacheMode::kGlobal;
  double nic_bandwidth_bytes_per_s = 87e9;  // paper §6: 87 GB/s measured on 4x200 Gbps
  std::string policy = "kvcache";
  double slo_ttft_ms = 30'000;
  double slo_tbt_ms = 100;
  bool early_rejection = true;
  std::string queue;  // "fcfs" | "slo" | "": the policy's default (mc/sched/queue_discipline.hpp)
  double queue_aging_weight = 4.0;
  double queue_guard_ms = 3'000;
  int64_t preempt_chunk_tokens = 0;    // sched::QueueConfig::preempt_chunk_tokens (0: off)
  std::string pending_prefix;          // "on" | "off" | "": the policy's default (sched::SchedulerConfig)
  double placement_load_weight = 1.0;  // sched::SchedulerConfig::placement_load_weight, 0 to 1000
  double slo_headroom = 0.2;           // sched::SchedulerConfig::slo_headroom, 0 to 0.9
  double shed_limit = 5.0;             // sched::SchedulerConfig::shed_limit, 0 to 1000
  double balancing_threshold = 1.0;    // sched::SchedulerConfig::balancing_threshold, 1 to 1000
  int64_t block_size = 512;
  int64_t chunk_tokens = 0;
  int64_t pipeline_group = 1;
  int64_t pipeline_chunk_tokens = 8192;
  double pipeline_reserve_factor = 2.0;  // sched::PipelineConfig::reserve_factor, 1 to 64
  double pipeline_min_gain = 0.3;        // sched::PipelineConfig::min_ttft_gain, 0 to 1
  int64_t decode_kv_capacity_tokens = 0;
  int64_t decode_max_batch = 0;
  int64_t max_context_tokens = 131'072;
  uint64_t seed = 1;
  // Per-instance NIC bandwidth (prefill_instances + decode_instances entries, prefill first); empty: every
  // instance's NIC is nic_bandwidth_bytes_per_s.
  std::vector<double> instance_nic_bandwidth_bytes_per_s;

  // The NIC bandwidth of instance `i` (prefill i, or decode i - prefill_instances).
  double nic_bandwidth_of(size_t i) const {
    return instance_nic_bandwidth_bytes_per_s.empty() ? nic_bandwidth_bytes_per_s
                                                      : instance_nic_bandwidth_bytes_per_s[i];
  }

  // Checks ranges and names; kInvalidArgument naming the field.
  Status validate() const;
  nlohmann::json to_json() const;
};

std::string_view cache_mode_name(CacheMode mode);

// Parses a CLUSTER.json document; `source` names it in messages.
Result<ClusterConfig> parse_cluster_config(const nlohmann::json& doc, const std::string& source);
// Reads and parses a file.
Result<ClusterConfig> load_cluster_config(const std::string& path);

}  // namespace mc::sim
