// Quotas per tenant in MasterCore (docs/SECURITY.md "Quotas (issue 51)"): usage after put, put_end, overwrite,
// remove, pin, expiry of an abandoned put, eviction and a takeover from the durable records; limits set and by
// default; a refusal is that tenant's alone.
#include <gtest/gtest.h>

#include "mc/store/master_core.hpp"
#include "mc/store/master_ha.hpp"
#include "mc/testkit/units.hpp"

namespace mc::store {
namespace {

using testkit::kMiB;

SegmentInfo quota_dram(const std::string& node, uint64_t cap) {
  SegmentInfo s;
  s.name = node + "/dram";
  s.node_id = node;
  s.host = node;
  s.domain = node;
  s.medium = Medium::kCpu;
  s.capacity_bytes = cap;
  s.endpoint = "tcp://127.0.0.1:1";
  return s;
}

MasterConfig quota_config(double share = 0) {
  MasterConfig c;
  c.lease_ms = 1000;
  c.put_takeover_ms = 5000;
  c.free_delay_ms = 2000;
  c.client_ttl_ms = 60000;
  c.node_grace_ms = 0;
  c.quota_default_share = share;
  return c;
}

class MasterQuotaTest : public ::testing::Test {
 protected:
  explicit MasterQuotaTest(double share = 0) : core_(quota_config(share), &clock_) {}
  void mount(uint64_t each = 16 * kMiB) {
    for (const char* n : {"n1", "n2", "n3"}) ASSERT_TRUE(core_.mount_segment(quota_dram(n, each)).is_ok());
  }
  PutOptions as(const std::string& tenant, uint32_t replicas = 1, bool pin = false) {
    PutOptions o;
    o.replicas = replicas;
    o.pin = pin;
    o.tenant = tenant;
    return o;
  }
  Result<PutGrant> start(const std::string& key, uint64_t size, const PutOptions& o) {
    return core_.put_start({"c-" + o.tenant, "", ""}, key, size, o);
  }
  Status put(const std::string& key, uint64_t size, const PutOptions& o) {
    Result<PutGrant> g = start(key, size, o);
    if (!g.is_ok()) return g.status();
    return core_.put_end({"c-" + o.tenant, "", ""}, key, g->put_id, 0);
  }
  TenantStats tenant(const std::string& name) const {
    for (const TenantStats& t : core_.stat().tenants) {
      if (t.tenant == name) return t;
    }
    return TenantStats{};
  }

