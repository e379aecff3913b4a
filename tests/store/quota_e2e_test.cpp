// End-to-end: quotas per tenant (issue 51, docs/SECURITY.md "Quotas (issue 51)") against real daemons started with
// keys (mc-auth init). bob, with a legitimate client key, pins half of the pool with put_start (+ put_end without
// writing a byte) and is refused past the default quota with a clear error naming it, while alice's 8 MiB puts
// succeed; bob's abandoned put expires and its bytes come back; mc-store stat and quota ls show both tenants; the
// admin raises bob's quota with mc-store quota set and his next put succeeds; the master's log and /metrics name
// bob. Children are stopped and files removed by RAII guards, also when a test fails.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mc/net/auth.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/store.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"
#include "tool_run.hpp"

namespace mc {
namespace MC_UNITY_ID {

namespace fs = std::filesystem;
const std::string kBin = MC_BINARY_DIR "/bin/";
constexpr uint64_t kMiB = 1 << 20;

struct TempDir : store_e2e::TempDir {
  TempDir() : store_e2e::TempDir("quota-e2e") {}
};
using store_e2e::read_file;
using store_e2e::run;

// GET URL/metrics (cpp-httplib, 3 s timeouts): the body, or "" on failure.
std::string get_metrics(const std::string& url) {
  httplib::Client c(url);
  c.set_connection_timeout(3, 0);
  c.set_read_timeout(3, 0);
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

std::string ready_field(const std::string& line, const std::string& key) {
  std::istringstream words(line);
  std::string w;
  while (words >> w) {
    if (w.rfind(key + "=", 0) == 0) return w.substr(key.size() + 1);
  }
  return "";
}

// Whether `text` holds `needle`; the message names both otherwise.
::testing::AssertionResult has(const std::string& text, const std::string& needle) {
  if (text.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not in:\n" << text;
}

class QuotaE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = tmp_.path / "keys";
    auto [rc, out] = run("mc-auth", {"init", keys_.string(), "--tenant", "alice", "--tenant", "bob", "--node", "node0",
                                     "--shared", "public"});
    ASSERT_EQ(rc, 0) << out;
    // A short takeover time, so the abandoned put expires within the test; clients live long, so only that rule can
    // expire it (a dead client's puts are reclaimed anyway).
    std::vector<std::string> argv = {kBin + "mc-store",   "master",
                                     "--listen",          "tcp://127.0.0.1:0",
                                     "--events",          "",
                                     "--put-takeover-ms", "3000",
                                     "--client-ttl-ms",   "600000",
                                     "--metrics-listen",  "127.0.0.1:0",
                                     "--auth-dir",        keys_.string(),
                                     "--auth-name",       "master"};
    testkit::ChildOptions o;
    o.stderr_path = (tmp_.path / "master.log").string();
    o.stop_grace_ms = 2000;
    master_ = std::make_unique<testkit::Child>(argv, o);
    ready_ = master_->wait_line("ready ", 10000);
    std::istringstream words(ready_);
    std::string word, service;
    words >> word >> service >> endpoint_;
    ASSERT_FALSE(endpoint_.empty()) << read_file(tmp_.path / "master.log");
    metrics_ = ready_field(ready_, "metrics");
    ASSERT_FALSE(metrics_.empty()) << ready_;
    o.stderr_path = (tmp_.path / "node.log").string();
    node_ = std::make_unique<testkit::Child>(
        std::vector<std::string>{kBin + "mc-store", "serve", "--master", endpoint_, "--node-id", "node0",
                                 "--dram-bytes", "64MiB", "--no-shm", "--auth-dir", keys_.string(), "--auth-name",
                                 "node0"},
        o);
    ASSERT_FALSE(node_->wait_ready(10000).empty()) << read_file(tmp_.path / "node.log");
  }
  void TearDown() override { (void)auth::set_process_keyring(nullptr); }

  std::pair<int, std::string> store(const std::string& who, std::vector<std::string> args) {
    const size_t at = args.size() > 1 && args[0] == "quota" ? 2 : 1;
    args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), {"--master", endpoint_});
    args.insert(args.end(), {"--auth-dir", keys_.string(), "--auth-name", who});
    return run("mc-store", args);
  }
  // The tenants' rows of mc-store quota ls --json as `who`, by tenant.
  std::map<std::string, nlohmann::json> tenants(const std::string& who) {
    std::map<std::string, nlohmann::json> out;
    auto [rc, text] = store(who, {"quota", "ls", "--json"});
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (rc != 0 || !j.is_array()) {
      ADD_FAILURE() << "quota ls as " << who << ": " << text;
      return out;
    }
    for (const auto& t : j) out[t["tenant"].get<std::string>()] = t;
    return out;
  }

