// Data-plane grants (mc/net/grant.hpp): a token verifies only under its key and unchanged, and covers only its
// segment, ops, range and lifetime.
#include "mc/net/grant.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace mc::auth {
namespace {

const std::string kKey(32, 'k');

Grant sample() { return Grant{"127.0.0.1:4000", 4096, 65536, kGrantRead, 1'000'000, "alice", 7}; }

TEST(Grant, RoundTripsUnderItsKey) {
  auto token = issue_grant(kKey, sample());
  ASSERT_TRUE(token.is_ok()) << token.status().to_string();
  EXPECT_LE(token->size(), kMaxGrantTokenBytes);
  EXPECT_EQ(token->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
            std::string::npos);
  auto g = verify_grant(kKey, token.value());
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->segment, "127.0.0.1:4000");
  EXPECT_EQ(g->offset, 4096u);
  EXPECT_EQ(g->length, 65536u);
  EXPECT_EQ(g->ops, kGrantRead);
  EXPECT_EQ(g->expiry_unix_ms, 1'000'000);
  EXPECT_EQ(g->grantee, "alice");
  EXPECT_EQ(g->id, 7u);
}

TEST(Grant, AnotherKeyOrAnyChangedCharacterIsForged) {
  const std::string token = issue_grant(kKey, sample()).value();
  auto other = verify_grant(std::string(32, 'x'), token);
  ASSERT_FALSE(other.is_ok());
  EXPECT_EQ(other.status().code(), Code::kPermissionDenied);
  EXPECT_NE(other.status().message().find("forged or damaged"), std::string::npos);
  for (size_t i = 0; i < token.size(); ++i) {
    std::string t = token;
    t[i] = t[i] == 'A' ? 'B' : 'A';
    auto g = verify_grant(kKey, t);
    EXPECT_FALSE(g.is_ok()) << "changed character " << i << " still verifies";
    if (!g.is_ok()) {
      EXPECT_EQ(g.status().code(), Code::kPermissionDenied);
    }
  }
  // Truncations and garbage are refused too, never read past the end.
  for (size_t n = 0; n < token.size(); ++n) EXPECT_FALSE(verify_grant(kKey, token.substr(0, n)).is_ok()) << n;
  EXPECT_FALSE(verify_grant(kKey, std::string(2000, 'A')).is_ok());
  EXPECT_FALSE(verify_grant(kKey, "!!!!").is_ok());
  // One spelling per grant: a byte with the high bit set that libsodium's decoder would read as '_' (fuzz_grant).
  for (size_t i = 0; i < token.size(); ++i) {
    std::string t = token;
    t[i] = static_cast<char>(static_cast<unsigned char>(t[i]) | 0x80);
    EXPECT_FALSE(verify_grant(kKey, t).is_ok()) << "high bit at " << i;
  }
  EXPECT_NE(verify_grant(kKey, "").status().message().find("carries no grant"), std::string::npos);
}

TEST(Grant, CoversOnlyItsSegmentOpRangeAndLifetime) {
  const Grant g = sample();
  EXPECT_TRUE(check_grant(g, "127.0.0.1:4000", kGrantRead, 4096, 65536, 1'000'000).is_ok());
  EXPECT_TRUE(check_grant(g, "127.0.0.1:4000", kGrantRead, 4096 + 65535, 1, 0).is_ok());
  auto msg = [&](const std::string& seg, uint8_t op, uint64_t off, uint64_t len, int64_t now) {
    Status st = check_grant(g, seg, op, off, len, now);
    EXPECT_EQ(st.code(), Code::kPermissionDenied);
    return st.message();
  };
  EXPECT_NE(msg("127.0.0.1:4001", kGrantRead, 4096, 1, 0).find("not 127.0.0.1:4001"), std::string::npos);
  EXPECT_NE(msg("127.0.0.1:4000", kGrantWrite, 4096, 1, 0).find("does not allow write"), std::string::npos);
  EXPECT_NE(msg("127.0.0.1:4000", kGrantRead, 4095, 2, 0).find("outside the grant"), std::string::npos);
  EXPECT_NE(msg("127.0.0.1:4000", kGrantRead, 4096, 65537, 0).find("outside the grant"), std::string::npos);
  EXPECT_NE(msg("127.0.0.1:4000", kGrantRead, 4096 + 65536, 1, 0).find("outside the grant"), std::string::npos);
  // Offsets near 2^64 cannot wrap into the range.
  EXPECT_NE(msg("127.0.0.1:4000", kGrantRead, std::numeric_limits<uint64_t>::max(), 4097, 0).find("outside"),
            std::string::npos);
  EXPECT_NE(msg("127.0.0.1:4000", kGrantRead, 4096, 1, 1'000'001).find("expired 1 ms ago"), std::string::npos);
}

TEST(Grant, IssuingRefusesWhatCouldNotBeChecked) {
  Grant g = sample();
  EXPECT_EQ(issue_grant("short", g).status().code(), Code::kInvalidArgument);
  g.length = 0;
  EXPECT_EQ(issue_grant(kKey, g).status().code(), Code::kInvalidArgument);
  g = sample();
  g.offset = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(issue_grant(kKey, g).status().code(), Code::kInvalidArgument);
  g = sample();
  g.ops = 0;
  EXPECT_EQ(issue_grant(kKey, g).status().code(), Code::kInvalidArgument);
  g.ops = 4;
  EXPECT_EQ(issue_grant(kKey, g).status().code(), Code::kInvalidArgument);
  g = sample();
  g.segment = std::string(256, 's');
  EXPECT_EQ(issue_grant(kKey, g).status().code(), Code::kInvalidArgument);
  g = sample();
  g.grantee = std::string(255, 'g');
  g.segment = std::string(255, 's');
  auto t = issue_grant(kKey, g);
  ASSERT_TRUE(t.is_ok());
  EXPECT_LE(t->size(), kMaxGrantTokenBytes);
  EXPECT_TRUE(verify_grant(kKey, t.value()).is_ok());
}

}  // namespace
}  // namespace mc::auth
