#include "mc/infer/prefill_worker.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <unordered_map>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
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
  } else if (const std::string sampling = proto::sampling_error(job.sampling); !sampling.empty()) {
    bad = error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': sampling: " + sampling);
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
  auto reply = run_prefill(job, blocks.value(), ledger);
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

Result<proto::PrefillJobReply> PrefillWorker::run_prefill(const proto::PrefillJobRequest& job,
                                                          std::vector<int32_t>& blocks, proto::RequestLedger& ledger) {
  const KvLayout& layout = kv_->layout();
  const int64_t bs = layout.block_size;
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  // A whole prefill is the one stage of every layer, first and last at once.
  const bool stage = job.is_stage();
  const int64_t end_layer = stage ? job.stage_first_layer + job.stage_layers : layout.num_layers;
  const bool first_stage = !stage || job.stage_index == 0;
  const bool last_stage = !stage || end_layer == backend_->model().num_layers;
  // The request's namespace: this worker's base with the job's adapter and salt (block_key.hpp).
  const KeyNamespace ns = ns_.with_request(RequestKeyScope{job.lora_name, job.lora_version, job.salt});
  const std::vector<uint64_t> hashes = seq_hashes(job.tokens, ns);
  const std::string what = stage ? "pipeline stage " + std::to_string(job.stage_index) + " of '" + job.request_id + "'"
                                 : "prefill of '" + job.request_id + "'";

  // 1. The prefix: leading complete blocks, never the one holding the last token. The first stage (a whole prefill's
  // only one) fetches what the store has and so decides the cached tokens; a later stage learns them from stage 0's
  // first chunk (its token_begin) and must find the same blocks: it cannot recompute its layers of a prefix without
  // the hidden states entering them.
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
  if (stage) metrics_.counter("mc_prefill_stage_jobs_total", "pipeline stage jobs run (DESIGN.md §18)").inc();
  if (first_stage) count_prompt_ledger(ledger, n, cached);  // once per prompt: where the prefix is decided
  count_fetch(ledger);                                      // every stage: the bytes this instance read (its layers)

  // 2. This instance's layers, chunk by chunk, each layer's KV streamed to decode as soon as it is final:
  // transfer-engine WRITEs when decode serves a segment, else kv_write.
  std::string target;
  MC_ASSIGN_OR_RETURN(KvSend kv_send, kv_sender(job, blocks, target));
  LayerStreamer streamer([&kv_send](const LayerSpan& sp) { return kv_send(sp.layer, sp.first, sp.end); }, target);
  int64_t writes = 0;
  const int64_t t_prefill = steady_ns();
  int64_t t_last_layer_done = 0;  // when the last layer's KV was handed to the stream
  const LayerDoneFn on_layer = [&](int64_t layer, int64_t begin, int64_t end) -> Status {
    MC_RETURN_IF_ERROR(layer_gate(job, writes));
    ++writes;
    // The first chunk also carries the fetched prefix.
    MC_RETURN_IF_ERROR(
        streamer.push(LayerSpan{layer, begin == cached ? 0 : begin / bs, layout.blocks_for_tokens(end)}));
    if (layer == end_layer - 1 && end == n) t_last_layer_done = steady_ns();
    // The next chunk writes into this chunk's last block: let the stream catch up first.
    if (layer == end_layer - 1 && end < n) MC_RETURN_IF_ERROR(streamer.drain());
    return Status::ok();
  };
  Result<TokenChoice> first_token = TokenChoice{};
  if (stage) {
    first_token = run_stage_chunks(
        job, blocks, cached, std::move(chunk0), on_layer, [&] { return streamer.drain(); }, what);
  } else {
    PrefillRequest req{job.tokens, cached, blocks, job.chunk_tokens > 0 ? job.chunk_tokens : options_.chunk_tokens,
                       LoraAdapter{job.lora_name, job.lora_version}};
    Result<PrefillResult> out = backend_->prefill(*kv_, req, on_layer);
    first_token = out.is_ok()
                      ? Result<TokenChoice>(choose_first_token(out->first_token, out->last_logits, job.sampling))
                      : out.status().with_context(what);
  }
  const int64_t t_last_layer = steady_ns();
  const Status streamed = streamer.finish();
  if (!first_token.is_ok()) return first_token.status();
  MC_RETURN_IF_ERROR(streamed);
  // The tail: last layer computed -> its last byte acknowledged by decode (the first token's logits are computed
  // meanwhile, so it can end before the backend returns).
  const int64_t t_all_kv = streamer.last_sent_ns() > 0 ? streamer.last_sent_ns() : steady_ns();
  const int64_t tail_ns = std::max<int64_t>(0, t_all_kv - (t_last_layer_done > 0 ? t_last_layer_done : t_last_layer));
  ledger.prefill_ms = (t_last_layer - t_prefill) / 1'000'000;
  ledger.kv_tail_ms = tail_ns / 1'000'000;
  ledger.kv_sent_bytes = streamer.bytes_sent();
  metrics_
      .histogram("mc_prefill_kv_tail_seconds", metrics::latency_buckets_s(),
                 "last layer computed -> all KV acknowledged by decode (layer-wise streaming tail)")
      .observe(static_cast<double>(tail_ns) * 1e-9);
  metrics_.histogram("mc_prefill_compute_seconds", metrics::latency_buckets_s(), "prefill compute time")
      .observe(static_cast<double>(t_last_layer - t_prefill) * 1e-9);
  metrics_.counter("mc_prefill_kv_sent_bytes_total", "KV bytes streamed to decode").inc(ledger.kv_sent_bytes);
  // The rate the Conductor is told (a stage runs part of the layers: not a rate of whole prompts).
  if (!stage && ledger.computed_tokens > 0 && t_last_layer > t_prefill) {
    const double rate =
        static_cast<double>(ledger.computed_tokens) / (static_cast<double>(t_last_layer - t_prefill) * 1e-9);
    const double prev = tokens_per_s_.load();
    tokens_per_s_.store(prev == 0 ? rate : 0.7 * prev + 0.3 * rate);
  }
  if (!last_stage) return proto::PrefillJobReply{job.request_id, 0, ledger};

  // 3. Commit at decode: the first token goes out now. Before a pipelined prompt's last stage gets here, every
  // stage's layers of every block have landed (run_stage_chunks).
  proto::KvCommitRequest commit{job.reservation_id, job.request_id, n, first_token->token, unix_time_ns(), ledger};
  commit.first_logprobs = std::move(first_token->logprobs);
  commit.kv_namespace_digest = ns.digest_hex();  // decode refuses KV of another namespace than the request's
  // A pipelined prompt's new complete blocks: no stage holds every layer of one, decode does once its check passed,
  // so decode puts them (keyed in the request's namespace by these hashes, DESIGN.md §18 "Live groups" point 5).
  if (stage && job.store_new_blocks) {
    commit.store_first_block = cached / bs;
    commit.store_block_hashes.assign(hashes.begin() + cached / bs, hashes.begin() + n / bs);
  }
  auto committed = link_->commit(job.decode_endpoint, commit);
  if (!committed.is_ok()) return committed.status().with_context("kv_commit at " + job.decode_endpoint);
  if (stage) {
    ledger.stored_blocks = committed->store_blocks_queued;
  } else {
    store_new_blocks(job, blocks, hashes, ns, cached / bs, ledger);  // 4.
  }
  return proto::PrefillJobReply{job.request_id, first_token->token, ledger};
}

void PrefillWorker::store_new_blocks(const proto::PrefillJobRequest& job, const std::vector<int32_t>& blocks,
                                     const std::vector<uint64_t>& hashes, const KeyNamespace& ns, int64_t first_block,
                                     proto::RequestLedger& ledger) {
  const KvLayout& layout = kv_->layout();
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  if (cache_ && job.store_new_blocks) {
    std::vector<BlockPut> puts;
    for (int64_t b = first_block; b < n / layout.block_size; ++b) {
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
}

}  // namespace mc::infer
