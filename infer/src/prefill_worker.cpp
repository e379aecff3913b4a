#include "mc/infer/prefill_worker.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/common/queue_order.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/net/grant.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"

namespace mc::infer {
namespace {

int64_t ms_since(int64_t t0_ns) { return (steady_ns() - t0_ns) / 1'000'000; }

class RpcDecodeLink final : public DecodeLink {
 public:
  explicit RpcDecodeLink(int timeout_ms)
      : client_(rpc::AsyncClientOptions{.client_name = "mc-prefill"}), timeout_ms_(timeout_ms) {}
  Result<proto::KvWriteReply> write(const std::string& ep, const proto::KvWriteRequest& r) override {
    return call(ep, r);
  }
  Result<proto::KvCommitReply> commit(const std::string& ep, const proto::KvCommitRequest& r) override {
    return call(ep, r);
  }
  Result<proto::DecodeReleaseReply> abort(const std::string& ep, const proto::DecodeAbortRequest& r) override {
    return call(ep, r);
  }
  Result<proto::PrefillStageHiddenReply> stage_hidden(const std::string& ep,
                                                      const proto::PrefillStageHiddenRequest& r) override {
    return call(ep, r);
  }
  Result<proto::PrefillStageSlotReply> stage_slot(const std::string& ep,
                                                  const proto::PrefillStageSlotRequest& r) override {
    return call(ep, r);
  }
  Result<std::string> kv_segment(const std::string& ep) override {
    MC_ASSIGN_OR_RETURN(proto::WorkerLoadReply load, call(ep, proto::WorkerLoadRequest{}));
    return load.kv_segment;
  }
  Status reachable(const std::string& ep) override {
    std::lock_guard lock(mu_);
    return reachable_locked(ep);
  }

 private:
  Status reachable_locked(const std::string& ep) {
    auto it = down_.find(ep);
    if (it == down_.end() || steady_ns() >= it->second.until_ns) return Status::ok();
    return Status(Code::kUnavailable, "decode instance at " + ep + " did not answer " +
                                          std::to_string(ms_since(it->second.since_ns)) + " ms ago (" + it->second.why +
                                          "); not called again until its back-off ends");
  }

  // A decode endpoint that failed on transport is called again only after a back-off (1 s, doubling to 8 s,
  // cleared by an answer): the jobs queued behind a dead decode instance's fail at once instead of each waiting
  // out a call timeout (DESIGN.md §10 "Worker faults").
  struct Down {
    int64_t since_ns = 0, until_ns = 0, backoff_ms = 0;
    std::string why;
  };
  // One call at a time: the job thread, the KV streamer's thread and the stage sender share this link, and the
  // AsyncClient is not thread-safe (a call holds the lock for its round trip).
  template <typename Req>
  Result<typename Req::Reply> call(const std::string& endpoint, const Req& req) {
    std::lock_guard lock(mu_);
    MC_RETURN_IF_ERROR(reachable_locked(endpoint));
    Result<typename Req::Reply> r = client_.call_sync(endpoint, req, timeout_ms_);
    if (r.is_ok() || (r.status().code() != Code::kTimeout && r.status().code() != Code::kUnavailable)) {
      down_.erase(endpoint);
      return r;
    }
    Down& d = down_[endpoint];
    d.backoff_ms = std::clamp<int64_t>(d.backoff_ms * 2, 1'000, 8'000);
    d.since_ns = steady_ns();
    d.until_ns = d.since_ns + d.backoff_ms * 1'000'000;
    d.why = r.status().message();
    return r;
  }
  std::mutex mu_;
  rpc::AsyncClient client_;
  int timeout_ms_;
  std::unordered_map<std::string, Down> down_;
};

// One layer's KV of blocks [first, end) of the job (positions in the prompt's block list).
struct LayerSpan {
  int64_t layer = 0;
  int64_t first = 0;
  int64_t end = 0;
};

// Sends layer spans on its own thread so the transfer of layer l overlaps the compute of layer l+1. `send`
// moves one span (an engine WRITE or a kv_write RPC) and returns the bytes it moved.
class LayerStreamer {
 public:
  using Send = std::function<Result<int64_t>(const LayerSpan&)>;
  LayerStreamer(Send send, std::string target) : send_(std::move(send)), target_(std::move(target)) {
    thread_ = std::thread([this] { run(); });
  }
  ~LayerStreamer() { (void)finish(); }

  // Queues a span; fails with the first send error once one happened (the prefill then stops).
  Status push(LayerSpan span) {
    std::lock_guard lock(mu_);
    if (!error_.is_ok()) return error_;
    queue_.push_back(span);
    cv_.notify_all();
    return Status::ok();
  }
  // Waits until every queued span was sent (or one failed).
  Status drain() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || !error_.is_ok() || done_; });
    return error_;
  }
  // Drains and stops the thread; idempotent.
  Status finish() {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    return error_;
  }
  int64_t bytes_sent() const { return bytes_sent_; }
  // Steady-clock ns when the last span sent so far landed (its send returned); 0 before any.
  int64_t last_sent_ns() const { return last_sent_ns_; }

 private:
  void run() {
    for (;;) {
      LayerSpan span;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
        if (queue_.empty() || !error_.is_ok()) {
          done_ = true;
          cv_.notify_all();
          return;
        }
        span = queue_.front();
        queue_.pop_front();
        busy_ = true;
      }
      auto sent = send_(span);
      std::lock_guard lock(mu_);
      busy_ = false;
      if (!sent.is_ok()) {
        error_ = sent.status().with_context("streaming layer " + std::to_string(span.layer) + " to " + target_);
        queue_.clear();
      } else {
        bytes_sent_ += sent.value();
        last_sent_ns_ = steady_ns();
      }
      cv_.notify_all();
    }
  }

  Send send_;
  std::string target_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LayerSpan> queue_;
  bool closing_ = false;
  bool busy_ = false;
  bool done_ = false;
  Status error_;
  int64_t bytes_sent_ = 0;
  int64_t last_sent_ns_ = 0;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<DecodeLink> make_rpc_decode_link(int timeout_ms) { return std::make_unique<RpcDecodeLink>(timeout_ms); }

Result<std::unique_ptr<PrefillWorker>> PrefillWorker::create(PrefillWorkerOptions options,
                                                             std::unique_ptr<Backend> backend,
                                                             std::unique_ptr<KvBlockCache> cache,
                                                             std::unique_ptr<DecodeLink> link) {
  if (options.block_tokens <= 0 || options.block_tokens > (1 << 20) || options.kv_blocks <= 0 ||
      options.chunk_tokens < 0) {
    return error(Code::kInvalidArgument,
                 "prefill worker: --block-tokens and --kv-blocks must be > 0, --chunk-tokens >= 0");
  }
  if (!backend || !link) return error(Code::kInvalidArgument, "prefill worker: backend and decode link are required");
  if (options.kv_transfer_timeout_ms <= 0) {
    return error(Code::kInvalidArgument, "prefill worker: kv_transfer_timeout_ms must be > 0");
  }
  MC_ASSIGN_OR_RETURN(auto kv, KvBuffer::create(backend->kv_layout(options.block_tokens), options.kv_blocks));
  std::unique_ptr<transfer::TransferEngine> engine;
  if (options.kv_engine) {
    transfer::EngineOptions eo;  // initiator only: no listen endpoint, no segment served
    eo.request_timeout_ms = options.kv_transfer_timeout_ms;
    MC_ASSIGN_OR_RETURN(engine, transfer::TransferEngine::create(std::move(eo)));
    auto region = engine->register_memory(kv->data(), static_cast<uint64_t>(kv->size_bytes()));
    if (!region.is_ok()) return region.status().with_context("prefill: registering the KV buffer");
  }
  auto worker = std::unique_ptr<PrefillWorker>(
      new PrefillWorker(options, std::move(backend), std::move(cache), std::move(link), std::move(kv)));
  worker->engine_ = std::move(engine);
  return worker;
}

PrefillWorker::PrefillWorker(PrefillWorkerOptions options, std::unique_ptr<Backend> backend,
                             std::unique_ptr<KvBlockCache> cache, std::unique_ptr<DecodeLink> link,
                             std::unique_ptr<KvBuffer> kv)
    : options_(options),
      backend_(std::move(backend)),
      cache_(std::move(cache)),
      link_(std::move(link)),
      kv_(std::move(kv)) {
  ns_ = kv_namespace(*backend_, options_.block_tokens, options_.weight_seed);
}

PrefillWorker::~PrefillWorker() {
  stage_engine_.reset();
  engine_.reset();
}

