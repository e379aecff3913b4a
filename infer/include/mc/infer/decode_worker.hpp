// mc::infer::DecodeWorker: the decoding instance behind mc-decode (DESIGN.md §3 step 4).
//
// Admission (reserve): a request needs blocks_for(input + output) KV blocks at full length. The worker keeps
// `committed` = Σ full-length blocks of every running and reserved request, and admits only when
// committed + need ≤ total, so a request admitted now can always grow to its full output without evicting
// anyone (admission that ignores future growth is impossible by construction). Prompt blocks are allocated
// physically at reserve (the prefill writes into them); growth blocks are allocated as decode reaches them.
// Bad lengths (≤ 0, input + output > the model's max context) are kInvalidArgument ("input too long"), before
// any allocation (DESIGN.md §13.14, steps 1-2). A full instance answers kRejected.
//
// KV arrival (layer-wise streaming, Mooncake §4). The KV buffer is shared memory (KvMemory::kShared).
// publish_kv_segment() registers it with a transfer engine (transfer/engine.hpp; peer-to-peer directory, segment
// name = the engine's "host:port"); reserve then returns that segment and, per prompt block, the segment offset of
// its layer 0. The prefill WRITEs each layer's blocks straight into the reservation (the engine picks shm on the
// same host, else rdma or tcp) and tags the last WRITE of each layer "kv/<reservation>/<layer>/<first>-<end>",
// issued only after the layer's other blocks landed. Its notification (on an engine thread, before the engine
// acknowledges it, so before the prefill's WRITE completes) marks blocks [first, end) of that layer arrived;
// a tag whose range does not match the reservation (unknown id, layer or block out of range, offset/length not
// that of block end-1's layer) is counted and, for a known reservation, poisons it (its commit fails).
// Without a published segment, kv_write RPCs carrying the bytes are the fallback (still accepted either way).
// kv_commit checks that every layer of every prompt block arrived; if not, the reservation is freed, the client
// gets request_error (kDataLoss) and the commit fails: decode never generates from incomplete KV (DESIGN.md
// §13.14, step 3). abort frees the reservation (or stops a running request) and tells the client. A reservation
// without commit expires after its ttl and is aborted the same way; with a published segment its blocks stay
// held (and counted against admission) until the prefill's kv_commit/decode_abort for it arrives or
// expired_hold_ms passes, since a prefill still computing may WRITE into them (one-sided writes cannot be refused).
//
// Key namespace (block_key.hpp): a reservation carries the request's key scope (adapter and salt); decode runs
// that adapter and expects the KV in its base namespace (kv_namespace) with that scope. A kv_commit naming
// another namespace digest (another adapter, salt, model, seed or block size at the prefill) is refused with
// kFailedPrecondition, the reservation freed and the client told: decode never generates from foreign KV.
//
// Cancel (decode_cancel, DESIGN.md §10 "Cancel"): every reservation of the request is freed as an expired one is
// (with a published segment its blocks stay held until the prefill's kv_commit or decode_abort for it, or
// expired_hold_ms, since its prefill may still WRITE into them), and its kv_commit is refused with kCancelled
// (for expired_hold_ms); a committed sequence (joining or running) leaves the batch at the next step and frees its
// KV blocks. In both cases the client gets one request_error with code kCancelled (its terminal event, carrying
// the tokens sent so far) and never request_done; a token already on its way may still arrive before it.
// mc_decode_cancelled_total counts the cancels that found the request.
//
// Conductor job reports: with set_job_reporter(), every first token, completion and failure sent to a client is
// also reported (conductor.job_report: first_token / done / failed).
//
// Continuous batching: committed requests join the batch at the next step; each step runs the backend once for
// every running sequence, emits one token per sequence with its wall-clock timestamp, and finished sequences
// free their KV and get request_done with the ledger (prefill's, plus decode time and output tokens).
//
// Threads: handler methods (reserve, kv_write, commit, abort, release, cancel, load) may be called from one thread and
// on_kv_notification from the transfer engine's threads while step() runs on another; shared state is under one
// mutex, and the backend runs outside it. All client messages are sent from the step() thread through the
// TokenSink.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/status.hpp"
#include "mc/infer/backend.hpp"
#include "mc/infer/block_put_queue.hpp"
#include "mc/infer/conductor_link.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"
#include "mc/transfer/engine.hpp"

