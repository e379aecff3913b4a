// The prefill and decode workers in one process (direct DecodeLink, in-memory block cache, recording token
// sink): prefix reuse with identical tokens, recompute when the store dies, admission counting future growth,
// DESIGN.md §13.14 (bad lengths, aborted prefill, incomplete KV), and layer-wise streaming through a real
// transfer engine on loopback (decode publishes its KV segment; prefill WRITEs with layer-arrival notifications).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "mc/infer/decode_worker.hpp"
#include "mc/infer/prefill_worker.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"
#include "mc/transfer/shared_buffer.hpp"

namespace mc::infer {
namespace {

constexpr int64_t kBlock = 16;

struct Recorded {
  std::vector<uint32_t> tokens;
  std::vector<int64_t> indexes;
  std::optional<proto::RequestLedger> done;
  std::optional<proto::RequestError> error;
};

class RecordingSink final : public TokenSink {
 public:
  explicit RecordingSink(std::map<std::string, Recorded>* out) : out_(out) {}
  Status token(const std::string&, const proto::TokenEvent& e) override {
    (*out_)[e.request_id].tokens.push_back(e.token);
    (*out_)[e.request_id].indexes.push_back(e.index);
    return Status::ok();
  }
  Status done(const std::string&, const proto::RequestDone& d) override {
    (*out_)[d.request_id].done = d.ledger;
    return Status::ok();
  }
  Status fail(const std::string&, const proto::RequestError& e) override {
    (*out_)[e.request_id].error = e;
    return Status::ok();
  }

 private:
  std::map<std::string, Recorded>* out_;
};

// Decode messages go straight to the decode worker; with `next`, a pipeline stage's hidden states to the next
// stage's worker (DESIGN.md §18 "Live groups").
class DirectLink final : public DecodeLink {
 public:
  explicit DirectLink(DecodeWorker** decode, PrefillWorker** next = nullptr) : decode_(decode), next_(next) {}
  Result<proto::KvWriteReply> write(const std::string&, const proto::KvWriteRequest& r) override {
    return (*decode_)->kv_write(r);
  }
  Result<proto::KvCommitReply> commit(const std::string&, const proto::KvCommitRequest& r) override {
    return (*decode_)->commit(r);
  }
  Result<proto::DecodeReleaseReply> abort(const std::string&, const proto::DecodeAbortRequest& r) override {
    return (*decode_)->abort(r);
  }
  Result<proto::PrefillStageHiddenReply> stage_hidden(const std::string& endpoint,
                                                      const proto::PrefillStageHiddenRequest& r) override {
    if (next_ == nullptr || *next_ == nullptr) return DecodeLink::stage_hidden(endpoint, r);
    MC_RETURN_IF_ERROR((*next_)->deliver_stage_hidden(r));
    return proto::PrefillStageHiddenReply{};
  }
  Result<proto::PrefillStageSlotReply> stage_slot(const std::string& endpoint,
                                                  const proto::PrefillStageSlotRequest& r) override {
    if (next_ == nullptr || *next_ == nullptr) return DecodeLink::stage_slot(endpoint, r);
    return (*next_)->stage_slot(r);
  }