// Blocks [first, end) of one layer: every block's layer range but the last as one batch, then the last one with
// the layer-arrival tag, so the notification means the whole span landed.
Status PrefillWorker::write_layer_engine(const proto::PrefillJobRequest& job, transfer::SegmentHandle segment,
                                         const std::string& segment_name, const std::vector<int32_t>& blocks,
                                         int64_t layer, int64_t first, int64_t end) {
  const int64_t lbb = kv_->layout().layer_block_bytes();
  auto request = [&](int64_t b) {
    transfer::TransferRequest r;
    r.op = transfer::Op::kWrite;
    r.local_addr = kv_->layer_block_span(blocks[static_cast<size_t>(b)], layer).data();
    r.segment = segment;
    r.remote_offset = job.decode_block_offsets_bytes[static_cast<size_t>(b)] + static_cast<uint64_t>(layer * lbb);
    r.length = static_cast<uint64_t>(lbb);
    r.grant = job.decode_kv_grant;
    return r;
  };
  // Waits past the engine's request deadline for in-flight slices, so no byte lands after this returns.
  const int64_t wait_ms = options_.kv_transfer_timeout_ms + engine_->options().slice_timeout_ms + 1000;
  auto check = [&](const transfer::BatchStatus& st, int64_t b0, int64_t b1) -> Status {
    if (st.state == transfer::TransferState::kCompleted) return Status::ok();
    const Status why = st.state == transfer::TransferState::kPending
                           ? error(Code::kTimeout, "still pending after " + std::to_string(wait_ms) + " ms")
                           : st.status;
    return why.with_context("transfer-engine WRITE of layer " + std::to_string(layer) + ", blocks [" +
                            std::to_string(b0) + ", " + std::to_string(b1) + ") to segment " + segment_name);
  };
  if (end - first > 1) {
    std::vector<transfer::TransferRequest> reqs;
    for (int64_t b = first; b < end - 1; ++b) reqs.push_back(request(b));
    MC_ASSIGN_OR_RETURN(transfer::BatchId batch, engine_->submit(reqs));
    auto st = engine_->wait(batch, wait_ms);
    if (!st.is_ok()) return st.status();
    const Status ok = check(st.value(), first, end - 1);
    if (is_final(st->state)) (void)engine_->free_batch(batch);
    MC_RETURN_IF_ERROR(ok);
  }
  transfer::TransferRequest last = request(end - 1);
  last.notify_tag = proto::KvLayerTag{job.reservation_id, layer, first, end}.encode();
  MC_ASSIGN_OR_RETURN(transfer::BatchId batch, engine_->submit(std::span<const transfer::TransferRequest>(&last, 1)));
  auto st = engine_->wait(batch, wait_ms);
  if (!st.is_ok()) return st.status();
  const Status ok = check(st.value(), end - 1, end);
  if (is_final(st->state)) (void)engine_->free_batch(batch);
  return ok;
}

Status PrefillWorker::layer_gate(const proto::PrefillJobRequest& job, int64_t writes) {
  if (abort_jobs_.load()) {
    std::lock_guard lock(abort_mu_);
    return error(Code::kUnavailable, abort_why_ + " (after " + std::to_string(writes) + " layer writes)");
  }
  if (job.fail_after_layers >= 0 && writes >= job.fail_after_layers) {
    return error(Code::kAborted, "injected prefill failure after " + std::to_string(writes) + " layer writes");
  }
  return Status::ok();
}

void PrefillWorker::abort_reservation(const proto::PrefillJobRequest& job, const Status& why) {
  if (job.decode_endpoint.empty() || job.reservation_id == 0) return;
  auto r = link_->abort(job.decode_endpoint,
                        proto::DecodeAbortRequest{job.reservation_id, static_cast<uint16_t>(why.code()),
                                                  "request '" + job.request_id + "': " + why.message()});
  if (!r.is_ok()) {
    MC_LOG_WARN << "prefill: could not abort reservation " << job.reservation_id << " at " << job.decode_endpoint
                << ": " << r.status().to_string();
  }
}

Status PrefillWorker::cancel_job(const proto::PrefillJobRequest& job) {
  const Status why(Code::kCancelled, "prefill_job '" + job.request_id +
                                         "': cancelled by its client before it started (dropped from the queue)");
  abort_reservation(job, why);
  return why;
}

void PrefillWorker::abort_jobs(const std::string& why) {
  {
    std::lock_guard lock(abort_mu_);
    abort_why_ = why;
  }
  abort_jobs_.store(true);
}

Result<proto::PrefillJobReply> PrefillWorker::run_job(const proto::PrefillJobRequest& job, int64_t queued_ms) {
  metrics_.counter("mc_prefill_jobs_total", "prefill jobs received").inc();
  proto::RequestLedger ledger;
  ledger.prompt_tokens = static_cast<int64_t>(job.tokens.size());
  ledger.queue_ms = queued_ms;
  auto abort_decode = [&](const Status& why) {
    metrics_.counter("mc_prefill_jobs_failed_total", "prefill jobs that failed (decode told to abort)").inc();
    abort_reservation(job, why);
  };

  const auto& m = backend_->model();
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  Status bad;
  if (abort_jobs_.load()) {
    std::lock_guard lock(abort_mu_);
    bad = error(Code::kUnavailable, "prefill_job '" + job.request_id + "': " + abort_why_);
  } else if (Status down = link_->reachable(job.decode_endpoint); !down.is_ok()) {
    bad = down.with_context("prefill_job '" + job.request_id + "'");  // its decode instance is gone: fail fast
  } else if (n == 0) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': empty prompt");
  } else if (n > m.max_context_tokens) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': input too long: " + std::to_string(n) +
                                            " tokens > max context " + std::to_string(m.max_context_tokens));
  } else if (job.decode_endpoint.empty() || job.reservation_id == 0) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id +
                                            "': no decode target (decode_endpoint, "
                                            "reservation_id from decode_reserve)");
  } else if (static_cast<int64_t>(job.decode_block_offsets_bytes.size()) != kv_->layout().blocks_for_tokens(n)) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': decode reservation has " +
                                            std::to_string(job.decode_block_offsets_bytes.size()) + " blocks, " +
                                            std::to_string(n) + " tokens need " +
                                            std::to_string(kv_->layout().blocks_for_tokens(n)) +
                                            " (decode and prefill must use the same --block-tokens)");
  } else if (job.fail_after_layers >= 0 && !options_.allow_fault_injection) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id +
                                            "': fail_after_layers needs a worker started with --allow-fault-injection");
  } else if (job.chunk_tokens < 0) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': chunk_tokens must be >= 0");
  } else if (Status scope = validate_key_scope(RequestKeyScope{job.lora_name, job.lora_version, job.salt},
                                               "prefill_job '" + job.request_id + "'");
             !scope.is_ok()) {
    bad = scope;
  } else if (Status stage = validate_stage(job); !stage.is_ok()) {
    bad = stage;
  } else {
    for (size_t i = 0; i < job.tokens.size(); ++i) {
      if (job.tokens[i] >= static_cast<uint64_t>(m.vocab_size)) {
        bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': token " +
                                                std::to_string(job.tokens[i]) + " at position " + std::to_string(i) +
                                                " >= vocab size " + std::to_string(m.vocab_size));
        break;
      }
    }
  }
  if (!bad.is_ok()) {
    abort_decode(bad);
    return bad;
  }
  auto blocks = kv_->allocate(kv_->layout().blocks_for_tokens(n));
  if (!blocks.is_ok()) {
    Status s = blocks.status().with_context("prefill_job '" + job.request_id + "'");
    abort_decode(s);
    return s;
  }
  auto reply =
      job.is_stage() ? run_stage_inner(job, blocks.value(), ledger) : run_job_inner(job, blocks.value(), ledger);
  if (job.is_stage()) {
    drop_stage_hidden(job);
    if (!reply.is_ok() && !job.next_stage_endpoint.empty()) {
      // The next stage waits for chunks that will not come: tell it at once (best effort; it times out otherwise).
      proto::PrefillStageHiddenRequest failed;
      failed.request_id = job.request_id;
      failed.reservation_id = job.reservation_id;
      failed.failed = "stage " + std::to_string(job.stage_index) + " failed: " + reply.status().message();
      (void)link_->stage_hidden(job.next_stage_endpoint, failed);
    }
  }
  kv_->free(blocks.value());
  if (!reply.is_ok()) {
    abort_decode(reply.status());
    return reply.status();
  }
  metrics_.counter("mc_prefill_jobs_done_total", "prefill jobs completed").inc();
  return reply;
}

Status PrefillWorker::validate_stage(const proto::PrefillJobRequest& job) const {
  const int64_t L = backend_->model().num_layers;
  const std::string what = "prefill_job '" + job.request_id + "' (pipeline stage " + std::to_string(job.stage_index) +
                           " of " + std::to_string(job.stage_count) + ", layers [" +
                           std::to_string(job.stage_first_layer) + ", +" + std::to_string(job.stage_layers) + "))";
  if (job.stage_layers < 0) return error(Code::kInvalidArgument, what + ": stage_layers must be >= 0");
  if (!job.is_stage()) return Status::ok();
  if (!backend_->runs_stages()) {
    return error(Code::kUnimplemented, what + ": the '" + backend_->kind() +
                                           "' backend does not run pipeline stages (ref and sim do); start "
                                           "the Conductor without --pipeline-group for this cluster");
  }
  if (job.stage_count < 2 || job.stage_count > L || job.stage_index < 0 || job.stage_index >= job.stage_count ||
      job.stage_first_layer < 0 || job.stage_first_layer >= L || job.stage_layers > L - job.stage_first_layer) {
    return error(Code::kInvalidArgument, what + ": the stage or its layers are outside the model's " +
                                             std::to_string(L) + " layers or the group");
  }
  const bool first = job.stage_index == 0, last = job.stage_index == job.stage_count - 1;
  if (first != (job.stage_first_layer == 0) || last != (job.stage_first_layer + job.stage_layers == L)) {
    return error(Code::kInvalidArgument,
                 what + ": stage 0 must start at layer 0 and the last stage end at layer " + std::to_string(L));
  }
  if (last != job.next_stage_endpoint.empty()) {
    return error(Code::kInvalidArgument, what + ": every stage but the last names its next stage's endpoint");
  }
  if (job.next_stage_endpoint.size() > 512)
    return error(Code::kInvalidArgument, what + ": next stage endpoint too long");
  return Status::ok();
}

