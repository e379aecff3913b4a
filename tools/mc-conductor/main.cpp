// mc-conductor: the global scheduler. Subcommands: serve (the daemon), stat (ask a running one), cancel (a
// request of a running one), replay-decisions (re-run a decision log through other policies).
#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/common/daemon.hpp"
#include "mc/conductor/conductor.hpp"
#include "mc/coord/etcd_flags.hpp"
#include "mc/net/flags.hpp"
#include "mc/sched/policy.hpp"

int main(int argc, char** argv) {
  CLI::App app{"mc-conductor: the global scheduler (prefix index, TTFT prediction, placement, early rejection)"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-conductor");

  mc::sched::ConductorOptions o;
  std::string cost_model = "llama3-70b", gpu = "a800x8";
  bool no_early_reject = false;
  o.scheduler.kv.kv_bytes_per_token = 0;  // from the cost model unless given
  auto* serve = app.add_subcommand("serve", "Run the Conductor daemon until SIGTERM/SIGINT");
  serve->add_option("--listen", o.listen, "ZeroMQ endpoint for clients and workers")
      ->envname("MC_CONDUCTOR_LISTEN")
      ->capture_default_str();
  serve->add_option("--kv-events", o.kv_events, "Store master KV-event PUB endpoint(s) to subscribe to")
      ->envname("MC_KV_EVENTS")
      ->delimiter(',');
  serve
      ->add_option("--store-master", o.store_master,
                   "Store master RPC endpoint: index resync after an event gap, segment hosts")
      ->envname("MC_STORE_MASTER");
  mc::cli::add_etcd_flags(*serve, o.etcd, o.cluster_id, "--store-master");
  serve->add_option("--policy", o.scheduler.policy, "Prefill placement policy")
      ->envname("MC_POLICY")
      ->capture_default_str()
      ->check(CLI::IsMember(mc::sched::policy_names()));
  serve->add_option("--seed", o.scheduler.seed, "Seed of the random policy")->capture_default_str();
  serve
      ->add_option("--queue", o.scheduler.queue.discipline,
                   "Order of each prefill instance's queue: fcfs (first come, first served) | slo (shortest predicted "
                   "prefill first, aged, never making a queued request late; the key travels in prefill.job). "
                   "Default: slo for the kvcache policy, fcfs for the baselines")
      ->envname("MC_QUEUE")
      ->check(CLI::IsMember({"fcfs", "slo"}));
  serve
      ->add_option("--queue-aging", o.scheduler.queue.aging_weight,
                   "slo order's aging weight: a job's key = its decision time + this x its predicted prefill ms (0: "
                   "FCFS with the deadline guard)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  serve
      ->add_option("--queue-guard-ms", o.scheduler.queue.guard_ms,
                   "slo order's deadline guard: a job never goes ahead of a queued one it would bring within this "
                   "many ms of its TTFT deadline")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86'400'000.0));
  serve
      ->add_option("--pending-prefix", o.scheduler.pending_prefix,
                   "A prefix an accepted request is still computing counts as cached on its prefill instance for a "
                   "later request that extends it and queues behind it there (a session's next turn; DESIGN.md §10): "
                   "on | off. Default: on for the kvcache policy, off for the baselines")
      ->check(CLI::IsMember({"on", "off"}));
  serve
      ->add_option("--placement-load-weight", o.scheduler.placement_load_weight,
                   "kvcache policy: among instances where the request is admissible (its TTFT SLO and target), take "
                   "the smallest TTFT + w x prefill "
                   "service (ms), w = this x mean predicted queue / mean service of recent jobs (0: smallest TTFT, "
                   "the paper's rule; DESIGN.md §10)")
      ->capture_default_str()
      ->check(mc::cli::finite_in(0, 1000));
  serve
      ->add_option("--slo-headroom", o.scheduler.slo_headroom,
                   "kvcache policy: fraction of the TTFT SLO kept free: it places, orders and admits to (1 - this) x "
                   "SLO, and admits a request past that target only when it meets the SLO after waiting at most this "
                   "x SLO (0: admit up to the SLO, the paper's rule; 0 to 0.9; DESIGN.md §10)")
      ->capture_default_str()
      ->check(mc::cli::finite_in(0, 0.9));
  serve
      ->add_option(
          "--balancing-threshold", o.scheduler.balancing_threshold,
          "The paper's KV-cache balancing threshold: an instance reads a prefix from another host only when it "
          "is more than this many times the prefix in its own host's memory (1: any longer prefix, priced by "
          "predicted TTFT alone; 1 to 1000; DESIGN.md §10)")
      ->capture_default_str()
      ->check(mc::cli::finite_in(1, 1000));
  serve
      ->add_option(
          "--shed-limit", o.scheduler.shed_limit,
          "kvcache policy: load shedding: turn away a request whose prefill would delay the requests queued "
          "after it by more than this x the TTFT SLO (--slo-ttft-ms, not the request's own) in all (its "
          "predicted service x the mean over the prefill instances of the queue it would wait there / mean "
          "service of recent jobs; near 0 when idle, so only the largest prompts of a burst go; judged after 64 "
          "jobs, never on a re-dispatch, off with --no-early-reject; reason load_shed, HTTP 429; 0: off, the "
          "paper's rule; 0 to 1000; DESIGN.md §10)")
      ->capture_default_str()
      ->check(mc::cli::finite_in(0, 1000));
  mc::cli::add_slo_default_flags(*serve, o.scheduler.slo.ttft_ms, o.scheduler.slo.tbt_ms);
  serve->add_flag("--no-early-reject", no_early_reject,
                  "Place requests even when they are predicted to miss their SLO (reject only impossible ones)");
  serve
      ->add_option("--pipeline-group", o.scheduler.pipeline.group_size,
                   "Prefill instances a long prompt may pipeline over (chunked pipeline parallelism, DESIGN.md §18; "
                   "1: off; the instances' backend must run stages: ref)")
      ->envname("MC_PIPELINE_GROUP")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  serve
      ->add_option("--prefill-chunk", o.scheduler.pipeline.chunk_tokens,
                   "Tokens of one chunk of a pipelined prefill (hidden states cross stages per chunk)")
      ->envname("MC_PREFILL_CHUNK")
      ->capture_default_str()
      ->check(CLI::Range(1, 16777216));
  serve
      ->add_option("--pipeline-reserve-factor", o.scheduler.pipeline.reserve_factor,
                   "Instances about free needed to form a group, as a multiple of its size (1: the members only)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 64.0));
  serve
      ->add_option("--pipeline-min-gain", o.scheduler.pipeline.min_ttft_gain,
                   "Fraction of the best single instance's predicted TTFT a group must save to be chosen (0 to 1; "
                   "the decision log names the rule that declined a group: pipeline_declined)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  serve
      ->add_option("--overload-queue-ms", o.scheduler.overload_queue_ms,
                   "Queue (ms) above which a prefix holder counts as overloaded (hot-prefix replication)")
      ->capture_default_str();
  serve->add_option("--heartbeat-interval-ms", o.heartbeat_interval_ms, "Heartbeat interval told to workers (ms)")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  serve
      ->add_option("--startup-hold-ms", o.startup_hold_ms,
                   "For this long after start (ms), a submit that finds no prefill or decode instance waits for the "
                   "workers to register instead of being rejected (0: reject at once)")
      ->envname("MC_STARTUP_HOLD_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{600'000}));
  serve
      ->add_option("--heartbeat-timeout-ms", o.scheduler.heartbeat_timeout_ms,
                   "A worker silent this long (ms) is removed with its cached blocks")
      ->envname("MC_HEARTBEAT_TIMEOUT_MS")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  serve
      ->add_option("--max-instances", o.max_instances,
                   "Registered worker instances at most; registering a new id beyond it is refused")
      ->envname("MC_MAX_INSTANCES")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  serve
      ->add_option("--decode-envelope", o.scheduler.decode_envelope_factor,
                   "Reported decode steps may move the decode model up to this many times the cost model's step "
                   "time (or 50 ms more); slower reports are refused (0: no envelope, e.g. the ref backend)")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  serve->add_option("--reserve-timeout-ms", o.reserve_timeout_ms, "Deadline of decode.reserve (ms)")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  serve->add_option("--job-timeout-ms", o.job_timeout_ms, "Deadline of a prefill job (ms)")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  serve
      ->add_option("--max-clock-skew-ms", o.max_clock_skew_ms,
                   "Refuse a job report whose event time is more than this (ms) before its request's submit or "
                   "previous event, or ahead of this Conductor's clock")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  serve
      ->add_option("--max-dispatch-attempts", o.max_dispatch_attempts,
                   "Dispatch attempts per request, the first included: a request whose worker died before its "
                   "first token is re-dispatched while attempts and TTFT SLO are left, else failed")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  serve->add_option("--decisions", o.decisions_path, "Append every decision with its inputs to FILE (JSONL)");
  mc::cli::add_time_scale_option(*serve, o.time_scale,
                                 "Workers run this many times faster than the hardware they model (sim backend): "
                                 "measured times are multiplied by it, bandwidth samples ignored");
  serve
      ->add_option("--cost-model", cost_model,
                   "Model preset, Hugging Face model directory or JSON file of the prefill/decode cost prior")
      ->envname("MC_COST_MODEL")
      ->capture_default_str();
  mc::cli::add_gpu_option(*serve, gpu);
  serve
      ->add_option("--kv-bytes-per-token", o.scheduler.kv.kv_bytes_per_token,
                   "KV bytes per token for transfer pricing (default: the cost model's)")
      ->envname("MC_KV_BYTES_PER_TOKEN")
      ->check(mc::cli::kPositiveFinite);
  serve
      ->add_option("--bw-same-host", o.bandwidth_priors.same_host_bytes_per_s,
                   "Prior same-host fetch bandwidth (bytes/s) until measured")
      ->capture_default_str();
  serve
      ->add_option("--bw-remote", o.bandwidth_priors.remote_bytes_per_s,
                   "Prior remote-pool fetch bandwidth (bytes/s) until measured")
      ->capture_default_str();
  serve
      ->add_option("--bw-ssd", o.bandwidth_priors.ssd_bytes_per_s, "Prior SSD fetch bandwidth (bytes/s) until measured")
      ->capture_default_str();
  serve
      ->add_option("--bw-path-half-life-ms", o.bandwidth_priors.path_half_life_ms,
                   "A host-to-host path's measured bandwidth decays back to the remote estimate with this half-life "
                   "(ms; 0: never): how soon a path measured slow is tried again")
      ->envname("MC_BW_PATH_HALF_LIFE_MS")
      ->check(mc::cli::kNonNegativeFinite)
      ->capture_default_str();
  mc::cli::add_key_namespace_flags(*serve, o.key_namespace, "--hash-seed");

  std::string endpoint = "tcp://127.0.0.1:7460";
  bool json = false;
  int timeout_ms = 2000;
  auto* stat = app.add_subcommand("stat",
                                  "Print a running Conductor's instances, loads, index, decisions and "
                                  "TTFT prediction error");
  stat->add_option("--endpoint", endpoint, "The Conductor's endpoint")->envname("MC_CONDUCTOR")->capture_default_str();
  mc::cli::add_json_flag(*stat, json, "Print the status document as JSON");
  stat->add_option("--timeout-ms", timeout_ms, "Reply deadline (ms)")->capture_default_str();

  std::string cancel_endpoint = "tcp://127.0.0.1:7460", cancel_id;
  bool cancel_json = false;
  int cancel_timeout_ms = 5000;
  auto* cancel = app.add_subcommand("cancel",
                                    "Cancel a request in the cluster (its client gave up): print the stage it was "
                                    "found in (dispatching, prefilling, decoding, or unknown)");
  cancel->add_option("REQUEST_ID", cancel_id, "The request's id as submitted")->required();
  cancel->add_option("--endpoint", cancel_endpoint, "The Conductor's endpoint")
      ->envname("MC_CONDUCTOR")
      ->capture_default_str();
  mc::cli::add_json_flag(*cancel, cancel_json, "Print the reply as JSON");
  cancel->add_option("--timeout-ms", cancel_timeout_ms, "Reply deadline (ms)")->capture_default_str();

  std::string log_path;
  std::vector<std::string> replay_policies = mc::sched::policy_names();
  uint64_t replay_seed = 1;
  bool replay_json = false;
  auto* replay = app.add_subcommand("replay-decisions",
                                    "Re-run each decision of a --decisions log through other policies and compare "
                                    "their choices and predicted TTFTs with the logged ones");
  replay->add_option("FILE", log_path, "Decision log (JSONL) written by serve --decisions")->required();
  replay->add_option("--policy", replay_policies, "Policies to re-run, comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember(mc::sched::policy_names()));
  replay->add_option("--seed", replay_seed, "Seed of the random policy (the serving Conductor's --seed)")
      ->capture_default_str();
  mc::cli::add_json_flag(*replay, replay_json, "Print the comparison as JSON");

  mc::cli::add_metrics_flags(*serve, o.metrics_listen);
  mc::cli::add_auth_flags(*serve, "conductor");
  mc::cli::add_auth_flags(*stat, "admin");
  mc::cli::add_auth_flags(*cancel, "admin");
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (replay->parsed()) {
    return mc::cli::report(
        "mc-conductor replay-decisions",
        mc::sched::print_decision_replay(log_path, replay_policies, replay_seed, replay_json, std::cout), replay_json);
  }
  if (cancel->parsed()) {
    return mc::cli::report(
        "mc-conductor cancel",
        mc::sched::cancel_request(cancel_endpoint, cancel_id, cancel_json, cancel_timeout_ms, std::cout), cancel_json);
  }
  if (stat->parsed()) {
    return mc::cli::report("mc-conductor stat",
                           mc::sched::print_conductor_status(endpoint, json, timeout_ms, std::cout), json);
  }
  o.scheduler.slo.early_reject = !no_early_reject;
  if (mc::Status st = mc::sched::apply_cost_model(o, cost_model, gpu); !st.is_ok()) {
    return mc::cli::report("mc-conductor", st);
  }
  mc::daemon::install_stop_signals();
  return mc::cli::report("mc-conductor", mc::sched::run_conductor(o));
}
