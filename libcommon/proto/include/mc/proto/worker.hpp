// The workers' section of the protocol (infer/, DESIGN.md §3): prefill and decode instances.
// Wire rules: envelope.hpp.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "mc/proto/message.hpp"
#include "mc/proto/sampling.hpp"

namespace mc::proto {

// ---------------------------------------------------------------------------------------------
// Workers (infer/): prefill and decode instances
// ---------------------------------------------------------------------------------------------
// (section owned by mc_infer)
//
// A request's path through the workers (DESIGN.md §3):
//   1. reserver (Conductor or a client) -> mc-decode  "decode.reserve": admission; holds KV for input + output
//      tokens counting the future growth of everything running or reserved; refuses (kRejected) when it does
//      not fit, rejects bad lengths (kInvalidArgument, "input too long"; DESIGN.md §13.14).
//   2. reserver -> mc-prefill "prefill.job": tokens, how many leading blocks to fetch from the store, the decode
//      endpoint + reservation, the client endpoint. The reply is deferred until the job is done and carries the
//      ledger; an error reply means the decode side was told to abort.
//   3. mc-prefill -> mc-decode: each layer's KV as soon as it is computed. When the decode instance publishes a
//      transfer-engine segment (DecodeReserveReply::kv_segment, also in WorkerLoadReply), a transfer-engine WRITE
//      straight into the reserved blocks with notify_tag KvLayerTag ("kv/<reservation_id>/<layer>/<first block>-<end
//      block>", the layer-arrival notification); otherwise, as a fallback, "decode.kv_write" RPCs carrying the bytes.
//      Then "decode.kv_commit" (prompt length, first token, ledger) or "decode.abort" on failure.
//   4. mc-decode -> client endpoint: "client.token_event" per token (first token included), then "client.request_done"
//   with
//      the ledger, or "client.request_error". A client never gets request_done after an abort.
//   "decode.release" frees a reservation that will get no job (the reserver changed its mind).

// Per-request cache and timing ledger (DESIGN.md §5). A time never measured is -1, not 0.
struct RequestLedger {
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;            // prefix tokens whose KV came from the store (= avoided prefill tokens)
  int64_t hit_tokens_local = 0;      // ... from a replica on this host (shared memory)
  int64_t hit_tokens_remote = 0;     // ... from another host or over the network
  int64_t missed_prefix_tokens = 0;  // tokens the job said to fetch that were missing/failed and recomputed
  int64_t computed_tokens = 0;       // tokens prefilled here
  int64_t fetch_bytes = 0;           // KV bytes read from the store (moved: a stage's layers of each block)
  int64_t kv_sent_bytes = 0;         // KV bytes written to the decode instance
  int64_t stored_blocks = 0;         // new complete blocks put into the store (pipelined: queued at decode)
  int64_t queue_ms = -1;             // job received -> started
  int64_t fetch_ms = -1;             // prefix batch_get
  int64_t prefill_ms = -1;           // compute of the new tokens
  int64_t kv_tail_ms = -1;           // last layer computed -> all KV acknowledged by decode
  int64_t decode_ms = -1;            // first token -> last token (decode side)
  int64_t output_tokens = 0;         // tokens actually generated (first token included)
  std::string decision;              // "fetch" (some prefix reused) | "recompute"
  // The SSD tier of the hits (DESIGN.md §5): hit tokens read from a storage node's SSD segment (not counted in
  // local or remote), and the bytes and wall time of those SSD reads (the Conductor refits its SSD bandwidth
  // from them; microseconds, since one block's read can take less than a millisecond). 0: none.
  int64_t hit_tokens_ssd = 0;
  int64_t fetch_ssd_bytes = 0;
  int64_t fetch_ssd_us = 0;
  // Per-path bandwidth (DESIGN.md §16 "Bandwidth decides, live"): the prefix fetch's wall time in microseconds
  // (fetch_ms is too coarse for one fast block), and the host every remote byte came from when it was one host
  // ("" otherwise: several hosts, none, or unknown).
  int64_t fetch_us = -1;
  std::string fetch_remote_host;
  MC_MESSAGE(prompt_tokens, hit_tokens, hit_tokens_local, hit_tokens_remote, missed_prefix_tokens, computed_tokens,
             fetch_bytes, kv_sent_bytes, stored_blocks, queue_ms, fetch_ms, prefill_ms, kv_tail_ms, decode_ms,
             output_tokens, decision, hit_tokens_ssd, fetch_ssd_bytes, fetch_ssd_us, fetch_us, fetch_remote_host);
};

struct DecodeReserveReply {
  uint64_t reservation_id = 0;
  int64_t block_tokens = 0;       // tokens per KV block of the decode buffer
  int64_t layer_block_bytes = 0;  // bytes of one layer of one block (one contiguous write)
  int64_t block_bytes = 0;        // bytes of one block (all layers)
  // Offset of each prompt block (its layer 0) in order: in the transfer-engine segment `kv_segment` when one is
  // published, else in the decode KV buffer. Layer l of block i is at block_offsets_bytes[i] + l * layer_block_bytes.
  std::vector<uint64_t> block_offsets_bytes;
  std::string kv_segment;   // transfer-engine segment of the buffer ("" = kv_write RPC only)
  int64_t free_blocks = 0;  // uncommitted blocks left after this reservation
  // With a grant key: the write grant (mc/net/grant.hpp) of kv_segment for this reservation (id =
  // reservation_id), which every WRITE and layer notification into its blocks must carry; it dies with the
  // reservation (released, expired, aborted or committed) or at its ttl. "" otherwise.
  std::string kv_grant{};
  MC_MESSAGE(reservation_id, block_tokens, layer_block_bytes, block_bytes, block_offsets_bytes, kv_segment, free_blocks,
             kv_grant);
};
struct DecodeReserveRequest {
  static constexpr const char* kType = "decode.reserve";
  using Reply = DecodeReserveReply;
  std::string request_id;
  int64_t input_length_tokens = 0;   // prompt tokens (> 0)
  int64_t output_length_tokens = 0;  // tokens to generate (> 0), first token included
  std::string client_endpoint;       // where token events go (ZeroMQ URI of the client's RpcServer)
  int64_t ttl_ms = 0;                // reservation dropped when no kv_commit arrives in time (0: worker default)
  // The request's key scope (block_key.hpp RequestKeyScope; all empty: base model, no salt): decode runs the
  // adapter and refuses a kv_commit whose KV namespace is not this scope in its own base namespace.
  std::string lora_name{};
  std::string lora_version{};
  std::string salt{};
  // With --auth-dir: the client's public key, which its token-event server serves with (docs/SECURITY.md); set by
  // the Conductor from the submitter's identity. Empty: the cluster key (no auth, or a daemon's server).
  std::string client_public_key{};
  SamplingParams sampling{};  // how decode chooses the tokens after the first
  // The id the client submitted, which its token events carry; request_id is the Conductor's, unique among live
  // requests whoever submitted them (docs/SECURITY.md "Request ids"). Empty: request_id.
  std::string client_request_id{};
  MC_MESSAGE(request_id, input_length_tokens, output_length_tokens, client_endpoint, ttl_ms, lora_name, lora_version,
             salt, client_public_key, sampling, client_request_id);
};

struct DecodeReleaseReply {
  bool released = false;  // false: no such reservation (already released, finished or expired)
  int64_t free_blocks = 0;
  MC_MESSAGE(released, free_blocks);
};
// Frees a reservation whose job was never dispatched; the client is not told.
struct DecodeReleaseRequest {
  static constexpr const char* kType = "decode.release";
  using Reply = DecodeReleaseReply;
  uint64_t reservation_id = 0;
  MC_MESSAGE(reservation_id);
};
// The prefill failed or was aborted (DESIGN.md §13.14): decode frees the reservation, never generates from it,
// and sends "client.request_error" to the client.
struct DecodeAbortRequest {
  static constexpr const char* kType = "decode.abort";
  using Reply = DecodeReleaseReply;
  uint64_t reservation_id = 0;
  uint16_t code = 0;  // mc::Code of the failure
  std::string reason;
  MC_MESSAGE(reservation_id, code, reason);
};

// Conductor -> mc-decode: the client cancelled request_id. A reservation of it is freed (a later kv_commit is
// refused), a running sequence leaves the batch and frees its KV blocks; no request_done follows. found = false:
// decode holds nothing of it (finished, or never reserved here).
struct DecodeCancelReply {
  bool found = false;
  int64_t free_blocks = 0;
  MC_MESSAGE(found, free_blocks);
};
struct DecodeCancelRequest {
  static constexpr const char* kType = "decode.cancel";
  using Reply = DecodeCancelReply;
  std::string request_id;
  MC_MESSAGE(request_id);
};
// Conductor -> mc-prefill: the client cancelled request_id. A queued job is dropped (its prefill_job is answered
// kCancelled after its decode reservation is aborted); a job already computing runs to its end.
struct PrefillCancelReply {
  bool dropped = false;  // false: not queued here (running, finished or unknown)
  MC_MESSAGE(dropped);
};
struct PrefillCancelRequest {
  static constexpr const char* kType = "prefill.cancel";
  using Reply = PrefillCancelReply;
  std::string request_id;
  MC_MESSAGE(request_id);
};

struct KvWriteReply {
  int64_t layers_received = 0;  // layers of this reservation with at least one write so far
  MC_MESSAGE(layers_received);
};
// One layer's KV of some blocks, written into the reservation's blocks: data holds block_indexes.size()
// consecutive ranges of layer_block_bytes (the decode buffer's layout). block_indexes are positions in the
// reservation's block list. The fallback for decode instances that publish no transfer-engine segment.
struct KvWriteRequest {
  static constexpr const char* kType = "decode.kv_write";
  using Reply = KvWriteReply;
  uint64_t reservation_id = 0;
  int64_t layer = 0;
  std::vector<uint32_t> block_indexes;
  std::vector<uint8_t> data;  // msgpack bin
  MC_MESSAGE(reservation_id, layer, block_indexes, data);
};

// The notify_tag of the transfer-engine WRITE that completes one layer of prompt blocks [first_block, end_block)
// of a reservation (step 3 above; block numbers are positions in the reservation's block list, as in
// KvWriteRequest::block_indexes). Text form, all decimal: "kv/<reservation_id>/<layer>/<first_block>-<end_block>".
// decode() accepts exactly what encode() writes (no other prefix, no missing or trailing text) and checks no
// ranges: the decode worker checks them against the reservation. Plain value; pure functions.
struct KvLayerTag {
  uint64_t reservation_id = 0;
  int64_t layer = 0;
  int64_t first_block = 0;
  int64_t end_block = 0;  // exclusive

