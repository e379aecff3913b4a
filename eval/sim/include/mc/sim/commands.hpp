// The commands behind the tools' thin mains: `mc-sim` (one simulation of a trace on a CLUSTER.json,
// with command-line overrides of the config) and `mc-plan threshold|node|capacity` (plan.hpp and
// node_capacity.hpp hold the arithmetic). Each validates its options, runs, writes data to `out` (a
// table, or JSON with --json) and returns a Status the main maps to an exit code (0 ok, 1 runtime, 2 bad
// input).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/sim/node_capacity.hpp"
#include "mc/sim/plan.hpp"
#include "mc/sim/simulator.hpp"
#include "mc/trace/trace.hpp"

namespace mc::sim {

// Overrides of CLUSTER.json from the command line; strings accept units ("3M", "87GB").
struct ClusterOverrides {
  std::optional<std::string> policy;
  std::optional<std::string> cache_mode;  // global | local
  std::optional<int64_t> prefill_instances;
  std::optional<int64_t> decode_instances;
  std::optional<std::string> cache_capacity_tokens;  // per prefill instance
  std::optional<std::string> nic_bandwidth;          // bytes/s per instance ("87GB", "25GB")
  std::optional<bool> early_rejection;
  std::optional<double> slo_ttft_ms;
  std::optional<double> slo_tbt_ms;
  std::optional<std::string> model;
  std::optional<std::string> gpu;
  std::optional<uint64_t> seed;
  std::optional<int64_t> pipeline_group;          // chunked pipeline parallelism: instances per group (1: off)
  std::optional<int64_t> pipeline_chunk_tokens;   // a pipelined prefill's chunk
  std::optional<double> pipeline_reserve_factor;  // instances about free to form a group, x its size
  std::optional<double> pipeline_min_gain;        // fraction of one instance's TTFT a group must save
  std::optional<std::string> queue;               // prefill queue discipline: fcfs | slo
  std::optional<double> queue_aging_weight;       // slo: key = now + weight x predicted service
  std::optional<int64_t> preempt_chunk_tokens;    // prefill instances yield after each chunk (0: off)
  std::optional<std::string> pending_prefix;      // on | off
  std::optional<double> placement_load_weight;    // kvcache: service's weight, x mean queue / mean service
  std::optional<double> slo_headroom;             // kvcache: fraction of the TTFT SLO kept free
  std::optional<double> shed_limit;               // kvcache: load shedding, x the TTFT SLO (0: off)
  std::optional<double> balancing_threshold;      // remote prefix reads only past this x the same-host prefix
  // Applies the set fields to `config` and validates it.
  Status apply(ClusterConfig& config) const;
};

struct SimCommand {
  std::string cluster_path;      // CLUSTER.json; empty: the defaults of ClusterConfig
  std::string description_path;  // --cluster: a cluster description (cluster_description.hpp); excludes cluster_path
  ClusterOverrides overrides;
  std::string trace_path = "-";
  bool lenient = false;
  trace::FormatOptions formats;  // --format, --timestamp-unit, --block-accounting, --synthesize-prefixes
  TraceWindow window;
  std::optional<int64_t> output_length;    // replaces every row's output_length (paper §8.? uses 1)
  std::string records_path;                // per-request JSONL file ("": none)
  bool json = false;                       // one JSON document instead of the table
  std::vector<double> report_slo_ttft_ms;  // summary thresholds; empty: the cluster's SLO
  std::vector<double> report_slo_tbt_ms;
  bool progress = false;
  bool refit = true;      // SimOptions::refit_predictors
  std::string html_path;  // --html: the run's page (mc/report/run_charts.hpp, plus instance utilisation); "": none
  std::string svg_dir;    // --svg: each chart as DIR/<chart>.svg; "": none
};

Status run_sim_command(const SimCommand& command, std::ostream& out);

struct ThresholdCommand {
  std::string model = "llama3-70b";
  std::string gpu = "a800x8";
  std::string prefix_tokens = "512,1K,2K,4K,8K,16K,32K,64K,128K";  // a count list (units.hpp)
  int64_t new_tokens = 1;
  bool json = false;
};
Status run_threshold_command(const ThresholdCommand& command, std::ostream& out);

// `mc-plan pipeline`: TTFT of one prompt with nothing cached on a group of X prefill nodes by chunked pipeline
// parallelism (mc/model/pipeline.hpp, DESIGN.md §18), against one node and the ideal 1/X, per prompt length.
struct PipelineCommand {
  std::string model = "llama3-70b";
  std::string gpu = "a800x8";
  std::string prompt_tokens = "8192,16384,32768,65536,131072";  // a count list (units.hpp: 1K = 1000)
  std::string groups = "1,2,4,8";                               // instances per group
  int64_t chunk_tokens = 8192;
  std::string link_bandwidth = "25GB";  // bytes/s between consecutive stages (a 200 Gbit/s NIC)
  double link_latency_us = 20;
  bool json = false;
};
Status run_pipeline_command(const PipelineCommand& command, std::ostream& out);

// `mc-plan node`: the modelled node's capacities and their live sizes (node_capacity.hpp).
struct NodeCommand {
  NodeCapacityOptions options;
  uint64_t spare_dram_bytes = 512ull << 30;  // parsed with units; copied into options
  bool json = false;
};
Status run_node_command(const NodeCommand& command, std::ostream& out);

struct CapacityCommand {
  std::string cluster_path;  // base CLUSTER.json (model, gpu, policy, block size, ...)
  ClusterOverrides overrides;
  std::string trace_path = "-";
  bool lenient = false;
  trace::FormatOptions formats;
  TraceWindow window;
  double accept = 0.99;
  int64_t max_instances = 64;
  std::string cache_candidates = "1M,3M,10M,30M,50M,100M";  // total tokens
  std::string nic_candidates = "12.5GB,25GB,50GB,100GB";    // bytes/s per instance
  double cache_fraction = 0.95;
  bool json = false;
  bool progress = false;
  std::string html_path;  // --html: the plan's page (trials, cache curve, the final run's charts); "": none
  std::string svg_dir;    // --svg: each chart as DIR/<chart>.svg; "": none
};
Status run_capacity_command(const CapacityCommand& command, std::ostream& out);

// Loads the cluster config of a command: the file (if any), then the overrides.
Result<ClusterConfig> resolve_cluster(const std::string& cluster_path, const ClusterOverrides& overrides);

}  // namespace mc::sim