 private:
  DecodeWorker** decode_;
  PrefillWorker** next_;
};

std::unique_ptr<Backend> backend(const std::string& kind) {
  BackendOptions o;
  o.kind = kind;
  o.model = model::model_preset("tiny").value();
  o.seed = 3;
  o.time_scale = 1e6;
  o.kv_bytes_per_token = 512;
  return make_backend(o).value();
}

struct Cluster {
  std::map<std::string, Recorded> client;
  DecodeWorker* decode_ptr = nullptr;
  std::unique_ptr<DecodeWorker> decode;
  std::unique_ptr<PrefillWorker> prefill;
  MemoryBlockCache* cache = nullptr;
  ManualClock clock{1'000'000'000};

  // engine: decode publishes its KV buffer as a transfer-engine segment on loopback and prefill WRITEs into it;
  // otherwise the kv_write fallback carries the bytes.
  Cluster(const std::string& kind, bool with_cache, int64_t decode_blocks = 256, bool engine = false) {
    DecodeWorkerOptions d;
    d.block_tokens = kBlock;
    d.kv_blocks = decode_blocks;
    d.weight_seed = 3;  // the backend's seed, as the prefill's below
    decode = DecodeWorker::create(d, backend(kind), std::make_unique<RecordingSink>(&client), &clock).value();
    decode_ptr = decode.get();
    if (engine) {
      transfer::EngineOptions eo;
      eo.listen = {"tcp://127.0.0.1:0"};
      const Status published = decode->publish_kv_segment(eo);
      EXPECT_TRUE(published.is_ok()) << published.to_string();
    }
    PrefillWorkerOptions p;
    p.block_tokens = kBlock;
    p.kv_blocks = 64;
    p.chunk_tokens = 24;
    p.weight_seed = 3;
    p.allow_fault_injection = true;
    std::unique_ptr<KvBlockCache> c;
    if (with_cache) {
      auto m = std::make_unique<MemoryBlockCache>();
      cache = m.get();
      c = std::move(m);
    }
    prefill = PrefillWorker::create(p, backend(kind), std::move(c), std::make_unique<DirectLink>(&decode_ptr)).value();
  }

  // reserve + prefill job + decode to the end. Returns the prefill job's result.
  Result<proto::PrefillJobReply> run(const std::string& id, const std::vector<uint32_t>& prompt, int64_t output,
                                     int64_t fail_after_layers = -1, const RequestKeyScope& scope = {}) {
    proto::DecodeReserveRequest rr{id, static_cast<int64_t>(prompt.size()), output, "inproc://client", 0};
    rr.lora_name = scope.lora_name;
    rr.lora_version = scope.lora_version;
    rr.salt = scope.salt;
    auto res = decode->reserve(rr);
    if (!res.is_ok()) return res.status();
    proto::PrefillJobRequest job;
    job.request_id = id;
    job.tokens = prompt;
    job.output_length_tokens = output;
    job.decode_endpoint = "inproc://decode";
    job.reservation_id = res->reservation_id;
    job.decode_block_offsets_bytes = res->block_offsets_bytes;
    job.decode_kv_segment = res->kv_segment;
    job.client_endpoint = "inproc://client";
    job.fail_after_layers = fail_after_layers;
    job.lora_name = scope.lora_name;
    job.lora_version = scope.lora_version;
    job.salt = scope.salt;
    auto reply = prefill->run_job(job);
    for (int i = 0; i < 1000 && !decode->idle(); ++i) EXPECT_TRUE(decode->step().is_ok());
    EXPECT_TRUE(decode->idle());
    return reply;
  }
};

std::vector<uint32_t> make_prompt(const std::vector<uint32_t>& shared, int64_t tail, uint32_t salt) {
  std::vector<uint32_t> p = shared;
  for (int64_t i = 0; i < tail; ++i) p.push_back((salt * 31 + static_cast<uint32_t>(i) * 7 + 5) % 256);
  return p;
}

uint64_t counter(DecodeWorker& w, const std::string& name) { return w.metrics().counter(name).value(); }

void shared_prefix_run(const std::string& kind, bool engine = false) {
  SCOPED_TRACE(kind + (engine ? " through the transfer engine" : " through kv_write"));
  std::vector<uint32_t> shared;
  for (int i = 0; i < 2 * kBlock; ++i) shared.push_back(static_cast<uint32_t>((i * 37 + 11) % 256));
  const std::vector<std::vector<uint32_t>> prompts = {make_prompt(shared, 9, 1), make_prompt(shared, 21, 2),
                                                      make_prompt(shared, 5, 3)};
  // The reference run always uses the kv_write fallback: the engine path must give the very same tokens.
  Cluster cached(kind, true, 256, engine), uncached(kind, false);
  int64_t sent_bytes = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    auto a = cached.run(id, prompts[i], 12);
    auto b = uncached.run(id, prompts[i], 12);
    ASSERT_TRUE(a) << a.status().to_string();
    ASSERT_TRUE(b) << b.status().to_string();
    EXPECT_EQ(b->ledger.hit_tokens, 0);
    EXPECT_EQ(b->ledger.decision, "recompute");
    if (i == 0) {
      EXPECT_EQ(a->ledger.hit_tokens, 0);
      EXPECT_GE(a->ledger.stored_blocks, 2);
    } else {
      EXPECT_EQ(a->ledger.hit_tokens, 2 * kBlock) << id;
      EXPECT_EQ(a->ledger.hit_tokens_local, 2 * kBlock);
      EXPECT_EQ(a->ledger.decision, "fetch");
      EXPECT_EQ(a->ledger.computed_tokens, static_cast<int64_t>(prompts[i].size()) - 2 * kBlock);
      EXPECT_EQ(a->ledger.fetch_bytes, 2 * cached.prefill->kv().layout().block_bytes());
    }
    const auto& got = cached.client[id];
    const auto& want = uncached.client[id];
    ASSERT_TRUE(got.done.has_value()) << id;
    EXPECT_FALSE(got.error.has_value());
    EXPECT_EQ(got.tokens.size(), 12u);
    EXPECT_EQ(got.tokens, want.tokens) << id << ": cache hit changed the output";
    EXPECT_EQ(got.done->hit_tokens, a->ledger.hit_tokens);
    EXPECT_EQ(got.done->output_tokens, 12);
    EXPECT_EQ(got.tokens.front(), a->first_token);
    for (size_t k = 0; k < got.indexes.size(); ++k) EXPECT_EQ(got.indexes[k], static_cast<int64_t>(k));
    // Every prompt block's every layer went to decode, prefix included (a block split by a chunk boundary of
    // the 24-token chunks goes twice).
    const int64_t blocks = (static_cast<int64_t>(prompts[i].size()) + kBlock - 1) / kBlock;
    EXPECT_GE(a->ledger.kv_sent_bytes, blocks * cached.decode->kv().layout().block_bytes()) << id;
    sent_bytes += a->ledger.kv_sent_bytes;
  }
  DecodeWorker& d = *cached.decode;
  if (engine) {
    EXPECT_EQ(counter(d, "mc_decode_kv_write_calls_total"), 0u) << "bytes went over kv_write RPCs";
    EXPECT_EQ(counter(d, "mc_decode_kv_engine_bytes_total"), static_cast<uint64_t>(sent_bytes));
    EXPECT_GE(counter(d, "mc_decode_kv_notifications_total"), prompts.size() * 4u);  // tiny: 4 layers
    EXPECT_EQ(counter(d, "mc_decode_kv_notifications_rejected_total"), 0u);
    EXPECT_GT(cached.prefill->metrics().counter("mc_prefill_kv_engine_writes_total").value(), 0u);
    EXPECT_EQ(cached.prefill->metrics().counter("mc_prefill_kv_rpc_writes_total").value(), 0u);
  } else {
    EXPECT_EQ(counter(d, "mc_decode_kv_engine_bytes_total"), 0u);
    EXPECT_GT(counter(d, "mc_decode_kv_write_calls_total"), 0u);
  }
  EXPECT_EQ(counter(d, "mc_decode_kv_received_bytes_total"), static_cast<uint64_t>(sent_bytes));
  EXPECT_EQ(cached.decode->load().kv_blocks_committed, 0);
  EXPECT_EQ(cached.decode->kv().free_blocks(), cached.decode->kv().num_blocks());
}

TEST(Workers, SharedPrefixHitsAndGivesTheSameTokensRef) { shared_prefix_run("ref"); }
TEST(Workers, SharedPrefixHitsAndGivesTheSameTokensSim) { shared_prefix_run("sim"); }
TEST(Workers, LayerWiseStreamingThroughTheTransferEngineRef) { shared_prefix_run("ref", /*engine=*/true); }
TEST(Workers, LayerWiseStreamingThroughTheTransferEngineSim) { shared_prefix_run("sim", /*engine=*/true); }

TEST(Workers, EngineReserveReplyNamesTheSegmentAndItsOffsets) {
  Cluster c("ref", false, 64, /*engine=*/true);
  const std::string seg = c.decode->kv_segment();
  ASSERT_FALSE(seg.empty());
  EXPECT_EQ(seg.rfind("127.0.0.1:", 0), 0u) << seg;
  auto res = c.decode->reserve({"r", 40, 4, "inproc://c", 0}).value();
  EXPECT_EQ(res.kv_segment, seg);
  EXPECT_EQ(c.decode->load().kv_segment, seg);
  ASSERT_EQ(res.block_offsets_bytes.size(), 3u);
  for (uint64_t off : res.block_offsets_bytes) EXPECT_EQ(off % static_cast<uint64_t>(res.block_bytes), 0u);
  // Without a segment: no name, kv_write only.
  Cluster plain("ref", false, 64);
  EXPECT_EQ(plain.decode->reserve({"r", 40, 4, "inproc://c", 0}).value().kv_segment, "");
}

// Field report #14: a prefill aborted after 2 layers of a 50-token prompt. The request fails with kAborted,
// the client gets an error and never a token or a completion, and decode's KV is back where it was.
// Returns the prompt, for a follow-up request.
std::vector<uint32_t> expect_aborted_prefill_never_generates(Cluster& c) {
  const int64_t baseline = c.decode->kv().free_blocks();
  std::vector<uint32_t> prompt;
  for (int i = 0; i < 50; ++i) prompt.push_back(static_cast<uint32_t>((i * 5) % 256));
  auto r = c.run("doomed", prompt, 20, /*fail_after_layers=*/2);
  EXPECT_FALSE(r);
  if (!r) {
    EXPECT_EQ(r.status().code(), Code::kAborted);
  }
  const auto& got = c.client["doomed"];
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_FALSE(got.done.has_value()) << "a successful completion after an abort";
  EXPECT_TRUE(got.error.has_value());
  EXPECT_EQ(c.decode->kv().free_blocks(), baseline);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  return prompt;
}

TEST(Workers, FieldReport14AbortedPrefillThroughTheEngineNeverGenerates) {
  Cluster c("ref", true, 256, /*engine=*/true);
  const std::vector<uint32_t> prompt = expect_aborted_prefill_never_generates(c);
  ASSERT_FALSE(HasFailure());
  EXPECT_GT(counter(*c.decode, "mc_decode_kv_notifications_total"), 0u) << "some layers did arrive";
  // The instance still serves a legal request afterwards.
  ASSERT_TRUE(c.run("fine", prompt, 3));
  EXPECT_TRUE(c.client["fine"].done.has_value());
}

// Notifications that do not name a reserved range are refused; one for a live reservation poisons it, so the
// commit fails and nothing is generated from KV that landed in the wrong place.
TEST(Workers, MalformedKvNotificationsAreRefused) {
  Cluster c("ref", false, 64, /*engine=*/true);
  auto res = c.decode->reserve({"p", 20, 5, "inproc://c", 0}).value();  // 2 blocks
  const uint64_t lbb = static_cast<uint64_t>(res.layer_block_bytes);
  auto note = [&](const std::string& tag, uint64_t offset, uint64_t length) {
    c.decode->on_kv_notification(transfer::Notification{tag, "127.0.0.1:1", transfer::Op::kWrite, offset, length});
  };
  note("garbage", 0, lbb);
  note("kv/999/0/0-1", res.block_offsets_bytes[0], lbb);  // unknown reservation
  const std::string id = std::to_string(res.reservation_id);
  EXPECT_EQ(counter(*c.decode, "mc_decode_kv_notifications_rejected_total"), 2u);
  for (int64_t l = 0; l < 4; ++l) {
    note("kv/" + id + "/" + std::to_string(l) + "/0-2", res.block_offsets_bytes[1] + l * lbb, lbb);
  }
  EXPECT_EQ(counter(*c.decode, "mc_decode_kv_notifications_rejected_total"), 2u);
  note("kv/" + id + "/1/0-2", res.block_offsets_bytes[0] + lbb, lbb);  // wrong offset for block 1 of layer 1
  note("kv/" + id + "/0/0-3", res.block_offsets_bytes[0], lbb);        // block range too long
  EXPECT_EQ(counter(*c.decode, "mc_decode_kv_notifications_rejected_total"), 4u);
  auto commit = c.decode->commit({res.reservation_id, "p", 20, 1, 0, {}});
  ASSERT_FALSE(commit);
  EXPECT_EQ(commit.status().code(), Code::kDataLoss);
  EXPECT_NE(commit.status().message().find("disagree on the KV layout"), std::string::npos)
      << commit.status().to_string();
  ASSERT_TRUE(c.decode->step());
  EXPECT_TRUE(c.client["p"].tokens.empty());
  ASSERT_TRUE(c.client["p"].error.has_value());
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
}

// A prefill may still WRITE into the blocks of a reservation that expired: with a published segment they stay
// held (and counted) until the prefill's abort/commit for it, or expired_hold_ms.
TEST(Workers, ExpiredReservationBlocksHeldUntilThePrefillIsDone) {
  Cluster c("ref", false, 64, /*engine=*/true);
  auto a = c.decode->reserve({"a", 20, 5, "inproc://c", 50}).value();
  auto b = c.decode->reserve({"b", 20, 5, "inproc://c", 50}).value();
  const int64_t held = c.decode->load().kv_blocks_committed;
  c.clock.advance_ms(51);
  ASSERT_TRUE(c.decode->step());
  EXPECT_EQ(c.decode->load().reservations, 0);
  ASSERT_TRUE(c.client["a"].error.has_value());
  EXPECT_EQ(c.client["a"].error->code, static_cast<uint16_t>(Code::kTimeout));
  EXPECT_EQ(c.decode->load().kv_blocks_committed, held) << "blocks freed while a prefill may still write";
  // The prefill of "a" ends: its abort frees the blocks; the client is not told twice.
  auto aborted = c.decode->abort({a.reservation_id, static_cast<uint16_t>(Code::kNotFound), "commit refused"});
  ASSERT_TRUE(aborted);
  EXPECT_TRUE(aborted->released);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, held / 2);
  // "b" never hears from its prefill: freed after expired_hold_ms (60 s by default).
  c.clock.advance_ms(60'001);
  ASSERT_TRUE(c.decode->step());
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  EXPECT_EQ(c.decode->kv().free_blocks(), c.decode->kv().num_blocks());
  EXPECT_EQ(c.decode->commit({b.reservation_id, "b", 20, 1, 0, {}}).status().code(), Code::kNotFound);
}

TEST(Workers, DecodeReportsFirstTokenDoneAndFailureToTheConductor) {
  Cluster c("ref", false, 256);
  std::vector<proto::ConductorJobReportRequest> reports;
  c.decode->set_job_reporter([&](proto::ConductorJobReportRequest r) { reports.push_back(std::move(r)); });
  std::vector<uint32_t> prompt(30, 9);
  ASSERT_TRUE(c.run("ok", prompt, 5));
  ASSERT_FALSE(c.run("bad", prompt, 5, /*fail_after_layers=*/1));
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].request_id, "ok");
  EXPECT_EQ(reports[0].phase, proto::kPhaseFirstToken);
  EXPECT_GT(reports[0].event_unix_ns, 0);
  EXPECT_EQ(reports[1].request_id, "ok");
  EXPECT_EQ(reports[1].phase, proto::kPhaseDone);
  EXPECT_EQ(reports[1].output_tokens, 5);
  EXPECT_GE(reports[1].event_unix_ns, reports[0].event_unix_ns);
  EXPECT_EQ(reports[2].request_id, "bad");
  EXPECT_EQ(reports[2].phase, proto::kPhaseFailed);
  EXPECT_NE(reports[2].message.find("injected"), std::string::npos) << reports[2].message;
}

