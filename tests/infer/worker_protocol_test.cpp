// Round trip of every worker message (protocol.hpp, section mc_infer).
#include <gtest/gtest.h>

#include "mc/proto/codec.hpp"
#include "mc/proto/protocol.hpp"
#include "mc/testkit/round_trip.hpp"

namespace mc::proto {
namespace {

using mc::testkit::round_trip;

RequestLedger sample_ledger() {
  RequestLedger l;
  l.prompt_tokens = 131072;
  l.hit_tokens = 124416;
  l.hit_tokens_local = 1024;
  l.hit_tokens_remote = 123392;
  l.missed_prefix_tokens = 512;
  l.computed_tokens = 6656;
  l.fetch_bytes = int64_t{1} << 40;
  l.kv_sent_bytes = 42;
  l.stored_blocks = 13;
  l.queue_ms = 0;
  l.fetch_ms = 17;
  l.prefill_ms = 900;
  l.kv_tail_ms = 3;
  l.decode_ms = -1;
  l.output_tokens = 7;
  l.decision = "fetch";
  return l;
}

void expect_ledger(const RequestLedger& l) {
  EXPECT_EQ(l.prompt_tokens, 131072);
  EXPECT_EQ(l.hit_tokens, 124416);
  EXPECT_EQ(l.hit_tokens_remote, 123392);
  EXPECT_EQ(l.missed_prefix_tokens, 512);
  EXPECT_EQ(l.fetch_bytes, int64_t{1} << 40);
  EXPECT_EQ(l.queue_ms, 0);
  EXPECT_EQ(l.decode_ms, -1);
  EXPECT_EQ(l.decision, "fetch");
}

TEST(WorkerProtocol, ReserveReleaseAbort) {
  auto r = round_trip(DecodeReserveRequest{"req-1", 32777, 100, "tcp://127.0.0.1:5000", 3000});
  EXPECT_EQ(r.request_id, "req-1");
  EXPECT_EQ(r.input_length_tokens, 32777);
  EXPECT_EQ(r.output_length_tokens, 100);
  EXPECT_EQ(r.client_endpoint, "tcp://127.0.0.1:5000");
  EXPECT_EQ(r.ttl_ms, 3000);
  auto rr = round_trip(DecodeReserveReply{0xfffffffffffULL, 16, 2048, 8192, {0, 8192, 1ULL << 40}, "h:1", 5});
  EXPECT_EQ(rr.reservation_id, 0xfffffffffffULL);
  EXPECT_EQ(rr.block_offsets_bytes.back(), 1ULL << 40);
  EXPECT_EQ(rr.layer_block_bytes, 2048);
  EXPECT_EQ(rr.kv_segment, "h:1");
  EXPECT_EQ(round_trip(DecodeReleaseRequest{9}).reservation_id, 9u);
  auto rel = round_trip(DecodeReleaseReply{true, 77});
  EXPECT_TRUE(rel.released);
  EXPECT_EQ(rel.free_blocks, 77);
  auto ab = round_trip(DecodeAbortRequest{9, 601, "prefill aborted after layer 2"});
  EXPECT_EQ(ab.code, 601);
  EXPECT_EQ(ab.reason, "prefill aborted after layer 2");
}

TEST(WorkerProtocol, DecodeAndPrefillCancel) {
  EXPECT_EQ(round_trip(DecodeCancelRequest{"r-1"}).request_id, "r-1");
  auto d = round_trip(DecodeCancelReply{true, 42});
  EXPECT_TRUE(d.found);
  EXPECT_EQ(d.free_blocks, 42);
  EXPECT_EQ(round_trip(PrefillCancelRequest{"r-2"}).request_id, "r-2");
  EXPECT_TRUE(round_trip(PrefillCancelReply{true}).dropped);
  EXPECT_FALSE(round_trip(PrefillCancelReply{}).dropped);
}

TEST(WorkerProtocol, KvWriteAndCommit) {
  KvWriteRequest w{5, 3, {0, 1, 7}, {}};
  for (int i = 0; i < 300; ++i) w.data.push_back(static_cast<uint8_t>(i));
  auto w2 = round_trip(w);
  EXPECT_EQ(w2.reservation_id, 5u);
  EXPECT_EQ(w2.layer, 3);
  EXPECT_EQ(w2.block_indexes, (std::vector<uint32_t>{0, 1, 7}));
  EXPECT_EQ(w2.data, w.data);
  // bytes travel as msgpack bin, not as an array of integers
  EXPECT_LT(codec::pack(w).size(), 300u + 64u);
  EXPECT_EQ(round_trip(KvWriteReply{4}).layers_received, 4);
  auto c = round_trip(
      KvCommitRequest{5, "req-1", 61, 4000000000u, 1700000000000000000LL, sample_ledger(), "00112233aabbccdd"});
  EXPECT_EQ(c.kv_namespace_digest, "00112233aabbccdd");
  EXPECT_EQ(c.first_token, 4000000000u);
  EXPECT_EQ(c.first_token_unix_ns, 1700000000000000000LL);
  EXPECT_EQ(c.prompt_tokens, 61);
  expect_ledger(c.ledger);
  EXPECT_EQ(round_trip(KvCommitReply{3}).batch_size, 3);
}

TEST(WorkerProtocol, PrefillJob) {
  PrefillJobRequest j;
  j.request_id = "r";
  j.tokens = {1, 2, 0xffffffffu};
  j.output_length_tokens = 10;
  j.fetch_prefix_blocks = 2;
  j.prefix_source = "node-1";
  j.decode_endpoint = "tcp://127.0.0.1:1";
  j.reservation_id = 3;
  j.decode_block_offsets_bytes = {4096, 0};
  j.decode_kv_segment = "127.0.0.1:40000";
  j.client_endpoint = "tcp://127.0.0.1:2";
  j.chunk_tokens = 64;
  j.store_new_blocks = false;
  j.fail_after_layers = 2;
  j.lora_name = "sql";
  j.lora_version = "3";
  j.salt = "tenant-7";
  j.queue_key_ns = 1'700'000'000'123'456'789;
  auto j2 = round_trip(j);
  EXPECT_EQ(j2.queue_key_ns, j.queue_key_ns);
  EXPECT_EQ(j2.lora_name, "sql");
  EXPECT_EQ(j2.lora_version, "3");
  EXPECT_EQ(j2.salt, "tenant-7");
  EXPECT_EQ(j2.tokens, j.tokens);
  EXPECT_EQ(j2.fetch_prefix_blocks, 2);
  EXPECT_EQ(j2.decode_block_offsets_bytes, j.decode_block_offsets_bytes);
  EXPECT_EQ(j2.decode_kv_segment, "127.0.0.1:40000");
  EXPECT_EQ(j2.chunk_tokens, 64);
  EXPECT_FALSE(j2.store_new_blocks);
  EXPECT_EQ(j2.fail_after_layers, 2);
  EXPECT_EQ(round_trip(PrefillJobRequest{}).fetch_prefix_blocks, -1);
  EXPECT_EQ(round_trip(PrefillJobRequest{}).queue_key_ns, 0);  // no key: the back of the queue
  auto r = round_trip(PrefillJobReply{"r", 17, sample_ledger()});
  EXPECT_EQ(r.first_token, 17u);
  expect_ledger(r.ledger);
}

TEST(WorkerProtocol, LoadAndClientEvents) {
  round_trip(WorkerLoadRequest{});
  WorkerLoadReply l;
  l.role = "decode";
  l.backend = "sim";
  l.model = "llama3-70b";
  l.queued_tokens = 5;
  l.batch_size = 3;
  l.kv_blocks_committed = 40;
  l.kv_blocks_free = 24;
  l.recent_step_ms = 12.5;
  l.kv_segment = "10.0.0.7:41000";
  auto l2 = round_trip(l);
  EXPECT_EQ(l2.kv_segment, "10.0.0.7:41000");
  EXPECT_EQ(l2.role, "decode");
  EXPECT_EQ(l2.kv_blocks_committed, 40);
  EXPECT_DOUBLE_EQ(l2.recent_step_ms, 12.5);
  auto t = round_trip(TokenEvent{"r", 3, 99, 1700000000000000123LL});
  EXPECT_EQ(t.index, 3);
  EXPECT_EQ(t.token, 99u);
  EXPECT_EQ(t.emitted_unix_ns, 1700000000000000123LL);
  expect_ledger(round_trip(RequestDone{"r", sample_ledger()}).ledger);
  auto e = round_trip(RequestError{"r", 601, "aborted", 0});
  EXPECT_EQ(e.code, 601);
  EXPECT_EQ(e.message, "aborted");
  EXPECT_TRUE(round_trip(ClientAck{true}).ok);
}

TEST(WorkerProtocol, FieldsAbsentFromAnOlderPeerKeepTheirDefaults) {
  // A prefill_job from a sender that does not know decode_kv_segment (e.g. an older conductor).
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(2);
  pk.pack(std::string("request_id"));
  pk.pack(std::string("old"));
  pk.pack(std::string("reservation_id"));
  pk.pack(uint64_t{4});
  auto j = codec::unpack<PrefillJobRequest>(std::string_view(buf.data(), buf.size()), "prefill.job");
  ASSERT_TRUE(j.is_ok()) << j.status().to_string();
  EXPECT_EQ(j->request_id, "old");
  EXPECT_EQ(j->reservation_id, 4u);
  EXPECT_EQ(j->decode_kv_segment, "");
  EXPECT_EQ(j->fail_after_layers, -1);
  EXPECT_EQ(j->lora_name, "");  // no key scope: the base model, no salt
  EXPECT_EQ(j->salt, "");
  // A kv_commit and a decode_reserve without a key scope or namespace digest.
  auto c = codec::unpack<KvCommitRequest>(std::string_view(buf.data(), buf.size()), "decode.kv_commit");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->kv_namespace_digest, "");
  auto r = codec::unpack<DecodeReserveRequest>(std::string_view(buf.data(), buf.size()), "decode.reserve");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->lora_name, "");
  EXPECT_EQ(r->lora_version, "");
}

