// mc-sim: simulate a request trace on a cluster described by CLUSTER.json or by a cluster description
// (--cluster, the file examples/cluster.sh starts), in virtual time, with the
// Conductor's own policies; prints replay's summary plus per-instance and cache ledgers.
#include <unistd.h>

#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/sim/commands.hpp"
#include "mc/trace/trace_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-sim: cluster-scale simulation of a Mooncake trace (N prefill + M decode instances, KV cache "
      "pool, NICs) in virtual time, with the Conductor's policies"};
  mc::cli::add_common_flags(app, "mc-sim");
  mc::sim::SimCommand cmd;
  mc::sim::ClusterOverrides& o = cmd.overrides;
  CLI::Option* positional =
      app.add_option("cluster", cmd.cluster_path, "CLUSTER.json (see mc-sim(1)); omitted: the built-in defaults");
  app.add_option("--cluster", cmd.description_path,
                 "A cluster description (examples/clusters/*.json, the file examples/cluster.sh starts): simulate "
                 "that cluster. Instances: the sums of daemons.prefill/decode; pool tokens = storage nodes x "
                 "dram_bytes / the live kv_bytes_per_token (spread over the prefill instances); NIC = nic_mbit x "
                 "1e6/8 x (model KV bytes per token / live). See mc-sim(1). Excludes the CLUSTER.json positional")
      ->envname("MC_CLUSTER")
      ->excludes(positional);
  mc::cli::add_trace_file_option(app, cmd.trace_path);
  app.add_flag("--lenient", cmd.lenient, "Skip malformed trace rows with a warning (default: strict, exit 2)");
  mc::cli::add_trace_format_flags(app, cmd.formats);
  mc::cli::add_trace_window_flags(app, cmd.window.start_s, cmd.window.duration_s, cmd.window.max_requests);
  mc::cli::add_rate_scale_option(app, cmd.window.rate_scale);
  app.add_option("--output-length", cmd.output_length, "Replace every row's output_length (tokens, >= 1)");
  app.add_option("--policy", o.policy, "Override: random|round_robin|least_loaded|cache_aware|kvcache")
      ->envname("MC_POLICY");
  app.add_option("--prefill-instances", o.prefill_instances, "Override: number of prefill instances");
  app.add_option("--decode-instances", o.decode_instances, "Override: number of decode instances");
  app.add_option("--cache-capacity-tokens", o.cache_capacity_tokens,
                 "Override: DRAM KV cache per prefill instance, tokens (\"3M\")");
  app.add_option("--cache-mode", o.cache_mode, "Override: global (one pool) | local (own cache only)");
  app.add_option("--nic-bandwidth", o.nic_bandwidth, "Override: NIC bandwidth per instance, bytes/s (\"87GB\")");
  app.add_option("--early-rejection", o.early_rejection, "Override: early rejection on (true) or off (false)");
  mc::cli::add_slo_override_flags(app, o.slo_ttft_ms, o.slo_tbt_ms, "the cluster's");
  mc::cli::add_model_option(app, o.model);
  app.add_option("--gpu", o.gpu, "Override: GPU preset of an instance (a800x8, h800x8)");
  app.add_option("--seed", o.seed, "Override: seed of the random policy");
  app.add_option("--pipeline-group", o.pipeline_group,
                 "Override: prefill instances a long prompt may pipeline over (chunked pipeline parallelism: the "
                 "layers split into that many stages, the Conductor picks a group when its predicted TTFT beats one "
                 "instance; 1: off; default 1)");
  app.add_option("--prefill-chunk", o.pipeline_chunk_tokens,
                 "Override: tokens of one chunk of a pipelined prefill (activations cross stages per chunk; default "
                 "8192)");
  app.add_option("--pipeline-reserve-factor", o.pipeline_reserve_factor,
                 "Override: instances about free needed to form a group, as a multiple of its size, 1 to 64 (1: the "
                 "members only; default 2; the Conductor's --pipeline-reserve-factor)");
  app.add_option("--pipeline-min-gain", o.pipeline_min_gain,
                 "Override: fraction of one instance's predicted TTFT a group must save to be chosen, 0 to 1 "
                 "(default 0.3; the Conductor's --pipeline-min-gain)");
  app.add_option("--queue", o.queue,
                 "Override: order of each prefill instance's queue: fcfs (first come, first served) | slo (shortest "
                 "predicted prefill first, aged, never making a queued request late; docs/DESIGN.md §10). Default: "
                 "slo for the kvcache policy, fcfs for the baselines")
      ->envname("MC_QUEUE")
      ->check(CLI::IsMember({"fcfs", "slo"}));
  app.add_option("--queue-aging", o.queue_aging_weight,
                 "Override: slo order's aging weight: a job's key = its decision time + this x its predicted "
                 "prefill ms (0: FCFS with the deadline guard; default 4)");
  app.add_option("--preempt-chunk-tokens", o.preempt_chunk_tokens,
                 "Override: preemption at chunk boundaries: each prefill instance computes a job this many tokens "
                 "at a time and, after each chunk, yields to a waiting job of a smaller queue key (docs/DESIGN.md "
                 "§10; 0: off, a started job runs to its end; default 0: a what-if, mc-prefill does not preempt; "
                 "docs/REPRODUCTION.md §7.4 measures it)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--pending-prefix", o.pending_prefix,
                 "Override: a prefix an accepted request is still computing counts as cached on its instance for a "
                 "later request that extends it and queues behind it there (a session's next turn; docs/DESIGN.md "
                 "§10): on | off. Default: on for the kvcache policy, off for the baselines")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--placement-load-weight", o.placement_load_weight,
                 "Override: kvcache policy: among instances where the request is admissible (its TTFT SLO and target), "
                 "take the smallest TTFT + w x "
                 "prefill service (ms), w = this x mean predicted queue / mean service of recent jobs (0: smallest "
                 "TTFT, the paper's rule; 0 to 1000; default 1; docs/DESIGN.md §10)")
      ->check(mc::cli::finite_in(0, 1000));
  app.add_option("--slo-headroom", o.slo_headroom,
                 "Override: kvcache policy: fraction of the TTFT SLO kept free: it places, orders and admits to "
                 "(1 - this) x SLO, and admits a request past that target only when it meets the SLO after waiting "
                 "at most this x SLO (0: admit up to the SLO, the paper's rule; 0 to 0.9; default 0.2; "
                 "docs/DESIGN.md §10)")
      ->check(mc::cli::finite_in(0, 0.9));
  app.add_option("--balancing-threshold", o.balancing_threshold,
                 "Override: the paper's KV-cache balancing threshold: an instance reads a prefix from another host "
                 "only when it is more than this many times the prefix in its own host's memory (1: any longer "
                 "prefix, priced by predicted TTFT alone; 1 to 1000; default 1; docs/DESIGN.md §10)")
      ->check(mc::cli::finite_in(1, 1000));
  app.add_option(
         "--shed-limit", o.shed_limit,
         "Override: kvcache policy: load shedding: turn away a request whose prefill would delay the "
         "requests queued after it by more than this x the cluster's TTFT SLO in all (its predicted service x the "
         "mean over the prefill instances of the queue it would wait there / mean service of recent jobs; "
         "near 0 when idle; reason load_shed; 0: off, the paper's rule; 0 to 1000; default 5; "
         "docs/DESIGN.md §10)")
      ->check(mc::cli::finite_in(0, 1000));
  mc::cli::add_slo_list_flags(app, "--report-slo-ttft-ms", cmd.report_slo_ttft_ms, "--report-slo-tbt-ms",
                              cmd.report_slo_tbt_ms, " of the summary's SLO table (default: the cluster's)");
  app.add_option("--refit", cmd.refit,
                 "Feed measured times back into the Conductor's predictor refit (true, as the daemons do) or keep "
                 "the cost model's priors (false)")
      ->capture_default_str();
  app.add_option("--out", cmd.records_path, "Write one JSON record per request (JSONL) to this file");
  mc::cli::add_json_flag(app, cmd.json, "Print one JSON document instead of the tables");
  app.add_option("--html", cmd.html_path,
                 "Also write one self-contained HTML page (opens offline) of the run: TTFT/TBT CDFs, TTFT over time "
                 "with rejections, per-instance queue and load, hit ratio over time, GPU-seconds spent and saved, SLO "
                 "attainment, instance utilisation; drawn by gnuplot (apt-get install gnuplot-nox)");
  app.add_option("--svg", cmd.svg_dir, "Also write each chart as DIR/<chart>.svg (the directory is created)");
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  cmd.progress = isatty(STDERR_FILENO) != 0;
  return mc::cli::report("mc-sim", mc::sim::run_sim_command(cmd, std::cout), cmd.json);
}
