// mc::infer::PrefillWorker: the prefill instance behind mc-prefill (DESIGN.md §3 step 3).
//
// run_job(job):
//   1. Validates the job (non-empty prompt within the model's max context, tokens in the vocabulary, a decode
//      target with one block offset per prompt block). Nothing is computed or sent for a bad job; its decode
//      reservation is aborted so the decode side frees it and tells the client (DESIGN.md §13.14).
//   The job's key scope (adapter and salt, PrefillJobRequest::lora_name/lora_version/salt) selects the request's
//   namespace: this worker's base namespace (kv_namespace) with that scope; every block key below is in it, the
//   backend runs the job's adapter, and kv_commit names the namespace's digest.
//   2. Fetches the prefix: the leading complete blocks (at most fetch_prefix_blocks, never the block holding the
//      last prompt token) are read from the KvBlockCache straight into this worker's KV buffer, one object per
//      block. The hit is the leading run of blocks that arrived; everything from the first missing or failed
//      block on is recomputed (a miss or a dead store only costs time, never an error or wrong KV).
//   3. Prefills the rest with the backend (chunked by chunk_tokens). As each layer finishes, its KV of the
//      touched blocks (and of the fetched prefix blocks, with the first chunk) is handed to a streaming thread
//      that writes it to the decode instance, so transfer overlaps compute (layer-wise streaming, Mooncake §4):
//      - transfer engine (the default): when the decode instance publishes a KV segment (job.decode_kv_segment,
//        or asked once per job through DecodeLink::kv_segment), a transfer-engine WRITE of each block's layer
//        range from this worker's KV buffer straight into the reserved decode blocks (shm on the same host, else
//        rdma/tcp; the engine pools endpoints), the layer's last block written after the others landed and tagged
//        "kv/<reservation>/<layer>/<first>-<end>" so decode learns the layer arrived (decode_worker.hpp);
//      - fallback, only when decode publishes no segment (or options.kv_engine is false): kv_write RPCs carrying
//        the bytes.
//      At a chunk boundary the stream is drained before the next chunk is computed, so no block is sent while
//      the backend writes into it.
//   4. Waits for the stream to drain (kv_tail_ms = last layer computed -> every write acknowledged), then
//      commits at decode (kv_commit with the first token and the ledger); the first token is not delayed by
//      step 5.
//   5. Puts the new complete blocks into the cache (store_new_blocks).
// Any failure after step 1 aborts the decode reservation (decode_abort) before the error is returned.
//
// DecodeLink abstracts the messages to decode instances: RPC in production (make_rpc_decode_link), direct calls
// in unit tests. Thread-safety: run_job is called from one job thread; load() from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mc/common/block_key.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/status.hpp"
#include "mc/infer/backend.hpp"
#include "mc/infer/block_cache.hpp"
#include "mc/infer/conductor_link.hpp"
#include "mc/infer/sampler.hpp"
#include "mc/proto/worker.hpp"
#include "mc/transfer/engine.hpp"
#include "mc/transfer/shared_buffer.hpp"