  TempDir tmp_;
  fs::path keys_;
  std::unique_ptr<testkit::Child> master_, node_;
  std::string endpoint_, ready_, metrics_;
};

// bob, as the issue did: pinned puts of 8 MiB with put_start (+ put_end without writing a byte).
proto::StorePutStartRequest bob_puts(std::vector<std::string> keys) {
  proto::StorePutStartRequest req;
  req.client_id = "bob-client";
  req.sizes_bytes.assign(keys.size(), 8 * kMiB);
  req.keys = std::move(keys);
  req.pin = true;
  return req;
}

TEST_F(QuotaE2E, OneTenantCannotPinThePoolAndTheAdminRaisesItsQuota) {
  {
    auto ring = auth::Keyring::load(keys_.string(), "bob");
    ASSERT_TRUE(ring.is_ok()) << ring.status().to_string();
    ASSERT_TRUE(auth::set_process_keyring(ring.value()).is_ok());
  }
  rpc::AsyncClient c;
  // The default with keys: half of the 64 MiB pool pinned, and as much in unfinished puts.
  auto started = c.call_sync(endpoint_, bob_puts({"p0", "p1", "p2", "p3"}), 5000);
  ASSERT_TRUE(started.is_ok()) << started.status().to_string();
  ASSERT_EQ(started->items.size(), 4u);
  for (const auto& item : started->items) ASSERT_EQ(item.code, 0) << item.message;
  proto::StorePutEndRequest end;
  end.client_id = "bob-client";
  for (int i = 0; i < 3; ++i) {  // p3 is abandoned
    end.keys.push_back("p" + std::to_string(i));
    end.put_ids.push_back(started->items[static_cast<size_t>(i)].put_id);
    end.checksums.push_back(0);
  }
  auto ended = c.call_sync(endpoint_, end, 5000);
  ASSERT_TRUE(ended.is_ok()) << ended.status().to_string();
  auto refused = c.call_sync(endpoint_, bob_puts({"p4"}), 5000);
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  ASSERT_EQ(refused->items.size(), 1u);
  EXPECT_EQ(refused->items[0].code, static_cast<uint16_t>(Code::kResourceExhausted)) << refused->items[0].message;
  EXPECT_TRUE(has(refused->items[0].message,
                  "tenant 'bob' is over its quota of pinned bytes: 33554432 in use + "
                  "8388608 asked > limit 33554432"));
  EXPECT_TRUE(has(refused->items[0].message, "ask the admin to raise it (mc-store quota set bob pinned:"));
  (void)auth::set_process_keyring(nullptr);

  // alice's 8 MiB puts succeed and read back.
  const fs::path blob = tmp_.path / "blob";
  {
    std::ofstream f(blob, std::ios::binary);
    std::string bytes(8 * kMiB, 'a');
    for (size_t i = 0; i < bytes.size(); i += 4096) bytes[i] = static_cast<char>(i / 4096);
    f << bytes;
  }
  for (const char* k : {"k1", "k2"}) {
    auto [rc, out] = store("alice", {"put", k, blob.string()});
    ASSERT_EQ(rc, 0) << k << ": " << out;
  }
  auto got = store("alice", {"get", "k2"});
  ASSERT_EQ(got.first, 0);
  EXPECT_EQ(got.second, read_file(blob));

  // mc-store stat and quota ls show both tenants' usage; a tenant sees its own row only.
  auto all = tenants("admin");
  ASSERT_TRUE(all.count("bob") && all.count("alice")) << store("admin", {"quota", "ls", "--json"}).second;
  EXPECT_GE(all["bob"]["pinned_bytes"], 24 * kMiB);  // 32 MiB until p3 expires (the refusal above said 32)
  EXPECT_EQ(all["bob"]["limit_pinned_bytes"], 32 * kMiB);
  EXPECT_EQ(all["bob"]["refused"], 1u);
  EXPECT_EQ(all["alice"]["bytes"], 16 * kMiB);
  EXPECT_EQ(all["alice"]["refused"], 0u);
  auto own = tenants("alice");
  EXPECT_EQ(own.size(), 1u);
  EXPECT_EQ(own.count("alice"), 1u);
  auto table = store("admin", {"stat"});
  ASSERT_EQ(table.first, 0) << table.second;
  EXPECT_TRUE(has(table.second, "pinned(MiB)"));
  EXPECT_TRUE(has(table.second, "bob"));
  EXPECT_TRUE(has(table.second, "alice"));
  for (const char* k : {"k1", "k2"}) {  // k2 once its read lease ends
    std::string out;
    EXPECT_TRUE(testkit::wait_until(
        [&] {
          auto r = store("alice", {"rm", k});
          out = r.second;
          return r.first == 0;
        },
        15000, 200))
        << k << ": " << out;
  }

  // bob's abandoned put (p3) expires after the takeover time although his client lives: its bytes come back.
  EXPECT_TRUE(testkit::wait_until([&] { return tenants("admin")["bob"]["puts"] == 0u; }, 20000, 200))
      << store("admin", {"quota", "ls", "--json"}).second;
  all = tenants("admin");
  EXPECT_EQ(all["bob"]["pinned_bytes"], 24 * kMiB);
  EXPECT_EQ(all["bob"]["put_bytes"], 0u);
  EXPECT_EQ(all["bob"]["objects"], 3u);

  // Full again, then raised by the admin (a tenant may not): bob's next put succeeds.
  {
    auto ring = auth::Keyring::load(keys_.string(), "bob");
    ASSERT_TRUE(ring.is_ok());
    ASSERT_TRUE(auth::set_process_keyring(ring.value()).is_ok());
  }
  rpc::AsyncClient b;
  auto again = b.call_sync(endpoint_, bob_puts({"p5"}), 5000);
  ASSERT_TRUE(again.is_ok() && again->items.size() == 1u);
  EXPECT_EQ(again->items[0].code, 0) << again->items[0].message;
  auto full = b.call_sync(endpoint_, bob_puts({"p6"}), 5000);
  ASSERT_TRUE(full.is_ok() && full->items.size() == 1u);
  EXPECT_EQ(full->items[0].code, static_cast<uint16_t>(Code::kResourceExhausted)) << full->items[0].message;
  (void)auth::set_process_keyring(nullptr);
  auto denied = store("bob", {"quota", "set", "bob", "pinned:64MiB"});
  EXPECT_NE(denied.first, 0);
  EXPECT_TRUE(has(denied.second, "store.quota_set"));
  auto set = store("admin", {"quota", "set", "bob", "pinned:48MiB,put-bytes:48MiB"});
  ASSERT_EQ(set.first, 0) << set.second;
  {
    auto ring = auth::Keyring::load(keys_.string(), "bob");
    ASSERT_TRUE(ring.is_ok());
    ASSERT_TRUE(auth::set_process_keyring(ring.value()).is_ok());
  }
  rpc::AsyncClient b2;
  auto raised = b2.call_sync(endpoint_, bob_puts({"p6"}), 5000);
  ASSERT_TRUE(raised.is_ok() && raised->items.size() == 1u);
  EXPECT_EQ(raised->items[0].code, 0) << raised->items[0].message;
  (void)auth::set_process_keyring(nullptr);
  EXPECT_EQ(tenants("admin")["bob"]["limit_pinned_bytes"], 48 * kMiB);

  // The master's log and /metrics name bob.
  const std::string log = read_file(tmp_.path / "master.log");
  EXPECT_TRUE(has(log, "quota: refused store.put_start of bob (client, tenant bob)"));
  EXPECT_TRUE(has(log, "quota of tenant bob set to 'pinned:48MiB,put-bytes:48MiB' by admin"));
  std::string metrics;
  EXPECT_TRUE(testkit::wait_until(
      [&] {
        metrics = get_metrics(metrics_);
        return metrics.find("mc_store_quota_refused_total{tenant=\"bob\"} 2") != std::string::npos;
      },
      10000, 200))
      << metrics;
  EXPECT_TRUE(has(metrics, "# TYPE mc_store_tenant_pinned_bytes gauge"));
  EXPECT_TRUE(has(metrics, "mc_store_tenant_pinned_bytes{tenant=\"bob\"} 41943040"));
  EXPECT_TRUE(has(metrics, "mc_store_quota_refused_total{tenant=\"alice\"} 0"));
}

}  // namespace MC_UNITY_ID
}  // namespace mc