Status PrefillWorker::validate_stage_chunk(const std::string& what, const std::string& request_id,
                                           uint64_t reservation_id, int64_t chunk_index, int64_t token_begin,
                                           int64_t token_end, int64_t bytes) const {
  const model::ModelConfig& model = backend_->model();
  if (request_id.empty() || request_id.size() > 256 || reservation_id == 0) {
    return error(Code::kInvalidArgument, what + ": request id (1-256 bytes) and reservation id required");
  }
  const int64_t rows = token_end - token_begin;
  if (chunk_index < 0 || chunk_index > model.max_context_tokens || token_begin < 0 || rows < 1 ||
      token_end > model.max_context_tokens) {
    return error(Code::kInvalidArgument, what + ": chunk or tokens [" + std::to_string(token_begin) + ", " +
                                             std::to_string(token_end) + ") outside the model's context of " +
                                             std::to_string(model.max_context_tokens));
  }
  const int64_t floats = backend_->stage_hidden_floats();  // hidden_size (ref); scaled like the KV (sim)
  if (bytes != rows * floats * 4) {
    return error(Code::kInvalidArgument, what + ": " + std::to_string(bytes) + " bytes of hidden states, " +
                                             std::to_string(rows * floats * 4) + " expected (tokens x " +
                                             std::to_string(floats) + " floats x 4 of the " + backend_->kind() +
                                             " backend): the stages run different models or backends");
  }
  return Status::ok();
}

void PrefillWorker::expire_stage_locked(int64_t now) {
  const int64_t expiry_ns = 2 * options_.stage_wait_timeout_ms * 1'000'000;
  // What no stage job asked for in time (its job failed elsewhere, or never came).
  for (auto it = stage_inbox_.begin(); it != stage_inbox_.end();) {
    for (auto c = it->second.begin(); c != it->second.end();) {
      if (now - c->second.received_ns > expiry_ns) {
        stage_inbox_bytes_ -= static_cast<int64_t>(c->second.message.hidden.size());
        c = it->second.erase(c);
      } else {
        ++c;
      }
    }
    it = it->second.empty() ? stage_inbox_.erase(it) : std::next(it);
  }
  // Slots set aside and never written (the sender died or gave up).
  for (auto it = stage_slots_.begin(); it != stage_slots_.end();) {
    if (now - it->second.granted_ns <= expiry_ns) {
      ++it;
      continue;
    }
    const auto bytes = static_cast<uint64_t>(it->second.chunk.bytes);
    stage_inbox_bytes_ -= it->second.chunk.bytes;
    stage_free_[it->second.offset] = bytes;
    it = stage_slots_.erase(it);
  }
  // Coalesce adjacent free ranges.
  for (auto it = stage_free_.begin(); it != stage_free_.end();) {
    auto next = std::next(it);
    if (next != stage_free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      stage_free_.erase(next);
    } else {
      it = next;
    }
  }
}

Status PrefillWorker::deliver_stage_hidden(proto::PrefillStageHiddenRequest m) {
  const std::string what =
      "prefill_stage_hidden '" + m.request_id.substr(0, 128) + "' chunk " + std::to_string(m.chunk_index);
  if (m.request_id.empty() || m.request_id.size() > 256 || m.reservation_id == 0) {
    return error(Code::kInvalidArgument, what + ": request id (1-256 bytes) and reservation id required");
  }
  const int64_t now = steady_ns();
  std::lock_guard lock(stage_mu_);
  expire_stage_locked(now);
  const auto key = std::make_pair(m.request_id, m.reservation_id);
  if (!m.failed.empty()) {
    if (stage_failed_.size() >= 4096) stage_failed_.erase(stage_failed_.begin());
    stage_failed_[key] = m.failed.substr(0, 1024);
    stage_cv_.notify_all();
    return Status::ok();
  }
  MC_RETURN_IF_ERROR(validate_stage_chunk(what, m.request_id, m.reservation_id, m.chunk_index, m.token_begin,
                                          m.token_end, static_cast<int64_t>(m.hidden.size())));
  auto& chunks = stage_inbox_[key];
  if (chunks.count(m.chunk_index) > 0) return error(Code::kInvalidArgument, what + ": already held");
  const auto bytes = static_cast<int64_t>(m.hidden.size());
  if (stage_inbox_bytes_ + bytes > options_.stage_inbox_bytes) {
    if (chunks.empty()) stage_inbox_.erase(key);
    metrics_.counter("mc_prefill_stage_hidden_refused_total", "stage hidden states refused: the inbox is full").inc();
    return error(Code::kResourceExhausted, what + ": " + std::to_string(stage_inbox_bytes_) +
                                               " bytes of hidden states already held (--stage-inbox-bytes " +
                                               std::to_string(options_.stage_inbox_bytes) + ")");
  }
  stage_inbox_bytes_ += bytes;
  const int64_t chunk_index = m.chunk_index;  // read before the move below
  chunks[chunk_index] = HeldChunk{std::move(m), now};
  metrics_.counter("mc_prefill_stage_hidden_bytes_total", "hidden-state bytes received from previous stages")
      .inc(static_cast<uint64_t>(bytes));
  stage_cv_.notify_all();
  return Status::ok();
}

Status PrefillWorker::publish_stage_segment(transfer::EngineOptions options) {
  if (stage_engine_) return error(Code::kFailedPrecondition, "prefill: stage segment already published");
  if (options.listen.empty()) {
    return error(Code::kInvalidArgument, "prefill: publishing the stage segment needs a listen endpoint");
  }
  MC_ASSIGN_OR_RETURN(
      transfer::SharedBuffer area,
      transfer::allocate_shared_buffer(static_cast<uint64_t>(options_.stage_inbox_bytes), "mc-prefill-stage"));
  stage_grant_key_ = options.grant_key;
  if (!stage_grant_key_.empty()) {
    // A grant names its slot by id: start this process's ids at a random point, so a grant issued before a restart
    // on the same port never names a slot of this life.
    std::random_device rd;
    next_stage_slot_ = ((static_cast<uint64_t>(rd()) << 16) ^ rd()) + 1;
    options.grant_scope = [this](const auth::Grant& g, transfer::Op op, uint64_t offset, uint64_t length) -> Status {
      std::lock_guard lock(stage_mu_);
      auto it = stage_slots_.find(g.id);
      if (op != transfer::Op::kWrite || it == stage_slots_.end() || offset != stage_area_base_ + it->second.offset ||
          length != static_cast<uint64_t>(it->second.chunk.bytes)) {
        metrics_.counter("mc_prefill_stage_grant_refused_total", "stage WRITEs refused: no live slot of the grant")
            .inc();
        return error(Code::kPermissionDenied, "stage slot " + std::to_string(g.id) + " is not live or not that range");
      }
      return Status::ok();
    };
  }
  MC_ASSIGN_OR_RETURN(auto engine, transfer::TransferEngine::create(std::move(options)));
  auto region = engine->register_memory(area.data(), area.size());
  if (!region.is_ok()) return region.status().with_context("prefill: registering the stage landing area");
  {
    std::lock_guard lock(stage_mu_);
    stage_area_base_ = region->segment_offset;
    stage_free_ = {{0, area.size()}};
  }
  stage_segment_ = engine->segment_name();
  stage_area_ = std::move(area);
  engine->set_notification_handler([this](const transfer::Notification& n) { on_stage_notification(n); });
  stage_engine_ = std::move(engine);
  metrics_.gauge("mc_prefill_stage_segment_published", "1 when stage hidden states land through the transfer engine")
      .set(1);
  return Status::ok();
}

std::string PrefillWorker::stage_segment() const { return stage_segment_; }

Result<proto::PrefillStageSlotReply> PrefillWorker::stage_slot(const proto::PrefillStageSlotRequest& r) {
  const std::string what =
      "prefill_stage_slot '" + r.request_id.substr(0, 128) + "' chunk " + std::to_string(r.chunk_index);
  if (!stage_engine_) {
    return error(Code::kFailedPrecondition, what +
                                                ": this instance serves no stage segment (send "
                                                "prefill_stage_hidden; mc-prefill --stage-listen)");
  }
  MC_RETURN_IF_ERROR(
      validate_stage_chunk(what, r.request_id, r.reservation_id, r.chunk_index, r.token_begin, r.token_end, r.bytes));
  const int64_t now = steady_ns();
  proto::PrefillStageSlotReply reply;
  {
    std::lock_guard lock(stage_mu_);
    expire_stage_locked(now);
    const auto bytes = static_cast<uint64_t>(r.bytes);
    auto room = std::find_if(stage_free_.begin(), stage_free_.end(), [&](const auto& f) { return f.second >= bytes; });
    if (stage_inbox_bytes_ + r.bytes > options_.stage_inbox_bytes || room == stage_free_.end()) {
      metrics_.counter("mc_prefill_stage_hidden_refused_total", "stage hidden states refused: the inbox is full").inc();
      return error(Code::kResourceExhausted, what + ": no room for " + std::to_string(r.bytes) + " bytes (" +
                                                 std::to_string(stage_inbox_bytes_) +
                                                 " held or landing, --stage-inbox-bytes " +
                                                 std::to_string(options_.stage_inbox_bytes) + "); retry later");
    }
    const uint64_t offset = room->first;
    const uint64_t left = room->second - bytes;
    stage_free_.erase(room);
    if (left > 0) stage_free_[offset + bytes] = left;
    stage_inbox_bytes_ += r.bytes;
    reply.slot_id = next_stage_slot_++;
    stage_slots_[reply.slot_id] = StageSlot{r, offset, now};
    reply.offset = stage_area_base_ + offset;
  }
  reply.segment = stage_segment_;
  if (!stage_grant_key_.empty()) {
    auth::Grant g;
    g.segment = stage_segment_;
    g.offset = reply.offset;
    g.length = static_cast<uint64_t>(r.bytes);
    g.ops = auth::kGrantWrite;
    g.expiry_unix_ms = unix_time_ns() / 1'000'000 + 2 * options_.stage_wait_timeout_ms + auth::kGrantClockSlackMs;
    g.id = reply.slot_id;
    MC_ASSIGN_OR_RETURN(reply.grant, auth::issue_grant(stage_grant_key_, g));
  }
  return reply;
}

