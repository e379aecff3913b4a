// mc-plan: capacity planning. `threshold`: the bandwidth above which fetching a cached prefix beats
// recomputing it. `pipeline`: TTFT of a long prompt on a group of prefill nodes by chunked pipeline parallelism.
// `node`: one modelled node's KV capacities in tokens and their live sizes. `capacity`: the fewest instances, cache and
// NIC bandwidth that meet a trace's SLOs.
#include <unistd.h>

#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/sim/commands.hpp"
#include "mc/trace/trace_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-plan: capacity planning for a KVCache-centric cluster (fetch threshold, cluster sizing by simulation)"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-plan");

  mc::sim::ThresholdCommand th;
  auto* th_cmd = app.add_subcommand("threshold",
                                    "Bandwidth above which fetching a cached prefix beats recomputing it, "
                                    "per prefix length");
  mc::cli::add_model_option(*th_cmd, th.model, /*env=*/true);
  mc::cli::add_gpu_option(*th_cmd, th.gpu);
  th_cmd->add_option("--prefix-tokens", th.prefix_tokens, "Prefix lengths, tokens (comma list, 1K = 1000)")
      ->capture_default_str();
  th_cmd->add_option("--new-tokens", th.new_tokens, "Tokens prefilled after the prefix")->capture_default_str();
  mc::cli::add_json_flag(*th_cmd, th.json, "Print JSON instead of the table");

  mc::sim::PipelineCommand pp;
  auto* pp_cmd = app.add_subcommand("pipeline",
                                    "TTFT of one prompt, nothing cached, on a group of X prefill nodes by chunked "
                                    "pipeline parallelism, against one node (per prompt length and group size)");
  mc::cli::add_model_option(*pp_cmd, pp.model, /*env=*/true);
  mc::cli::add_gpu_option(*pp_cmd, pp.gpu);
  pp_cmd->add_option("--prompt-tokens", pp.prompt_tokens, "Prompt lengths, tokens (comma list)")->capture_default_str();
  pp_cmd->add_option("--groups", pp.groups, "Group sizes X (instances; the layers split into X stages)")
      ->capture_default_str();
  pp_cmd
      ->add_option("--prefill-chunk", pp.chunk_tokens,
                   "Tokens of one chunk, 256 to 16777216 (activations cross stages per chunk)")
      ->capture_default_str();
  pp_cmd->add_option("--link-bandwidth", pp.link_bandwidth, "Between consecutive stages, bytes/s")
      ->capture_default_str();
  pp_cmd
      ->add_option("--link-latency-us", pp.link_latency_us,
                   "Fixed cost of one boundary crossing, microseconds (0 to 1000000)")
      ->capture_default_str();
  mc::cli::add_json_flag(*pp_cmd, pp.json, "Print JSON instead of the table");

  mc::sim::NodeCommand node;
  auto* node_cmd = app.add_subcommand("node",
                                      "One modelled node's KV capacities in tokens (decode HBM, DRAM pool) and the "
                                      "live sizes holding as many tokens at a byte scale");
  mc::cli::add_model_option(*node_cmd, node.options.model, /*env=*/true);
  mc::cli::add_gpu_option(*node_cmd, node.options.gpu);
  mc::cli::add_size_option(*node_cmd, "--spare-dram-bytes", node.spare_dram_bytes,
                           "DRAM one node lends to the pool (512GiB, 1TiB, ...)")
      ->capture_default_str();
  node_cmd->add_option("--nic-mbit", node.options.nic_mbit, "The node's NICs together, Mbit/s (8 x 200 Gbit/s)")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  node_cmd->add_option("--scale", node.options.scale, "Modelled / live KV bytes per token")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  node_cmd
      ->add_option("--time-scale", node.options.time_scale,
                   "The live cluster runs this many times faster than modelled (the NIC is sped up as much)")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  node_cmd->add_option("--nic-cap-mbit", node.options.nic_cap_mbit, "The most a live link is shaped to (0: no cap)")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  mc::cli::add_block_size_option(*node_cmd, node.options.block_size, "--block-size", "Tokens per KV block");
  mc::cli::add_json_flag(*node_cmd, node.json, "Print JSON instead of the lines");

  mc::sim::CapacityCommand cap;
  auto* cap_cmd = app.add_subcommand("capacity",
                                     "Fewest prefill and decode instances, cache and NIC bandwidth meeting "
                                     "the SLOs for a trace (by simulation)");
  cap_cmd->add_option("cluster", cap.cluster_path, "Base CLUSTER.json (model, gpu, policy, ...); omitted: defaults");
  mc::cli::add_trace_file_option(*cap_cmd, cap.trace_path);
  cap_cmd->add_flag("--lenient", cap.lenient, "Skip malformed trace rows with a warning");
  mc::cli::add_trace_format_flags(*cap_cmd, cap.formats);
  mc::cli::add_trace_window_flags(*cap_cmd, cap.window.start_s, cap.window.duration_s, cap.window.max_requests);
  mc::cli::add_rate_scale_option(*cap_cmd, cap.window.rate_scale);
  mc::cli::add_slo_override_flags(*cap_cmd, cap.overrides.slo_ttft_ms, cap.overrides.slo_tbt_ms,
                                  "the config's, 30000 and 100");
  cap_cmd->add_option("--accept", cap.accept, "Fraction of requests that must meet both SLOs")->capture_default_str();
  mc::cli::add_model_option(*cap_cmd, cap.overrides.model);
  cap_cmd->add_option("--gpu", cap.overrides.gpu, "Override: GPU preset");
  cap_cmd->add_option("--policy", cap.overrides.policy, "Override: scheduling policy");
  cap_cmd->add_option("--max-instances", cap.max_instances, "Search bound per role")->capture_default_str();
  cap_cmd->add_option("--cache-candidates", cap.cache_candidates, "Total cache capacities to consider, tokens")
      ->capture_default_str();
  cap_cmd
      ->add_option("--cache-fraction", cap.cache_fraction,
                   "Pick the smallest cache reaching this fraction of the infinite-cache hit ratio")
      ->capture_default_str();
  cap_cmd->add_option("--nic-candidates", cap.nic_candidates, "NIC bandwidths to consider, bytes/s per instance")
      ->capture_default_str();
  mc::cli::add_json_flag(*cap_cmd, cap.json, "Print JSON instead of the tables");
  cap_cmd->add_option("--html", cap.html_path,
                      "Also write one self-contained HTML page (opens offline): the capacity curve, every trial's "
                      "attainment, and the final run's charts; drawn by gnuplot (apt-get install gnuplot-nox)");
  cap_cmd->add_option("--svg", cap.svg_dir, "Also write each chart as DIR/<chart>.svg (the directory is created)");

  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (th_cmd->parsed())
    return mc::cli::report("mc-plan threshold", mc::sim::run_threshold_command(th, std::cout), th.json);
  if (pp_cmd->parsed())
    return mc::cli::report("mc-plan pipeline", mc::sim::run_pipeline_command(pp, std::cout), pp.json);
  if (node_cmd->parsed()) return mc::cli::report("mc-plan node", mc::sim::run_node_command(node, std::cout), node.json);
  cap.progress = isatty(STDERR_FILENO) != 0;
  return mc::cli::report("mc-plan capacity", mc::sim::run_capacity_command(cap, std::cout), cap.json);
}