  ManualClock clock_{1'000'000'000};
  MasterCore core_;
};

TEST_F(MasterQuotaTest, UsageFollowsPutPutEndOverwritePinAndRemove) {
  mount();
  auto g = start("tenant/bob/a", 1 * kMiB, as("bob", 2));
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  TenantStats t = tenant("bob");
  EXPECT_EQ(t.usage.puts, 1u);
  EXPECT_EQ(t.usage.put_bytes, 2 * kMiB);  // charged for the two replicas asked
  EXPECT_EQ(t.usage.bytes, 2 * kMiB);
  EXPECT_EQ(t.usage.objects, 1u);
  ASSERT_TRUE(core_.put_end({"c-bob", "", ""}, "tenant/bob/a", g->put_id, 0).is_ok());
  t = tenant("bob");
  EXPECT_EQ(t.usage.puts, 0u);
  EXPECT_EQ(t.usage.put_bytes, 0u);
  EXPECT_EQ(t.usage.bytes, 2 * kMiB);
  EXPECT_EQ(t.usage.objects, 1u);
  PutOptions ow = as("bob");
  ow.overwrite = true;
  ASSERT_TRUE(put("tenant/bob/a", 3 * kMiB, ow).is_ok());
  t = tenant("bob");
  EXPECT_EQ(t.usage.bytes, 3 * kMiB);
  EXPECT_EQ(t.usage.objects, 1u);
  ASSERT_TRUE(core_.pin("tenant/bob/a", 0).is_ok());
  EXPECT_EQ(tenant("bob").usage.pinned_bytes, 3 * kMiB);
  ASSERT_TRUE(core_.unpin("tenant/bob/a").is_ok());
  EXPECT_EQ(tenant("bob").usage.pinned_bytes, 0u);
  // A soft pin's bytes leave the usage when it runs out.
  ASSERT_TRUE(core_.pin("tenant/bob/a", 100).is_ok());
  EXPECT_EQ(tenant("bob").usage.pinned_bytes, 3 * kMiB);
  clock_.advance_ms(200);
  core_.tick();
  EXPECT_EQ(tenant("bob").usage.pinned_bytes, 0u);
  // A shared key counts to the tenant that wrote it; another role's keys to nobody.
  ASSERT_TRUE(put("shared/team/x", 1 * kMiB, as("bob")).is_ok());
  ASSERT_TRUE(put("kv/m/0001", 5 * kMiB, as("")).is_ok());
  t = tenant("bob");
  EXPECT_EQ(t.usage.bytes, 4 * kMiB);
  EXPECT_EQ(t.usage.objects, 2u);
  // A key with a control character is refused (it would forge lines where `mc-store ls` prints it).
  EXPECT_EQ(put("tenant/bob/a\nkv/forged \x1b[8m", 1 * kMiB, as("bob")).code(), Code::kInvalidArgument);
  // Alice may not pin bob's shared object: his quota would pay for her pin (a tester's finding).
  Status foreign = core_.pin("shared/team/x", 0, "alice");
  EXPECT_EQ(foreign.code(), Code::kPermissionDenied) << foreign.to_string();
  EXPECT_NE(foreign.message().find("written by tenant 'bob'"), std::string::npos) << foreign.message();
  EXPECT_EQ(tenant("bob").usage.pinned_bytes, 0u);
  ASSERT_TRUE(core_.pin("shared/team/x", 0, "bob").is_ok());
  ASSERT_TRUE(core_.unpin("shared/team/x").is_ok());
  ASSERT_TRUE(core_.remove("tenant/bob/a").is_ok());
  ASSERT_TRUE(core_.remove("shared/team/x").is_ok());
  t = tenant("bob");
  EXPECT_EQ(t.usage.bytes, 0u);
  EXPECT_EQ(t.usage.objects, 0u);
  EXPECT_EQ(core_.stat().tenants.size(), 1u);  // no "" bucket: the exempt put is nobody's
}

TEST_F(MasterQuotaTest, OverQuotaIsAClearErrorToThatTenantAlone) {
  mount();
  QuotaLimits q;
  q.pinned_bytes = 4 * kMiB;
  ASSERT_TRUE(core_.set_quota("bob", q).is_ok());
  ASSERT_TRUE(put("tenant/bob/p1", 2 * kMiB, as("bob", 1, true)).is_ok());
  ASSERT_TRUE(put("tenant/bob/p2", 2 * kMiB, as("bob", 1, true)).is_ok());
  Status s = put("tenant/bob/p3", 2 * kMiB, as("bob", 1, true));
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("tenant 'bob' is over its quota of pinned bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("4194304 in use + 2097152 asked > limit 4194304"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("mc-store quota set bob pinned:"), std::string::npos) << s.message();
  EXPECT_FALSE(core_.exists("tenant/bob/p3"));
  // Pinning later is held to the same quota.
  ASSERT_TRUE(put("tenant/bob/u", 2 * kMiB, as("bob")).is_ok());
  EXPECT_EQ(core_.pin("tenant/bob/u", 0).code(), Code::kResourceExhausted);
  // alice is not bob: her pinned 8 MiB puts succeed.
  EXPECT_TRUE(put("tenant/alice/p", 8 * kMiB, as("alice", 1, true)).is_ok());
  EXPECT_EQ(tenant("bob").refused, 2u);
  EXPECT_EQ(tenant("alice").refused, 0u);
  // Raised: bob's next put succeeds.
  q.pinned_bytes = 8 * kMiB;
  ASSERT_TRUE(core_.set_quota("bob", q).is_ok());
  EXPECT_TRUE(put("tenant/bob/p3", 2 * kMiB, as("bob", 1, true)).is_ok());
  // Unfinished puts by count; a refused overwrite keeps the old object.
  q.puts = 1;
  q.bytes = 10 * kMiB;
  ASSERT_TRUE(core_.set_quota("bob", q).is_ok());
  ASSERT_TRUE(start("tenant/bob/w1", 1 * kMiB, as("bob")).is_ok());
  s = start("tenant/bob/w2", 1 * kMiB, as("bob")).status();
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("unfinished puts"), std::string::npos) << s.message();
  q.puts = kQuotaDefault;
  ASSERT_TRUE(core_.set_quota("bob", q).is_ok());
  PutOptions ow = as("bob");
  ow.overwrite = true;
  EXPECT_EQ(put("tenant/bob/u", 8 * kMiB, ow).code(), Code::kResourceExhausted);  // 9 + 8 - 2 > 10 MiB
  EXPECT_TRUE(core_.exists("tenant/bob/u"));
  EXPECT_TRUE(put("tenant/bob/u", 3 * kMiB, ow).is_ok());  // 9 + 3 - 2 = 10 MiB: the old one is credited
}

class MasterQuotaDefaultTest : public MasterQuotaTest {
 protected:
  MasterQuotaDefaultTest() : MasterQuotaTest(0.5) {}
};

// With keys (quota_default_share 0.5): no tenant holds more than half the DRAM pinned, nor in unfinished puts.
TEST_F(MasterQuotaDefaultTest, NoTenantHoldsMoreThanHalfTheDramPinnedOrUnfinished) {
  mount();  // 48 MiB of DRAM: 24 MiB each
  // Another role's puts (the cluster's KV blocks) are exempt and counted to nobody.
  ASSERT_TRUE(put("kv/m/0001", 4 * kMiB, as("", 1, true)).is_ok());
  ASSERT_TRUE(core_.remove("kv/m/0001").is_ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(put("tenant/bob/p" + std::to_string(i), 8 * kMiB, as("bob", 1, true)).is_ok()) << i;
  }
  Status s = put("tenant/bob/p3", 8 * kMiB, as("bob", 1, true));
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("the default with keys: 50% of the pool's DRAM capacity"), std::string::npos)
      << s.message();
  // Pinned and unfinished together: half, not half each (else one tenant holds the whole pool).
  s = start("tenant/bob/w0", 1 * kMiB, as("bob")).status();
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("pinned and unfinished put bytes together"), std::string::npos) << s.message();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(core_.remove("tenant/bob/p" + std::to_string(i)).is_ok()) << i;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(start("tenant/bob/w" + std::to_string(i), 8 * kMiB, as("bob")).is_ok()) << i;
  }
  s = start("tenant/bob/w3", 1 * kMiB, as("bob")).status();
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("unfinished put bytes"), std::string::npos) << s.message();
  TenantStats t = tenant("bob");
  EXPECT_EQ(t.limits.pinned_bytes, 24 * kMiB);
  EXPECT_EQ(t.limits.put_bytes, 24 * kMiB);
  EXPECT_EQ(t.limits.bytes, kQuotaNone);
  EXPECT_EQ(core_.stat().tenants.size(), 1u);
}