void PrefillWorker::on_stage_notification(const transfer::Notification& note) {
  auto reject = [&](const std::string& why) {
    metrics_.counter("mc_prefill_stage_notifications_rejected_total", "stage notifications naming no live slot").inc();
    // A peer chooses tag and from: at most 128 bytes of each reach the log.
    MC_LOG_WARN << "prefill: stage notification '" << note.tag.substr(0, 128) << "' from "
                << (note.from.empty() ? "?" : note.from.substr(0, 128)) << " ignored: " << why;
  };
  const std::optional<proto::StageChunkTag> tag =
      note.op == transfer::Op::kWrite ? proto::StageChunkTag::decode(note.tag) : std::nullopt;
  if (!tag) return reject("not a stage chunk tag stage/<slot>");
  if (!stage_grant_key_.empty() && note.grant_id != tag->slot_id) {
    return reject("the tag names slot " + std::to_string(tag->slot_id) + " but the grant is slot " +
                  std::to_string(note.grant_id) + "'s");
  }
  proto::PrefillStageHiddenRequest m;
  {
    std::lock_guard lock(stage_mu_);
    auto it = stage_slots_.find(tag->slot_id);
    if (it == stage_slots_.end()) return reject("no such slot (expired or already landed)");
    const StageSlot& slot = it->second;
    if (note.segment_offset != stage_area_base_ + slot.offset ||
        note.length != static_cast<uint64_t>(slot.chunk.bytes)) {
      return reject("wrote " + std::to_string(note.length) + " B at " + std::to_string(note.segment_offset) +
                    ", the slot is " + std::to_string(slot.chunk.bytes) + " B at " +
                    std::to_string(stage_area_base_ + slot.offset));
    }
    m.request_id = slot.chunk.request_id;
    m.reservation_id = slot.chunk.reservation_id;
    m.chunk_index = slot.chunk.chunk_index;
    m.token_begin = slot.chunk.token_begin;
    m.token_end = slot.chunk.token_end;
    m.last_chunk = slot.chunk.last_chunk;
    const auto* src = static_cast<const uint8_t*>(stage_area_.data()) + slot.offset;
    m.hidden.assign(src, src + slot.chunk.bytes);
    stage_inbox_bytes_ -= slot.chunk.bytes;
    stage_free_[slot.offset] = static_cast<uint64_t>(slot.chunk.bytes);
    stage_slots_.erase(it);
  }
  metrics_.counter("mc_prefill_stage_engine_bytes_total", "hidden-state bytes landed through the transfer engine")
      .inc(m.hidden.size());
  if (Status held = deliver_stage_hidden(std::move(m)); !held.is_ok()) reject(held.message());
}

Status PrefillWorker::send_stage_hidden(const proto::PrefillJobRequest& job, const proto::PrefillStageHiddenRequest& m,
                                        int64_t* engine_bytes) {
  if (engine_) {
    proto::PrefillStageSlotRequest ask{m.request_id,
                                       m.reservation_id,
                                       m.chunk_index,
                                       m.token_begin,
                                       m.token_end,
                                       m.last_chunk,
                                       static_cast<int64_t>(m.hidden.size())};
    const int64_t deadline = steady_ns() + options_.stage_wait_timeout_ms * 1'000'000;
    int64_t backoff_ms = 2;
    Result<proto::PrefillStageSlotReply> slot = link_->stage_slot(job.next_stage_endpoint, ask);
    // The next stage's inbox is full until its job takes chunks: retry, bounded by the stage wait.
    while (!slot.is_ok() && slot.status().code() == Code::kResourceExhausted && steady_ns() < deadline &&
           !abort_jobs_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 100);
      slot = link_->stage_slot(job.next_stage_endpoint, ask);
    }
    if (slot.is_ok()) {
      if (stage_outbox_.size() < m.hidden.size()) {
        if (stage_outbox_.data() != nullptr) (void)engine_->unregister_memory(stage_outbox_.data());
        stage_outbox_ = transfer::SharedBuffer();
        MC_ASSIGN_OR_RETURN(stage_outbox_, transfer::allocate_shared_buffer(m.hidden.size(), "mc-prefill-outbox"));
        auto region = engine_->register_memory(stage_outbox_.data(), stage_outbox_.size());
        if (!region.is_ok()) {
          stage_outbox_ = transfer::SharedBuffer();
          return region.status().with_context("registering the stage outbox");
        }
      }
      std::memcpy(stage_outbox_.data(), m.hidden.data(), m.hidden.size());
      MC_ASSIGN_OR_RETURN(transfer::SegmentHandle segment, engine_->open_segment(slot->segment));
      transfer::TransferRequest w;
      w.op = transfer::Op::kWrite;
      w.local_addr = stage_outbox_.data();
      w.segment = segment;
      w.remote_offset = slot->offset;
      w.length = m.hidden.size();
      w.grant = slot->grant;
      w.notify_tag = proto::StageChunkTag{slot->slot_id}.encode();
      const int64_t wait_ms = options_.kv_transfer_timeout_ms + engine_->options().slice_timeout_ms + 1000;
      MC_ASSIGN_OR_RETURN(transfer::BatchId batch, engine_->submit(std::span<const transfer::TransferRequest>(&w, 1)));
      auto st = engine_->wait(batch, wait_ms);
      if (!st.is_ok()) return st.status();
      const transfer::TransferState state = st->state;
      const Status why = st->status;
      if (is_final(state)) (void)engine_->free_batch(batch);
      if (state != transfer::TransferState::kCompleted) {
        return (state == transfer::TransferState::kPending
                    ? error(Code::kTimeout, "still pending after " + std::to_string(wait_ms) + " ms")
                    : why)
            .with_context("transfer-engine WRITE of chunk " + std::to_string(m.chunk_index) +
                          "'s hidden states to segment " + slot->segment);
      }
      *engine_bytes += static_cast<int64_t>(m.hidden.size());
      return Status::ok();
    }
    // A next stage serving no stage segment (or a link without slots) takes the RPC; any other error is the send's.
    if (slot.status().code() != Code::kFailedPrecondition && slot.status().code() != Code::kUnimplemented) {
      return slot.status();
    }
  }
  auto sent = link_->stage_hidden(job.next_stage_endpoint, m);
  return sent.is_ok() ? Status::ok() : sent.status();
}

Result<proto::PrefillStageHiddenRequest> PrefillWorker::take_stage_hidden(const proto::PrefillJobRequest& job,
                                                                          int64_t chunk) {
  const auto key = std::make_pair(job.request_id, job.reservation_id);
  const int64_t deadline = steady_ns() + options_.stage_wait_timeout_ms * 1'000'000;
  std::unique_lock lock(stage_mu_);
  for (;;) {
    if (auto f = stage_failed_.find(key); f != stage_failed_.end()) {
      return error(Code::kAborted, "previous pipeline stage: " + f->second);
    }
    auto it = stage_inbox_.find(key);
    if (it != stage_inbox_.end()) {
      auto c = it->second.find(chunk);
      if (c != it->second.end()) {
        proto::PrefillStageHiddenRequest m = std::move(c->second.message);
        it->second.erase(c);
        if (it->second.empty()) stage_inbox_.erase(it);
        stage_inbox_bytes_ -= static_cast<int64_t>(m.hidden.size());
        return m;
      }
    }
    if (abort_jobs_.load()) {
      std::lock_guard a(abort_mu_);
      return error(Code::kUnavailable, abort_why_);
    }
    const int64_t left = deadline - steady_ns();
    if (left <= 0) {
      // kAborted, not kTimeout: the Conductor reads a timeout as the instance not answering.
      return error(Code::kAborted,
                   "chunk " + std::to_string(chunk) + " of the previous pipeline stage did not come in " +
                       std::to_string(options_.stage_wait_timeout_ms) + " ms (--stage-wait-timeout-ms)");
    }
    stage_cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 100'000'000)));
  }
}

void PrefillWorker::drop_stage_hidden(const proto::PrefillJobRequest& job) {
  const auto key = std::make_pair(job.request_id, job.reservation_id);
  std::lock_guard lock(stage_mu_);
  stage_failed_.erase(key);
  auto it = stage_inbox_.find(key);
  if (it == stage_inbox_.end()) return;
  for (const auto& [chunk, held] : it->second) stage_inbox_bytes_ -= static_cast<int64_t>(held.message.hidden.size());
  stage_inbox_.erase(it);
}

