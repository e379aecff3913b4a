#include "mc/common/block_key.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>

#include "block_key_golden.hpp"

namespace mc {
namespace {

std::vector<uint32_t> iota_tokens(size_t n) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), 0u);
  return t;
}

// Golden values: a change of algorithm, byte order or seed handling must break this test, not the cache
// (DESIGN.md §13.1). local[0] was cross-checked with the xxhsum tool (XXH3-64, seed 0) over the same
// 2048 bytes of little-endian u32 tokens 0..511.
TEST(BlockKey, GoldenDigests) {
  KeyNamespace ns;  // plain: seed 0, block size 512
  auto tokens = iota_tokens(1024);
  auto h = seq_hashes(tokens, ns);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(hash_hex(h[0]), MC_GOLDEN_BLOCK0);
  EXPECT_EQ(hash_hex(h[1]), MC_GOLDEN_BLOCK1);
  EXPECT_EQ(h[0], local_block_hash(std::span<const uint32_t>(tokens).first(512), 0));
  EXPECT_EQ(h[1], chain_hash(h[0], local_block_hash(std::span<const uint32_t>(tokens).subspan(512), 0), 0));
}

TEST(BlockKey, OnlyCompleteBlocksAreKeyed) {
  KeyNamespace ns;
  EXPECT_EQ(seq_hashes(iota_tokens(511), ns).size(), 0u);
  EXPECT_EQ(seq_hashes(iota_tokens(1023), ns).size(), 1u);
  EXPECT_EQ(seq_hashes(iota_tokens(1025), ns).size(), 2u);
  ns.block_size = 256;
  EXPECT_EQ(seq_hashes(iota_tokens(1024), ns).size(), 4u);
}

TEST(BlockKey, ChainDependsOnEveryEarlierBlock) {
  KeyNamespace ns;
  auto a = iota_tokens(1536);
  auto b = a;
  b[3] = 999999;  // differ in block 0 only
  auto ha = seq_hashes(a, ns), hb = seq_hashes(b, ns);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(ha[i], hb[i]) << "block " << i;
  auto c = a;
  c[1100] = 7;  // differ in block 2 only
  auto hc = seq_hashes(c, ns);
  EXPECT_EQ(ha[0], hc[0]);
  EXPECT_EQ(ha[1], hc[1]);
  EXPECT_NE(ha[2], hc[2]);
}

// Field report #3: every namespace field separates keys.
TEST(BlockKey, NamespaceFieldsSeparateKeys) {
  auto tokens = iota_tokens(1024);
  KeyNamespace base;
  base.model_id = "m";
  base.kv_dtype = "bf16";
  base.layout = "tp8";
  std::set<uint64_t> seen{seq_hashes(tokens, base)[0], seq_hashes(tokens, KeyNamespace{})[0]};
  std::set<std::string> digests{base.digest_hex(), KeyNamespace{}.digest_hex()};
  auto variant = [&](auto mutate) {
    KeyNamespace ns = base;
    mutate(ns);
    EXPECT_TRUE(seen.insert(seq_hashes(tokens, ns)[0]).second);
    EXPECT_TRUE(digests.insert(ns.digest_hex()).second);
  };
  variant([](KeyNamespace& n) { n.kv_dtype = "fp8"; });
  variant([](KeyNamespace& n) { n.model_revision = "r2"; });
  variant([](KeyNamespace& n) { n.layout = "tp4"; });
  variant([](KeyNamespace& n) { n.lora_name = "adapter"; });
  variant([](KeyNamespace& n) { n.lora_version = "2"; });
  variant([](KeyNamespace& n) { n.salt = "tenant-a"; });
  variant([](KeyNamespace& n) { n.seed = 1; });
  variant([](KeyNamespace& n) { n.model_id = "m2"; });
  // Field boundaries are length-prefixed: ("ab","") != ("a","b").
  KeyNamespace x, y;
  x.model_id = "ab";
  y.model_id = "a";
  y.model_revision = "b";
  EXPECT_NE(x.chain_seed(), y.chain_seed());
  EXPECT_EQ(block_store_key(base, 0x1234).substr(0, 20), "kv/" + base.digest_hex() + "/");
  EXPECT_EQ(block_store_key(base, 0x1234).substr(20), "0000000000001234");
}