// An abandoned put of a tenant expires put_takeover_ms after put_start even while its client lives: its bytes and
// its count come back, and a late put_end is refused. Another role's put waits for put_reclaim_ms.
TEST_F(MasterQuotaTest, AbandonedPutExpiresAtTheTakeoverTime) {
  mount();
  auto g = start("tenant/bob/w", 8 * kMiB, as("bob"));
  ASSERT_TRUE(g.is_ok());
  auto exempt = start("kv/m/0002", 8 * kMiB, as(""));
  ASSERT_TRUE(exempt.is_ok());
  EXPECT_EQ(tenant("bob").usage.put_bytes, 8 * kMiB);
  for (int i = 0; i < 6; ++i) {  // 6 s, the client heartbeating
    clock_.advance_ms(1000);
    core_.client_heartbeat("c-bob");
    core_.client_heartbeat("c-");
    for (const char* n : {"n1", "n2", "n3"}) (void)core_.node_heartbeat(n);
    core_.tick();
  }
  TenantStats t = tenant("bob");
  EXPECT_EQ(t.usage.puts, 0u);
  EXPECT_EQ(t.usage.put_bytes, 0u);
  EXPECT_EQ(t.usage.objects, 0u);
  EXPECT_EQ(core_.put_end({"c-bob", "", ""}, "tenant/bob/w", g->put_id, 0).code(), Code::kFailedPrecondition);
  EXPECT_EQ(core_.stat().processing, 1u);  // the exempt one is still there
  clock_.advance_ms(2500);                 // free_delay_ms
  for (const char* n : {"n1", "n2", "n3"}) (void)core_.node_heartbeat(n);
  core_.tick();
  uint64_t used = 0;
  for (const SegmentStats& s : core_.stat().segments) used += s.used_bytes;
  EXPECT_EQ(used, 8 * kMiB);  // bob's range is free again; the exempt put's is held
}

