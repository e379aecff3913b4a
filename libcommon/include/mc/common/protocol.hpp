// Every control-plane message of mc, in one schema header (SYSTEM.md §2).
//
// Wire format (ZeroMQ, see rpc.hpp): a request or reply is two frames
//   frame 0: header, a msgpack map {"v": protocol version (u32), "type": message type (str), "id": call id (u64)}
//   frame 1: body, a msgpack map of the struct named by "type" (fields by name, see MSGPACK_DEFINE_MAP)
// A reply carries the request's "id" and the type "<request type>.reply", or "error" with an ErrorReply body.
// Pushed messages (no request) carry id 0. KV events use their own three-frame form (kv_events below).
//
// Rules for every struct here: field names carry units (_ms, _ns, _bytes, _tokens); integers are
// fixed-width; a missing field decodes to its default (so fields can be added compatibly); a field of
// the wrong type fails the whole decode with kMalformedMessage. Every request type declares
// `static constexpr const char* kType` and `using Reply`. Bump kProtocolVersion on any incompatible
// change; peers compare versions on connect (HelloRequest) and in every header.
//
// Each area owns one section below; keep sections in this order and add a round-trip test in
// tests/common/protocol_test.cpp for every new message.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <msgpack.hpp>

namespace mc::proto {

inline constexpr uint32_t kProtocolVersion = 1;
// Largest frame a peer accepts; larger frames are dropped with a log line (ZMQ_MAXMSGSIZE).
inline constexpr int64_t kMaxMessageBytes = 64LL << 20;

// ---------------------------------------------------------------------------------------------
// Envelope and common messages (libcommon)
// ---------------------------------------------------------------------------------------------

struct Header {
  uint32_t v = 0;
  std::string type;
  uint64_t id = 0;
  MSGPACK_DEFINE_MAP(v, type, id);
};

inline constexpr const char* kErrorType = "error";

// Body of an "error" reply. code is an mc::Code value.
struct ErrorReply {
  uint16_t code = 0;
  std::string message;
  MSGPACK_DEFINE_MAP(code, message);
};

struct HelloReply {
  uint32_t protocol_version = 0;
  std::string service;  // "mc-store master", "mc-conductor", ...
  std::string build;    // version+git revision
  MSGPACK_DEFINE_MAP(protocol_version, service, build);
};
// Sent by RpcClient::connect before any other call; a version mismatch is answered with an error.
struct HelloRequest {
  static constexpr const char* kType = "hello";
  using Reply = HelloReply;
  uint32_t protocol_version = 0;
  std::string client_name;
  MSGPACK_DEFINE_MAP(protocol_version, client_name);
};

struct PingReply {
  int64_t server_unix_ms = 0;
  MSGPACK_DEFINE_MAP(server_unix_ms);
};
struct PingRequest {
  static constexpr const char* kType = "ping";
  using Reply = PingReply;
  int64_t client_unix_ms = 0;
  MSGPACK_DEFINE_MAP(client_unix_ms);
};

// Every daemon answers "stat" with its metrics registry rendered as JSON (metrics.hpp).
struct StatReply {
  std::string service;
  std::string metrics_json;     // Registry::json()
  std::string prometheus_text;  // Registry::prometheus_text(), only when asked
  MSGPACK_DEFINE_MAP(service, metrics_json, prometheus_text);
};
struct StatRequest {
  static constexpr const char* kType = "stat";
  using Reply = StatReply;
  bool with_prometheus_text = false;
  MSGPACK_DEFINE_MAP(with_prometheus_text);
};

// ---------------------------------------------------------------------------------------------
// KV events (SYSTEM.md §4, after the open KV-events contract, Mooncake RFC #1527)
// Published on a ZeroMQ PUB socket as three frames:
//   [topic (str, e.g. "kv"), event_id as big-endian u64, msgpack KvEvent]
// event_id increases by exactly 1 per event on one stream; a subscriber that sees a gap resyncs.
// ---------------------------------------------------------------------------------------------

inline constexpr const char* kKvEventStored = "stored";
inline constexpr const char* kKvEventRemoved = "removed";
inline constexpr const char* kKvEventCleared = "cleared";  // every block of backend_id is gone

struct KvEvent {
  std::string type;                  // stored | removed | cleared
  uint64_t event_id = 0;             // same as frame 1
  int64_t ts_unix_ms = 0;
  std::vector<uint64_t> seq_hashes;  // prefix-chained block hashes (block_key.hpp)
  std::string backend_id;            // the holder: storage segment or instance name
  std::string medium;                // gpu | cpu | disk
  MSGPACK_DEFINE_MAP(type, event_id, ts_unix_ms, seq_hashes, backend_id, medium);
};

// ---------------------------------------------------------------------------------------------
// Transfer engine (transfer/): segment descriptors and the peer-to-peer directory
// ---------------------------------------------------------------------------------------------
// (section owned by mc_transfer)

// ---------------------------------------------------------------------------------------------
// Store (store/): master RPCs, storage node RPCs
// ---------------------------------------------------------------------------------------------
// (section owned by mc_store)

// ---------------------------------------------------------------------------------------------
// Workers (infer/): prefill and decode instances
// ---------------------------------------------------------------------------------------------
// (section owned by mc_infer)

// ---------------------------------------------------------------------------------------------
// Conductor (sched/): client submissions, worker registration, heartbeats, job reports
// ---------------------------------------------------------------------------------------------
// (section owned by mc_sched / mc-conductor)
//
// Clients (mc-trace-replay) and workers (mc-prefill, mc-decode) are RpcClients of mc-conductor's one
// ROUTER endpoint. A request's life:
//   client  -> conductor  conductor.submit              reply: accepted (prefill, decode, predictions)
//                                                        or rejected (reason, predicted_ttft_ms) at once
//   conductor -> workers  the jobs (worker section: the messages mc_infer defines)
//   workers -> conductor  conductor.job_report          phases: prefill_done, first_token, tokens, done, failed
//   conductor -> client   pushed conductor.event        first_token, tokens, done{ledger}, failed
// Tokens therefore reach the client through the Conductor (one hop more, and every actual TTFT is
// measured where the prediction was made). Workers keep themselves known with conductor.register
// (once, again after a "register again" heartbeat reply) and conductor.heartbeat (load).

// A request (SYSTEM.md §3 step 1). The prompt is given by `tokens`; the Conductor keys its complete
// blocks with its own key namespace (block_key.hpp) unless the client sends `block_hashes` (the seq
// hashes of the complete blocks, computed with the same namespace). `hash_ids` (trace block ids) are
// passed on to the workers untouched. 0 for an SLO means the Conductor's default (--slo-*-ms).
struct ConductorSubmitReply {
  std::string request_id;
  bool accepted = false;
  std::string prefill_id;           // chosen prefill instance (empty when rejected)
  std::string decode_id;            // chosen decode instance (empty when rejected)
  double predicted_ttft_ms = 0;     // also set when rejected: the best prediction seen
  double predicted_tbt_ms = 0;
  int64_t hit_tokens = 0;           // prefix tokens the prefill will reuse instead of computing
  bool replicate_prefix = false;    // the reused prefix is copied near the prefill instance
  std::string reject_reason;        // ttft_slo | tbt_slo | kv_capacity | no_prefill_instance | ...; empty if accepted
  std::string reason;               // human-readable explanation, names instances and predicted values
  MSGPACK_DEFINE_MAP(request_id, accepted, prefill_id, decode_id, predicted_ttft_ms, predicted_tbt_ms, hit_tokens,
                     replicate_prefix, reject_reason, reason);
};
struct ConductorSubmitRequest {
  static constexpr const char* kType = "conductor.submit";
  using Reply = ConductorSubmitReply;
  std::string request_id;               // unique per client run
  int64_t input_tokens = 0;             // prompt length (== tokens.size() when tokens are given)
  int64_t output_tokens = 0;            // tokens to generate
  std::vector<uint32_t> tokens;         // the prompt
  std::vector<uint64_t> hash_ids;       // trace block ids (one per block_size_tokens, last may be partial)
  std::vector<uint64_t> block_hashes;   // optional precomputed seq hashes of the complete blocks
  int64_t block_size_tokens = 0;        // 0: the Conductor's; otherwise must equal it
  double slo_ttft_ms = 0;
  double slo_tbt_ms = 0;
  MSGPACK_DEFINE_MAP(request_id, input_tokens, output_tokens, tokens, hash_ids, block_hashes, block_size_tokens,
                     slo_ttft_ms, slo_tbt_ms);
};

// The cache/compute ledger of one request (SYSTEM.md §5), as far as the reporting side knows it.
// -1 marks a value that was not measured (absent in JSON reports, never 0).
struct RequestLedger {
  int64_t prompt_tokens = -1;
  int64_t hit_tokens_local = -1;         // same host (own GPU cache or this host's DRAM segment)
  int64_t hit_tokens_remote = -1;        // another host's DRAM through the transfer engine
  int64_t hit_tokens_ssd = -1;
  int64_t avoided_prefill_tokens = -1;
  int64_t transfer_bytes = -1;           // KV bytes moved for this request (pool -> prefill)
  double transfer_ms = -1;
  double queue_ms = -1;                  // job received -> prefill started
  double prefill_ms = -1;                // compute only
  std::string decision;                  // fetch | recompute (the Conductor fills it)
  double predicted_ttft_ms = -1;         // the Conductor fills it
  double ttft_ms = -1;                   // submit -> first token, on the Conductor's clock
  MSGPACK_DEFINE_MAP(prompt_tokens, hit_tokens_local, hit_tokens_remote, hit_tokens_ssd, avoided_prefill_tokens,
                     transfer_bytes, transfer_ms, queue_ms, prefill_ms, decision, predicted_ttft_ms, ttft_ms);
};

inline constexpr const char* kEventFirstToken = "first_token";
inline constexpr const char* kEventTokens = "tokens";
inline constexpr const char* kEventDone = "done";
inline constexpr const char* kEventFailed = "failed";

// Pushed by the Conductor to the client that submitted the request (RpcServer::push_to, id 0).
struct ConductorEvent {
  static constexpr const char* kType = "conductor.event";
  std::string request_id;
  std::string kind;                 // first_token | tokens | done | failed
  std::vector<uint32_t> tokens;     // output token ids carried by this event (first_token, tokens)
  int64_t output_tokens = 0;        // done: tokens produced in all (the server's count)
  double since_submit_ms = 0;       // Conductor clock: submit -> this event was forwarded
  std::string message;              // failed: why
  RequestLedger ledger;             // done / failed
  MSGPACK_DEFINE_MAP(request_id, kind, tokens, output_tokens, since_submit_ms, message, ledger);
};

struct ConductorRegisterReply {
  int64_t heartbeat_interval_ms = 0;   // send heartbeats at least this often
  int64_t heartbeat_timeout_ms = 0;    // silent longer than this = dead, removed with its cached blocks
  int64_t block_size_tokens = 0;       // the Conductor's key namespace block size (must match the worker's)
  MSGPACK_DEFINE_MAP(heartbeat_interval_ms, heartbeat_timeout_ms, block_size_tokens);
};
struct ConductorRegisterRequest {
  static constexpr const char* kType = "conductor.register";
  using Reply = ConductorRegisterReply;
  std::string instance_id;          // unique ("prefill-0")
  std::string role;                 // prefill | decode
  std::string host;                 // host name: same-host pricing with storage segments there
  std::string endpoint;             // the worker's own RPC endpoint (jobs), tcp://host:port
  std::string backend_id;           // its KV-event backend id (own GPU prefix cache); empty: instance_id
  int64_t kv_capacity_tokens = 0;   // decode: KV tokens it can reserve (required > 0)
  int64_t block_size_tokens = 0;    // 0: not checked
  int64_t kv_bytes_per_token = 0;   // 0: not checked
  MSGPACK_DEFINE_MAP(instance_id, role, host, endpoint, backend_id, kv_capacity_tokens, block_size_tokens,
                     kv_bytes_per_token);
};

struct ConductorHeartbeatReply {
  bool registered = true;           // false: the Conductor forgot this worker (restart, expiry): register again
  MSGPACK_DEFINE_MAP(registered);
};
// Load report. Absent figures are 0, which is right for an idle worker (field report #12).
struct ConductorHeartbeatRequest {
  static constexpr const char* kType = "conductor.heartbeat";
  using Reply = ConductorHeartbeatReply;
  std::string instance_id;
  int64_t queued_prefill_tokens = 0;  // prefill: tokens of queued or running jobs not yet prefilled
  int64_t queued_prefill_jobs = 0;
  int64_t running_requests = 0;       // decode: requests in the batch
  int64_t kv_reserved_tokens = 0;     // decode: reserved KV tokens (input + output of admitted requests)
  int64_t context_tokens = 0;         // decode: sum of the batch's context lengths now
  // decode: measured steps since the last heartbeat (the Conductor refits its TBT model from them)
  int64_t decode_steps = 0;
  double decode_step_ms_mean = 0;
  double decode_batch_mean = 0;       // mean batch size over those steps
  double decode_context_tokens_mean = 0;
  MSGPACK_DEFINE_MAP(instance_id, queued_prefill_tokens, queued_prefill_jobs, running_requests, kv_reserved_tokens,
                     context_tokens, decode_steps, decode_step_ms_mean, decode_batch_mean,
                     decode_context_tokens_mean);
};

inline constexpr const char* kPhasePrefillDone = "prefill_done";  // prefill instance: KV computed and sent
inline constexpr const char* kPhaseFirstToken = "first_token";    // decode instance
inline constexpr const char* kPhaseTokens = "tokens";             // decode instance, token batches
inline constexpr const char* kPhaseDone = "done";                 // decode instance: last token sent
inline constexpr const char* kPhaseFailed = "failed";             // either: the request cannot complete

struct ConductorJobReportReply {
  bool known = true;  // false: the Conductor has no such request in flight (late or duplicate report)
  MSGPACK_DEFINE_MAP(known);
};
// A worker's report on one request. Measured figures use the worker's clock (durations only).
struct ConductorJobReportRequest {
  static constexpr const char* kType = "conductor.job_report";
  using Reply = ConductorJobReportReply;
  std::string request_id;
  std::string instance_id;
  std::string phase;                  // prefill_done | first_token | tokens | done | failed
  std::vector<uint32_t> tokens;       // first_token, tokens: the new output token ids
  int64_t output_tokens = 0;          // done: tokens produced in all
  // prefill_done: what the prefill did (feeds the predictors and the ledger)
  int64_t prefilled_tokens = 0;       // computed
  int64_t reused_tokens = 0;          // loaded from cache, all tiers
  int64_t hit_tokens_local = 0;
  int64_t hit_tokens_remote = 0;
  int64_t hit_tokens_ssd = 0;
  double queue_ms = 0;                // job received -> prefill started
  double prefill_ms = 0;              // compute only
  int64_t transfer_bytes_same_host = 0;
  int64_t transfer_bytes_remote = 0;
  int64_t transfer_bytes_ssd = 0;
  int64_t transfer_ns_same_host = 0;  // time spent on those fetches (0: none)
  int64_t transfer_ns_remote = 0;
  int64_t transfer_ns_ssd = 0;
  std::string message;                // failed: why (names the object and the lower layer's error)
  MSGPACK_DEFINE_MAP(request_id, instance_id, phase, tokens, output_tokens, prefilled_tokens, reused_tokens,
                     hit_tokens_local, hit_tokens_remote, hit_tokens_ssd, queue_ms, prefill_ms,
                     transfer_bytes_same_host, transfer_bytes_remote, transfer_bytes_ssd, transfer_ns_same_host,
                     transfer_ns_remote, transfer_ns_ssd, message);
};

}  // namespace mc::proto
