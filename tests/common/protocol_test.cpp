// Round trip of every message type in protocol.hpp, and decoding of bad bytes.
#include "mc/proto/protocol.hpp"

#include <gtest/gtest.h>

#include "mc/proto/codec.hpp"
#include "mc/testkit/round_trip.hpp"

namespace mc::proto {
namespace {

using mc::testkit::round_trip;

TEST(Protocol, CommonMessagesRoundTrip) {
  Header h{kProtocolVersion, "put_start", 0xffffffffffffULL};
  auto h2 = round_trip(h);
  EXPECT_EQ(h2.v, kProtocolVersion);
  EXPECT_EQ(h2.type, "put_start");
  EXPECT_EQ(h2.id, 0xffffffffffffULL);
  auto e = round_trip(ErrorReply{404, "key kv/x not found"});
  EXPECT_EQ(e.code, 404);
  EXPECT_EQ(e.message, "key kv/x not found");
  auto hello = round_trip(HelloRequest{kProtocolVersion, "mc-xfer"});
  EXPECT_EQ(hello.client_name, "mc-xfer");
  auto hr = round_trip(HelloReply{1, "mc-store master", "0.1.0"});
  EXPECT_EQ(hr.service, "mc-store master");
  EXPECT_EQ(round_trip(PingReply{123456789012LL}).server_unix_ms, 123456789012LL);
  EXPECT_EQ(round_trip(PingRequest{42}).client_unix_ms, 42);
  EXPECT_TRUE(round_trip(StatRequest{true}).with_prometheus_text);
  auto st = round_trip(StatReply{"svc", R"({"counters":{}})", "x 1\n"});
  EXPECT_EQ(st.prometheus_text, "x 1\n");
  EXPECT_EQ(st.metrics_json, R"({"counters":{}})");
  KvEvent ev{kKvEventStored, 7, 1700000000000LL, {1, 0xffffffffffffffffULL}, "node-1/seg0", "cpu"};
  auto ev2 = round_trip(ev);
  EXPECT_EQ(ev2.type, "stored");
  EXPECT_EQ(ev2.event_id, 7u);
  EXPECT_EQ(ev2.seq_hashes, ev.seq_hashes);
  EXPECT_EQ(ev2.backend_id, "node-1/seg0");
  EXPECT_EQ(ev2.medium, "cpu");
}

// Regression (tests/fuzz/fuzz_protocol): msgpack-c allocates a container's elements when it reads the
// header, so a few bytes declaring 2^32 - 1 elements made a 100 GB allocation (an abort under ASan, memory
// exhaustion otherwise). Such sizes are now refused before msgpack sees them, naming the offset.
TEST(Protocol, DeclaredSizesBeyondTheInputAreRefusedBeforeAllocating) {
  const std::string huge_array("\xdd\xff\xff\xff\xff", 5);
  auto a = codec::unpack<StoreExistsRequest>(huge_array, "huge array");
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().code(), Code::kMalformedMessage);
  EXPECT_NE(a.status().message().find("declare 4294967295 elements"), std::string::npos) << a.status().message();
  // A map field whose list declares 2^31 elements, as the fuzzer found it inside a real request.
  std::string put = codec::pack(StorePutStartRequest{});
  const std::string keys = codec::pack(std::string("keys"));
  const size_t at = put.find(keys);
  ASSERT_NE(at, std::string::npos);
  put.replace(at + keys.size(), 1, std::string("\xdd\x80\x00\x00\x00", 5));
  auto p = codec::unpack<StorePutStartRequest>(put, "put_start");
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("truncated"), std::string::npos) << p.status().message();
  auto m = codec::unpack<KvEvent>(std::string("\xdf\x7f\xff\xff\xff", 5), "huge map");
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), Code::kMalformedMessage);
  // Sizes that fit are untouched: a list of 1000 keys, each element nested in its own array.
  StoreExistsRequest many;
  for (int i = 0; i < 1000; ++i) many.keys.push_back("k" + std::to_string(i));
  auto back = codec::unpack<StoreExistsRequest>(codec::pack(many), "many");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->keys, many.keys);
  auto nested = codec::unpack<std::vector<std::vector<int>>>(
      codec::pack(std::vector<std::vector<int>>{{1, 2}, {}, {3}}), "nested");
  ASSERT_TRUE(nested.is_ok()) << nested.status().to_string();
  EXPECT_EQ(nested->size(), 3u);
}