TEST(Workers, DeadStoreMeansRecomputeNotError) {
  std::vector<uint32_t> shared;
  for (int i = 0; i < 3 * kBlock; ++i) shared.push_back(static_cast<uint32_t>((i * 13 + 1) % 256));
  Cluster c("ref", true), ref("ref", false);
  ASSERT_TRUE(c.run("warm", make_prompt(shared, 4, 9), 3));
  c.cache->set_available(false);
  const auto prompt = make_prompt(shared, 7, 10);
  auto r = c.run("cold", prompt, 8);
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->ledger.hit_tokens, 0);
  EXPECT_EQ(r->ledger.decision, "recompute");
  ASSERT_TRUE(ref.run("cold", prompt, 8));
  EXPECT_EQ(c.client["cold"].tokens, ref.client["cold"].tokens);
  ASSERT_TRUE(c.client["cold"].done.has_value());
}

TEST(Workers, ExplicitPrefixMissIsRecordedAndRecomputed) {
  Cluster c("ref", true);
  std::vector<uint32_t> prompt;
  for (int i = 0; i < 3 * kBlock + 2; ++i) prompt.push_back(static_cast<uint32_t>(i % 256));
  auto res = c.decode->reserve({"x", static_cast<int64_t>(prompt.size()), 2, "inproc://c", 0}).value();
  proto::PrefillJobRequest job;
  job.request_id = "x";
  job.tokens = prompt;
  job.fetch_prefix_blocks = 2;  // the conductor believed two blocks were cached: they are not
  job.decode_endpoint = "inproc://d";
  job.reservation_id = res.reservation_id;
  job.decode_block_offsets_bytes = res.block_offsets_bytes;
  auto r = c.prefill->run_job(job);
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->ledger.hit_tokens, 0);
  EXPECT_EQ(r->ledger.missed_prefix_tokens, 2 * kBlock);
  EXPECT_EQ(r->ledger.computed_tokens, static_cast<int64_t>(prompt.size()));
}

TEST(Workers, AdmissionCountsFutureGrowth) {
  // 10 blocks of 16 tokens. Each request: 40-token prompt (3 blocks now) growing to 40 + 60 = 100 tokens
  // (7 blocks). Both fit now (6 blocks) but not at full length (14): the second must be refused.
  Cluster c("ref", false, 10);
  auto first = c.decode->reserve({"a", 40, 60, "inproc://c", 0});
  ASSERT_TRUE(first) << first.status().to_string();
  EXPECT_EQ(first->free_blocks, 3);
  auto second = c.decode->reserve({"b", 40, 60, "inproc://c", 0});
  ASSERT_FALSE(second);
  EXPECT_EQ(second.status().code(), Code::kRejected);
  EXPECT_NE(second.status().message().find("full length"), std::string::npos);
  // A request that fits within what is left is admitted.
  EXPECT_TRUE(c.decode->reserve({"c", 16, 32, "inproc://c", 0}));
  EXPECT_TRUE(c.decode->release({first->reservation_id}).value().released);
  EXPECT_FALSE(c.decode->release({first->reservation_id}).value().released);
  EXPECT_TRUE(c.decode->reserve({"b", 40, 60, "inproc://c", 0}));
}

TEST(Workers, FieldReport14BadLengthsRejectedBeforeAllocation) {
  Cluster c("ref", false, 4096);  // tiny: max context 32768
  const int64_t baseline = c.decode->kv().free_blocks();
  auto too_long = c.decode->reserve({"long", 32777, 100, "inproc://c", 0});
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.status().code(), Code::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("input too long"), std::string::npos);
  for (int64_t bad : {int64_t{0}, int64_t{-5}, int64_t{1} << 31, std::numeric_limits<int64_t>::max()}) {
    auto r = c.decode->reserve({"bad", bad, 10, "inproc://c", 0});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  // output that would overflow input + output
  EXPECT_FALSE(c.decode->reserve({"ovf", 10, std::numeric_limits<int64_t>::max(), "inproc://c", 0}));
  EXPECT_EQ(c.decode->kv().free_blocks(), baseline);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  EXPECT_TRUE(c.client.empty()) << "no tokens for rejected requests";
}

TEST(Workers, FieldReport14AbortedPrefillNeverGenerates) {
  Cluster c("ref", true);
  expect_aborted_prefill_never_generates(c);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(c.client["doomed"].error->code, static_cast<uint16_t>(Code::kAborted));
  EXPECT_EQ(c.cache->size(), 0u) << "a failed prefill stores nothing";
}