void PrefillWorker::count_prompt_ledger(const proto::RequestLedger& ledger, int64_t n, int64_t cached) {
  metrics_.counter("mc_prefill_hit_tokens_total", "prompt tokens whose KV came from the store").inc(cached);
  metrics_.counter("mc_prefill_computed_tokens_total", "prompt tokens computed").inc(n - cached);
  // The rest of the cache ledger (DESIGN.md §5) as counters.
  metrics_.counter("mc_prefill_prompt_tokens_total", "prompt tokens of the jobs run").inc(n);
  metrics_.counter("mc_prefill_hit_tokens_local_total", "hit tokens read from a replica on this host")
      .inc(ledger.hit_tokens_local);
  metrics_.counter("mc_prefill_hit_tokens_remote_total", "hit tokens read from another node's DRAM")
      .inc(ledger.hit_tokens_remote);
  metrics_.counter("mc_prefill_hit_tokens_ssd_total", "hit tokens read from a storage node's SSD")
      .inc(ledger.hit_tokens_ssd);
  metrics_.counter("mc_prefill_missed_prefix_tokens_total", "prefix tokens planned as hits, missing, recomputed")
      .inc(std::max<int64_t>(0, ledger.missed_prefix_tokens));
}

void PrefillWorker::count_fetch(const proto::RequestLedger& ledger) {
  metrics_.counter("mc_prefill_fetch_bytes_total", "KV bytes read from the store").inc(ledger.fetch_bytes);
  metrics_.counter("mc_prefill_fetch_ssd_bytes_total", "KV bytes read from SSD segments").inc(ledger.fetch_ssd_bytes);
}

Result<proto::PrefillJobReply> PrefillWorker::run_stage_inner(const proto::PrefillJobRequest& job,
                                                              std::vector<int32_t>& blocks,
                                                              proto::RequestLedger& ledger) {
  const KvLayout& layout = kv_->layout();
  const model::ModelConfig& model = backend_->model();
  const int64_t bs = layout.block_size;
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  const int64_t first_layer = job.stage_first_layer, end_layer = job.stage_first_layer + job.stage_layers;
  const bool first_stage = job.stage_index == 0, last_stage = end_layer == model.num_layers;
  const int64_t chunk =
      job.chunk_tokens > 0 ? job.chunk_tokens : (options_.chunk_tokens > 0 ? options_.chunk_tokens : n);
  const KeyNamespace ns = ns_.with_request(RequestKeyScope{job.lora_name, job.lora_version, job.salt});
  const std::vector<uint64_t> hashes = seq_hashes(job.tokens, ns);
  const std::string what = "pipeline stage " + std::to_string(job.stage_index) + " of '" + job.request_id + "'";

  // 1. The prefix. Stage 0 fetches as a whole prefill does and so decides the cached tokens; a later stage learns
  // them from stage 0's first chunk (its token_begin) and must find the same blocks: it cannot recompute its layers
  // of a prefix without the hidden states entering them.
  int64_t cached = 0;
  std::optional<proto::PrefillStageHiddenRequest> chunk0;
  if (first_stage) {
    int64_t want = (n - 1) / bs;
    if (job.fetch_prefix_blocks >= 0) want = std::min(want, job.fetch_prefix_blocks);
    const int64_t hit_blocks = fetch_prefix(job, blocks, hashes, ns, want, ledger);
    if (job.fetch_prefix_blocks >= 0) ledger.missed_prefix_tokens = (want - hit_blocks) * bs;
    cached = hit_blocks * bs;
  } else {
    auto m = take_stage_hidden(job, 0);
    if (!m.is_ok()) return m.status().with_context(what);
    cached = m->token_begin;
    if (cached % bs != 0 || cached >= n) {
      return error(Code::kInvalidArgument, what + ": the previous stage's first chunk starts at token " +
                                               std::to_string(cached) + ", not a block boundary before " +
                                               std::to_string(n));
    }
    chunk0 = std::move(m).value();
    if (cached > 0) {
      const int64_t hit_blocks = fetch_prefix(job, blocks, hashes, ns, cached / bs, ledger);
      if (hit_blocks * bs != cached) {
        return error(Code::kUnavailable,
                     what + ": prefix block " + std::to_string(hit_blocks) + " of the " + std::to_string(cached / bs) +
                         " stage 0 found could not be read here (evicted or unreachable meanwhile)");
      }
    }
  }
  ledger.hit_tokens = cached;
  ledger.computed_tokens = n - cached;
  ledger.decision = cached > 0 ? "fetch" : "recompute";
  metrics_.counter("mc_prefill_stage_jobs_total", "pipeline stage jobs run (DESIGN.md §18)").inc();
  if (first_stage) count_prompt_ledger(ledger, n, cached);  // once per prompt: at the stage that decides the prefix
  count_fetch(ledger);                                      // every stage: the bytes this instance read (its layers)

  // 2. The chunks through this stage's layers, each layer's KV streamed to decode as in a whole prefill.
  std::string target;
  MC_ASSIGN_OR_RETURN(KvSend kv_send, kv_sender(job, blocks, target));
  LayerStreamer streamer([&kv_send](const LayerSpan& sp) { return kv_send(sp.layer, sp.first, sp.end); }, target);
  int64_t writes = 0;
  uint32_t first_token = 0;
  int64_t hidden_sent_bytes = 0, hidden_engine_bytes = 0;
  const int64_t t_prefill = steady_ns();
  int64_t t_last_layer_done = 0, wait_ns = 0;
  // A chunk's hidden states go on their own thread while the next chunk computes; one send in flight at a time
  // (the outbox is one buffer), so a chunk waits here only for the previous chunk's send.
  std::future<Status> in_flight;
  auto sent = [&in_flight]() -> Status { return in_flight.valid() ? in_flight.get() : Status::ok(); };
  for (int64_t k = 0, begin = cached; begin < n; ++k) {
    const int64_t end = std::min(n, begin + chunk);
    std::vector<float> hidden_in;
    if (!first_stage) {
      const int64_t t_wait = steady_ns();
      Result<proto::PrefillStageHiddenRequest> m =
          k == 0 ? Result<proto::PrefillStageHiddenRequest>(std::move(*chunk0)) : take_stage_hidden(job, k);
      wait_ns += steady_ns() - t_wait;
      if (!m.is_ok()) return m.status().with_context(what);
      if (m->token_begin != begin || m->token_end != end || m->last_chunk != (end == n)) {
        return error(Code::kInvalidArgument, what + ": chunk " + std::to_string(k) +
                                                 " of the previous stage holds tokens [" +
                                                 std::to_string(m->token_begin) + ", " + std::to_string(m->token_end) +
                                                 "), expected [" + std::to_string(begin) + ", " + std::to_string(end) +
                                                 ") (the stages were given different chunk sizes)");
      }
      hidden_in.resize(m->hidden.size() / sizeof(float));
      std::memcpy(hidden_in.data(), m->hidden.data(), m->hidden.size());
    }
    auto on_layer = [&](int64_t layer, int64_t b, int64_t e) -> Status {
      MC_RETURN_IF_ERROR(layer_gate(job, writes));
      ++writes;
      MC_RETURN_IF_ERROR(streamer.push(LayerSpan{layer, b == cached ? 0 : b / bs, layout.blocks_for_tokens(e)}));
      if (layer == end_layer - 1 && e == n) t_last_layer_done = steady_ns();
      if (layer == end_layer - 1 && e < n) MC_RETURN_IF_ERROR(streamer.drain());  // the next chunk shares a block
      return Status::ok();
    };
    StageRequest sr;
    sr.tokens = job.tokens;
    sr.block_table = blocks;
    sr.token_begin = begin;
    sr.token_end = end;
    sr.first_layer = first_layer;
    sr.num_layers = job.stage_layers;
    sr.hidden_in = hidden_in;
    sr.lora = LoraAdapter{job.lora_name, job.lora_version};
    auto out = backend_->prefill_stage(*kv_, sr, on_layer);
    if (!out.is_ok()) return out.status().with_context(what + ", chunk " + std::to_string(k));
    if (last_stage) {
      if (end == n) first_token = out->first_token;
    } else {
      // Before the last chunk leaves, every KV byte of this stage has landed at decode: the last stage commits
      // only after that chunk, so decode never sees a commit before an earlier stage's layers.
      if (end == n) MC_RETURN_IF_ERROR(streamer.drain());
      proto::PrefillStageHiddenRequest m;
      m.request_id = job.request_id;
      m.reservation_id = job.reservation_id;
      m.chunk_index = k;
      m.token_begin = begin;
      m.token_end = end;
      m.last_chunk = end == n;
      m.hidden.resize(out->hidden_out.size() * sizeof(float));
      std::memcpy(m.hidden.data(), out->hidden_out.data(), m.hidden.size());
      hidden_sent_bytes += static_cast<int64_t>(m.hidden.size());
      MC_RETURN_IF_ERROR(sent());
      in_flight = std::async(std::launch::async, [this, &job, &what, &hidden_engine_bytes, m = std::move(m), k] {
        const Status s = send_stage_hidden(job, m, &hidden_engine_bytes);
        return s.is_ok() ? s
                         : s.with_context(what + ": sending chunk " + std::to_string(k) + "'s hidden states to " +
                                          job.next_stage_endpoint);
      });
    }
    begin = end;
  }
  MC_RETURN_IF_ERROR(sent());  // the last chunk reached the next stage
  const int64_t t_last_layer = steady_ns();
  MC_RETURN_IF_ERROR(streamer.finish());
  const int64_t t_all_kv = streamer.last_sent_ns() > 0 ? streamer.last_sent_ns() : steady_ns();
  ledger.prefill_ms = (t_last_layer - t_prefill) / 1'000'000;
  ledger.kv_tail_ms =
      std::max<int64_t>(0, t_all_kv - (t_last_layer_done > 0 ? t_last_layer_done : t_last_layer)) / 1'000'000;
  ledger.kv_sent_bytes = streamer.bytes_sent();
  metrics_.counter("mc_prefill_kv_sent_bytes_total", "KV bytes streamed to decode").inc(ledger.kv_sent_bytes);
  metrics_.counter("mc_prefill_stage_hidden_sent_bytes_total", "hidden-state bytes sent to next stages")
      .inc(static_cast<uint64_t>(hidden_sent_bytes));
  metrics_
      .counter("mc_prefill_stage_hidden_engine_sent_bytes_total",
               "of those, bytes WRITTEN through the transfer engine (the rest went as prefill_stage_hidden RPCs)")
      .inc(static_cast<uint64_t>(hidden_engine_bytes));
  metrics_
      .histogram("mc_prefill_stage_wait_seconds", metrics::latency_buckets_s(),
                 "a stage job's time waiting for its previous stage's chunks")
      .observe(static_cast<double>(wait_ns) * 1e-9);
  if (!last_stage) return proto::PrefillJobReply{job.request_id, 0, ledger};

  // 3. The last stage commits at decode: every stage's layers of every block have landed (see above).
  proto::KvCommitRequest commit{job.reservation_id, job.request_id, n, first_token, unix_time_ns(), ledger};
  commit.kv_namespace_digest = ns.digest_hex();
  // New complete blocks: no stage holds every layer of one, decode does once its check passed, so decode puts
  // them (keyed in the request's namespace by these hashes, DESIGN.md §18 "Live groups" point 5).
  if (job.store_new_blocks) {
    commit.store_first_block = cached / bs;
    commit.store_block_hashes.assign(hashes.begin() + cached / bs, hashes.begin() + n / bs);
  }
  auto committed = link_->commit(job.decode_endpoint, commit);
  if (!committed.is_ok()) return committed.status().with_context("kv_commit at " + job.decode_endpoint);
  ledger.stored_blocks = committed->store_blocks_queued;
  return proto::PrefillJobReply{job.request_id, first_token, ledger};
}

