// PrefillWorker's pipeline stages (DESIGN.md §18 "Live groups"): the checks of a stage job and of the chunks a
// previous stage sends, the inbox of those chunks (RPCs or tagged transfer-engine WRITEs into the stage segment),
// the sending of this stage's chunks, and the chunk loop of a stage's prefill (run_prefill in prefill_worker.cpp
// runs the rest of the job, as for a whole prefill).
#include <algorithm>
#include <cstring>
#include <future>
#include <random>
#include <string>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/infer/prefill_worker.hpp"
#include "mc/net/grant.hpp"

namespace mc::infer {

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

Result<TokenChoice> PrefillWorker::run_stage_chunks(const proto::PrefillJobRequest& job,
                                                    const std::vector<int32_t>& blocks, int64_t cached,
                                                    std::optional<proto::PrefillStageHiddenRequest> chunk0,
                                                    const LayerDoneFn& on_layer,
                                                    const std::function<Status()>& drain_kv, const std::string& what) {
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  const bool first_stage = job.stage_index == 0;
  const bool last_stage = job.stage_first_layer + job.stage_layers == backend_->model().num_layers;
  const int64_t chunk =
      job.chunk_tokens > 0 ? job.chunk_tokens : (options_.chunk_tokens > 0 ? options_.chunk_tokens : n);
  TokenChoice first_token;
  int64_t hidden_sent_bytes = 0, hidden_engine_bytes = 0, wait_ns = 0;
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
    StageRequest sr;
    sr.tokens = job.tokens;
    sr.block_table = blocks;
    sr.token_begin = begin;
    sr.token_end = end;
    sr.first_layer = job.stage_first_layer;
    sr.num_layers = job.stage_layers;
    sr.hidden_in = hidden_in;
    sr.lora = LoraAdapter{job.lora_name, job.lora_version};
    auto out = backend_->prefill_stage(*kv_, sr, on_layer);
    if (!out.is_ok()) return out.status().with_context(what + ", chunk " + std::to_string(k));
    if (last_stage) {
      if (end == n) first_token = choose_first_token(out->first_token, out->last_logits, job.sampling);
    } else {
      // Before the last chunk leaves, every KV byte of this stage has landed at decode: the last stage commits
      // only after that chunk, so decode never sees a commit before an earlier stage's layers.
      if (end == n) MC_RETURN_IF_ERROR(drain_kv());
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
  return first_token;
}

}  // namespace mc::infer