TEST(Workers, CommitWithMissingLayersIsRefused) {
  Cluster c("ref", false);
  auto res = c.decode->reserve({"partial", 20, 5, "inproc://c", 0}).value();
  proto::KvWriteRequest w;
  w.reservation_id = res.reservation_id;
  w.layer = 0;
  w.block_indexes = {0, 1};
  w.data.assign(static_cast<size_t>(2 * res.layer_block_bytes), 0);
  ASSERT_TRUE(c.decode->kv_write(w));
  // Malformed writes are refused, nothing copied.
  auto bad = w;
  bad.block_indexes = {0, 5};
  EXPECT_EQ(c.decode->kv_write(bad).status().code(), Code::kOutOfRange);
  bad = w;
  bad.data.pop_back();
  EXPECT_EQ(c.decode->kv_write(bad).status().code(), Code::kInvalidArgument);
  bad = w;
  bad.layer = 99;
  EXPECT_FALSE(c.decode->kv_write(bad));
  auto commit = c.decode->commit({res.reservation_id, "partial", 20, 1, 0, {}});
  ASSERT_FALSE(commit);
  EXPECT_EQ(commit.status().code(), Code::kDataLoss);
  ASSERT_TRUE(c.decode->step());
  ASSERT_TRUE(c.client["partial"].error.has_value());
  EXPECT_TRUE(c.client["partial"].tokens.empty());
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  EXPECT_EQ(c.decode->kv_write(w).status().code(), Code::kNotFound);
}

// The request's key scope (DESIGN.md §4.1): equal scopes share blocks, another adapter, version or salt never
// does; the adapter changes the KV bytes (a seeded low-rank delta), the salt only the keys.
void key_scope_run(const std::string& kind) {
  SCOPED_TRACE(kind);
  Cluster c(kind, true);
  std::vector<uint32_t> prompt;
  for (int i = 0; i < 2 * kBlock + 7; ++i) prompt.push_back(static_cast<uint32_t>((i * 53 + 3) % 256));
  const RequestKeyScope base{}, a1{"a", "1", ""}, a2{"a", "2", ""}, b1{"b", "1", ""}, a1t{"a", "1", "t"};
  struct Step {
    RequestKeyScope scope;
    int64_t hit_tokens;
  };
  const std::vector<Step> steps = {{base, 0}, {a1, 0},  {a1, 2 * kBlock},  {a2, 0},
                                   {b1, 0},   {a1t, 0}, {base, 2 * kBlock}};
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string id = "s" + std::to_string(i);
    auto r = c.run(id, prompt, 4, -1, steps[i].scope);
    ASSERT_TRUE(r) << r.status().to_string();
    EXPECT_EQ(r->ledger.hit_tokens, steps[i].hit_tokens) << id << " " << steps[i].scope.describe();
    ASSERT_TRUE(c.client[id].done.has_value()) << id;
  }
  EXPECT_EQ(c.cache->size(), 5u * 2u);  // two blocks in each of the five namespaces
  // Block 0's bytes per namespace.
  const KeyNamespace ns = kv_namespace(c.prefill->backend(), kBlock, 3);
  const uint64_t block_bytes = static_cast<uint64_t>(c.prefill->kv().layout().block_bytes());
  auto block0 = [&](const RequestKeyScope& scope) {
    const KeyNamespace scoped = ns.with_request(scope);
    std::vector<std::byte> buf(block_bytes);
    BlockGet g{block_store_key(scoped, seq_hashes(prompt, scoped)[0]), buf};
    auto got = c.cache->get(std::span<const BlockGet>(&g, 1));
    EXPECT_TRUE(got.is_ok() && got->front().is_ok()) << scope.describe();
    return buf;
  };
  EXPECT_NE(block0(base), block0(a1));
  EXPECT_NE(block0(a1), block0(a2));
  EXPECT_NE(block0(a1), block0(b1));
  EXPECT_EQ(block0(a1), block0(a1t)) << "a salt changes the keys, not the KV";
}

TEST(Workers, KeyScopeSeparatesBlocksRef) { key_scope_run("ref"); }
TEST(Workers, KeyScopeSeparatesBlocksSim) { key_scope_run("sim"); }

// The adapter also changes what is generated: the same prompt under two adapters gives other tokens (ref).
TEST(Workers, AdapterChangesTheOutputRef) {
  Cluster c("ref", false);
  std::vector<uint32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<uint32_t>((i * 29 + 1) % 256));
  ASSERT_TRUE(c.run("base", prompt, 8));
  ASSERT_TRUE(c.run("x", prompt, 8, -1, {"x", "1", ""}));
  ASSERT_TRUE(c.run("x-again", prompt, 8, -1, {"x", "1", ""}));
  EXPECT_NE(c.client["base"].tokens, c.client["x"].tokens);
  EXPECT_EQ(c.client["x"].tokens, c.client["x-again"].tokens);
}

// Decode refuses KV of another namespace than the request's: the reservation is freed, the client told.
TEST(Workers, CommitOfAnotherNamespaceIsRefused) {
  Cluster c("ref", false);
  proto::DecodeReserveRequest rr{"foreign", 20, 5, "inproc://c", 0};
  rr.lora_name = "a";
  rr.lora_version = "1";
  auto res = c.decode->reserve(rr).value();
  proto::KvWriteRequest w;
  w.reservation_id = res.reservation_id;
  w.block_indexes = {0, 1};
  w.data.assign(static_cast<size_t>(2 * res.layer_block_bytes), 0);
  for (int64_t l = 0; l < c.decode->kv().layout().num_layers; ++l) {
    w.layer = l;
    ASSERT_TRUE(c.decode->kv_write(w));
  }
  const KeyNamespace other = kv_namespace(c.decode->backend(), kBlock, 3).with_request({"a", "2", ""});
  proto::KvCommitRequest commit{res.reservation_id, "foreign", 20, 1, 0, {}, other.digest_hex()};
  auto refused = c.decode->commit(commit);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("a@1"), std::string::npos) << refused.status().message();
  ASSERT_TRUE(c.decode->step());
  ASSERT_TRUE(c.client["foreign"].error.has_value());
  EXPECT_TRUE(c.client["foreign"].tokens.empty());
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  // A bad scope is refused at reservation.
  rr.lora_name = "";
  EXPECT_EQ(c.decode->reserve(rr).status().code(), Code::kInvalidArgument);
}

TEST(Workers, ReservationExpiresWithoutCommit) {
  Cluster c("ref", false);
  auto res = c.decode->reserve({"late", 20, 5, "inproc://c", 50}).value();
  ASSERT_TRUE(c.decode->step());
  EXPECT_EQ(c.decode->load().reservations, 1);
  c.clock.advance_ms(51);
  ASSERT_TRUE(c.decode->step());
  EXPECT_EQ(c.decode->load().reservations, 0);
  ASSERT_TRUE(c.client["late"].error.has_value());
  EXPECT_EQ(c.client["late"].error->code, static_cast<uint16_t>(Code::kTimeout));
}