  std::string encode() const {
    return "kv/" + std::to_string(reservation_id) + "/" + std::to_string(layer) + "/" + std::to_string(first_block) +
           "-" + std::to_string(end_block);
  }
  // nullopt when `tag` is not of the form above.
  static std::optional<KvLayerTag> decode(std::string_view tag) {
    constexpr std::string_view kPrefix = "kv/";
    if (!tag.starts_with(kPrefix)) return std::nullopt;
    const char* p = tag.data() + kPrefix.size();
    const char* const end = tag.data() + tag.size();
    KvLayerTag t;
    // One decimal field, then `sep` (or the end of the tag when sep is 0).
    auto field = [&](auto& value, char sep) {
      auto [next, ec] = std::from_chars(p, end, value);
      if (ec != std::errc() || next == p) return false;
      p = next;
      if (sep == 0) return p == end;
      if (p == end || *p != sep) return false;
      ++p;
      return true;
    };
    if (!field(t.reservation_id, '/') || !field(t.layer, '/') || !field(t.first_block, '-') || !field(t.end_block, 0)) {
      return std::nullopt;
    }
    return t;
  }
  bool operator==(const KvLayerTag&) const = default;
};

struct KvCommitReply {
  int64_t batch_size = 0;  // running sequences once this one joined
  // Of the request's store_block_hashes: how many blocks decode copied and queued for its store (0 without one,
  // or when its put queue was full). Their puts complete after this reply (mc_decode_store_*_blocks_total).
  int64_t store_blocks_queued = 0;
  MC_MESSAGE(batch_size, store_blocks_queued);
};
// All layers are sent: decode checks that every layer of every prompt block arrived (else kDataLoss, the
// reservation is freed and the client gets request_error), then joins the request to its batch.
struct KvCommitRequest {
  static constexpr const char* kType = "decode.kv_commit";
  using Reply = KvCommitReply;
  uint64_t reservation_id = 0;
  std::string request_id;
  int64_t prompt_tokens = 0;
  uint32_t first_token = 0;
  int64_t first_token_unix_ns = 0;  // when prefill produced it
  RequestLedger ledger;
  // KeyNamespace::digest_hex() of the namespace the KV was computed in (the prefill's base namespace with the
  // job's key scope); "" = not told (an older prefill). Decode refuses a digest that is not the request's.
  std::string kv_namespace_digest{};  // {}: older aggregate initialisations stay complete
  // Decode puts these prompt blocks into its store (a pipelined prefill, DESIGN.md §18 "Live groups": no stage
  // holds every layer of a block, decode does once the check above passed). Block store_first_block + i has the
  // sequence hash store_block_hashes[i] (block_key.hpp seq_hashes); decode keys it in the reservation's namespace
  // itself, so a prefill cannot name another namespace. Only complete prompt blocks: store_first_block >= 0 and
  // store_first_block + size <= prompt_tokens / block size, else the commit is refused (kInvalidArgument).
  // Empty: nothing to store here (a whole prefill stores its own blocks).
  int64_t store_first_block = 0;
  std::vector<uint64_t> store_block_hashes{};
  // With the job's sampling.logprobs >= 0: the first token's logprob, then its top alternatives (as TokenEvent).
  std::vector<TokenLogprob> first_logprobs{};
  MC_MESSAGE(reservation_id, request_id, prompt_tokens, first_token, first_token_unix_ns, ledger, kv_namespace_digest,
             store_first_block, store_block_hashes, first_logprobs);
};

struct PrefillJobReply {
  std::string request_id;
  uint32_t first_token = 0;
  RequestLedger ledger;
  MC_MESSAGE(request_id, first_token, ledger);
};
// Work for a prefill instance. The reply comes when the job is done (KV committed at decode, new blocks stored);
// on any failure the decode reservation is aborted first and the reply is the error.
struct PrefillJobRequest {
  static constexpr const char* kType = "prefill.job";
  using Reply = PrefillJobReply;
  std::string request_id;
  std::vector<uint32_t> tokens;  // the prompt (traces: synthesized from hash_ids by the submitter)
  int64_t output_length_tokens = 0;
  int64_t fetch_prefix_blocks = -1;  // leading complete blocks to read from the store; -1: as many as present
  std::string prefix_source;         // where the Conductor expects the prefix (segment name; informational)
  std::string decode_endpoint;       // mc-decode RPC endpoint
  uint64_t reservation_id = 0;       // from decode_reserve
  std::vector<uint64_t> decode_block_offsets_bytes;  // from decode_reserve
  std::string decode_kv_segment;  // from decode_reserve (kv_segment); "": the prefill asks decode (worker_load)
  std::string decode_kv_grant{};  // from decode_reserve (kv_grant): carried by every WRITE into decode_kv_segment
  std::string client_endpoint;
  int64_t chunk_tokens = 0;        // 0: the worker's --chunk-tokens
  bool store_new_blocks = true;    // put new complete blocks into the store
  int64_t fail_after_layers = -1;  // fault injection (tests, DESIGN.md §13.14): fail once this many layer
                                   // writes were sent; -1 = never. Refused unless the worker allows it.
  // The request's key scope (block_key.hpp RequestKeyScope; all empty: base model, no salt): the prefill runs
  // the adapter and keys, fetches and stores the blocks in its base namespace with this scope.
  std::string lora_name{};
  std::string lora_version{};
  std::string salt{};
  // Chunked pipeline parallelism (DESIGN.md §18 "Live groups"). stage_layers > 0 makes this job stage stage_index
  // of a group of stage_count prefill instances: it computes the model's layers [stage_first_layer,
  // stage_first_layer + stage_layers) over the prompt's new tokens in chunks of chunk_tokens (the worker's when 0),
  // streams those layers' KV into the decode reservation like a whole prefill, and (all but the last stage) sends
  // each chunk's hidden states to next_stage_endpoint (prefill_stage_hidden). Stage 0 fetches the prefix and fixes
  // how many tokens are cached; the others learn it from its first chunk. Only the last stage commits at decode.
  // stage_layers 0: a whole prefill (the other stage fields are then ignored).
  int64_t stage_first_layer = 0;
  int64_t stage_layers = 0;
  int64_t stage_index = 0;
  int64_t stage_count = 1;
  std::string next_stage_endpoint{};
  bool is_stage() const { return stage_layers > 0; }
  // The job's place in the instance's queue (DESIGN.md §10 "Queue discipline"; mc/common/queue_order.hpp): waiting
  // jobs run in key order, equal keys in arrival order. Nanoseconds on the Conductor's clock, compared only with
  // other keys; in [0, kMaxQueueKeyNs], else the job is refused (kInvalidArgument). 0: no key (an older
  // Conductor, a client): the job joins the back of the queue, as first come, first served.
  int64_t queue_key_ns = 0;
  SamplingParams sampling{};  // how the first token is chosen (the last stage's, of a pipelined prompt)
  MC_MESSAGE(request_id, tokens, output_length_tokens, fetch_prefix_blocks, prefix_source, decode_endpoint,
             reservation_id, decode_block_offsets_bytes, decode_kv_segment, client_endpoint, chunk_tokens,
             store_new_blocks, fail_after_layers, lora_name, lora_version, salt, decode_kv_grant, stage_first_layer,
             stage_layers, stage_index, stage_count, next_stage_endpoint, queue_key_ns, sampling);
};

// Stage s -> stage s+1 of a pipelined prefill (DESIGN.md §18 "Live groups"): the hidden states of one chunk after
// stage s's last layer, (token_end - token_begin) rows of hidden_size fp32 values, little-endian, row per token.
// The receiver holds them (bounded: --stage-inbox-bytes) until its stage job of (request_id, reservation_id) asks
// for chunk chunk_index; chunk 0's token_begin is the prompt's cached tokens (stage 0 decided them). A sender
// drains its own KV stream to decode before it sends the last chunk, so when the last stage commits every earlier
// stage's layers have landed. Refused (kInvalidArgument, kResourceExhausted) when malformed or over the bound.
struct PrefillStageHiddenReply {
  bool held = true;
  MC_MESSAGE(held);
};
struct PrefillStageHiddenRequest {
  static constexpr const char* kType = "prefill.stage_hidden";
  using Reply = PrefillStageHiddenReply;
  std::string request_id;
  uint64_t reservation_id = 0;
  int64_t chunk_index = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  bool last_chunk = false;
  std::vector<uint8_t> hidden;  // msgpack bin: (token_end - token_begin) x hidden_size x 4 bytes
  // Non-empty: stage s failed (this says why; it aborted the decode reservation) and sends no more chunks: the
  // receiver's stage job fails at once instead of waiting out --stage-wait-timeout-ms. hidden is then empty.
  std::string failed{};
  MC_MESSAGE(request_id, reservation_id, chunk_index, token_begin, token_end, last_chunk, hidden, failed);
};

// Stage s asks stage s+1 where to WRITE one chunk's hidden states through the transfer engine (DESIGN.md §18
// "Live groups" point 2): the fields of PrefillStageHiddenRequest without the bytes, and their size. The receiver,
// when it serves a stage segment (mc-prefill --stage-listen), sets aside `bytes` of it for the chunk (counted
// against --stage-inbox-bytes, like a held chunk) and answers where, with a write grant of that range under the
// cluster's grant key; the sender WRITEs the bytes there tagged StageChunkTag{slot_id}, and the chunk is held as
// if sent by prefill_stage_hidden once that WRITE's notification arrived. kFailedPrecondition: the receiver serves
// no stage segment (send prefill_stage_hidden instead); kResourceExhausted: no room now (retry, bounded by the
// stage's wait); kInvalidArgument: malformed (the checks of prefill_stage_hidden). A slot never written expires
// after 2 x --stage-wait-timeout-ms.
struct PrefillStageSlotReply {
  std::string segment;  // the receiver's stage segment ("host:port")
  uint64_t offset = 0;  // where in it the chunk's `bytes` go
  uint64_t slot_id = 0;
  std::string grant;  // with --auth-dir: the write grant of [offset, +bytes) (grant.hpp); "" without
  MC_MESSAGE(segment, offset, slot_id, grant);
};
struct PrefillStageSlotRequest {
  static constexpr const char* kType = "prefill.stage_slot";
  using Reply = PrefillStageSlotReply;
  std::string request_id;
  uint64_t reservation_id = 0;
  int64_t chunk_index = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  bool last_chunk = false;
  int64_t bytes = 0;  // (token_end - token_begin) x hidden_size x 4
  MC_MESSAGE(request_id, reservation_id, chunk_index, token_begin, token_end, last_chunk, bytes);
};
// The notify tag of a stage chunk's WRITE: "stage/<slot_id>". Plain value; pure functions.
struct StageChunkTag {
  uint64_t slot_id = 0;
  std::string encode() const { return "stage/" + std::to_string(slot_id); }
  // nullopt when `tag` is not of the form above.
  static std::optional<StageChunkTag> decode(std::string_view tag) {
    constexpr std::string_view kPrefix = "stage/";
    if (!tag.starts_with(kPrefix)) return std::nullopt;
    StageChunkTag t;
    const char* p = tag.data() + kPrefix.size();
    const char* const end = tag.data() + tag.size();
    auto [next, ec] = std::from_chars(p, end, t.slot_id);
    if (ec != std::errc() || next == p || next != end) return std::nullopt;
    return t;
  }
};

struct WorkerLoadReply {
  std::string role;     // "prefill" | "decode"
  std::string backend;  // "ref" | "sim"
  std::string model;
  int64_t queued_jobs = 0;         // prefill: jobs waiting
  int64_t queued_tokens = 0;       // prefill: prompt tokens waiting
  int64_t running_tokens = 0;      // prefill: tokens of the job in progress; decode: context tokens in the batch
  int64_t predicted_queue_ms = 0;  // prefill: cost-model time of the queue (sim) or measured rate (ref)
  int64_t batch_size = 0;          // decode: running sequences
  int64_t reservations = 0;        // decode: reserved, not yet committed
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;       // physically holding KV
  int64_t kv_blocks_committed = 0;  // decode: promised to running + reserved requests at full length
  int64_t kv_blocks_free = 0;       // total - committed (decode) / total - used (prefill)
  double recent_step_ms = 0;        // decode: mean of the recent steps
  std::string kv_segment;           // decode: transfer-engine segment prefill writes KV into ("" = kv_write only)
  MC_MESSAGE(role, backend, model, queued_jobs, queued_tokens, running_tokens, predicted_queue_ms, batch_size,
             reservations, kv_blocks_total, kv_blocks_used, kv_blocks_committed, kv_blocks_free, recent_step_ms,
             kv_segment);
};
struct WorkerLoadRequest {
  static constexpr const char* kType = "worker.load";
  using Reply = WorkerLoadReply;
  bool detailed = false;  // reserved; no effect yet
  MC_MESSAGE(detailed);
};

struct ClientAck {
  bool ok = true;
  MC_MESSAGE(ok);
};
// decode -> client: one output token. index 0 is the first token (produced by prefill).
struct TokenEvent {
  static constexpr const char* kType = "client.token_event";
  using Reply = ClientAck;
  std::string request_id;
  int64_t index = 0;
  uint32_t token = 0;
  int64_t emitted_unix_ns = 0;
  // With the request's sampling.logprobs >= 0: {token, its logprob}, then the sampling.logprobs most likely tokens
  // (most likely first). Empty otherwise, and from a backend without a distribution (sim).
  std::vector<TokenLogprob> logprobs{};
  MC_MESSAGE(request_id, index, token, emitted_unix_ns, logprobs);
};
// decode -> client: the request finished (all output_length_tokens generated).
struct RequestDone {
  static constexpr const char* kType = "client.request_done";
  using Reply = ClientAck;
  std::string request_id;
  RequestLedger ledger;
  MC_MESSAGE(request_id, ledger);
};
// decode -> client: the request failed (prefill aborted, KV incomplete, decode error). No request_done follows.
struct RequestError {
  static constexpr const char* kType = "client.request_error";
  using Reply = ClientAck;
  std::string request_id;
  uint16_t code = 0;  // mc::Code
  std::string message;
  int64_t output_tokens = 0;  // tokens sent before the failure
  MC_MESSAGE(request_id, code, message, output_tokens);
};

}  // namespace mc::proto