namespace mc::infer {

// Messages from a prefill instance to decode instances and next pipeline stages (named by endpoint). Called from
// the job thread, the KV streamer's thread and the stage sender's at once: implementations are thread-safe.
class DecodeLink {
 public:
  virtual ~DecodeLink() = default;
  virtual Result<proto::KvWriteReply> write(const std::string& endpoint, const proto::KvWriteRequest& request) = 0;
  virtual Result<proto::KvCommitReply> commit(const std::string& endpoint, const proto::KvCommitRequest& request) = 0;
  virtual Result<proto::DecodeReleaseReply> abort(const std::string& endpoint,
                                                  const proto::DecodeAbortRequest& request) = 0;
  // The transfer-engine segment the decode instance serves its KV buffer on ("" = none: use write()).
  virtual Result<std::string> kv_segment(const std::string& /*endpoint*/) { return std::string(); }
  // kUnavailable (naming the endpoint and the last failure) while `endpoint` is known not to answer: a call to
  // it failed on transport within its back-off (1 s doubling to 8 s); its calls fail the same way meanwhile.
  virtual Status reachable(const std::string& /*endpoint*/) { return Status::ok(); }
  // Pipelined prefill (DESIGN.md §18 "Live groups"): one chunk's hidden states to the next stage's mc-prefill.
  virtual Result<proto::PrefillStageHiddenReply> stage_hidden(const std::string& endpoint,
                                                              const proto::PrefillStageHiddenRequest& /*request*/) {
    return error(Code::kUnimplemented, "this link sends no stage hidden states (to " + endpoint + ")");
  }
  // The same through the transfer engine: where the next stage takes a chunk (prefill_stage_slot).
  virtual Result<proto::PrefillStageSlotReply> stage_slot(const std::string& endpoint,
                                                          const proto::PrefillStageSlotRequest& /*request*/) {
    return error(Code::kUnimplemented, "this link asks no stage slots (of " + endpoint + ")");
  }
};
// One RpcClient per decode endpoint, `timeout_ms` per call; thread-safe (its calls are serialised by one mutex).
std::unique_ptr<DecodeLink> make_rpc_decode_link(int timeout_ms);

struct PrefillWorkerOptions {
  int64_t block_tokens = 16;              // tokens per KV block (= the store's block size for this namespace)
  int64_t kv_blocks = 1024;               // blocks in this worker's KV buffer (the longest prompt it can take)
  int64_t chunk_tokens = 0;               // default chunk size of chunked prefill; 0 = whole prompt at once
  uint64_t weight_seed = 0;               // part of the key namespace
  bool allow_fault_injection = false;     // honour PrefillJobRequest::fail_after_layers (tests)
  bool kv_engine = true;                  // WRITE KV through a transfer engine to decode instances with a segment
  int64_t kv_transfer_timeout_ms = 5000;  // deadline of one layer's WRITEs (engine request timeout)
  // Pipelined prefill (DESIGN.md §18 "Live groups"): how long a stage job waits for its previous stage's next chunk
  // before it fails (its reservation aborted), and the most hidden-state bytes held for stage jobs not yet asking.
  int64_t stage_wait_timeout_ms = 30000;
  int64_t stage_inbox_bytes = int64_t{64} << 20;
};

class PrefillWorker {
 public:
  // `cache` may be null (no store: every job recomputes). kInvalidArgument for bad options.
  static Result<std::unique_ptr<PrefillWorker>> create(PrefillWorkerOptions options, std::unique_ptr<Backend> backend,
                                                       std::unique_ptr<KvBlockCache> cache,
                                                       std::unique_ptr<DecodeLink> link);
  ~PrefillWorker();

  // Runs one job to completion (see the header comment). `queued_ms` goes into the ledger.
  Result<proto::PrefillJobReply> run_job(const proto::PrefillJobRequest& job, int64_t queued_ms = 0);
  // A job cancelled by its client before it started (prefill_cancel dropped it from the queue): aborts its decode
  // reservation with kCancelled (decode frees it and tells the client) and returns the kCancelled error its
  // prefill_job is answered with. Called on the job thread, like run_job.
  Status cancel_job(const proto::PrefillJobRequest& job);
  // From now on a job fails with `why` (kUnavailable) before its compute or at its next layer, aborting its decode
  // reservation as a failed job does (the drain timeout). Thread-safe.
  void abort_jobs(const std::string& why);

  const Backend& backend() const { return *backend_; }
  KvBuffer& kv() { return *kv_; }
  metrics::Registry& metrics() { return metrics_; }
  const KeyNamespace& key_namespace() const { return ns_; }
  const PrefillWorkerOptions& options() const { return options_; }
  // Measured prefill rate (computed tokens per second, moving average); 0 before the first job.
  double measured_tokens_per_s() const { return tokens_per_s_.load(); }
  // A chunk's hidden states from the previous stage of a pipelined prefill (prefill_stage_hidden), held until the
  // stage job of that request asks for them. kInvalidArgument for a malformed message (sizes not matching this
  // backend's Backend::stage_hidden_floats() per token, a token range outside its context, a chunk already held),
  // kResourceExhausted past stage_inbox_bytes. Messages nobody asked for expire after 2 x stage_wait_timeout_ms.
  // Thread-safe, never blocks.
  Status deliver_stage_hidden(proto::PrefillStageHiddenRequest message);
  // Serves a stage segment (DESIGN.md §18 "Live groups" point 2): a landing area of stage_inbox_bytes (shared
  // memory: one memcpy from a previous stage on this host) registered with its own transfer engine listening on
  // options.listen, where previous stages WRITE their chunks' hidden states (stage_slot). With options.grant_key
  // every WRITE must carry the grant stage_slot issued for its slot. Errors of TransferEngine::create and
  // register_memory; kFailedPrecondition when already published. Call before serving.
  Status publish_stage_segment(transfer::EngineOptions options);
  // "host:port" of the stage segment; "" when none.
  std::string stage_segment() const;
  // prefill_stage_slot: sets aside request.bytes of the landing area for one chunk (see the protocol). Errors:
  // kFailedPrecondition (no stage segment), kInvalidArgument (the checks of deliver_stage_hidden),
  // kResourceExhausted (held and landing bytes would pass stage_inbox_bytes, or no contiguous room). Thread-safe.
  Result<proto::PrefillStageSlotReply> stage_slot(const proto::PrefillStageSlotRequest& request);
  // The stage engine's notification handler: a slot's WRITE landed; its bytes become a held chunk (public for
  // tests). A tag, range or grant that is not a live slot's is counted and ignored.
  void on_stage_notification(const transfer::Notification& note);