TEST(Workers, BadJobsAbortTheReservation) {
  Cluster c("ref", false);
  auto res = c.decode->reserve({"j", 10, 5, "inproc://c", 0}).value();
  proto::PrefillJobRequest job;
  job.request_id = "j";
  job.tokens = std::vector<uint32_t>(10, 300);  // outside the vocabulary (256)
  job.decode_endpoint = "inproc://d";
  job.reservation_id = res.reservation_id;
  job.decode_block_offsets_bytes = res.block_offsets_bytes;
  EXPECT_EQ(c.prefill->run_job(job).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(c.decode->step());
  ASSERT_TRUE(c.client["j"].error.has_value());
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
}

// The RPC link to decode instances: a decode endpoint that did not answer is not called again during its
// back-off, so the jobs queued behind a dead decode instance fail at once instead of each waiting out a timeout.
// decode_cancel (DESIGN.md §10 "Cancel") of a reservation not yet committed: freed (with a segment, its blocks held
// until the prefill is done writing), the client told kCancelled, the commit refused kCancelled.
void cancel_reservation_run(bool engine) {
  Cluster c("ref", false, 64, engine);
  auto a = c.decode->reserve({"a", 20, 5, "inproc://c", 0}).value();
  auto b = c.decode->reserve({"b", 20, 5, "inproc://c", 0}).value();
  const int64_t committed = c.decode->load().kv_blocks_committed;
  auto cancelled = c.decode->cancel({"a"});
  ASSERT_TRUE(cancelled) << cancelled.status().to_string();
  EXPECT_TRUE(cancelled->found);
  EXPECT_EQ(c.decode->load().reservations, 1);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, engine ? committed : committed / 2)
      << "with a segment the blocks stay held while the prefill may write";
  ASSERT_TRUE(c.decode->step());
  ASSERT_TRUE(c.client["a"].error.has_value());
  EXPECT_EQ(c.client["a"].error->code, static_cast<uint16_t>(Code::kCancelled));
  EXPECT_FALSE(c.client["a"].done.has_value());
  auto commit = c.decode->commit({a.reservation_id, "a", 20, 1, 0, {}});
  EXPECT_EQ(commit.status().code(), Code::kCancelled) << commit.status().to_string();
  EXPECT_EQ(c.decode->load().kv_blocks_committed, committed / 2);
  // The prefill's abort after its refused commit frees nothing more and tells the client nothing more.
  c.client.erase("a");
  EXPECT_FALSE(
      c.decode->abort({a.reservation_id, static_cast<uint16_t>(Code::kCancelled), "commit refused"}).value().released);
  ASSERT_TRUE(c.decode->step());
  EXPECT_EQ(c.client.count("a"), 0u);
  EXPECT_FALSE(c.decode->cancel({"a"}).value().found) << "cancelled before: nothing left";
  EXPECT_EQ(c.decode->metrics().counter("mc_decode_cancelled_total").value(), 1u);
  EXPECT_TRUE(c.decode->release({b.reservation_id}).value().released);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  EXPECT_EQ(c.decode->kv().free_blocks(), c.decode->kv().num_blocks());
}
TEST(Workers, CancelFreesAReservationAndRefusesItsCommit) { cancel_reservation_run(/*engine=*/false); }
TEST(Workers, CancelFreesAReservationAndRefusesItsCommitEngine) { cancel_reservation_run(/*engine=*/true); }

// decode_cancel of a request in the batch: it leaves at the next step with its KV freed; the client gets
// request_error kCancelled with the tokens sent so far and never request_done; the other request runs on.
TEST(Workers, CancelStopsARunningSequenceAndFreesItsKv) {
  Cluster c("ref", false, 256);
  std::vector<uint32_t> prompt(40, 7);
  std::vector<uint64_t> reservations;
  for (const std::string id : {"stay", "go"}) {
    auto res = c.decode->reserve({id, 40, 50, "inproc://c", 0}).value();
    proto::PrefillJobRequest job;
    job.request_id = id;
    job.tokens = prompt;
    job.output_length_tokens = 50;
    job.decode_endpoint = "inproc://decode";
    job.reservation_id = res.reservation_id;
    job.decode_block_offsets_bytes = res.block_offsets_bytes;
    job.client_endpoint = "inproc://c";
    ASSERT_TRUE(c.prefill->run_job(job));
  }
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.decode->step());
  ASSERT_EQ(c.decode->load().batch_size, 2);
  const int64_t sent = static_cast<int64_t>(c.client["go"].tokens.size());
  ASSERT_GT(sent, 1);
  auto cancelled = c.decode->cancel({"go"});
  ASSERT_TRUE(cancelled);
  EXPECT_TRUE(cancelled->found);
  ASSERT_TRUE(c.decode->step());
  EXPECT_EQ(c.decode->load().batch_size, 1);
  ASSERT_TRUE(c.client["go"].error.has_value());
  EXPECT_EQ(c.client["go"].error->code, static_cast<uint16_t>(Code::kCancelled));
  EXPECT_EQ(c.client["go"].error->output_tokens, sent);
  EXPECT_EQ(static_cast<int64_t>(c.client["go"].tokens.size()), sent) << "no token after the cancel";
  for (int i = 0; i < 1000 && !c.decode->idle(); ++i) ASSERT_TRUE(c.decode->step());
  EXPECT_FALSE(c.client["go"].done.has_value());
  ASSERT_TRUE(c.client["stay"].done.has_value());
  EXPECT_EQ(c.client["stay"].tokens.size(), 50u);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  EXPECT_EQ(c.decode->load().kv_blocks_used, 0);
  EXPECT_FALSE(c.decode->cancel({"stay"}).value().found) << "finished: nothing to cancel";
  EXPECT_EQ(c.decode->metrics().counter("mc_decode_cancelled_total").value(), 1u);
}

// A queued prefill job dropped by prefill_cancel: its reservation is aborted with kCancelled, the client told once.
TEST(Workers, CancelledQueuedJobAbortsItsReservation) {
  Cluster c("ref", false, 64);
  auto res = c.decode->reserve({"q", 20, 5, "inproc://c", 0}).value();
  proto::PrefillJobRequest job;
  job.request_id = "q";
  job.tokens.assign(20, 3);
  job.output_length_tokens = 5;
  job.decode_endpoint = "inproc://decode";
  job.reservation_id = res.reservation_id;
  job.decode_block_offsets_bytes = res.block_offsets_bytes;
  const Status st = c.prefill->cancel_job(job);
  EXPECT_EQ(st.code(), Code::kCancelled);
  EXPECT_EQ(c.decode->load().reservations, 0);
  EXPECT_EQ(c.decode->load().kv_blocks_committed, 0);
  ASSERT_TRUE(c.decode->step());
  ASSERT_TRUE(c.client["q"].error.has_value());
  EXPECT_EQ(c.client["q"].error->code, static_cast<uint16_t>(Code::kCancelled));
  EXPECT_EQ(c.prefill->metrics().counter("mc_prefill_jobs_done_total").value(), 0u);
}

TEST(RpcDecodeLink, AnEndpointThatDidNotAnswerFailsFastDuringItsBackOff) {
  auto link = make_rpc_decode_link(200);
  const std::string gone = "ipc:///tmp/mc-worker-test-no-decode-" + std::to_string(::getpid());  // nobody there
  EXPECT_TRUE(link->reachable(gone).is_ok());
  auto first = link->abort(gone, proto::DecodeAbortRequest{1, 0, "test"});
  ASSERT_FALSE(first.is_ok());
  EXPECT_EQ(first.status().code(), Code::kTimeout) << first.status().to_string();
  const Status down = link->reachable(gone);
  EXPECT_EQ(down.code(), Code::kUnavailable) << down.to_string();
  EXPECT_NE(down.message().find(gone), std::string::npos) << down.message();
  auto second = link->commit(gone, proto::KvCommitRequest{});
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable) << second.status().to_string();
  EXPECT_NE(second.status().message().find("not called again"), std::string::npos) << second.status().message();
  EXPECT_TRUE(link->reachable(gone + "-other").is_ok());  // per endpoint
}

// ---- Pipelined prefill stages (DESIGN.md §18 "Live groups") in one process ----

std::unique_ptr<PrefillWorker> stage_worker(const std::string& kind, DecodeWorker** decode, PrefillWorker** next,
                                            int64_t stage_wait_timeout_ms = 30'000,
                                            std::unique_ptr<KvBlockCache> cache = nullptr) {
  PrefillWorkerOptions p;
  p.block_tokens = kBlock;
  p.kv_blocks = 64;
  p.weight_seed = 3;
  p.allow_fault_injection = true;
  p.stage_wait_timeout_ms = stage_wait_timeout_ms;
  p.stage_inbox_bytes = 1 << 20;
  return PrefillWorker::create(p, backend(kind), std::move(cache), std::make_unique<DirectLink>(decode, next)).value();
}

// One worker's view of a cache the test shares between workers: forwards to it and counts the bytes this worker
// asked for.
class SharedCache final : public KvBlockCache {
 public:
  SharedCache(MemoryBlockCache* shared, int64_t* read_bytes) : shared_(shared), read_bytes_(read_bytes) {}
  Result<std::vector<Status>> get(std::span<const BlockGet> items) override {
    auto got = shared_->get(items);
    if (got.is_ok()) {
      for (size_t i = 0; i < items.size(); ++i) {
        if (got.value()[i].is_ok()) *read_bytes_ += static_cast<int64_t>(items[i].buffer.size());
      }
    }
    return got;
  }
  Result<std::vector<Status>> put(std::span<const BlockPut> items, uint64_t part_bytes) override {
    return shared_->put(items, part_bytes);
  }
  BlockCacheCounters counters() const override { return {*read_bytes_, 0, 0, 0, {}}; }
  std::string describe() const override { return "shared in-process cache"; }