std::pair<std::string, int64_t> PrefillWorker::fetch_in_progress() const {
  std::lock_guard lock(fetch_mu_);
  if (fetch_request_id_.empty()) return {"", 0};
  return {fetch_request_id_, steady_ns() - fetch_start_ns_};
}

int64_t PrefillWorker::fetch_prefix(const proto::PrefillJobRequest& job, const std::vector<int32_t>& blocks,
                                    const std::vector<uint64_t>& hashes, const KeyNamespace& ns, int64_t want,
                                    proto::RequestLedger& ledger) {
  const KvLayout& layout = kv_->layout();
  const int64_t bs = layout.block_size;
  int64_t hit_blocks = 0;
  if (cache_ && want > 0) {
    const int64_t t0 = steady_ns();
    // A pipeline stage reads its layers of each block only (one contiguous range, checked by the block's per-layer
    // part checksums; DESIGN.md §18); a whole prefill reads whole blocks.
    const auto block_bytes = static_cast<uint64_t>(layout.block_bytes());
    const uint64_t offset =
        job.is_stage() ? static_cast<uint64_t>(job.stage_first_layer * layout.layer_block_bytes()) : 0;
    const uint64_t length =
        job.is_stage() ? static_cast<uint64_t>(job.stage_layers * layout.layer_block_bytes()) : block_bytes;
    std::vector<BlockGet> items;
    for (int64_t b = 0; b < want; ++b) {
      items.push_back({block_store_key(ns, hashes[static_cast<size_t>(b)]),
                       kv_->block_span(blocks[static_cast<size_t>(b)]).subspan(offset, length), offset, block_bytes});
    }
    const BlockCacheCounters before = cache_->counters();
    {
      std::lock_guard lock(fetch_mu_);
      fetch_request_id_ = job.request_id;
      fetch_start_ns_ = t0;
    }
    auto got = cache_->get(items);
    {
      std::lock_guard lock(fetch_mu_);
      fetch_request_id_.clear();
    }
    if (got.is_ok()) {
      while (hit_blocks < want && got.value()[static_cast<size_t>(hit_blocks)].is_ok()) ++hit_blocks;
      if (hit_blocks < want && job.fetch_prefix_blocks >= 0) {
        MC_LOG_INFO << "prefill '" << job.request_id << "': prefix block " << hit_blocks << " unavailable ("
                    << got.value()[static_cast<size_t>(hit_blocks)].to_string() << "); recomputing from there";
      }
    } else {
      MC_LOG_WARN << "prefill '" << job.request_id << "': prefix fetch from " << cache_->describe()
                  << " failed, recomputing: " << got.status().to_string();
    }
    const BlockCacheCounters after = cache_->counters();
    ledger.fetch_ms = ms_since(t0);
    ledger.fetch_us = (steady_ns() - t0) / 1000;
    metrics_
        .histogram("mc_prefill_fetch_seconds", metrics::latency_buckets_s(),
                   "prefix fetch from the store (one batch get of the cached blocks; the KV transfer in)")
        .observe(static_cast<double>(steady_ns() - t0) * 1e-9);

    // The hits split by the tier the bytes came from (DRAM here, DRAM elsewhere, SSD), in proportion to the
    // bytes each tier delivered in this call.
    const int64_t local = after.local_bytes - before.local_bytes;
    const int64_t remote = after.remote_bytes - before.remote_bytes;
    const int64_t ssd = after.ssd_bytes - before.ssd_bytes;
    const int64_t hit_tokens = hit_blocks * bs;
    const int64_t read = local + remote + ssd;
    // The bytes the cache moved (a stage's layers of each block; whole blocks when the store had to read them whole).
    ledger.fetch_bytes = read;
    ledger.hit_tokens_local = read > 0 ? hit_tokens * local / read : 0;
    ledger.hit_tokens_ssd = read > 0 ? hit_tokens * ssd / read : 0;
    ledger.hit_tokens_remote = hit_tokens - ledger.hit_tokens_local - ledger.hit_tokens_ssd;
    ledger.fetch_ssd_bytes = ssd;
    ledger.fetch_ssd_us = (after.ssd_read_ns - before.ssd_read_ns) / 1000;
    // The one host every remote byte came from, if one did (a path sample for the Conductor).
    if (remote > 0) {
      for (const auto& [host, bytes] : after.remote_bytes_by_host) {
        auto b = before.remote_bytes_by_host.find(host);
        const int64_t moved = bytes - (b == before.remote_bytes_by_host.end() ? 0 : b->second);
        if (moved == remote && !host.empty()) ledger.fetch_remote_host = host;
      }
    }
  }
  return hit_blocks;
}

Result<PrefillWorker::KvSend> PrefillWorker::kv_sender(const proto::PrefillJobRequest& job,
                                                       const std::vector<int32_t>& blocks, std::string& target) {
  std::string segment_name = job.decode_kv_segment;
  if (segment_name.empty() && engine_) {
    auto asked = link_->kv_segment(job.decode_endpoint);
    if (!asked.is_ok()) return asked.status().with_context("asking " + job.decode_endpoint + " for its KV segment");
    segment_name = asked.value();
  }
  KvSend send;
  target = job.decode_endpoint;
  if (engine_ && !segment_name.empty()) {
    auto segment = engine_->open_segment(segment_name);
    if (!segment.is_ok()) {
      return segment.status().with_context("opening the KV segment of decode instance " + job.decode_endpoint);
    }
    target = "segment " + segment_name + " (" + engine_->segment_transport(segment.value()).value_or("?") + ")";
    send = [this, &job, &blocks, seg = segment.value(), segment_name](int64_t layer, int64_t first,
                                                                      int64_t end) -> Result<int64_t> {
      Status st = write_layer_engine(job, seg, segment_name, blocks, layer, first, end);
      if (!st.is_ok()) return st;
      metrics_.counter("mc_prefill_kv_engine_writes_total", "layer spans written through the transfer engine").inc();
      return (end - first) * kv_->layout().layer_block_bytes();
    };
  } else {
    send = [this, &job, &blocks](int64_t layer, int64_t first, int64_t end) -> Result<int64_t> {
      const int64_t lbb = kv_->layout().layer_block_bytes();
      proto::KvWriteRequest w;
      w.reservation_id = job.reservation_id;
      w.layer = layer;
      w.data.resize(static_cast<size_t>((end - first) * lbb));
      for (int64_t b = first; b < end; ++b) {
        w.block_indexes.push_back(static_cast<uint32_t>(b));
        std::memcpy(w.data.data() + (b - first) * lbb,
                    kv_->layer_block_span(blocks[static_cast<size_t>(b)], layer).data(), static_cast<size_t>(lbb));
      }
      MC_RETURN_IF_ERROR(link_->write(job.decode_endpoint, w).status());
      metrics_.counter("mc_prefill_kv_rpc_writes_total", "layer spans sent as kv_write RPCs (fallback)").inc();
      return static_cast<int64_t>(w.data.size());
    };
  }
  return send;
}