// 60 MiB of one-element arrays fit the size bound (each element takes a byte) but held 2.5 GB and a daemon's
// serving loop for 20 s in msgpack-c; nesting past codec::detail::kMaxDepth is refused before decoding.
TEST(Protocol, NestingDeeperThanTheLimitIsRefusedBeforeDecoding) {
  const size_t limit = codec::detail::kMaxDepth;
  std::string deep = std::string(limit, '\x91') + '\xc0';  // kMaxDepth arrays around a nil: decodes
  auto ok = codec::unpack<std::vector<int>>(deep, "deep");
  EXPECT_FALSE(ok.is_ok());  // ill-typed for the struct, but refused by msgpack's conversion, not by the depth
  EXPECT_EQ(ok.status().message().find("nest deeper"), std::string::npos) << ok.status().message();
  deep = std::string(limit + 1, '\x91') + '\xc0';
  auto bad = codec::unpack<StoreExistsRequest>(deep, "too deep");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kMalformedMessage);
  EXPECT_NE(bad.status().message().find("nest deeper than " + std::to_string(limit) + " levels"), std::string::npos)
      << bad.status().message();
  // The attack as sent: 60 MiB of 0x91 (as a header or a body).
  const std::string bomb = std::string(60u << 20, '\x91') + '\xc0';
  auto b = codec::unpack<Header>(bomb, "message header");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("nest deeper"), std::string::npos) << b.status().message().substr(0, 200);
  // Depth is counted per open container: a wide message at depth 2 is untouched, and closing containers frees
  // their levels (1,000 sibling arrays of depth 3 in one list).
  std::vector<std::vector<std::vector<int>>> wide(1000, std::vector<std::vector<int>>{{1, 2}, {3}});
  auto w = codec::unpack<std::vector<std::vector<std::vector<int>>>>(codec::pack(wide), "wide");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->size(), 1000u);
}

TEST(Protocol, BadBytesAreErrorsNotCrashes) {
  std::string good = codec::pack(KvEvent{kKvEventRemoved, 1, 2, {3, 4, 5}, "b", "disk"});
  for (size_t cut = 0; cut < good.size(); ++cut) {
    auto r = codec::unpack<KvEvent>(good.substr(0, cut), "cut");
    EXPECT_FALSE(r.is_ok()) << cut;
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().code(), Code::kMalformedMessage);
    }
  }
  auto trailing = codec::unpack<KvEvent>(good + "x", "trailing");
  EXPECT_FALSE(trailing.is_ok());
  // Ill-typed: a string where a u64 list is expected.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(1);
  pk.pack(std::string("seq_hashes"));
  pk.pack(std::string("not a list"));
  auto ill = codec::unpack<KvEvent>(std::string(buf.data(), buf.size()), "ill-typed event");
  ASSERT_FALSE(ill.is_ok());
  EXPECT_NE(ill.status().message().find("ill-typed event"), std::string::npos);
  // Missing fields decode to defaults (compatible additions).
  msgpack::sbuffer buf2;
  msgpack::packer<msgpack::sbuffer> pk2(buf2);
  pk2.pack_map(1);
  pk2.pack(std::string("type"));
  pk2.pack(std::string("cleared"));
  auto partial = codec::unpack<KvEvent>(std::string(buf2.data(), buf2.size()), "partial");
  ASSERT_TRUE(partial.is_ok());
  EXPECT_EQ(partial->type, "cleared");
  EXPECT_TRUE(partial->seq_hashes.empty());
  // Random garbage never crashes.
  std::string junk;
  for (int i = 0; i < 2000; ++i) {
    junk.push_back(static_cast<char>((i * 2654435761u) >> 13));
    (void)codec::unpack<KvEvent>(junk, "junk");
  }
}

}  // namespace
}  // namespace mc::proto