  // The job whose prefix fetch is running now and for how long (ns), for the heartbeat: a fetch still running
  // bounds its path's bandwidth before it reports (DESIGN.md §16 "Bandwidth decides, live"). {"", 0} when none.
  // Thread-safe.
  std::pair<std::string, int64_t> fetch_in_progress() const;

 private:
  PrefillWorker(PrefillWorkerOptions options, std::unique_ptr<Backend> backend, std::unique_ptr<KvBlockCache> cache,
                std::unique_ptr<DecodeLink> link, std::unique_ptr<KvBuffer> kv);
  void abort_reservation(const proto::PrefillJobRequest& job, const Status& why);  // decode_abort, logged
  // Before each layer's KV is handed on: kUnavailable once abort_jobs() was called, kAborted at the job's injected
  // failure (fail_after_layers), else ok. `writes`: layer spans handed on so far.
  Status layer_gate(const proto::PrefillJobRequest& job, int64_t writes);
  // Steps 2-5 of the job (the header's list), one path for a whole prefill and a pipeline stage (job.is_stage():
  // DESIGN.md §18 "Live groups"), which is a prefill of some layers that may start from the previous stage's hidden
  // states, hand its own on, and leave the commit to the last stage. `blocks`: the job's KV blocks here.
  Result<proto::PrefillJobReply> run_prefill(const proto::PrefillJobRequest& job, std::vector<int32_t>& blocks,
                                             proto::RequestLedger& ledger);
  // A stage's chunks: each one's hidden states in from the previous stage (chunk 0 already taken: `chunk0`; stage 0:
  // none), through the stage's layers (on_layer streams their KV; drain_kv waits until it landed), and out to the
  // next stage on a thread of their own while the next chunk computes. The first token (the last stage; else 0).
  // The last stage's first token, chosen by the job's sampling from the last chunk's logits.
  Result<TokenChoice> run_stage_chunks(const proto::PrefillJobRequest& job, const std::vector<int32_t>& blocks,
                                       int64_t cached, std::optional<proto::PrefillStageHiddenRequest> chunk0,
                                       const LayerDoneFn& on_layer, const std::function<Status()>& drain_kv,
                                       const std::string& what);
  // Step 5 of a whole prefill: its new complete blocks from `first_block` on into the store, counted in the ledger.
  void store_new_blocks(const proto::PrefillJobRequest& job, const std::vector<int32_t>& blocks,
                        const std::vector<uint64_t>& hashes, const KeyNamespace& ns, int64_t first_block,
                        proto::RequestLedger& ledger);
  Status validate_stage(const proto::PrefillJobRequest& job) const;
  // The checks of a previous stage's chunk (deliver_stage_hidden, stage_slot): ids, token range, byte count.
  Status validate_stage_chunk(const std::string& what, const std::string& request_id, uint64_t reservation_id,
                              int64_t chunk_index, int64_t token_begin, int64_t token_end, int64_t bytes) const;
  // Sends one chunk's hidden states to the job's next stage: through the transfer engine when that stage serves a
  // stage segment (stage_slot, then a tagged WRITE from the outbox; kResourceExhausted retried until the stage
  // wait ends), else as a prefill_stage_hidden RPC. Adds the bytes moved by the engine to *engine_bytes.
  Status send_stage_hidden(const proto::PrefillJobRequest& job, const proto::PrefillStageHiddenRequest& m,
                           int64_t* engine_bytes);
  void expire_stage_locked(int64_t now);  // held chunks and slots past 2 x stage_wait_timeout_ms (stage_mu_ held)
  // The prompt's cache ledger as counters (mc_prefill_hit_tokens_total, ...): once per prompt of n tokens, cached
  // from the store (a pipelined prompt: at stage 0 only).
  void count_prompt_ledger(const proto::RequestLedger& ledger, int64_t n, int64_t cached);
  // The fetch byte counters: every job and every stage (each reads its own bytes).
  void count_fetch(const proto::RequestLedger& ledger);
  // Waits (stage_wait_timeout_ms at most, ended by abort_jobs) for chunk `chunk` of the job's previous stage.
  Result<proto::PrefillStageHiddenRequest> take_stage_hidden(const proto::PrefillJobRequest& job, int64_t chunk);
  void drop_stage_hidden(const proto::PrefillJobRequest& job);  // what is still held for the job
  // Reads the first `want` prompt blocks from the cache into `blocks` (step 1 of run_job), fills the ledger's fetch
  // fields, and returns how many leading blocks arrived. A pipeline stage reads its layers of each block only.
  int64_t fetch_prefix(const proto::PrefillJobRequest& job, const std::vector<int32_t>& blocks,
                       const std::vector<uint64_t>& hashes, const KeyNamespace& ns, int64_t want,
                       proto::RequestLedger& ledger);
  // Moves one layer's KV of prompt blocks [first, end) to the job's decode reservation (a transfer-engine WRITE, or
  // a kv_write RPC when decode publishes no segment) and returns the bytes moved; `target` names where.
  using KvSend = std::function<Result<int64_t>(int64_t layer, int64_t first, int64_t end)>;
  Result<KvSend> kv_sender(const proto::PrefillJobRequest& job, const std::vector<int32_t>& blocks,
                           std::string& target);
  Status write_layer_engine(const proto::PrefillJobRequest& job, transfer::SegmentHandle segment,
                            const std::string& segment_name, const std::vector<int32_t>& blocks, int64_t layer,
                            int64_t first, int64_t end);

  PrefillWorkerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvBlockCache> cache_;
  std::unique_ptr<DecodeLink> link_;
  std::unique_ptr<KvBuffer> kv_;
  KeyNamespace ns_;
  metrics::Registry metrics_;
  std::atomic<double> tokens_per_s_{0};
  std::atomic<bool> abort_jobs_{false};
  std::mutex abort_mu_;
  std::string abort_why_;  // guarded by abort_mu_
  mutable std::mutex fetch_mu_;
  std::string fetch_request_id_;                      // guarded by fetch_mu_: the job fetching its prefix now
  int64_t fetch_start_ns_ = 0;                        // guarded by fetch_mu_
  std::unique_ptr<transfer::TransferEngine> engine_;  // initiator only (no segment served); null: kv_engine off
  // Hidden states held for stage jobs, by (request id, reservation id) then chunk (guarded by stage_mu_).
  struct HeldChunk {
    proto::PrefillStageHiddenRequest message;
    int64_t received_ns = 0;
  };
  std::mutex stage_mu_;
  std::condition_variable stage_cv_;
  std::map<std::pair<std::string, uint64_t>, std::map<int64_t, HeldChunk>> stage_inbox_;
  std::map<std::pair<std::string, uint64_t>, std::string> stage_failed_;  // a previous stage's failure, by job
  int64_t stage_inbox_bytes_ = 0;  // held chunks' bytes plus the landing area's slots (guarded by stage_mu_)
  // The stage segment (publish_stage_segment): landing area, its free ranges (offset -> bytes) and live slots.
  struct StageSlot {
    proto::PrefillStageSlotRequest chunk;
    uint64_t offset = 0;  // in the landing area
    int64_t granted_ns = 0;
  };
  transfer::SharedBuffer stage_area_;
  uint64_t stage_area_base_ = 0;  // segment offset of stage_area_.data()
  std::string stage_segment_;
  std::string stage_grant_key_;
  std::map<uint64_t, uint64_t> stage_free_;    // guarded by stage_mu_
  std::map<uint64_t, StageSlot> stage_slots_;  // by slot id, guarded by stage_mu_
  uint64_t next_stage_slot_ = 1;               // guarded by stage_mu_
  // The sender's registered outbox for chunks it WRITEs (grown to the largest chunk; the job thread only).
  transfer::SharedBuffer stage_outbox_;
  // Last members: destroyed first, so no notification handler runs into a half-destroyed worker.
  std::unique_ptr<transfer::TransferEngine> stage_engine_;
};

struct PrefillServeOptions {
  std::string endpoint = "tcp://127.0.0.1:0";
  std::string gpu = "a800x8";           // for predicted_queue_ms of the sim backend
  ConductorHeartbeatOptions conductor;  // register and heartbeat there when its endpoint is set
  std::string metrics_listen;           // --metrics-listen: "ADDR:PORT" of GET /metrics (metrics_http.hpp); empty: off
  int64_t drain_timeout_s = 30;         // SIGTERM's drain: how long queued and running jobs may still take
};

// Runs a PrefillWorker as a daemon: binds the endpoint, announces "ready mc-prefill <endpoint> ...", queues
// prefill_job requests (answered when done), answers worker_load and stat, until SIGTERM/SIGINT. prefill_cancel
// drops a queued job of that request (its reservation aborted, its prefill_job answered kCancelled, counted in
// mc_prefill_cancelled_total); a running job runs on (dropped = false).
// Drain (DESIGN.md §10 "Drain"): on the first SIGTERM/SIGINT it sends conductor.drain, refuses new prefill_jobs
// (kUnavailable, "draining"), finishes the queued and running jobs (their KV committed to decode, their replies
// sent) and returns ok. Jobs not done within drain_timeout_s, or at a second signal, fail as a failed job does
// (kUnavailable; decode_abort, so the client gets request_error): a running one at its next layer.
Status serve_prefill(PrefillWorker& worker, const PrefillServeOptions& options);

}  // namespace mc::infer
