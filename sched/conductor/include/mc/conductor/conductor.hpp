// mc-conductor, the daemon around the Scheduler (scheduler.hpp): one ZeroMQ ROUTER endpoint for
// clients (conductor.submit, conductor.cancel, conductor.status, stat) and workers (conductor.register, .heartbeat,
// .job_report); KV-event subscriptions that feed the prefix index; and the dispatch of accepted
// requests to the workers with the worker section's messages (decode_reserve, then prefill_job). A decision
// with replicate_prefix first sends store.replicate_near (asynchronous, bounded by store_timeout_ms) to the
// store master, so that the chosen prefill instance's read of the prefix leaves a copy on its host.
//
// Threading: everything runs on the thread that calls run_conductor() (one loop polling the server,
// the worker connections and the event subscriptions; no locks). Worker calls are asynchronous
// (DEALER sockets, replies matched by id, deadlines enforced), so a long prefill never blocks the
// loop. Blocking calls are limited to the store master's resync of the prefix index (after a gap or a
// restart), bounded by store_timeout_ms. The store master's store.stat is asked every second, asynchronously:
// segment hosts (same-host pricing), suspect segments (their blocks parked out of the index until the node is
// back) and the KV-event incarnation (another one: the master restarted, and the index is resynced against it;
// prefix_index.hpp). The index's reconciliation counters and the planned hits the prefill found missing
// (mc_conductor_planned_missing_tokens_total) are in `mc-conductor stat` (field report 24).
//
// Worker faults (DESIGN.md §10, sched/policy faults.hpp): an instance whose watched connection closes (its
// process died: seen within one loop pass), that misses its heartbeats for heartbeat_timeout_ms, or whose
// decode_reserve / prefill_job / decode_release fails on transport (timeout, unavailable), is removed, and within the
// same loop pass (100 ms tick) each request it holds is re-dispatched (nothing reached the client, attempts and TTFT
// budget left) or failed: a rejection when the submit was not answered yet, else "client.request_error" sent by the
// Conductor to the client endpoint naming the instance and the cause. A reservation on a live decode instance is
// released (decode_release) at once; when a prefill died or failed after it may have committed, decode_release's answer
// decides (released: re-dispatch; not released: the decode instance has the request). A decode instance's death fails
// the requests it was streaming. `stat` counts them (faults: redispatched, failed_by_instance_death,
// reservations_released, connection_lost, refused_*).
//
// Cancel (DESIGN.md §10 "Cancel", faults.hpp plan_cancel): conductor.cancel from the submitter's identity (or an
// admin key) settles the request in the books at once and it is never (re-)dispatched: a request still reserving
// or replicating has its reservation released and its submit answered as a rejection "cancelled"; one whose prefill
// job was sent gets prefill_cancel (a queued job is dropped: stage "dispatching") and decode_cancel (decode refuses
// its commit, or stops it); one decoding gets decode_cancel. The prefill job's later answer, failure or instance
// death then only closes its record. `stat` counts the cancels by stage (cancels).
//
// Errors: a bad submit gets an error reply (kInvalidArgument naming the field; an SLO above 24 h is refused)
// or a rejection; a heartbeat with a negative or absurd figure, and a job report with an event time before
// its request's submit or previous event or beyond max_clock_skew_ms in the future, get an error reply and
// are counted, never fed to the predictors; nothing here aborts on network errors.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "mc/common/block_key.hpp"
#include "mc/common/status.hpp"
#include "mc/sched/predictors.hpp"
#include "mc/sched/types.hpp"

