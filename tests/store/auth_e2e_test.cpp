// End-to-end: the attacks of issue 18 against real daemons started with keys (mc-auth init), each refused, and the
// legitimate path still working. The store: tenants' keys are their own (get, ls, rm, overwrite), a shared
// namespace is shared, an anonymous caller and a tenant cannot unmount or forge a node, and the master logs each
// refusal naming the caller. The Conductor: an instance id belongs to the key that registered it first, and a
// tenant cannot register. Children are stopped and files removed by RAII guards, also when a test fails.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "mc/common/auth.hpp"
#include "mc/common/rpc.hpp"
#include "mc/testkit/process.hpp"

namespace mc {
namespace {

namespace fs = std::filesystem;
const std::string kBin = MC_BINARY_DIR "/bin/";

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/mc-auth-e2e.XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs a tool to completion: (exit code, stdout + stderr).
std::pair<int, std::string> run(const std::string& tool, const std::vector<std::string>& args) {
  std::string cmd = kBin + tool;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1 < /dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<testkit::Child> start(const std::string& tool, const std::vector<std::string>& args,
                                      const fs::path& log) {
  std::vector<std::string> argv = {kBin + tool};
  argv.insert(argv.end(), args.begin(), args.end());
  testkit::ChildOptions o;
  o.stderr_path = log.string();
  o.stop_grace_ms = 2000;
  return std::make_unique<testkit::Child>(argv, o);
}

// Makes this test process the identity `name` of `dir` (for raw RPC as an attacker holding that key would).
void become(const fs::path& dir, const std::string& name) {
  auto ring = auth::Keyring::load(dir.string(), name);
  ASSERT_TRUE(ring.is_ok()) << ring.status().to_string();
  ASSERT_TRUE(auth::set_process_keyring(ring.value()).is_ok());
}

class AuthStoreE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = tmp_.path / "keys";
    auto [rc, out] = run("mc-auth", {"init", keys_.string(), "--tenant", "alice", "--tenant", "bob", "--node", "node0",
                                     "--shared", "public"});
    ASSERT_EQ(rc, 0) << out;
    master_ = start("mc-store",
                    {"master", "--listen", "tcp://127.0.0.1:0", "--auth-dir", keys_.string(), "--auth-name", "master"},
                    tmp_.path / "master.log");
    endpoint_ = master_->wait_ready(10000);
    ASSERT_FALSE(endpoint_.empty()) << read_file(tmp_.path / "master.log");
    node_ = start("mc-store",
                  {"serve", "--master", endpoint_, "--node-id", "node0", "--dram-bytes", "16MiB", "--auth-dir",
                   keys_.string(), "--auth-name", "node0"},
                  tmp_.path / "node.log");
    ASSERT_FALSE(node_->wait_ready(10000).empty()) << read_file(tmp_.path / "node.log");
  }
  void TearDown() override { (void)auth::set_process_keyring(nullptr); }

  // mc-store SUBCOMMAND as `who` ("" = no keys at all).
  std::pair<int, std::string> store(const std::string& who, std::vector<std::string> args) {
    args.insert(args.begin() + 1, {"--master", endpoint_});
    if (!who.empty()) args.insert(args.end(), {"--auth-dir", keys_.string(), "--auth-name", who});
    return run("mc-store", args);
  }
  std::string file(const std::string& name, const std::string& text) {
    const fs::path p = tmp_.path / name;
    std::ofstream(p) << text;
    return p.string();
  }