namespace mc::infer {

// Delivers client messages. The RPC implementation connects to each client endpoint (RpcServer on the client
// side) and calls token_event / request_done / request_error. An endpoint is rpc::keyed_endpoint's form (with keys,
// "ENDPOINT key=Z85": the client's server serves with its own key). Called from the decode step thread only.
class TokenSink {
 public:
  virtual ~TokenSink() = default;
  virtual Status token(const std::string& endpoint, const proto::TokenEvent& event) = 0;
  virtual Status done(const std::string& endpoint, const proto::RequestDone& done) = 0;
  virtual Status fail(const std::string& endpoint, const proto::RequestError& error) = 0;
  // Called on every decode step (also an idle one): the sink's own timed work, e.g. resending to a client that
  // stopped answering (RPC sink: at-least-once, in order per client). No-op default.
  virtual void poll() {}
};
// The RPC sink (one RpcClient per endpoint, timeout per message).
std::unique_ptr<TokenSink> make_rpc_token_sink(int timeout_ms);

struct DecodeWorkerOptions {
  int64_t block_tokens = 16;           // tokens per KV block
  int64_t kv_blocks = 1024;            // blocks in the KV buffer
  int64_t max_batch_size = 64;         // running sequences at most (more wait in the join queue)
  int64_t reservation_ttl_ms = 30000;  // default ttl of a reservation without commit
  // The longest ttl_ms a decode_reserve may ask for (and reservation_ttl_ms may be); more is refused with
  // kInvalidArgument, as is a negative one.
  int64_t max_reservation_ttl_ms = 600000;
  int64_t expired_hold_ms = 60000;  // blocks of an expired reservation held at most this long (segment only)
  uint64_t weight_seed = 0;         // part of the key namespace (kv_namespace; the prefill's --seed)
};

class DecodeWorker {
 public:
  // Owns the backend; allocates the KV buffer. kInvalidArgument for bad options.
  static Result<std::unique_ptr<DecodeWorker>> create(DecodeWorkerOptions options, std::unique_ptr<Backend> backend,
                                                      std::unique_ptr<TokenSink> sink,
                                                      const Clock* clock = &RealClock::instance());
  ~DecodeWorker();

  Result<proto::DecodeReserveReply> reserve(const proto::DecodeReserveRequest& request);
  Result<proto::DecodeReleaseReply> release(const proto::DecodeReleaseRequest& request);
  Result<proto::DecodeReleaseReply> abort(const proto::DecodeAbortRequest& request);
  // The client cancelled request_id (decode_cancel from the Conductor): see "Cancel" above. found = false when
  // nothing of it is here (finished, never reserved here, or cancelled before).
  Result<proto::DecodeCancelReply> cancel(const proto::DecodeCancelRequest& request);
  Result<proto::KvWriteReply> kv_write(const proto::KvWriteRequest& request);
  Result<proto::KvCommitReply> commit(const proto::KvCommitRequest& request);
  // The store this instance puts a pipelined prefill's new blocks into (kv_commit's store_block_hashes, DESIGN.md
  // §18 "Live groups"), through a BlockPutQueue of at most max_queued_bytes of copies. Without one, such blocks
  // are not stored (counted in mc_decode_store_unset_blocks_total). Call before serving.
  void set_block_store(std::unique_ptr<KvBlockCache> cache, int64_t max_queued_bytes);
  // Waits until the blocks queued so far were put (or failed); no-op without a store. For tests and drain.
  void flush_store_puts();
  proto::WorkerLoadReply load() const;
  // The decode steps measured since the last call (the latest proto::kMaxDecodeStepSamples), each with its batch
  // size, context tokens and wall time, oldest first; the heartbeat sends them to the Conductor's TBT refit.
  std::vector<proto::DecodeStepSample> take_step_samples();

  // Serves the KV buffer as a transfer-engine segment (options.listen must name at least one endpoint) and takes
  // layer-arrival notifications. Errors: those of TransferEngine::create/register_memory; kFailedPrecondition
  // when already published. Call before serving reservations.
  Status publish_kv_segment(transfer::EngineOptions options);
  // "host:port" of the published segment; "" when none.
  std::string kv_segment() const;
  // A transfer-engine notification (the engine's handler; public for tests).
  void on_kv_notification(const transfer::Notification& note);
  // The decode side of a KV grant (EngineOptions::grant_scope, docs/SECURITY.md "Data-plane grants"): ok when
  // [offset, offset+length) lies inside one block of the live reservation grant.id; kPermissionDenied otherwise
  // (reservation released/expired/committed, a block not its own, a READ). Any thread.
  Status kv_grant_scope(const auth::Grant& grant, transfer::Op op, uint64_t offset, uint64_t length);
  // Called (from the step thread) for each first token / done / failure sent to a client. Set before serving.
  void set_job_reporter(std::function<void(proto::ConductorJobReportRequest)> reporter);