 private:
  MemoryBlockCache* shared_;
  int64_t* read_bytes_;
};

proto::PrefillJobRequest stage_job(const proto::DecodeReserveReply& res, const std::string& id,
                                   const std::vector<uint32_t>& prompt, int64_t stage, int64_t first_layer,
                                   int64_t layers) {
  proto::PrefillJobRequest job;
  job.request_id = id;
  job.tokens = prompt;
  job.output_length_tokens = 6;
  job.decode_endpoint = "inproc://decode";
  job.reservation_id = res.reservation_id;
  job.decode_block_offsets_bytes = res.block_offsets_bytes;
  job.client_endpoint = "inproc://client";
  job.chunk_tokens = 24;
  job.stage_index = stage;
  job.stage_count = 2;
  job.stage_first_layer = first_layer;
  job.stage_layers = layers;
  job.next_stage_endpoint = stage == 0 ? "inproc://stage1" : "";
  return job;
}

// Both backends run stages: the ref one computes the same KV and tokens; the sim one writes the same bytes and gives
// the same tokens as one sim worker (its hidden states carry each token's running hash, scaled like its KV).
class PipelineStages : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineStages, TwoStagesGiveTheTokensOfOneWorker) {
  const std::string kind = GetParam();
  std::vector<uint32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 37 + 11) % 256);
  Cluster whole(kind, false);
  ASSERT_TRUE(whole.run("p", prompt, 6).is_ok());
  ASSERT_EQ(whole.client["p"].tokens.size(), 6u);

  Cluster c(kind, false);
  PrefillWorker* second = nullptr;
  auto w1 = stage_worker(kind, &c.decode_ptr, &second);
  auto w0 = stage_worker(kind, &c.decode_ptr, &second);
  second = w1.get();
  auto res = c.decode->reserve({"p", 100, 6, "inproc://client", 0}).value();
  // tiny: 4 layers, stages of 1 and 3 (uneven); chunks of 24 tokens (5 chunks).
  Result<proto::PrefillJobReply> last = error(Code::kInternal, "not run");
  std::thread t([&] { last = w1->run_job(stage_job(res, "p", prompt, 1, 1, 3)); });
  auto first = w0->run_job(stage_job(res, "p", prompt, 0, 0, 1));
  t.join();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_EQ(last->first_token, whole.client["p"].tokens[0]);
  for (int i = 0; i < 1000 && !c.decode->idle(); ++i) ASSERT_TRUE(c.decode->step().is_ok());
  EXPECT_EQ(c.client["p"].tokens, whole.client["p"].tokens);
  EXPECT_TRUE(c.client["p"].done.has_value());
  EXPECT_EQ(w0->metrics().counter("mc_prefill_stage_hidden_sent_bytes_total", "").value(),
            100u * static_cast<uint64_t>(w0->backend().stage_hidden_floats()) * 4u);
}

INSTANTIATE_TEST_SUITE_P(Backends, PipelineStages, ::testing::Values("ref", "sim"));

// A cached prefix is read by each stage for its own layers only (issue 22 item 1): a 1-layer and a 3-layer stage
// read 1/4 and 3/4 of every cached block, and the tokens are those of one worker that read whole blocks.
TEST_P(PipelineStages, EachStageReadsItsLayersOfTheCachedPrefix) {
  const std::string kind = GetParam();
  std::vector<uint32_t> prompt(100), longer;
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 29 + 3) % 256);
  longer = prompt;
  for (uint32_t i = 0; i < 60; ++i) longer.push_back((i * 13 + 1) % 256);
  Cluster whole(kind, true);
  ASSERT_TRUE(whole.run("p", prompt, 6).is_ok());  // stores the prompt's 6 complete blocks
  auto ref = whole.run("q", longer, 6);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  ASSERT_GT(ref->ledger.hit_tokens, 0);

  Cluster c(kind, false);
  int64_t read0 = 0, read1 = 0;
  PrefillWorker* second = nullptr;
  auto w1 = stage_worker(kind, &c.decode_ptr, &second, 30'000, std::make_unique<SharedCache>(whole.cache, &read1));
  auto w0 = stage_worker(kind, &c.decode_ptr, &second, 30'000, std::make_unique<SharedCache>(whole.cache, &read0));
  second = w1.get();
  auto res = c.decode->reserve({"q", static_cast<int64_t>(longer.size()), 6, "inproc://client", 0}).value();
  Result<proto::PrefillJobReply> last = error(Code::kInternal, "not run");
  std::thread t([&] { last = w1->run_job(stage_job(res, "q", longer, 1, 1, 3)); });
  auto first = w0->run_job(stage_job(res, "q", longer, 0, 0, 1));
  t.join();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  for (int i = 0; i < 1000 && !c.decode->idle(); ++i) ASSERT_TRUE(c.decode->step().is_ok());
  EXPECT_EQ(c.client["q"].tokens, whole.client["q"].tokens);

  const int64_t layer_block_bytes = c.decode->kv().layout().layer_block_bytes();
  const int64_t cached_blocks = first->ledger.hit_tokens / kBlock;
  EXPECT_GE(cached_blocks, 6);
  EXPECT_EQ(last->ledger.hit_tokens, first->ledger.hit_tokens);
  EXPECT_EQ(first->ledger.fetch_bytes, cached_blocks * 1 * layer_block_bytes);
  EXPECT_EQ(last->ledger.fetch_bytes, cached_blocks * 3 * layer_block_bytes);
  EXPECT_EQ(read0 + read1, (cached_blocks * 4) * layer_block_bytes);  // the prefix's bytes once in all
}

// The two stages of a pipelined prompt, with decode holding `store` (null: none); returns the last stage's reply.
Result<proto::PrefillJobReply> run_two_stages(Cluster& c, const std::vector<uint32_t>& prompt, const std::string& id,
                                              const std::string& kind = "ref") {
  PrefillWorker* second = nullptr;
  auto w1 = stage_worker(kind, &c.decode_ptr, &second);
  auto w0 = stage_worker(kind, &c.decode_ptr, &second);
  second = w1.get();
  auto res = c.decode->reserve({id, static_cast<int64_t>(prompt.size()), 6, "inproc://client", 0}).value();
  Result<proto::PrefillJobReply> last = error(Code::kInternal, "not run");
  std::thread t([&] { last = w1->run_job(stage_job(res, id, prompt, 1, 1, 3)); });
  auto first = w0->run_job(stage_job(res, id, prompt, 0, 0, 1));
  t.join();
  EXPECT_TRUE(first.is_ok()) << first.status().to_string();
  for (int i = 0; i < 1000 && !c.decode->idle(); ++i) EXPECT_TRUE(c.decode->step().is_ok());
  return last;
}

// No stage holds every layer of a block: decode puts the pipelined prompt's complete blocks (DESIGN.md §18 "Live
// groups" point 5), under the keys and with the bytes one worker's whole prefill stores.
TEST_P(PipelineStages, DecodeStoresAPipelinedPromptsBlocksAsOneWorkerWould) {
  const std::string kind = GetParam();
  std::vector<uint32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 41 + 7) % 256);
  Cluster whole(kind, true);
  auto one = whole.run("p", prompt, 6);
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  ASSERT_EQ(one->ledger.stored_blocks, 6);  // 100 tokens: 6 complete blocks of 16

  Cluster c(kind, false);
  auto store = std::make_unique<MemoryBlockCache>();
  MemoryBlockCache* decode_store = store.get();
  c.decode->set_block_store(std::move(store), 1 << 20);
  auto last = run_two_stages(c, prompt, "p", kind);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_EQ(last->ledger.stored_blocks, 6);
  EXPECT_EQ(c.client["p"].tokens, whole.client["p"].tokens);
  c.decode->flush_store_puts();
  ASSERT_EQ(decode_store->size(), 6u);
  EXPECT_EQ(c.decode->metrics().counter("mc_decode_stored_blocks_total").value(), 6u);

  const KeyNamespace ns = kv_namespace(c.decode->backend(), kBlock, 3);
  const std::vector<uint64_t> hashes = seq_hashes(prompt, ns);
  const auto block_bytes = static_cast<size_t>(c.decode->kv().layout().block_bytes());
  for (size_t b = 0; b < 6; ++b) {
    std::vector<std::byte> want(block_bytes), got(block_bytes);
    const std::string key = block_store_key(ns, hashes[b]);
    std::vector<BlockGet> w = {{key, want}}, g = {{key, got}};
    ASSERT_TRUE(whole.cache->get(w).value()[0].is_ok()) << key;
    ASSERT_TRUE(decode_store->get(g).value()[0].is_ok()) << "decode did not store block " << b << " as " << key;
    if (kind == "sim") {  // hashes and their streams: exactly one worker's bytes
      EXPECT_EQ(want, got) << "block " << b;
      continue;
    }
    const auto* wf = reinterpret_cast<const float*>(want.data());
    const auto* gf = reinterpret_cast<const float*>(got.data());
    float max_diff = 0;
    for (size_t i = 0; i < block_bytes / sizeof(float); ++i) max_diff = std::max(max_diff, std::abs(wf[i] - gf[i]));
    EXPECT_LE(max_diff, 1e-5F) << "block " << b;
  }
}

