// mc-sim: simulate a request trace on a cluster described by CLUSTER.json, in virtual time, with the
// Conductor's own policies; prints replay's summary plus per-instance and cache ledgers.
#include <unistd.h>

#include <iostream>

#include "mc/common/cli.hpp"
#include "mc/sim/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-sim: cluster-scale simulation of a Mooncake trace (N prefill + M decode instances, KV cache "
      "pool, NICs) in virtual time, with the Conductor's policies"};
  mc::cli::add_common_flags(app, "mc-sim");
  mc::sim::SimCommand cmd;
  mc::sim::ClusterOverrides& o = cmd.overrides;
  app.add_option("cluster", cmd.cluster_path, "CLUSTER.json (see mc-sim(1)); omitted: the built-in defaults");
  app.add_option("--trace", cmd.trace_path, "Mooncake JSONL trace file, or - for stdin")
      ->envname("MC_TRACE")
      ->capture_default_str();
  app.add_flag("--lenient", cmd.lenient, "Skip malformed trace rows with a warning (default: strict, exit 2)");
  app.add_option("--start-s", cmd.window.start_s, "Skip rows before this trace time (s)")->capture_default_str();
  app.add_option("--duration-s", cmd.window.duration_s, "Trace seconds to replay from --start-s (0: to the end)")
      ->capture_default_str();
  app.add_option("--max-requests", cmd.window.max_requests, "At most this many rows (0: no limit)")
      ->capture_default_str();
  app.add_option("--rate-scale", cmd.window.rate_scale, "Multiply the arrival rate (2: twice as many requests/s)")
      ->envname("MC_RATE_SCALE")
      ->capture_default_str();
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
  app.add_option("--slo-ttft-ms", o.slo_ttft_ms, "Override: the cluster's TTFT SLO (ms)");
  app.add_option("--slo-tbt-ms", o.slo_tbt_ms, "Override: the cluster's TBT SLO (ms)");
  app.add_option("--model", o.model, "Override: model preset or JSON file (llama3-70b, llama3-8b, ...)");
  app.add_option("--gpu", o.gpu, "Override: GPU preset of an instance (a800x8, h800x8)");
  app.add_option("--seed", o.seed, "Override: seed of the random policy");
  app.add_option("--report-slo-ttft-ms", cmd.report_slo_ttft_ms,
                 "TTFT limits (ms) of the summary's SLO table (default: the cluster's)")
      ->delimiter(',');
  app.add_option("--report-slo-tbt-ms", cmd.report_slo_tbt_ms,
                 "TBT limits (ms) of the summary's SLO table (default: the cluster's)")
      ->delimiter(',');
  app.add_option("--refit", cmd.refit,
                 "Feed measured times back into the Conductor's predictor refit (true, as the daemons do) or keep "
                 "the cost model's priors (false)")
      ->capture_default_str();
  app.add_option("--out", cmd.records_path, "Write one JSON record per request (JSONL) to this file");
  app.add_flag("--json", cmd.json, "Print one JSON document instead of the tables");
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  cmd.progress = isatty(STDERR_FILENO) != 0;
  return mc::cli::report("mc-sim", mc::sim::run_sim_command(cmd, std::cout));
}