TEST(WorkerProtocol, WrongTypesAreMalformed) {
  // input_length of 2^64-1 does not fit the signed field: a decode error, never a wraparound.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(1);
  pk.pack(std::string("input_length_tokens"));
  pk.pack(uint64_t{0xffffffffffffffffULL});
  auto r = codec::unpack<DecodeReserveRequest>(std::string_view(buf.data(), buf.size()), "reserve");
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kMalformedMessage);
}

TEST(WorkerProtocol, KvLayerTagRoundTrip) {
  const KvLayerTag tag{UINT64_MAX, 79, 0, 8192};
  EXPECT_EQ(tag.encode(), "kv/18446744073709551615/79/0-8192");
  EXPECT_EQ(KvLayerTag::decode(tag.encode()), tag);
  const KvLayerTag small{7, 3, 12, 13};
  EXPECT_EQ(small.encode(), "kv/7/3/12-13");
  EXPECT_EQ(KvLayerTag::decode("kv/7/3/12-13"), small);
  // Negative layers and blocks parse (the decode worker rejects them against the reservation).
  EXPECT_EQ(KvLayerTag::decode("kv/1/-1/0-1"), (KvLayerTag{1, -1, 0, 1}));
}

TEST(WorkerProtocol, KvLayerTagRejectsOtherText) {
  for (const char* bad :
       {"", "kv/", "kv/1/2/3", "kv/1/2/3-", "kv/1/2/3-4x", "kv/1/2/3-4/", "kv//2/3-4", "kv/1/2-3-4", "kv/-1/2/3-4",
        "xv/1/2/3-4", "kv/1/2/3_4", "kv/ 1/2/3-4", "kv/18446744073709551616/0/0-1", "kv/1/2/3-4 "}) {
    EXPECT_EQ(KvLayerTag::decode(bad), std::nullopt) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace mc::proto