// The put queue is bounded: a commit whose blocks do not fit is still served, its blocks counted as dropped;
// without a store they are counted as unset. Neither fails the request.
TEST(Workers, DecodeStorePutsAreBoundedAndNeverFailTheRequest) {
  std::vector<uint32_t> prompt(100, 9);
  Cluster full("ref", false);
  full.decode->set_block_store(std::make_unique<MemoryBlockCache>(), 1);  // smaller than one block
  auto last = run_two_stages(full, prompt, "q");
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_EQ(last->ledger.stored_blocks, 0);
  EXPECT_TRUE(full.client["q"].done.has_value());
  EXPECT_EQ(full.decode->metrics().counter("mc_decode_store_dropped_blocks_total").value(), 6u);

  Cluster none("ref", false);
  last = run_two_stages(none, prompt, "r");
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_EQ(last->ledger.stored_blocks, 0);
  EXPECT_TRUE(none.client["r"].done.has_value());
  EXPECT_EQ(none.decode->metrics().counter("mc_decode_store_unset_blocks_total").value(), 6u);
}

// A commit naming blocks that are not complete blocks of the prompt is refused (an attacker's or a bug's).
TEST(Workers, CommitNamingBlocksOutsideThePromptIsRefused) {
  // (first block, count): a 20-token prompt has one complete block, block 0.
  for (const auto& [first, count] : std::vector<std::pair<int64_t, size_t>>{{0, 1}, {-1, 1}, {0, 2}, {1, 1}}) {
    Cluster c("ref", false);
    c.decode->set_block_store(std::make_unique<MemoryBlockCache>(), 1 << 20);
    auto res = c.decode->reserve({"x", 20, 5, "inproc://c", 0}).value();  // 20 tokens: 1 complete block
    proto::KvWriteRequest w;
    w.reservation_id = res.reservation_id;
    w.block_indexes = {0, 1};
    w.data.assign(static_cast<size_t>(2 * res.layer_block_bytes), 0);
    for (int64_t l = 0; l < c.decode->kv().layout().num_layers; ++l) {
      w.layer = l;
      ASSERT_TRUE(c.decode->kv_write(w));
    }
    proto::KvCommitRequest commit{res.reservation_id, "x", 20, 1, 0, {}, ""};
    commit.store_first_block = first;
    commit.store_block_hashes.assign(count, 42);
    auto r = c.decode->commit(commit);
    if (first == 0 && count == 1) {
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->store_blocks_queued, 1);
      continue;
    }
    ASSERT_FALSE(r.is_ok()) << first << "+" << count;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("not complete blocks"), std::string::npos) << r.status().message();
    ASSERT_TRUE(c.decode->step());
    EXPECT_TRUE(c.client["x"].error.has_value()) << "the client was not told";
  }
}

// The hidden states cross through the transfer engine when the next stage serves a stage segment (DESIGN.md §18
// "Live groups" point 2): a slot asked by RPC, the bytes WRITTEN (same host: shared memory) with the slot's tag;
// with a grant key, only with the slot's grant. The tokens are one worker's.
void stage_engine_run(const std::string& grant_key) {
  std::vector<uint32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 37 + 11) % 256);
  Cluster whole("ref", false);
  ASSERT_TRUE(whole.run("p", prompt, 6).is_ok());

  Cluster c("ref", false);
  PrefillWorker* second = nullptr;
  auto w1 = stage_worker("ref", &c.decode_ptr, &second);
  auto w0 = stage_worker("ref", &c.decode_ptr, &second);
  second = w1.get();
  transfer::EngineOptions eo;
  eo.listen = {"tcp://127.0.0.1:0"};
  eo.grant_key = grant_key;
  ASSERT_TRUE(w1->publish_stage_segment(eo).is_ok());
  ASSERT_FALSE(w1->stage_segment().empty());
  auto res = c.decode->reserve({"p", 100, 6, "inproc://client", 0}).value();
  Result<proto::PrefillJobReply> last = error(Code::kInternal, "not run");
  std::thread t([&] { last = w1->run_job(stage_job(res, "p", prompt, 1, 1, 3)); });
  auto first = w0->run_job(stage_job(res, "p", prompt, 0, 0, 1));
  t.join();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  for (int i = 0; i < 1000 && !c.decode->idle(); ++i) ASSERT_TRUE(c.decode->step().is_ok());
  EXPECT_EQ(c.client["p"].tokens, whole.client["p"].tokens);
  // Every chunk went through the engine (100 tokens of 64 fp32 values), none as an RPC.
  const uint64_t sent = w0->metrics().counter("mc_prefill_stage_hidden_sent_bytes_total").value();
  EXPECT_EQ(sent, 100u * 64 * 4);
  EXPECT_EQ(w0->metrics().counter("mc_prefill_stage_hidden_engine_sent_bytes_total").value(), sent);
  EXPECT_EQ(w1->metrics().counter("mc_prefill_stage_engine_bytes_total").value(), sent);
  EXPECT_EQ(w1->metrics().counter("mc_prefill_stage_notifications_rejected_total").value(), 0u);
}

TEST(Workers, StageHiddenStatesCrossThroughTheTransferEngine) { stage_engine_run(""); }
TEST(Workers, StageHiddenStatesCrossThroughTheTransferEngineWithGrants) {
  stage_engine_run(std::string(32, 'k'));  // the grant key (32 bytes)
}