  // One scheduling round: expire reservations, join committed requests (sending their first token), run one
  // decode step over the batch, send the tokens, finish completed requests. Returns the number of sequences
  // stepped (0: idle). A backend error fails every sequence of the batch (clients get request_error).
  Result<int64_t> step();
  // The step thread's idle wait: returns at once when sequences are joining or running or messages wait to be sent,
  // else when a commit, cancel, abort or end_all gives step() work, or after timeout_ms (reservations expire by the
  // clock). Replaces a 1 ms poll that woke an idle decode ~1,000 times a second.
  void wait_for_work(int64_t timeout_ms);

  // True when nothing is running, joining or reserved.
  bool idle() const;
  // Drain (serve_decode): from now on decode_reserve is refused (kUnavailable, "draining"); everything held goes on.
  void refuse_reservations(const std::string& instance_id);
  // The drain timeout: every reservation is dropped and every sequence stopped at the next step, each client told
  // `why` (request_error); returns how many. Thread-safe.
  int64_t end_all(const Status& why);
  KvBuffer& kv() { return *kv_; }
  metrics::Registry& metrics() { return metrics_; }
  const Backend& backend() const { return *backend_; }

 private:
  struct Reservation;
  struct Sequence;
  struct Outgoing;
  struct Expired;
  DecodeWorker(DecodeWorkerOptions options, std::unique_ptr<Backend> backend, std::unique_ptr<TokenSink> sink,
               std::unique_ptr<KvBuffer> kv, const Clock* clock);
  void drop_reservation_locked(uint64_t id, const Status& why, bool tell_client, bool hold_blocks = false);
  bool release_expired_locked(uint64_t id);
  void flush_outgoing();
  // Queues the blocks a commit asks to store (its checks passed); returns how many were queued.
  int64_t store_blocks_locked(const Reservation& r, const proto::KvCommitRequest& c);

  DecodeWorkerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<TokenSink> sink_;
  std::unique_ptr<KvBuffer> kv_;
  const Clock* clock_;
  KeyNamespace ns_;  // base namespace of this worker's KV
  metrics::Registry metrics_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // notified under mu_ when step() has work (wait_for_work)
  uint64_t next_reservation_ = 1;
  int64_t committed_blocks_ = 0;
  std::map<uint64_t, std::unique_ptr<Reservation>> reservations_;
  std::deque<std::unique_ptr<Sequence>> joining_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<Outgoing> outgoing_;
  std::map<uint64_t, Expired> expired_;  // expired reservations whose blocks are still held
  // Reservations cancelled before their commit -> until when (clock_ ns) their kv_commit is refused kCancelled.
  std::map<uint64_t, int64_t> cancelled_;
  double recent_step_ms_ = 0;
  std::string refusing_as_;  // non-empty: draining, reservations refused (the instance id, for the message)
  std::deque<proto::DecodeStepSample> step_samples_;  // since the last take_step_samples(), bounded
  std::function<void(proto::ConductorJobReportRequest)> reporter_;
  std::string kv_segment_;                     // set once by publish_kv_segment, before serving
  uint64_t kv_segment_base_ = 0;               // segment offset of kv_->data()
  std::string kv_grant_key_;                   // with --auth-dir: the grant key reservations' kv_grant is issued under
  std::unique_ptr<BlockPutQueue> store_puts_;  // set_block_store; null: blocks are not stored here
  bool warned_no_store_ = false;
  // Last member: destroyed first, so no notification handler runs into a half-destroyed worker.
  std::unique_ptr<transfer::TransferEngine> engine_;
};

// Runs a DecodeWorker as a daemon: binds `endpoint`, announces "ready mc-decode <endpoint> ...", serves the RPCs
// (plus stat and worker_load) and steps the batch on its own thread until SIGTERM/SIGINT. With a conductor
// endpoint it registers there and heartbeats its load (conductor_link.hpp). With `metrics_listen` ("ADDR:PORT",
// --metrics-listen) it serves GET /metrics there (metrics_http.hpp) and the ready line says metrics=http://...
// Drain (DESIGN.md §10 "Drain"): on the first SIGTERM/SIGINT it sends conductor.drain, refuses new decode_reserves
// (kUnavailable, "draining"), keeps taking KV writes and commits for the reservations it holds and steps until
// every sequence finished and every reservation was committed and finished, released, aborted or expired, then
// returns ok. What is left after drain_timeout_s (or at a second signal) ends with request_error kUnavailable.
Status serve_decode(DecodeWorker& worker, const std::string& endpoint, const ConductorHeartbeatOptions& conductor = {},
                    const std::string& metrics_listen = {}, int64_t drain_timeout_s = 30);

}  // namespace mc::infer