// A request's namespace is the worker's base with the request's adapter and salt: equal scopes give equal
// keys, any difference in adapter, version or salt gives other keys (and another store-key digest), and
// the base's own adapter and salt are replaced, never kept.
TEST(BlockKey, RequestScopeSelectsTheNamespace) {
  auto tokens = iota_tokens(64);
  KeyNamespace base;
  base.model_id = "tiny";
  base.model_revision = "ref-seed0";
  base.block_size = 16;
  const RequestKeyScope a1{"a", "1", ""}, a2{"a", "2", ""}, b1{"b", "1", ""}, a1t{"a", "1", "t"};
  EXPECT_EQ(seq_hashes(tokens, base.with_request({})), seq_hashes(tokens, base));
  EXPECT_EQ(seq_hashes(tokens, base.with_request(a1)), seq_hashes(tokens, base.with_request(RequestKeyScope{a1})));
  std::set<uint64_t> first;
  std::set<std::string> digests;
  for (const RequestKeyScope& s : {RequestKeyScope{}, a1, a2, b1, a1t, RequestKeyScope{"", "", "t"}}) {
    const KeyNamespace ns = base.with_request(s);
    EXPECT_EQ(ns.request_scope(), s);
    EXPECT_EQ(ns.model_id, "tiny");
    EXPECT_TRUE(first.insert(seq_hashes(tokens, ns)[0]).second) << s.describe();
    EXPECT_TRUE(digests.insert(ns.digest_hex()).second) << s.describe();
  }
  KeyNamespace salted = base.with_request(a1t);
  EXPECT_EQ(salted.with_request(a1).digest_hex(), base.with_request(a1).digest_hex());
  EXPECT_EQ(salted.with_request({}).digest_hex(), base.digest_hex());
  EXPECT_EQ(a1t.describe(), "a@1 salt=t");
  EXPECT_EQ(RequestKeyScope{}.describe(), "base");
}

TEST(BlockKey, KeyScopeValidation) {
  EXPECT_TRUE(validate_key_scope({}, "r").is_ok());
  EXPECT_TRUE(validate_key_scope({"a", "", "t"}, "r").is_ok());
  Status no_name = validate_key_scope({"", "2", ""}, "row 3");
  EXPECT_EQ(no_name.code(), Code::kInvalidArgument);
  EXPECT_NE(no_name.message().find("row 3: lora_version '2' without lora_name"), std::string::npos)
      << no_name.message();
  Status long_salt = validate_key_scope({"", "", std::string(kMaxKeyScopeFieldBytes + 1, 'x')}, "r");
  EXPECT_NE(long_salt.message().find("salt has 257 bytes"), std::string::npos) << long_salt.message();
  EXPECT_FALSE(validate_key_scope({"a\n", "", ""}, "r").is_ok());
}

// The store key grammar (block_key.hpp BlockStoreKey): one formatter, one parser, and what the parser refuses.
TEST(BlockStoreKey, FormatsAndParsesTheOneGrammar) {
  KeyNamespace ns;
  ns.model_id = "llama3-8b";
  const std::string key = block_store_key(ns, 0xffu);
  EXPECT_EQ(key, "kv/" + ns.digest_hex() + "/00000000000000ff");
  const std::optional<BlockStoreKey> parsed = BlockStoreKey::parse(key);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->namespace_digest, ns.digest_hex());
  EXPECT_EQ(parsed->seq_hash, 0xffu);
  EXPECT_EQ(parsed->str(), key);
  EXPECT_EQ((BlockStoreKey{"ha", 0xfedcba9876543210ULL}).str(), "kv/ha/fedcba9876543210");
  for (const char* bad : {"", "kv/", "kv//00000000000000ff", "kv/x/zz", "kv/x/00000000000000f",
                          "kv/x/00000000000000fff", "kv/x/0000000000000g0f", "kv/a/b/00000000000000ff",
                          "xv/x/00000000000000ff", "kv/x/-0000000000000ff", "plain-key"}) {
    EXPECT_FALSE(BlockStoreKey::parse(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace mc