// A stage segment's slots: validated like prefill_stage_hidden, bounded by --stage-inbox-bytes; a WRITE without
// the slot's grant is refused, a notification naming no live slot or another range is ignored.
TEST(Workers, StageSlotsAreValidatedBoundedAndGranted) {
  DecodeWorker* none_decode = nullptr;
  PrefillWorker* none = nullptr;
  auto w = stage_worker("ref", &none_decode, &none);
  proto::PrefillStageSlotRequest r{"x", 9, 0, 0, 4, false, 4 * 64 * 4};
  EXPECT_EQ(w->stage_slot(r).status().code(), Code::kFailedPrecondition) << "no stage segment yet";
  transfer::EngineOptions eo;
  eo.listen = {"tcp://127.0.0.1:0"};
  eo.grant_key = std::string(32, 'k');
  ASSERT_TRUE(w->publish_stage_segment(eo).is_ok());
  EXPECT_EQ(w->publish_stage_segment(eo).code(), Code::kFailedPrecondition);
  r.bytes -= 1;
  EXPECT_EQ(w->stage_slot(r).status().code(), Code::kInvalidArgument);
  r.bytes += 1;
  r.token_end = int64_t{1} << 40;
  EXPECT_EQ(w->stage_slot(r).status().code(), Code::kInvalidArgument);
  r.token_end = 4;
  auto slot = w->stage_slot(r);
  ASSERT_TRUE(slot.is_ok()) << slot.status().to_string();
  EXPECT_EQ(slot->segment, w->stage_segment());
  EXPECT_FALSE(slot->grant.empty());
  // The bound (1 MiB here): 4,096 tokens of 256 bytes do not fit beside the 1 KiB set aside.
  proto::PrefillStageSlotRequest big{"big", 9, 0, 0, 4096, false, 4096 * 64 * 4};
  EXPECT_EQ(w->stage_slot(big).status().code(), Code::kResourceExhausted);

  // A WRITE into the slot without its grant is refused; with it, the chunk is held for the stage job.
  auto client = transfer::TransferEngine::create({}).value();
  auto buf = transfer::allocate_shared_buffer(static_cast<uint64_t>(r.bytes)).value();
  ASSERT_TRUE(client->register_memory(buf.data(), buf.size()).is_ok());
  auto seg = client->open_segment(slot->segment);
  ASSERT_TRUE(seg.is_ok()) << seg.status().to_string();
  transfer::TransferRequest wr;
  wr.op = transfer::Op::kWrite;
  wr.local_addr = buf.data();
  wr.segment = seg.value();
  wr.remote_offset = slot->offset;
  wr.length = static_cast<uint64_t>(r.bytes);
  wr.notify_tag = proto::StageChunkTag{slot->slot_id}.encode();
  EXPECT_NE(client->transfer_sync(wr, 5000).state, transfer::TransferState::kCompleted) << "a WRITE without grant";
  EXPECT_EQ(w->metrics().counter("mc_prefill_stage_engine_bytes_total").value(), 0u);
  wr.grant = slot->grant;
  EXPECT_EQ(client->transfer_sync(wr, 5000).state, transfer::TransferState::kCompleted);
  EXPECT_EQ(w->metrics().counter("mc_prefill_stage_engine_bytes_total").value(), static_cast<uint64_t>(r.bytes));
  EXPECT_EQ(w->deliver_stage_hidden(
                 proto::PrefillStageHiddenRequest{"x", 9, 0, 0, 4, false, std::vector<uint8_t>(4 * 64 * 4, 0)})
                .code(),
            Code::kInvalidArgument)
      << "the chunk is held already (it landed)";
  // The slot is gone once landed: the same WRITE again names no live slot (its grant is refused).
  EXPECT_NE(client->transfer_sync(wr, 5000).state, transfer::TransferState::kCompleted);

  // Notifications a peer forges: not a stage tag, no such slot, another range.
  w->on_stage_notification({"kv/1/2/3-4", "", transfer::Op::kWrite, 0, 16, 0});
  w->on_stage_notification({"stage/77", "", transfer::Op::kWrite, 0, 16, 77});
  auto slot2 = w->stage_slot(proto::PrefillStageSlotRequest{"y", 9, 0, 0, 4, false, 4 * 64 * 4});
  ASSERT_TRUE(slot2.is_ok());
  w->on_stage_notification(
      {proto::StageChunkTag{slot2->slot_id}.encode(), "", transfer::Op::kWrite, slot2->offset + 8, 16, slot2->slot_id});
  EXPECT_EQ(w->metrics().counter("mc_prefill_stage_notifications_rejected_total").value(), 3u);
}

TEST(Workers, AFailedFirstStageFailsTheNextAtOnce) {
  std::vector<uint32_t> prompt(100, 5);
  Cluster c("ref", false);
  PrefillWorker* second = nullptr;
  auto w1 = stage_worker("ref", &c.decode_ptr, &second);
  auto w0 = stage_worker("ref", &c.decode_ptr, &second);
  second = w1.get();
  auto res = c.decode->reserve({"f", 100, 6, "inproc://client", 0}).value();
  proto::PrefillJobRequest j0 = stage_job(res, "f", prompt, 0, 0, 2);
  j0.fail_after_layers = 0;  // fails at its first layer, before any chunk left
  Result<proto::PrefillJobReply> last = error(Code::kInternal, "not run");
  std::thread t([&] { last = w1->run_job(stage_job(res, "f", prompt, 1, 2, 2)); });
  EXPECT_FALSE(w0->run_job(j0).is_ok());
  t.join();
  ASSERT_FALSE(last.is_ok());
  EXPECT_EQ(last.status().code(), Code::kAborted);
  EXPECT_NE(last.status().message().find("stage 0 failed"), std::string::npos) << last.status().to_string();
  for (int i = 0; i < 100 && !c.decode->idle(); ++i) ASSERT_TRUE(c.decode->step().is_ok());
  ASSERT_TRUE(c.client["f"].error.has_value()) << "the client hears the failure";
}

TEST(Workers, AStageWaitsBoundedForItsPredecessor) {
  std::vector<uint32_t> prompt(100, 5);
  Cluster c("ref", false);
  PrefillWorker* none = nullptr;
  auto w1 = stage_worker("ref", &c.decode_ptr, &none, /*stage_wait_timeout_ms=*/50);
  auto res = c.decode->reserve({"w", 100, 6, "inproc://client", 0}).value();
  auto r = w1->run_job(stage_job(res, "w", prompt, 1, 2, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kAborted);
  EXPECT_NE(r.status().message().find("--stage-wait-timeout-ms"), std::string::npos) << r.status().to_string();
  for (int i = 0; i < 100 && !c.decode->idle(); ++i) ASSERT_TRUE(c.decode->step().is_ok());
  ASSERT_TRUE(c.client["w"].error.has_value());
}

TEST(Workers, StageJobsAndHiddenStatesAreValidated) {
  std::vector<uint32_t> prompt(100, 5);
  Cluster c("ref", false);
  PrefillWorker* none = nullptr;
  auto w = stage_worker("ref", &c.decode_ptr, &none);
  // Bad stage shapes: each refused before anything runs, the reservation aborted.
  const std::vector<std::tuple<int64_t, int64_t, int64_t, std::string>> bad = {
      {0, 1, 3, "inproc://s"},  // stage 0 must start at layer 0
      {1, 0, 4, ""},            // stage 1 of 2 starting at layer 0
      {0, 0, 5, "inproc://s"},  // more layers than the model's 4
      {1, 2, 2, "inproc://s"},  // the last stage names a next stage
      {0, 0, 2, ""},            // stage 0 names no next stage
  };
  for (const auto& [stage, first, layers, next] : bad) {
    auto res = c.decode->reserve({"b", 100, 6, "inproc://client", 0}).value();
    proto::PrefillJobRequest j = stage_job(res, "b", prompt, stage, first, layers);
    j.next_stage_endpoint = next;
    auto r = w->run_job(j);
    ASSERT_FALSE(r.is_ok()) << stage << " " << first << " " << layers;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  }
  // A sim stage takes the sim backend's hidden states (scaled like its KV), not the ref backend's rows.
  DecodeWorker* d = c.decode_ptr;
  auto sim = stage_worker("sim", &d, &none);
  EXPECT_LT(sim->backend().stage_hidden_floats(), w->backend().stage_hidden_floats());

  // Hidden states a peer sends: sizes must match the model (tiny: hidden 64 -> 256 bytes a token).
  proto::PrefillStageHiddenRequest m;
  m.request_id = "x";
  m.reservation_id = 9;
  m.token_begin = 0;
  m.token_end = 4;
  m.hidden.assign(4 * 64 * 4 - 1, 0);
  EXPECT_EQ(w->deliver_stage_hidden(m).code(), Code::kInvalidArgument);
  m.token_end = int64_t{1} << 40;
  EXPECT_EQ(w->deliver_stage_hidden(m).code(), Code::kInvalidArgument);
  m.token_begin = 8;
  m.token_end = 4;
  EXPECT_EQ(w->deliver_stage_hidden(m).code(), Code::kInvalidArgument);
  m.token_begin = 0;
  m.token_end = 4;
  m.hidden.assign(4 * 64 * 4, 0);
  EXPECT_TRUE(w->deliver_stage_hidden(m).is_ok());
  EXPECT_EQ(w->deliver_stage_hidden(m).code(), Code::kInvalidArgument) << "a chunk held twice";
  m.request_id.clear();
  EXPECT_EQ(w->deliver_stage_hidden(m).code(), Code::kInvalidArgument);
  // The inbox bound (1 MiB here): 4,096 tokens of 256 bytes fill it, beside the 1 KiB already held.
  m.request_id = "big";
  m.token_end = 4096;
  m.hidden.assign(4096 * 64 * 4, 0);
  EXPECT_EQ(w->deliver_stage_hidden(m).code(), Code::kResourceExhausted);
}

}  // namespace
}  // namespace mc::infer