Result<proto::PrefillJobReply> PrefillWorker::run_job_inner(const proto::PrefillJobRequest& job,
                                                            std::vector<int32_t>& blocks,
                                                            proto::RequestLedger& ledger) {
  const KvLayout& layout = kv_->layout();
  const int64_t bs = layout.block_size;
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  // The request's namespace: this worker's base with the job's adapter and salt (block_key.hpp).
  const KeyNamespace ns = ns_.with_request(RequestKeyScope{job.lora_name, job.lora_version, job.salt});
  const std::vector<uint64_t> hashes = seq_hashes(job.tokens, ns);

  // 1. Prefix fetch: leading complete blocks, never the one holding the last token.
  int64_t want = (n - 1) / bs;
  if (job.fetch_prefix_blocks >= 0) want = std::min(want, job.fetch_prefix_blocks);
  const int64_t hit_blocks = fetch_prefix(job, blocks, hashes, ns, want, ledger);
  const int64_t cached = hit_blocks * bs;
  ledger.hit_tokens = cached;
  if (job.fetch_prefix_blocks >= 0) ledger.missed_prefix_tokens = (want - hit_blocks) * bs;
  ledger.computed_tokens = n - cached;
  ledger.decision = cached > 0 ? "fetch" : "recompute";
  count_prompt_ledger(ledger, n, cached);
  count_fetch(ledger);

  // 2. Prefill with layer-wise streaming: transfer-engine WRITEs when decode serves a segment, else kv_write.
  std::string target;
  MC_ASSIGN_OR_RETURN(KvSend kv_send, kv_sender(job, blocks, target));
  LayerStreamer streamer([&kv_send](const LayerSpan& sp) { return kv_send(sp.layer, sp.first, sp.end); }, target);
  int64_t writes = 0;
  const int64_t num_layers = layout.num_layers;
  const int64_t t_prefill = steady_ns();
  int64_t t_last_layer_done = 0;  // when the last layer's KV was handed to the stream
  auto on_layer = [&](int64_t layer, int64_t begin, int64_t end) -> Status {
    MC_RETURN_IF_ERROR(layer_gate(job, writes));
    const int64_t first = begin == cached ? 0 : begin / bs;  // the first chunk also carries the fetched prefix
    ++writes;
    MC_RETURN_IF_ERROR(streamer.push(LayerSpan{layer, first, layout.blocks_for_tokens(end)}));
    if (layer == num_layers - 1 && end == n) t_last_layer_done = steady_ns();
    // The next chunk writes into this chunk's last block: let the stream catch up first.
    if (layer == num_layers - 1 && end < n) MC_RETURN_IF_ERROR(streamer.drain());
    return Status::ok();
  };
  PrefillRequest req{job.tokens, cached, blocks, job.chunk_tokens > 0 ? job.chunk_tokens : options_.chunk_tokens,
                     LoraAdapter{job.lora_name, job.lora_version}};
  auto result = backend_->prefill(*kv_, req, on_layer);
  const int64_t t_last_layer = steady_ns();
  Status streamed = streamer.finish();
  if (!result.is_ok()) return result.status().with_context("prefill of '" + job.request_id + "'");
  MC_RETURN_IF_ERROR(streamed);
  // The tail: last layer computed -> its last byte acknowledged by decode (the first token's logits are computed
  // meanwhile, so it can end before the backend returns).
  const int64_t t_all_kv = streamer.last_sent_ns() > 0 ? streamer.last_sent_ns() : steady_ns();
  const int64_t tail_from = t_last_layer_done > 0 ? t_last_layer_done : t_last_layer;
  const int64_t tail_ns = std::max<int64_t>(0, t_all_kv - tail_from);
  ledger.prefill_ms = (t_last_layer - t_prefill) / 1'000'000;
  ledger.kv_tail_ms = tail_ns / 1'000'000;
  metrics_
      .histogram("mc_prefill_kv_tail_seconds", metrics::latency_buckets_s(),
                 "last layer computed -> all KV acknowledged by decode (layer-wise streaming tail)")
      .observe(static_cast<double>(tail_ns) * 1e-9);
  ledger.kv_sent_bytes = streamer.bytes_sent();
  if (ledger.computed_tokens > 0 && t_last_layer > t_prefill) {
    const double rate =
        static_cast<double>(ledger.computed_tokens) / (static_cast<double>(t_last_layer - t_prefill) * 1e-9);
    const double prev = tokens_per_s_.load();
    tokens_per_s_.store(prev == 0 ? rate : 0.7 * prev + 0.3 * rate);
  }
  metrics_.histogram("mc_prefill_compute_seconds", metrics::latency_buckets_s(), "prefill compute time")
      .observe(static_cast<double>(t_last_layer - t_prefill) * 1e-9);
  metrics_.counter("mc_prefill_kv_sent_bytes_total", "KV bytes streamed to decode").inc(ledger.kv_sent_bytes);

  // 3. Commit at decode: the first token goes out now.
  proto::KvCommitRequest commit{job.reservation_id, job.request_id, n, result->first_token, unix_time_ns(), ledger};
  commit.kv_namespace_digest = ns.digest_hex();  // decode refuses KV of another namespace than the request's
  auto committed = link_->commit(job.decode_endpoint, commit);
  if (!committed.is_ok()) return committed.status().with_context("kv_commit at " + job.decode_endpoint);

  // 4. New complete blocks into the store.
  if (cache_ && job.store_new_blocks) {
    std::vector<BlockPut> puts;
    for (int64_t b = hit_blocks; b < n / bs; ++b) {
      puts.push_back(
          {block_store_key(ns, hashes[static_cast<size_t>(b)]), kv_->block_span(blocks[static_cast<size_t>(b)])});
    }
    if (!puts.empty()) {
      // Each layer a part with its own checksum, so a pipeline stage reads its layers of the block only.
      auto put = cache_->put(puts, static_cast<uint64_t>(layout.layer_block_bytes()));
      if (put.is_ok()) {
        for (const auto& s : put.value()) ledger.stored_blocks += s.is_ok() ? 1 : 0;
      } else {
        MC_LOG_WARN << "prefill '" << job.request_id << "': storing new blocks failed: " << put.status().to_string();
      }
    }
  }
  metrics_.counter("mc_prefill_stored_blocks_total", "new blocks put into the store").inc(ledger.stored_blocks);
  return proto::PrefillJobReply{job.request_id, result->first_token, ledger};
}