  TempDir tmp_;
  fs::path keys_;
  std::unique_ptr<testkit::Child> master_, node_;
  std::string endpoint_;
};

TEST_F(AuthStoreE2E, TenantsKeepTheirKeysAnonymousAndForgedCallsAreRefused) {
  // The legitimate path: alice stores and reads her object; it lists under her own name.
  ASSERT_EQ(store("alice", {"put", "k1", file("a", "alice's bytes")}).first, 0);
  auto [rc, got] = store("alice", {"get", "k1"});
  ASSERT_EQ(rc, 0) << got;
  EXPECT_EQ(got, "alice's bytes");
  auto ls = store("alice", {"ls", "--json"});
  EXPECT_NE(ls.second.find("\"k1\""), std::string::npos) << ls.second;
  EXPECT_EQ(ls.second.find("tenant/"), std::string::npos) << ls.second;

  // bob cannot read, list, remove or overwrite it: his k1 is another object.
  EXPECT_NE(store("bob", {"get", "k1"}).first, 0);
  EXPECT_EQ(store("bob", {"ls", "--json"}).second.find("k1"), std::string::npos);
  EXPECT_NE(store("bob", {"rm", "k1"}).first, 0);
  EXPECT_NE(store("bob", {"rm", "../alice/k1"}).first, 0);
  ASSERT_EQ(store("bob", {"put", "--overwrite", "k1", file("b", "bob's bytes")}).first, 0);
  EXPECT_EQ(store("alice", {"get", "k1"}).second, "alice's bytes");
  EXPECT_EQ(store("bob", {"get", "k1"}).second, "bob's bytes");
  // Nor name her space, or a shared namespace he did not opt into.
  auto cross = store("bob", {"get", "shared/private/x"});
  EXPECT_NE(cross.first, 0);
  EXPECT_NE(cross.second.find("not one this tenant opted into"), std::string::npos) << cross.second;

  // A shared namespace both opted into is shared.
  ASSERT_EQ(store("alice", {"put", "shared/public/prompt", file("p", "system prompt")}).first, 0);
  EXPECT_EQ(store("bob", {"get", "shared/public/prompt"}).second, "system prompt");

  // The admin sees the whole pool.
  auto all = store("admin", {"ls", "--json"});
  EXPECT_NE(all.second.find("tenant/alice/k1"), std::string::npos) << all.second;
  EXPECT_NE(all.second.find("tenant/bob/k1"), std::string::npos) << all.second;

  // Anonymous (no keys): refused at the handshake, nothing removed.
  EXPECT_NE(store("", {"rm", "tenant/alice/k1"}).first, 0);
  EXPECT_EQ(store("alice", {"get", "k1"}).second, "alice's bytes");

  // A tenant may not unmount a node, nor mount one; the master says who and why.
  become(keys_, "alice");
  {
    rpc::AsyncClient c;
    auto r = c.call_sync(endpoint_, proto::StoreUnmountRequest{"node0", "node0/dram"}, 3000);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    EXPECT_NE(r.status().message().find("alice (client, tenant alice)"), std::string::npos);
  }
  // Another storage key cannot unmount node0 or publish under its node id: the id is node0's key's.
  become(keys_, "node");
  {
    rpc::AsyncClient c;
    auto r = c.call_sync(endpoint_, proto::StoreUnmountRequest{"node0", "node0/dram"}, 3000);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    EXPECT_NE(r.status().message().find("bound to the key of 'node0'"), std::string::npos) << r.status().message();
    auto hb = c.call_sync(endpoint_, proto::StoreNodeHeartbeatRequest{"node0", {}}, 3000);
    EXPECT_EQ(hb.status().code(), Code::kPermissionDenied) << hb.status().to_string();
  }
  EXPECT_EQ(store("alice", {"get", "k1"}).second, "alice's bytes");  // still served
  const std::string log = read_file(tmp_.path / "master.log");
  EXPECT_NE(log.find("refused 'store.unmount' from alice (client, tenant alice)"), std::string::npos) << log;
  EXPECT_NE(log.find("refused: storage node id 'node0' from node (storage)"), std::string::npos) << log;
}

TEST(AuthSetup, WithoutKeysADaemonListensOnLoopbackOnly) {
  TempDir tmp;
  auto [rc, out] = run("mc-store", {"master", "--listen", "tcp://0.0.0.0:0"});
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("refusing to listen on 0.0.0.0 without authentication"), std::string::npos) << out;
  auto [rc2, out2] =
      run("mc-store", {"master", "--listen", "tcp://127.0.0.1:0", "--auth-dir", (tmp.path / "none").string()});
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("mc-auth init"), std::string::npos) << out2;
}

TEST(AuthConductorE2E, AnInstanceIdBelongsToItsFirstKeyAndTenantsCannotRegister) {
  TempDir tmp;
  const fs::path keys = tmp.path / "keys";
  ASSERT_EQ(run("mc-auth", {"init", keys.string(), "--tenant", "alice", "--worker", "prefill0"}).first, 0);
  auto conductor =
      start("mc-conductor",
            {"serve", "--listen", "tcp://127.0.0.1:0", "--auth-dir", keys.string(), "--auth-name", "conductor"},
            tmp.path / "conductor.log");
  const std::string ep = conductor->wait_ready(10000);
  ASSERT_FALSE(ep.empty()) << read_file(tmp.path / "conductor.log");
  proto::ConductorRegisterRequest reg;
  reg.instance_id = "prefill0";
  reg.role = "prefill";
  reg.host = "h";
  reg.endpoint = "tcp://127.0.0.1:1";

  become(keys, "prefill0");
  {
    rpc::AsyncClient c;
    auto r = c.call_sync(ep, reg, 3000);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  }
  // The generic worker key (another worker, or a stolen one) cannot take the id over, nor heartbeat under it.
  become(keys, "worker");
  {
    rpc::AsyncClient c;
    reg.endpoint = "tcp://127.0.0.1:2";
    auto r = c.call_sync(ep, reg, 3000);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    proto::ConductorHeartbeatRequest hb;
    hb.instance_id = "prefill0";
    auto h = c.call_sync(ep, hb, 3000);
    EXPECT_EQ(h.status().code(), Code::kPermissionDenied) << h.status().to_string();
  }
  // A tenant's client may submit but not register an instance.
  become(keys, "alice");
  {
    rpc::AsyncClient c;
    reg.instance_id = "fake-decode";
    reg.role = "decode";
    reg.kv_capacity_tokens = int64_t{1} << 40;
    auto r = c.call_sync(ep, reg, 3000);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    EXPECT_NE(r.status().message().find("allowed: worker, admin"), std::string::npos) << r.status().message();
  }
  const std::string log = read_file(tmp.path / "conductor.log");
  EXPECT_NE(log.find("bound to the key of 'prefill0'"), std::string::npos) << log;
  EXPECT_NE(log.find("refused 'conductor.register' from alice"), std::string::npos) << log;
}

}  // namespace
}  // namespace mc
