// Round trip of every message of protocol.hpp's Conductor section (and of the store fields it relies on).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "mc/proto/codec.hpp"
#include "mc/proto/protocol.hpp"
#include "mc/testkit/round_trip.hpp"

namespace mc::proto {
namespace {

using mc::testkit::round_trip;

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
  r.client_endpoint = "tcp://127.0.0.1:7000";
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
  EXPECT_EQ(o.client_endpoint, "tcp://127.0.0.1:7000");
  EXPECT_STREQ(ConductorSubmitRequest::kType, "conductor.submit");

  ConductorSubmitReply a{"r-17", true, "prefill-1", "decode-0", 812.5, 31.25, 4096, 6144, true, "", "kvcache: ..."};
  auto ao = round_trip(a);
  EXPECT_TRUE(ao.accepted);
  EXPECT_EQ(ao.prefill_id, "prefill-1");
  EXPECT_EQ(ao.decode_id, "decode-0");
  EXPECT_EQ(ao.predicted_ttft_ms, 812.5);
  EXPECT_EQ(ao.predicted_tbt_ms, 31.25);
  EXPECT_EQ(ao.hit_tokens, 4096);
  EXPECT_EQ(ao.pool_prefix_tokens, 6144);
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

TEST(ConductorProtocol, ReplicateNearRoundTrip) {
  StoreReplicateNearRequest q;
  q.keys = {"kv/0123456789abcdef/00000000000000ff", "kv/0123456789abcdef/0000000000000100"};
  q.host = "host1";
  auto o = round_trip(q);
  EXPECT_EQ(o.keys, q.keys);
  EXPECT_EQ(o.host, "host1");
  EXPECT_EQ(round_trip(StoreReplicateNearReply{7}).marked, 7u);
  EXPECT_STREQ(StoreReplicateNearRequest::kType, "store.replicate_near");
}

// put_start carries the writer's host label (master placement near the writer); a message from a client
// that predates the field decodes with an empty host.
TEST(ConductorProtocol, PutStartCarriesTheWritersHost) {
  StorePutStartRequest q;
  q.client_id = "prefill0-1";
  q.keys = {"k"};
  q.sizes_bytes = {512};
  q.client_host = "host0";
  EXPECT_EQ(round_trip(q).client_host, "host0");
  std::map<std::string, std::string> old{{"client_id", "c"}};
  auto o = codec::unpack<StorePutStartRequest>(codec::pack(old), "test");
  ASSERT_TRUE(o.is_ok()) << o.status().to_string();
  EXPECT_EQ(o->client_id, "c");
  EXPECT_EQ(o->client_host, "");
}

TEST(ConductorProtocol, CancelRoundTrip) {
  EXPECT_EQ(round_trip(ConductorCancelRequest{"r-9"}).request_id, "r-9");
  auto r = round_trip(ConductorCancelReply{"r-9", "decoding"});
  EXPECT_EQ(r.request_id, "r-9");
  EXPECT_EQ(r.stage, "decoding");
  EXPECT_EQ(std::string(ConductorCancelRequest::kType), "conductor.cancel");
}

TEST(ConductorProtocol, StatusRoundTrip) {
  ConductorStatusRequest q;
  q.with_instances = false;
  EXPECT_FALSE(round_trip(q).with_instances);
  auto r = round_trip(ConductorStatusReply{"{\"instances\":[]}"});
  EXPECT_EQ(r.status_json, "{\"instances\":[]}");
}

TEST(ConductorProtocol, WorkerMessagesRoundTrip) {
  ConductorRegisterRequest reg{"decode-0", "decode", "node-a", "tcp://127.0.0.1:5001", "gpu-d0", 131072, 512, "", 0};
  auto ro = round_trip(reg);
  EXPECT_EQ(ro.instance_id, "decode-0");
  EXPECT_EQ(ro.role, "decode");
  EXPECT_EQ(ro.host, "node-a");
  EXPECT_EQ(ro.endpoint, "tcp://127.0.0.1:5001");
  EXPECT_EQ(ro.backend_id, "gpu-d0");
  EXPECT_EQ(ro.kv_capacity_tokens, 131072);
  EXPECT_EQ(ro.block_size_tokens, 512);
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
  hb.decode_step_samples = {DecodeStepSample{8, 9000, 7.5}, DecodeStepSample{2, 100, 3.25}};
  auto ho = round_trip(hb);
  EXPECT_EQ(ho.instance_id, "decode-0");
  EXPECT_EQ(ho.queued_prefill_tokens, 1);
  EXPECT_EQ(ho.queued_prefill_jobs, 2);
  EXPECT_EQ(ho.running_requests, 3);
  EXPECT_EQ(ho.kv_reserved_tokens, 4);
  EXPECT_EQ(ho.context_tokens, 5);
  EXPECT_EQ(ho.decode_steps, 6);
  ASSERT_EQ(ho.decode_step_samples.size(), 2u);
  EXPECT_EQ(ho.decode_step_samples[0].batch_requests, 8);
  EXPECT_EQ(ho.decode_step_samples[0].context_tokens, 9000);
  EXPECT_EQ(ho.decode_step_samples[0].step_ms, 7.5);
  EXPECT_EQ(ho.decode_step_samples[1].step_ms, 3.25);
  EXPECT_FALSE(round_trip(ConductorHeartbeatReply{false}).registered);

  ConductorJobReportRequest j{"r-1", "decode-0", kPhaseDone, 1'700'000'000'000'000'000, 9, "m"};
  auto jo = round_trip(j);
  EXPECT_EQ(jo.request_id, "r-1");
  EXPECT_EQ(jo.instance_id, "decode-0");
  EXPECT_EQ(jo.phase, "done");
  EXPECT_EQ(jo.event_unix_ns, 1'700'000'000'000'000'000);
  EXPECT_EQ(jo.output_tokens, 9);
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