namespace mc::sched {

struct ConductorOptions {
  std::string listen = "tcp://127.0.0.1:7460";  // clients and workers
  std::vector<std::string> kv_events;           // store master PUB endpoints (tcp://...:7451)
  std::string store_master;                     // for index resync and segment hosts; empty: none
  // A replicated store master (DESIGN.md §17): with etcd set, the store master and its KV event stream are those of
  // the leader of cluster_id, followed through etcd (store_master is then ignored; kv_events may still name others).
  std::string etcd;
  std::string cluster_id;
  int store_timeout_ms = 2'000;
  SchedulerConfig scheduler;
  // How tokens become block keys (DESIGN.md §4.1). Its model, revision, dtype, layout and seed are the base
  // namespace (must match the prefill workers'; all empty: adopted from the first prefill worker); its LoRA
  // adapter and salt are the default key scope of requests that name none. A request's blocks are keyed in
  // the base with its own scope (ConductorSubmitRequest::lora_name/lora_version/salt).
  KeyNamespace key_namespace;
  PrefillCostPrior prefill_prior;
  DecodeCostPrior decode_prior;
  BandwidthPriors bandwidth_priors;
  int64_t heartbeat_interval_ms = 500;  // told to workers at registration
  // A (re)started Conductor knows no worker until each registers again: for this long after its start (ms), a submit
  // that finds no placeable prefill or decode instance waits for one (at most 4,096 submits and 256 MiB of their
  // prompts wait) instead of being rejected with no_prefill_instance / no_decode_instance. 0: reject at once.
  int64_t startup_hold_ms = 3'000;
  int64_t reserve_timeout_ms = 5'000;  // decode_reserve
  int64_t job_timeout_ms = 600'000;    // prefill_job (its reply comes when the job is done)
  int64_t max_clock_skew_ms = 60'000;  // job-report event times may be off the Conductor's clock by this much
  int max_dispatch_attempts = 3;       // per request, the first included: re-dispatches after worker faults
  // Registered instances at most: a registration of a new id beyond it is refused (each registered worker holds a
  // watched connection of the Conductor's, so an unbounded registry would exhaust its file descriptors).
  int64_t max_instances = 1'024;
  std::string decisions_path;  // JSONL of every decision; empty: none
  // Workers running X times faster than the hardware they model (the sim backend's --time-scale):
  // their measured times are multiplied by X before refitting and before TTFT accounting, so the
  // predictors, SLOs and reports stay in modelled milliseconds. Their KV bytes are scaled by another
  // factor, so with X != 1 bandwidth samples are not taken and the priors stay.
  double time_scale = 1.0;
  std::string metrics_listen;  // --metrics-listen: "ADDR:PORT" of GET /metrics (metrics_http.hpp); empty: off
};

// Sets the prefill and decode priors (and kv_bytes_per_token when it is <= 0) from the backend's GPU
// cost model (mc/model/cost_model.hpp): `model_spec` a preset or JSON file, `gpu_name` a GPU preset.
// kNotFound names the known presets.
Status apply_cost_model(ConductorOptions& options, const std::string& model_spec, const std::string& gpu_name);

// Runs until SIGTERM/SIGINT (daemon::stop_requested()). Prints the ready line
// "ready mc-conductor <endpoint> policy=<name>" on stdout once listening.
Status run_conductor(const ConductorOptions& options);

// `mc-conductor stat`: asks a running Conductor for its status and prints a table (instances with
// units in the headers, then index, decisions, predictors, TTFT error) or the JSON document.
Status print_conductor_status(const std::string& endpoint, bool json, int timeout_ms, std::ostream& out);

// `mc-conductor cancel REQUEST_ID`: asks a running Conductor to cancel a request (conductor.cancel, DESIGN.md §10
// "Cancel") and prints the stage it was found in ("request ID: cancelled while decoding", or that it is unknown:
// finished, failed or never submitted) or the reply as JSON {"request_id", "stage"}. An unknown request is not an
// error. Errors: the call's (kPermissionDenied naming the caller when another identity submitted it; kTimeout,
// kUnavailable), kInvalidArgument for an empty id.
Status cancel_request(const std::string& endpoint, const std::string& request_id, bool json, int timeout_ms,
                      std::ostream& out);

// `mc-conductor replay-decisions FILE`: reads a decision log (serve --decisions), re-runs every logged decision
// through each of `policies` (decision_replay.hpp; `seed` for random) and prints one row per policy (same and
// different choices, acceptances, rejections, predicted-TTFT difference mean / p99 / max) or the JSON
// document. kNotFound for a missing file; kInvalidArgument naming the line of a malformed record, or an
// unknown policy.
Status print_decision_replay(const std::string& path, const std::vector<std::string>& policies, uint64_t seed,
                             bool json, std::ostream& out);

// A submitted request, its block keys seq_hashes(tokens, ns): block_hashes sent with the tokens must equal the first
// of those keys (kInvalidArgument naming the first that differs) and be no more than its complete blocks. A submit
// without tokens is refused (the prefill instance needs the prompt). kInvalidArgument names the field.
Result<Request> request_from_submit(const std::string& request_id, int64_t input_tokens, int64_t output_tokens,
                                    const std::vector<uint32_t>& tokens, const std::vector<uint64_t>& block_hashes,
                                    int64_t block_size_tokens, double slo_ttft_ms, double slo_tbt_ms,
                                    const KeyNamespace& ns);

}  // namespace mc::sched
