// Round trip of every message of protocol.hpp's Conductor section.
#include <gtest/gtest.h>

#include "mc/common/codec.hpp"
#include "mc/common/protocol.hpp"

namespace mc::proto {
namespace {

template <typename T>
T round_trip(const T& in) {
  auto out = codec::unpack<T>(codec::pack(in), "test");
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? out.value() : T{};
}

TEST(ConductorProtocol, SubmitRoundTrip) {
  ConductorSubmitRequest r;
  r.request_id = "r-17";
  r.input_tokens = 1025;
  r.output_tokens = 64;
  r.tokens = {1, 2, 0xffffffffu};
  r.hash_ids = {0, 4294967296ULL, 18446744073709551615ULL};
  r.block_hashes = {0x8000000000000001ULL};
  r.block_size_tokens = 512;
  r.slo_ttft_ms = 1500.5;
  r.slo_tbt_ms = 100;
  auto o = round_trip(r);
  EXPECT_EQ(o.request_id, "r-17");
  EXPECT_EQ(o.input_tokens, 1025);
  EXPECT_EQ(o.output_tokens, 64);
  EXPECT_EQ(o.tokens, r.tokens);
  EXPECT_EQ(o.hash_ids, r.hash_ids);
  EXPECT_EQ(o.block_hashes, r.block_hashes);
  EXPECT_EQ(o.block_size_tokens, 512);
  EXPECT_EQ(o.slo_ttft_ms, 1500.5);
  EXPECT_EQ(o.slo_tbt_ms, 100);
  EXPECT_STREQ(ConductorSubmitRequest::kType, "conductor.submit");

  ConductorSubmitReply a{"r-17", true, "prefill-1", "decode-0", 812.5, 31.25, 4096, true, "", "kvcache: ..."};
  auto ao = round_trip(a);
  EXPECT_TRUE(ao.accepted);
  EXPECT_EQ(ao.prefill_id, "prefill-1");
  EXPECT_EQ(ao.decode_id, "decode-0");
  EXPECT_EQ(ao.predicted_ttft_ms, 812.5);
  EXPECT_EQ(ao.predicted_tbt_ms, 31.25);
  EXPECT_EQ(ao.hit_tokens, 4096);
  EXPECT_TRUE(ao.replicate_prefix);
  EXPECT_EQ(ao.reason, "kvcache: ...");
  ConductorSubmitReply rej;
  rej.request_id = "r-18";
  rej.reject_reason = "ttft_slo";
  rej.predicted_ttft_ms = 2500;
  auto ro = round_trip(rej);
  EXPECT_FALSE(ro.accepted);
  EXPECT_EQ(ro.reject_reason, "ttft_slo");
  EXPECT_EQ(ro.predicted_ttft_ms, 2500);
}

TEST(ConductorProtocol, EventAndLedgerRoundTrip) {
  ConductorEvent e;
  e.request_id = "r-1";
  e.kind = kEventDone;
  e.tokens = {7, 8};
  e.output_tokens = 2;
  e.since_submit_ms = 123.5;
  e.message = "";
  e.ledger.prompt_tokens = 1025;
  e.ledger.hit_tokens_remote = 512;
  e.ledger.transfer_ms = 3.5;
  e.ledger.decision = "fetch";
  e.ledger.ttft_ms = 99.5;
  auto o = round_trip(e);
  EXPECT_EQ(o.kind, "done");
  EXPECT_EQ(o.tokens, e.tokens);
  EXPECT_EQ(o.output_tokens, 2);
  EXPECT_EQ(o.since_submit_ms, 123.5);
  EXPECT_EQ(o.ledger.prompt_tokens, 1025);
  EXPECT_EQ(o.ledger.hit_tokens_remote, 512);
  EXPECT_EQ(o.ledger.hit_tokens_local, -1);  // not measured stays -1
  EXPECT_EQ(o.ledger.transfer_ms, 3.5);
  EXPECT_EQ(o.ledger.decision, "fetch");
  EXPECT_EQ(o.ledger.ttft_ms, 99.5);
}

TEST(ConductorProtocol, WorkerMessagesRoundTrip) {
  ConductorRegisterRequest reg{"decode-0", "decode", "node-a", "tcp://127.0.0.1:5001", "gpu-d0", 131072, 512, 327680};
  auto ro = round_trip(reg);
  EXPECT_EQ(ro.instance_id, "decode-0");
  EXPECT_EQ(ro.role, "decode");
  EXPECT_EQ(ro.host, "node-a");
  EXPECT_EQ(ro.endpoint, "tcp://127.0.0.1:5001");
  EXPECT_EQ(ro.backend_id, "gpu-d0");
  EXPECT_EQ(ro.kv_capacity_tokens, 131072);
  EXPECT_EQ(ro.block_size_tokens, 512);
  EXPECT_EQ(ro.kv_bytes_per_token, 327680);
  auto rr = round_trip(ConductorRegisterReply{500, 3000, 512});
  EXPECT_EQ(rr.heartbeat_interval_ms, 500);
  EXPECT_EQ(rr.heartbeat_timeout_ms, 3000);
  EXPECT_EQ(rr.block_size_tokens, 512);

  ConductorHeartbeatRequest hb;
  hb.instance_id = "decode-0";
  hb.queued_prefill_tokens = 1;
  hb.queued_prefill_jobs = 2;
  hb.running_requests = 3;
  hb.kv_reserved_tokens = 4;
  hb.context_tokens = 5;
  hb.decode_steps = 6;
  hb.decode_step_ms_mean = 7.5;
  hb.decode_batch_mean = 8.5;
  hb.decode_context_tokens_mean = 9.5;
  auto ho = round_trip(hb);
  EXPECT_EQ(ho.instance_id, "decode-0");
  EXPECT_EQ(ho.queued_prefill_tokens, 1);
  EXPECT_EQ(ho.queued_prefill_jobs, 2);
  EXPECT_EQ(ho.running_requests, 3);
  EXPECT_EQ(ho.kv_reserved_tokens, 4);
  EXPECT_EQ(ho.context_tokens, 5);
  EXPECT_EQ(ho.decode_steps, 6);
  EXPECT_EQ(ho.decode_step_ms_mean, 7.5);
  EXPECT_EQ(ho.decode_batch_mean, 8.5);
  EXPECT_EQ(ho.decode_context_tokens_mean, 9.5);
  EXPECT_FALSE(round_trip(ConductorHeartbeatReply{false}).registered);

  ConductorJobReportRequest j;
  j.request_id = "r-1";
  j.instance_id = "prefill-0";
  j.phase = kPhasePrefillDone;
  j.tokens = {42};
  j.output_tokens = 9;
  j.prefilled_tokens = 513;
  j.reused_tokens = 512;
  j.hit_tokens_local = 1;
  j.hit_tokens_remote = 511;
  j.hit_tokens_ssd = 0;
  j.queue_ms = 1.5;
  j.prefill_ms = 2.5;
  j.transfer_bytes_same_host = 10;
  j.transfer_bytes_remote = 20;
  j.transfer_bytes_ssd = 30;
  j.transfer_ns_same_host = 40;
  j.transfer_ns_remote = 50;
  j.transfer_ns_ssd = 60;
  j.message = "m";
  auto jo = round_trip(j);
  EXPECT_EQ(jo.phase, "prefill_done");
  EXPECT_EQ(jo.tokens, j.tokens);
  EXPECT_EQ(jo.output_tokens, 9);
  EXPECT_EQ(jo.prefilled_tokens, 513);
  EXPECT_EQ(jo.reused_tokens, 512);
  EXPECT_EQ(jo.hit_tokens_local, 1);
  EXPECT_EQ(jo.hit_tokens_remote, 511);
  EXPECT_EQ(jo.queue_ms, 1.5);
  EXPECT_EQ(jo.prefill_ms, 2.5);
  EXPECT_EQ(jo.transfer_bytes_same_host, 10);
  EXPECT_EQ(jo.transfer_bytes_remote, 20);
  EXPECT_EQ(jo.transfer_bytes_ssd, 30);
  EXPECT_EQ(jo.transfer_ns_same_host, 40);
  EXPECT_EQ(jo.transfer_ns_remote, 50);
  EXPECT_EQ(jo.transfer_ns_ssd, 60);
  EXPECT_EQ(jo.message, "m");
  EXPECT_FALSE(round_trip(ConductorJobReportReply{false}).known);
}

TEST(ConductorProtocol, WrongTypesFailToDecode) {
  // A submit whose input_tokens is a string must not decode into garbage.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(2);
  pk.pack(std::string("request_id"));
  pk.pack(std::string("r"));
  pk.pack(std::string("input_tokens"));
  pk.pack(std::string("many"));
  auto out = codec::unpack<ConductorSubmitRequest>(std::string_view(buf.data(), buf.size()), "test");
  EXPECT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), Code::kMalformedMessage);
}

}  // namespace
}  // namespace mc::proto