Status serve_prefill(PrefillWorker& worker, const PrefillServeOptions& options) {
  MC_ASSIGN_OR_RETURN(model::GpuSpec gpu, model::gpu_preset(options.gpu));
  rpc::ServerOptions so;
  so.service = "mc-prefill";
  so.bind_endpoints = {options.endpoint};
  MC_ASSIGN_OR_RETURN(auto server, rpc::RpcServer::bind(so));
  server->serve_stat(&worker.metrics());
  std::vector<std::pair<std::string, std::string>> metrics_extra;
  MC_ASSIGN_OR_RETURN(
      std::unique_ptr<metrics::HttpExporter> exporter,
      metrics::start_daemon_exporter(options.metrics_listen, so.service, &worker.metrics(), &metrics_extra));

  struct Queued {
    proto::PrefillJobRequest job;
    rpc::CallContext ctx;
    int64_t received_ns;
    int64_t key_ns = 0;  // its place in the queue (the job's queue_key_ns; none: the back)
  };
  struct Finished {
    rpc::CallContext ctx;
    Result<proto::PrefillJobReply> reply;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Queued> queue;
  std::deque<Queued> dropped;  // cancelled before they started: the job thread aborts their reservations first
  std::deque<Finished> finished;
  int64_t running_tokens = 0;
  bool job_running = false;  // the runner thread computes a job (its reply not yet in `finished`)
  bool stopping = false;

  const std::string self = resolve_conductor_options(options.conductor, "prefill").instance_id;
  bool refusing = false;  // draining: the Conductor took the notice, new jobs are refused (guarded by mu)
  server->handle<proto::PrefillJobRequest>([&](const proto::PrefillJobRequest& job,
                                               const rpc::CallContext& ctx) -> Result<proto::PrefillJobReply> {
    std::lock_guard lock(mu);
    if (refusing) {
      worker.metrics().counter("mc_prefill_refused_draining_total", "prefill jobs refused while draining").inc();
      return error(Code::kUnavailable, "prefill_job '" + job.request_id + "': mc-prefill " + self +
                                           " is draining (SIGTERM): it takes no new jobs; send it elsewhere");
    }
    if (job.queue_key_ns < 0 || job.queue_key_ns > kMaxQueueKeyNs) {
      return error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': queue_key_ns " +
                                               std::to_string(job.queue_key_ns) + " is outside [0, 2^62]");
    }
    ctx.defer();
    // The Conductor's order (queue_order.hpp): after every waiting job of a key <= its own; no key: the back.
    const int64_t key = job.queue_key_ns > 0 ? job.queue_key_ns : (queue.empty() ? 0 : queue.back().key_ns);
    const auto at = queue_insert_position(queue.begin(), queue.end(), key, 0, [](const Queued& x) { return x.key_ns; });
    queue.insert(at, Queued{job, ctx, steady_ns(), key});
    cv.notify_one();
    return proto::PrefillJobReply{};
  });
  // prefill_cancel (DESIGN.md §10 "Cancel"): a queued job leaves the queue at once; the job thread aborts its decode
  // reservation (kCancelled) before its next job and then answers its prefill_job with kCancelled. A job already
  // computing runs on (its decode instance refuses the commit).
  server->handle<proto::PrefillCancelRequest>([&](const proto::PrefillCancelRequest& req,
                                                  const rpc::CallContext&) -> Result<proto::PrefillCancelReply> {
    proto::PrefillCancelReply reply;
    std::lock_guard lock(mu);
    for (auto it = queue.begin(); it != queue.end();) {
      if (it->job.request_id == req.request_id) {
        dropped.push_back(std::move(*it));
        it = queue.erase(it);
        reply.dropped = true;
      } else {
        ++it;
      }
    }
    if (reply.dropped) {
      worker.metrics().counter("mc_prefill_cancelled_total", "queued jobs dropped: cancelled by their client").inc();
      cv.notify_one();
    }
    return reply;
  });
  // prefill_stage_hidden (DESIGN.md §18 "Live groups"): a previous stage's chunk, held for our stage job.
  server->handle<proto::PrefillStageHiddenRequest>(
      [&](const proto::PrefillStageHiddenRequest& req,
          const rpc::CallContext&) -> Result<proto::PrefillStageHiddenReply> {
        MC_RETURN_IF_ERROR(worker.deliver_stage_hidden(req));
        return proto::PrefillStageHiddenReply{};
      });
  // prefill_stage_slot: where a previous stage WRITEs a chunk through the transfer engine (its stage segment).
  server->handle<proto::PrefillStageSlotRequest>(
      [&](const proto::PrefillStageSlotRequest& req, const rpc::CallContext&) { return worker.stage_slot(req); });
  auto current_load = [&]() -> proto::WorkerLoadReply {
    proto::WorkerLoadReply l;
    l.role = "prefill";
    l.backend = worker.backend().kind();
    l.model = worker.backend().model().name;
    std::lock_guard lock(mu);
    l.queued_jobs = static_cast<int64_t>(queue.size());
    double predicted_s = 0;
    const double rate = worker.measured_tokens_per_s();
    for (const auto& q : queue) {
      const int64_t t = static_cast<int64_t>(q.job.tokens.size());
      l.queued_tokens += t;
      predicted_s += worker.backend().kind() == "sim" ? model::prefill_time_s(worker.backend().model(), gpu, t, 0)
                                                      : (rate > 0 ? static_cast<double>(t) / rate : 0.0);
    }
    l.running_tokens = running_tokens;
    l.predicted_queue_ms = static_cast<int64_t>(predicted_s * 1e3);
    l.kv_blocks_total = worker.kv().num_blocks();
    l.kv_blocks_free = worker.kv().free_blocks();
    l.kv_blocks_used = l.kv_blocks_total - l.kv_blocks_free;
    return l;
  };
  server->handle<proto::WorkerLoadRequest>(
      [&](const auto&, const auto&) -> Result<proto::WorkerLoadReply> { return current_load(); });

  std::thread runner([&] {
    for (;;) {
      Queued q;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty() || !dropped.empty(); });
        if (stopping) return;
        if (!dropped.empty()) {
          q = std::move(dropped.front());
          dropped.pop_front();
          lock.unlock();
          Status cancelled = worker.cancel_job(q.job);
          lock.lock();
          finished.push_back({std::move(q.ctx), std::move(cancelled)});
          continue;
        }
        q = std::move(queue.front());
        queue.pop_front();
        running_tokens = static_cast<int64_t>(q.job.tokens.size());
        job_running = true;
      }
      worker.metrics()
          .histogram("mc_prefill_queue_seconds", metrics::latency_buckets_s(), "prefill job received -> started")
          .observe(static_cast<double>(steady_ns() - q.received_ns) * 1e-9);
      auto reply = worker.run_job(q.job, (steady_ns() - q.received_ns) / 1'000'000);
      std::lock_guard lock(mu);
      running_tokens = 0;
      job_running = false;
      finished.push_back({std::move(q.ctx), std::move(reply)});
    }
  });

  const ConductorHeartbeatOptions conductor = resolve_conductor_options(options.conductor, "prefill");
  proto::ConductorRegisterRequest reg;
  reg.instance_id = conductor.instance_id;
  reg.role = "prefill";
  reg.host = conductor.host;
  reg.endpoint = server->endpoints().front();
  reg.kv_capacity_tokens = worker.kv().num_blocks() * worker.kv().layout().block_size;
  reg.block_size_tokens = worker.kv().layout().block_size;
  reg.key_namespace_digest = worker.key_namespace().digest_hex();
  reg.key_chain_seed = worker.key_namespace().chain_seed();
  reg.key_model_id = worker.key_namespace().model_id;
  reg.key_model_revision = worker.key_namespace().model_revision;
  reg.key_kv_dtype = worker.key_namespace().kv_dtype;
  reg.key_layout = worker.key_namespace().layout;
  reg.key_seed = worker.key_namespace().seed;
  reg.runs_pipeline_stages = worker.backend().runs_stages();
  ConductorHeartbeat heartbeat(conductor, reg, [&] {
    const proto::WorkerLoadReply l = current_load();
    proto::ConductorHeartbeatRequest hb;
    hb.queued_prefill_tokens = l.queued_tokens + l.running_tokens;
    hb.queued_prefill_jobs = l.queued_jobs + (l.running_tokens > 0 ? 1 : 0);
    auto [fetching, elapsed_ns] = worker.fetch_in_progress();
    hb.fetch_request_id = std::move(fetching);
    hb.fetch_elapsed_us = elapsed_ns / 1000;
    return hb;
  });
  Status served = heartbeat.wait_registered(conductor.start_wait_ms);
  if (served.is_ok()) {
    std::vector<std::pair<std::string, std::string>> extra = {
        {"backend", worker.backend().kind()},
        {"model", worker.backend().model().name},
        {"kv_blocks", std::to_string(worker.kv().num_blocks())},
        {"block_tokens", std::to_string(worker.kv().layout().block_size)},
        {"namespace", worker.key_namespace().digest_hex()}};
    if (!worker.stage_segment().empty()) extra.emplace_back("stage_segment", worker.stage_segment());
    extra.insert(extra.end(), metrics_extra.begin(), metrics_extra.end());
    daemon::announce_ready("mc-prefill", server->endpoints().front(), extra);
  }
  // Drain (DESIGN.md §10 "Drain"): the first stop signal starts it; new jobs are refused once the Conductor took the
  // notice (or 1 s passed: a Conductor that is down places nothing here either); the loop ends when nothing is
  // queued, running or unanswered. At the deadline (or a second signal) the jobs left fail as failed jobs do.
  bool draining = false, aborted = false;
  int64_t drain_start_ns = 0, drain_deadline_ns = 0;
  while (served.is_ok()) {
    if (daemon::stop_requested() && !draining) {
      draining = true;
      drain_start_ns = steady_ns();
      drain_deadline_ns = drain_start_ns + options.drain_timeout_s * 1'000'000'000;
      heartbeat.request_drain();
      std::lock_guard lock(mu);
      MC_LOG_INFO << "mc-prefill: draining (SIGTERM): " << queue.size() + (job_running ? 1 : 0)
                  << " job(s) held get up to " << options.drain_timeout_s << " s; a second signal ends them at once";
    }
    if (draining) {
      std::lock_guard lock(mu);
      if (!refusing && (heartbeat.drain_acknowledged() || steady_ns() - drain_start_ns > 1'000'000'000))
        refusing = true;
      if (!aborted && (steady_ns() > drain_deadline_ns || daemon::stop_now_requested())) {
        aborted = true;
        const std::string why = daemon::stop_now_requested()
                                    ? "mc-prefill " + self + " stopped (a second signal)"
                                    : "mc-prefill " + self + " drained: its drain timeout (" +
                                          std::to_string(options.drain_timeout_s) + " s) ended the job";
        MC_LOG_WARN << "mc-prefill: " << why << ": failing " << queue.size() + (job_running ? 1 : 0) << " job(s)";
        worker.metrics()
            .counter("mc_prefill_drain_aborted_total", "jobs failed by the drain timeout (or a second signal)")
            .inc(queue.size() + (job_running ? 1 : 0));
        worker.abort_jobs(why);  // queued ones fail before their compute, a running one at its next layer
        refusing = true;
        cv.notify_one();
      }
      if (refusing && queue.empty() && dropped.empty() && !job_running && finished.empty()) break;
    }
    served = server->poll_once(5);
    if (!served.is_ok()) break;
    std::deque<Finished> done;
    {
      std::lock_guard lock(mu);
      done.swap(finished);
    }
    for (auto& f : done) {
      Status s =
          f.reply.is_ok() ? server->reply_to(f.ctx, f.reply.value()) : server->reply_error_to(f.ctx, f.reply.status());
      if (!s.is_ok()) MC_LOG_WARN << "mc-prefill: reply not sent: " << s.to_string();
    }
  }
  if (draining) {
    MC_LOG_INFO << "mc-prefill: drained in " << (steady_ns() - drain_start_ns) / 1'000'000 << " ms";
  }
  heartbeat.stop();
  {
    std::lock_guard lock(mu);
    stopping = true;
    cv.notify_one();
  }
  runner.join();  // a job in progress finishes first (bounded by its RPC timeouts)
  MC_LOG_INFO << "mc-prefill: stopping";
  return served;
}

}  // namespace mc::infer
