// The Conductor's section of the protocol (sched/, DESIGN.md §10): submissions, registration, heartbeats.
// Wire rules: envelope.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/proto/message.hpp"
#include "mc/proto/sampling.hpp"

namespace mc::proto {

// ---------------------------------------------------------------------------------------------
// Conductor (sched/): client submissions, worker registration, heartbeats, job reports
// ---------------------------------------------------------------------------------------------
// (section owned by mc_sched / mc-conductor)
//
// Clients (mc-trace-replay) and workers (mc-prefill, mc-decode) are RpcClients of mc-conductor's one
// ROUTER endpoint. A request's life:
//   client    -> conductor  conductor.submit       the Conductor decides at once; a rejection is the reply
//   conductor -> mc-decode  decode_reserve         (worker section) for the chosen decode instance
//                                                  conductor.submit is answered "accepted" once it holds
//   conductor -> mc-prefill prefill_job            (worker section) prefix plan, decode target, client_endpoint;
//                                                  its reply (job done, ledger) refits the predictors
//   mc-decode -> client     token_event, request_done / request_error   (worker section, to client_endpoint)
//   workers   -> conductor  conductor.register once (again when a heartbeat reply says so),
//                           conductor.heartbeat (load) every heartbeat_interval_ms,
//                           conductor.job_report (optional: first_token / done / failed seen by mc-decode),
//                           conductor.drain on SIGTERM (again after every re-registration while it drains)

// A request (DESIGN.md §3 step 1). The prompt is given by `tokens`; the Conductor keys its complete
// blocks with its own key namespace (block_key.hpp) unless the client sends `block_hashes` (the seq
// hashes of the complete blocks, computed with the same namespace). 0 for an SLO means the
// Conductor's default (--slo-ttft-ms, --slo-tbt-ms).
struct ConductorSubmitReply {
  std::string request_id;
  bool accepted = false;
  std::string prefill_id;        // chosen prefill instance (empty when rejected)
  std::string decode_id;         // chosen decode instance (empty when rejected)
  double predicted_ttft_ms = 0;  // also set when rejected: the best prediction seen
  double predicted_tbt_ms = 0;
  int64_t hit_tokens = 0;  // prefix tokens the prefill will reuse instead of computing
  // The longest prefix of the prompt held anywhere in the pool (complete blocks, tokens) when the
  // request was placed: hit_tokens < pool_prefix_tokens means recomputing part of it was predicted faster.
  int64_t pool_prefix_tokens = 0;
  bool replicate_prefix = false;  // the reused prefix is copied near the prefill instance
  // ttft_slo | tbt_slo | kv_capacity | no_prefill_instance | no_decode_instance | invalid_request |
  // decode_refused (the chosen decode instance refused the reservation); empty when accepted
  std::string reject_reason;
  std::string reason;  // human-readable explanation, names instances and predicted values
  MC_MESSAGE(request_id, accepted, prefill_id, decode_id, predicted_ttft_ms, predicted_tbt_ms, hit_tokens,
             pool_prefix_tokens, replicate_prefix, reject_reason, reason);
};
struct ConductorSubmitRequest {
  static constexpr const char* kType = "conductor.submit";
  using Reply = ConductorSubmitReply;
  std::string request_id;              // unique per client run
  int64_t input_tokens = 0;            // prompt length (== tokens.size() when tokens are given)
  int64_t output_tokens = 0;           // tokens to generate, first token included
  std::vector<uint32_t> tokens;        // the prompt
  std::vector<uint64_t> hash_ids;      // trace block ids, kept in the decision log
  std::vector<uint64_t> block_hashes;  // optional precomputed seq hashes of the complete blocks
  int64_t block_size_tokens = 0;       // 0: the Conductor's; otherwise must equal it
  double slo_ttft_ms = 0;
  double slo_tbt_ms = 0;
  std::string client_endpoint;  // where mc-decode sends token events (the client's RpcServer)
  // The request's key scope (block_key.hpp RequestKeyScope): the LoRA adapter it runs with and its tenant
  // salt. All empty: the Conductor's default (--lora, --lora-version, --salt; by default the base model, no
  // salt). The Conductor keys the blocks (block_hashes must then be computed in that scope too), matches the
  // prefix and places by it, and passes it on to the prefill and decode instances.
  std::string lora_name{};
  std::string lora_version{};
  std::string salt{};
  // How the output tokens are chosen (sampling.hpp SamplingParams; default greedy). Out of its bounds: rejected
  // (invalid_request). Passed on to the prefill and decode instances.
  SamplingParams sampling{};
  MC_MESSAGE(request_id, input_tokens, output_tokens, tokens, hash_ids, block_hashes, block_size_tokens, slo_ttft_ms,
             slo_tbt_ms, client_endpoint, lora_name, lora_version, salt, sampling);
};

// The client gave up on a request (an HTTP client that disconnected mid-stream, mc-gateway): the Conductor stops
// whatever of it is still under way and frees what it holds, and answers with the stage it found the request in.
// Only the identity that submitted the request may cancel it (with keys; docs/SECURITY.md). The client gets no
// further token events once the cancel is answered (a late one may still be in flight and is to be ignored).
struct ConductorCancelReply {
  std::string request_id;
  // dispatching (a reservation or a prefill not yet started: nothing runs for it any more) | prefilling (its
  // prefill runs; the decode instance drops it at commit) | decoding (the decode instance stops it and frees its
  // KV) | unknown (finished, failed, or never submitted by this client)
  std::string stage;
  MC_MESSAGE(request_id, stage);
};
struct ConductorCancelRequest {
  static constexpr const char* kType = "conductor.cancel";
  using Reply = ConductorCancelReply;
  std::string request_id;
  MC_MESSAGE(request_id);
};

struct ConductorRegisterReply {
  int64_t heartbeat_interval_ms = 0;  // send heartbeats at least this often
  int64_t heartbeat_timeout_ms = 0;   // silent longer than this = dead, removed with its cached blocks
  int64_t block_size_tokens = 0;      // the Conductor's key namespace block size (must match the worker's)
  MC_MESSAGE(heartbeat_interval_ms, heartbeat_timeout_ms, block_size_tokens);
};
struct ConductorRegisterRequest {
  static constexpr const char* kType = "conductor.register";
  using Reply = ConductorRegisterReply;
  std::string instance_id;         // unique ("prefill-0")
  std::string role;                // prefill | decode
  std::string host;                // host name: same-host pricing with storage segments there
  std::string endpoint;            // the worker's own RPC endpoint (prefill_job / decode_reserve)
  std::string backend_id;          // its KV-event backend id (own GPU prefix cache); empty: instance_id
  int64_t kv_capacity_tokens = 0;  // decode: KV tokens it can reserve (required > 0)
  int64_t block_size_tokens = 0;   // 0: not checked; else must equal the Conductor's
  // The block-key namespace the worker stores KV under (block_key.hpp): its digest (store keys
  // "kv/<digest>/...") and chain seed (KeyNamespace::chain_seed()). Empty digest: not told.
  std::string key_namespace_digest;
  uint64_t key_chain_seed = 0;
  // The fields of that (base) namespace, from which the Conductor derives each request's namespace (its
  // adapter and salt added, block_key.hpp with_request). Checked against key_namespace_digest; a worker that
  // sends none (older) serves only requests of the base scope.
  std::string key_model_id{};
  std::string key_model_revision{};
  std::string key_kv_dtype{};
  std::string key_layout{};
  uint64_t key_seed = 0;
  // prefill: its backend runs pipeline stages (DESIGN.md §18 "Live groups"): only such instances join groups.
  bool runs_pipeline_stages = false;
  MC_MESSAGE(instance_id, role, host, endpoint, backend_id, kv_capacity_tokens, block_size_tokens, key_namespace_digest,
             key_chain_seed, key_model_id, key_model_revision, key_kv_dtype, key_layout, key_seed,
             runs_pipeline_stages);
};

struct ConductorHeartbeatReply {
  bool registered = true;  // false: the Conductor forgot this worker (restart, expiry): register again
  MC_MESSAGE(registered);
};
// One measured decode step: the batch it ran, the context tokens of that batch (sum over its sequences) and
// its wall time (the worker's ms; the Conductor multiplies by its --time-scale).
struct DecodeStepSample {
  int64_t batch_requests = 0;
  int64_t context_tokens = 0;
  double step_ms = 0;
  MC_MESSAGE(batch_requests, context_tokens, step_ms);
};
// Most step samples one heartbeat carries (the latest ones; older steps of that interval are only counted).
inline constexpr size_t kMaxDecodeStepSamples = 256;

// Load report. Absent figures are 0, which is right for an idle worker (DESIGN.md §13.12).
struct ConductorHeartbeatRequest {
  static constexpr const char* kType = "conductor.heartbeat";
  using Reply = ConductorHeartbeatReply;
  std::string instance_id;
  int64_t queued_prefill_tokens = 0;  // prefill: tokens of queued or running jobs not yet prefilled
  int64_t queued_prefill_jobs = 0;
  int64_t running_requests = 0;    // decode: requests in the batch
  int64_t kv_reserved_tokens = 0;  // decode: KV tokens promised (input + output of running and reserved)
  int64_t context_tokens = 0;      // decode: sum of the batch's context lengths now
  // decode: steps run since the last heartbeat, and the latest of them (at most kMaxDecodeStepSamples; the
  // Conductor refuses more), each with its own batch and context: the Conductor refits its TBT model from them
  int64_t decode_steps = 0;
  std::vector<DecodeStepSample> decode_step_samples;
  // prefill: the request whose prefix fetch is running now, and for how long (microseconds): a fetch still
  // running bounds its path's bandwidth (DESIGN.md §16 "Bandwidth decides, live"). "" / 0: none.
  std::string fetch_request_id;
  int64_t fetch_elapsed_us = 0;
  MC_MESSAGE(instance_id, queued_prefill_tokens, queued_prefill_jobs, running_requests, kv_reserved_tokens,
             context_tokens, decode_steps, decode_step_samples, fetch_request_id, fetch_elapsed_us);
};

// A worker drains (SIGTERM; DESIGN.md §10 "Drain"): the Conductor places nothing new on it from now on but keeps it
// registered (its heartbeats accepted, the requests it holds running to their end), and counts its exit as a drain
// (mc_conductor_instances_drained_total), not a death. Requests it still holds when its process exits are settled as
// for a death (re-dispatched or failed). Sent from the worker's own key (bound to the instance like heartbeats);
// the flag is the Conductor's until the instance leaves, so a worker that re-registers (a Conductor restart) sends it
// again. A separate message rather than a heartbeat field: it is sent at once, not at the next heartbeat, and its
// answer tells the worker that no new placement will come.
struct ConductorDrainReply {
  bool registered = true;  // false: the Conductor does not know this instance (nothing will be placed on it anyway)
  // Requests the Conductor still sees on the instance (dispatching, prefilling or decoding) when the notice arrived.
  int64_t requests_held = 0;
  MC_MESSAGE(registered, requests_held);
};
struct ConductorDrainRequest {
  static constexpr const char* kType = "conductor.drain";
  using Reply = ConductorDrainReply;
  std::string instance_id;
  MC_MESSAGE(instance_id);
};

inline constexpr const char* kPhaseFirstToken = "first_token";  // mc-decode sent the first token
inline constexpr const char* kPhaseDone = "done";               // mc-decode sent the last token
inline constexpr const char* kPhaseFailed = "failed";           // the request cannot complete

struct ConductorJobReportReply {
  bool known = true;  // false: the Conductor has no such request in flight (late or duplicate report)
  MC_MESSAGE(known);
};
// Optional report from a worker on one request: lets the Conductor measure TTFT where it predicted it
// and free its decode ledger entry at once (otherwise it frees it at the predicted end).
struct ConductorJobReportRequest {
  static constexpr const char* kType = "conductor.job_report";
  using Reply = ConductorJobReportReply;
  std::string request_id;
  std::string instance_id;
  std::string phase;          // first_token | done | failed
  int64_t event_unix_ns = 0;  // when it happened (wall clock of the worker)
  int64_t output_tokens = 0;  // done: tokens produced
  std::string message;        // failed: why
  MC_MESSAGE(request_id, instance_id, phase, event_unix_ns, output_tokens, message);
};

// `mc-conductor stat`: the Conductor's state as one JSON document (instances with load and liveness,
// index size, decisions by kind, predictor state, TTFT prediction error).
struct ConductorStatusReply {
  std::string status_json;
  MC_MESSAGE(status_json);
};
struct ConductorStatusRequest {
  static constexpr const char* kType = "conductor.status";
  using Reply = ConductorStatusReply;
  bool with_instances = true;
  MC_MESSAGE(with_instances);
};

}  // namespace mc::proto