// Usage counts only what exists: objects evicted under pressure leave it.
TEST_F(MasterQuotaTest, EvictedObjectsLeaveTheUsage) {
  ASSERT_TRUE(core_.mount_segment(quota_dram("n1", 16 * kMiB)).is_ok());
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(put("tenant/bob/o" + std::to_string(i), 2 * kMiB, as("bob")).is_ok()) << i;
    clock_.advance_ms(10);
  }
  uint64_t present = 0, n = 0;
  for (const ObjectInfo& o : core_.ls("tenant/bob/", 100)) {
    present += o.size_bytes;
    ++n;
  }
  EXPECT_LT(n, 12u);  // some were evicted
  TenantStats t = tenant("bob");
  EXPECT_EQ(t.usage.bytes, present);
  EXPECT_EQ(t.usage.objects, n);
}

// A takeover rebuilds the usage from the etcd records (a shared key's writer is recorded in its record).
TEST_F(MasterQuotaTest, UsageIsRebuiltFromTheDurableRecords) {
  mount();
  ASSERT_TRUE(put("tenant/bob/a", 2 * kMiB, as("bob", 2, true)).is_ok());
  ASSERT_TRUE(put("shared/team/b", 1 * kMiB, as("bob")).is_ok());
  ASSERT_TRUE(put("tenant/alice/c", 3 * kMiB, as("alice")).is_ok());
  ASSERT_TRUE(start("tenant/bob/w", 1 * kMiB, as("bob")).is_ok());  // unfinished: not carried over
  std::vector<DurableSegment> segs = core_.durable_segments();
  std::vector<DurableObject> objs;
  for (const DurableObject& o : core_.durable_objects()) {  // through the etcd records, as a standby reads them
    const std::string text = encode_object_record(o, 1000);
    EXPECT_EQ(text.find("\"owner\""), o.key == "shared/team/b" ? text.find("\"owner\":\"bob\"") : std::string::npos)
        << text;  // only a shared key records its writer
    Result<DurableObject> back = decode_object_record(o.key, text, 1000);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    objs.push_back(std::move(back).value());
  }
  MasterCore next(quota_config(), &clock_);
  ASSERT_TRUE(next.load_durable(segs, objs).is_ok());
  std::map<std::string, TenantUsage> got;
  for (const TenantStats& t : next.tenant_stats()) got[t.tenant] = t.usage;
  EXPECT_EQ(got["bob"].bytes, 5 * kMiB);
  EXPECT_EQ(got["bob"].pinned_bytes, 4 * kMiB);
  EXPECT_EQ(got["bob"].objects, 2u);
  EXPECT_EQ(got["bob"].puts, 0u);
  EXPECT_EQ(got["alice"].bytes, 3 * kMiB);
}

TEST(QuotaLimits, ParseNamesUnitsAndErrors) {
  auto q = parse_quota_limits("bytes:2GiB,pinned:1GiB,puts:64,put-bytes:512MiB,objects:100000");
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->bytes, 2ull << 30);
  EXPECT_EQ(q->pinned_bytes, 1ull << 30);
  EXPECT_EQ(q->puts, 64u);
  EXPECT_EQ(q->put_bytes, 512ull << 20);
  EXPECT_EQ(q->objects, 100000u);
  auto merged = parse_quota_limits("pinned:default", *q);
  ASSERT_TRUE(merged.is_ok());
  EXPECT_EQ(merged->pinned_bytes, kQuotaDefault);
  EXPECT_EQ(merged->bytes, 2ull << 30);
  auto bad = parse_quota_limits("pins:3");
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown quota 'pins'"), std::string::npos);
  EXPECT_EQ(parse_quota_limits("bytes:lots").status().code(), Code::kInvalidArgument);
  auto tq = parse_tenant_quota("alice=bytes:2GiB");
  ASSERT_TRUE(tq.is_ok());
  EXPECT_EQ(tq->first, "alice");
  EXPECT_EQ(parse_tenant_quota("bytes:2GiB").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace mc::store
