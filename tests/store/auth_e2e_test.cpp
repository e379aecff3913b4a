// End-to-end: the attacks of issue 18 against real daemons started with keys (mc-auth init), each refused, and the
// legitimate path still working. The store: tenants' keys are their own (get, ls, rm, overwrite), a shared
// namespace is shared, an anonymous caller and a tenant cannot unmount or forge a node, and the master logs each
// refusal naming the caller. The Conductor: an instance id belongs to the key that registered it first, and a
// tenant cannot register. The data plane: a storage node's and a decode instance's memory move only under the grant of
// the party that allocated it (the master, the decode instance), for its range, op and lifetime; raw reads and writes
// without one, with a forged one or beyond one are refused and logged. Children are stopped and files removed by RAII
// guards, also when a test fails.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mc/net/auth.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/store.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/proto/worker.hpp"
#include "mc/testkit/process.hpp"
#include "tool_run.hpp"

namespace mc {
namespace MC_UNITY_ID {

namespace fs = std::filesystem;
const std::string kBin = MC_BINARY_DIR "/bin/";

struct TempDir : store_e2e::TempDir {
  TempDir() : store_e2e::TempDir("auth-e2e") {}
};
using store_e2e::read_file;
using store_e2e::run;

std::unique_ptr<testkit::Child> start(const std::string& tool, const std::vector<std::string>& args,
                                      const fs::path& log) {
  std::vector<std::string> argv = {kBin + tool};
  argv.insert(argv.end(), args.begin(), args.end());
  testkit::ChildOptions o;
  o.stderr_path = log.string();
  o.stop_grace_ms = 2000;
  return std::make_unique<testkit::Child>(argv, o);
}

// Word `i` (0-based) of a daemon's ready line "ready TOOL ENDPOINT k=v ...", or the value of `key=` when key is given.
std::string ready_word(const std::string& line, size_t i, const std::string& key = "") {
  std::istringstream words(line);
  std::string w;
  for (size_t n = 0; words >> w; ++n) {
    if (key.empty() ? n == i : w.rfind(key + "=", 0) == 0) return key.empty() ? w : w.substr(key.size() + 1);
  }
  return "";
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
                    {"master", "--listen", "tcp://127.0.0.1:0", "--events", "", "--auth-dir", keys_.string(),
                     "--auth-name", "master"},
                    tmp_.path / "master.log");
    endpoint_ = master_->wait_ready(10000);
    ASSERT_FALSE(endpoint_.empty()) << read_file(tmp_.path / "master.log");
    node_ = start("mc-store",
                  {"serve", "--master", endpoint_, "--node-id", "node0", "--dram-bytes", "16MiB", "--no-shm",
                   "--auth-dir", keys_.string(), "--auth-name", "node0"},
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

// Whether `text` holds `needle`; the message names both otherwise.
::testing::AssertionResult has(const std::string& text, const std::string& needle) {
  if (text.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not in:\n" << text;
}

// Sends one completion notification to the transfer engine at "HOST:PORT" as a raw client would (the tcp wire
// header of transfer/src/tcp/wire.hpp: magic "MCX1", op 4 = notify, version 1, aux = the packed notification) and
// returns the reply's code (0 ok), or -1 when no reply came.
int raw_notify(const std::string& host_port, const std::string& packed) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int code = -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    unsigned char hdr[32] = {'M', 'C', 'X', '1', 4, 1};
    const auto aux = static_cast<uint32_t>(packed.size());
    std::memcpy(hdr + 8, &aux, 4);
    std::string msg(reinterpret_cast<char*>(hdr), sizeof hdr);
    msg += packed;
    unsigned char rep[24];
    if (send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(msg.size()) &&
        recv(fd, rep, sizeof rep, MSG_WAITALL) == static_cast<ssize_t>(sizeof rep)) {
      uint16_t c = 0;
      std::memcpy(&c, rep + 4, 2);
      code = c;
    }
  }
  close(fd);
  return code;
}

TEST_F(AuthStoreE2E, PoolBytesMoveOnlyUnderTheMastersGrant) {
  // The legitimate path, over tcp (the node serves no shm): put and get carry the master's grants.
  ASSERT_EQ(store("alice", {"put", "k1", file("a", "alice's secret bytes")}).first, 0);
  ASSERT_EQ(store("bob", {"put", "k1", file("b", "bob's bytes")}).first, 0);
  ASSERT_EQ(store("alice", {"get", "k1"}).second, "alice's secret bytes");

  // What alice's client is handed for her object: its replica and a read grant for exactly its bytes.
  become(keys_, "alice");
  proto::StoreReplica replica;
  {
    rpc::AsyncClient c;
    auto r = c.call_sync(endpoint_, proto::StoreGetReplicasRequest{"alice-raw", "", "", {"k1"}}, 3000);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->items.size(), 1u);
    ASSERT_FALSE(r->items[0].replicas.empty());
    replica = r->items[0].replicas[0];
  }
  ASSERT_FALSE(replica.grant.empty());
  ASSERT_FALSE(replica.xfer_segment.empty());
  const std::string off = std::to_string(replica.xfer_offset_bytes);
  const std::string len = std::to_string(replica.size_bytes);
  auto xfer = [&](const std::string& who, std::vector<std::string> args) {
    args.insert(args.end(), {"--target", replica.xfer_segment, "--transport", "tcp", "--timeout-ms", "3000"});
    if (!who.empty()) args.insert(args.end(), {"--auth-dir", keys_.string(), "--auth-name", who});
    return run("mc-xfer", args);
  };

  // A raw read of the node's DRAM without a grant: refused before any byte moves.
  auto anon = xfer("", {"read", "--offset", "0", "--length", "4096"});
  EXPECT_NE(anon.first, 0);
  EXPECT_TRUE(has(anon.second, "grant refused: the request carries no grant"));
  // Holding a tenant's key gives no grant key: the same.
  auto tenant = xfer("alice", {"read", "--offset", off, "--length", len});
  EXPECT_NE(tenant.first, 0);
  EXPECT_TRUE(has(tenant.second, "carries no grant"));
  // The admin of another cluster mints grants under another key: forged here.
  const fs::path other = tmp_.path / "other";
  ASSERT_EQ(run("mc-auth", {"init", other.string()}).first, 0);
  auto forged = run("mc-xfer", {"read", "--target", replica.xfer_segment, "--transport", "tcp", "--offset", off,
                                "--length", len, "--auth-dir", other.string(), "--auth-name", "admin"});
  EXPECT_NE(forged.first, 0);
  EXPECT_TRUE(has(forged.second, "grant forged or damaged"));
  std::string damaged = replica.grant;
  damaged[damaged.size() / 2] = damaged[damaged.size() / 2] == 'A' ? 'B' : 'A';
  EXPECT_TRUE(has(xfer("", {"read", "--offset", off, "--length", len, "--grant", damaged}).second, "forged"));
  // Alice's read grant: not a write (overwriting her object in place), not the bytes next to it (bob's object).
  auto write = xfer("", {"write", "--offset", off, "--length", len, "--grant", replica.grant});
  EXPECT_NE(write.first, 0);
  EXPECT_TRUE(has(write.second, "grant does not allow write"));
  auto beyond = xfer("", {"read", "--offset", "0", "--length", "16384", "--grant", replica.grant});
  EXPECT_NE(beyond.first, 0);
  EXPECT_TRUE(has(beyond.second, "is outside the grant"));
  // The grant's own range reads.
  auto granted = xfer("", {"read", "--offset", off, "--length", len, "--grant", replica.grant});
  EXPECT_EQ(granted.first, 0) << granted.second;
  // An operator debugging with the admin's keys (the cluster's grant key) issues a grant for itself.
  auto admin = xfer("admin", {"read", "--offset", "0", "--length", "4096"});
  EXPECT_EQ(admin.first, 0) << admin.second;

  // Nothing was changed; the node logged each refusal with the peer and the reason, and counted them.
  EXPECT_EQ(store("alice", {"get", "k1"}).second, "alice's secret bytes");
  EXPECT_EQ(store("bob", {"get", "k1"}).second, "bob's bytes");
  const std::string log = read_file(tmp_.path / "node.log");
  EXPECT_TRUE(has(log, "refused read [0, +4096) from 127.0.0.1:"));
  EXPECT_TRUE(has(log, "grant refused: the request carries no grant"));
}

// The SSD tier: store.node.read/write of a node's disk segment need the master's grant too. Bob's object is demoted
// to SSD by alice's puts; bob still reads it (the legitimate path, with the grant of its disk replica); alice's raw
// read and write of those bytes on the node are refused and logged naming her.
TEST(AuthSsdE2E, DemotedBytesMoveOnlyUnderTheMastersGrant) {
  TempDir tmp;
  const fs::path keys = tmp.path / "keys";
  ASSERT_EQ(run("mc-auth", {"init", keys.string(), "--tenant", "alice", "--tenant", "bob", "--node", "node0"}).first,
            0);
  auto master = start(
      "mc-store",
      {"master", "--listen", "tcp://127.0.0.1:0", "--events", "", "--auth-dir", keys.string(), "--auth-name", "master"},
      tmp.path / "master.log");
  const std::string ep = master->wait_ready(10000);
  ASSERT_FALSE(ep.empty()) << read_file(tmp.path / "master.log");
  fs::create_directories(tmp.path / "ssd");
  testkit::ChildOptions o;
  o.stderr_path = (tmp.path / "node.log").string();
  o.stop_grace_ms = 2000;
  testkit::Child node({kBin + "mc-store", "serve", "--master", ep, "--node-id", "node0", "--dram-bytes", "2MiB",
                       "--ssd-dir", (tmp.path / "ssd").string(), "--ssd-bytes", "8MiB", "--no-shm", "--heartbeat-ms",
                       "100", "--auth-dir", keys.string(), "--auth-name", "node0"},
                      o);
  const std::string ready = node.wait_line("ready", 10000);
  ASSERT_FALSE(ready.empty()) << read_file(tmp.path / "node.log");
  const std::string node_rpc = ready_word(ready, 2);
  auto store = [&](const std::string& who, std::vector<std::string> args) {
    args.insert(args.begin() + 1, {"--master", ep});
    args.insert(args.end(), {"--auth-dir", keys.string(), "--auth-name", who});
    return run("mc-store", args);
  };
  const fs::path bob_file = tmp.path / "bob";
  std::ofstream(bob_file) << std::string(256 << 10, 'B');
  ASSERT_EQ(store("bob", {"put", "secret", bob_file.string()}).first, 0);
  const fs::path filler = tmp.path / "filler";
  std::ofstream(filler) << std::string(256 << 10, 'a');
  // Alice's puts push bob's object out of the 2 MiB of DRAM onto the SSD (bounded: 40 puts).
  bool demoted = false;
  for (int i = 0; i < 40 && !demoted; ++i) {
    ASSERT_EQ(store("alice", {"put", "fill" + std::to_string(i), filler.string()}).first, 0);
    demoted = store("admin", {"ls", "--json"}).second.find("node0/ssd") != std::string::npos;
  }
  ASSERT_TRUE(demoted) << store("admin", {"ls", "--json"}).second;
  // Bob reads his object from the SSD, under the grant of its disk replica.
  auto got = store("bob", {"get", "secret"});
  ASSERT_EQ(got.first, 0) << got.second;
  EXPECT_EQ(got.second, std::string(256 << 10, 'B'));

  // Alice, on the node's RPC port: no grant, no bytes; no overwrite.
  become(keys, "alice");
  {
    rpc::AsyncClient c;
    auto r = c.call_sync(node_rpc, proto::StoreNodeReadRequest{"node0/ssd", 0, 4096, ""}, 3000);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    EXPECT_TRUE(has(r.status().message(), "carries no grant"));
    proto::StoreNodeWriteRequest wr;
    wr.segment = "node0/ssd";
    wr.offset_bytes = 0;
    wr.data.assign(4096, 'X');
    auto wrote = c.call_sync(node_rpc, wr, 3000);
    EXPECT_EQ(wrote.status().code(), Code::kPermissionDenied) << wrote.status().to_string();
  }
  (void)auth::set_process_keyring(nullptr);
  EXPECT_EQ(store("bob", {"get", "secret"}).second, std::string(256 << 10, 'B'));
  const std::string log = read_file(tmp.path / "node.log");
  EXPECT_TRUE(has(log, "refused store.node.read [0, +4096) of node0/ssd from alice (client, tenant alice)"));
  EXPECT_TRUE(has(log, "refused store.node.write"));
}

TEST(AuthDecodeE2E, DecodeKvTakesWritesOnlyUnderALiveReservationsGrant) {
  TempDir tmp;
  const fs::path keys = tmp.path / "keys";
  ASSERT_EQ(run("mc-auth", {"init", keys.string(), "--worker", "decode0"}).first, 0);
  testkit::ChildOptions o;
  o.stderr_path = (tmp.path / "decode.log").string();
  o.stop_grace_ms = 2000;
  testkit::Child decode({kBin + "mc-decode", "--listen", "tcp://127.0.0.1:0", "--backend", "sim", "--kv-blocks", "64",
                         "--auth-dir", keys.string(), "--auth-name", "decode0"},
                        o);
  const std::string ready = decode.wait_line("ready", 15000);
  ASSERT_FALSE(ready.empty()) << read_file(tmp.path / "decode.log");
  const std::string endpoint = ready_word(ready, 2);
  const std::string kv_segment = ready_word(ready, 0, "kv_segment");
  ASSERT_FALSE(kv_segment.empty() || kv_segment == "none") << ready;

  // The Conductor reserves KV for a request: decode hands back the write grant of the reservation's blocks.
  become(keys, "conductor");
  rpc::AsyncClient c;
  proto::DecodeReserveRequest reserve;
  reserve.request_id = "r1";
  reserve.input_length_tokens = 32;
  reserve.output_length_tokens = 4;
  reserve.client_endpoint = "tcp://127.0.0.1:1";
  auto res = c.call_sync(endpoint, reserve, 3000);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  ASSERT_FALSE(res->kv_grant.empty());
  ASSERT_FALSE(res->block_offsets_bytes.empty());
  const std::string block0 = std::to_string(res->block_offsets_bytes[0]);
  const std::string lbb = std::to_string(res->layer_block_bytes);
  uint64_t other_block = res->block_offsets_bytes.back() + static_cast<uint64_t>(res->block_bytes);
  for (uint64_t b : res->block_offsets_bytes) other_block = std::max(other_block, b + res->block_bytes);
  auto xfer = [&](std::vector<std::string> args) {
    args.insert(args.end(), {"--target", kv_segment, "--transport", "tcp", "--timeout-ms", "3000"});
    return run("mc-xfer", args);
  };

  // An attacker's WRITE into the reservation's KV, and a forged layer notification: refused.
  auto anon = xfer({"write", "--offset", block0, "--length", lbb});
  EXPECT_NE(anon.first, 0);
  EXPECT_TRUE(has(anon.second, "grant refused: the request carries no grant"));
  proto::TransferNotification forged;
  forged.tag = "kv/" + std::to_string(res->reservation_id) + "/0/0-1";
  forged.op = 2;
  forged.segment_offset = res->block_offsets_bytes[0];
  forged.length_bytes = static_cast<uint64_t>(res->layer_block_bytes);
  EXPECT_EQ(raw_notify(kv_segment, codec::pack(forged)), static_cast<int>(Code::kPermissionDenied));
  // The grant's holder (the prefill the Conductor passes it to) writes the reservation's blocks...
  auto granted = xfer({"write", "--offset", block0, "--length", lbb, "--grant", res->kv_grant});
  EXPECT_EQ(granted.first, 0) << granted.second;
  // ... and no other block, nor reads any.
  auto other = xfer({"write", "--offset", std::to_string(other_block), "--length", lbb, "--grant", res->kv_grant});
  EXPECT_NE(other.first, 0);
  EXPECT_TRUE(has(other.second, "is not reservation"));
  auto read = xfer({"read", "--offset", block0, "--length", lbb, "--grant", res->kv_grant});
  EXPECT_NE(read.first, 0);
  EXPECT_TRUE(has(read.second, "grant does not allow read"));
  // Released, the reservation's grant is dead.
  auto rel = c.call_sync(endpoint, proto::DecodeReleaseRequest{res->reservation_id}, 3000);
  ASSERT_TRUE(rel.is_ok()) << rel.status().to_string();
  auto late = xfer({"write", "--offset", block0, "--length", lbb, "--grant", res->kv_grant});
  EXPECT_NE(late.first, 0);
  EXPECT_TRUE(has(late.second, "is no longer live"));

  const std::string log = read_file(tmp.path / "decode.log");
  EXPECT_TRUE(has(log, "refused write [" + block0 + ", +" + lbb + ") from 127.0.0.1:"));
  EXPECT_TRUE(has(log, "refused notification from 127.0.0.1:"));
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

// Issue 51: a key directory other users can write (they could add an admin key to the roster), or a secret they can
// read, is refused at start naming the path and the chmod; mc-auth init makes an existing directory private.
TEST(AuthSetup, AKeyDirectoryOtherUsersCanWriteOrReadTheSecretsOfIsRefused) {
  TempDir tmp;
  const fs::path keys = tmp.path / "keys";
  ASSERT_EQ(::mkdir(keys.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(keys.c_str(), 0777), 0);
  ASSERT_EQ(run("mc-auth", {"init", keys.string(), "--tenant", "alice"}).first, 0);
  struct stat st {};
  ASSERT_EQ(::stat(keys.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::vector<std::string> master = {"master",      "--listen", "tcp://127.0.0.1:0", "--auth-dir", keys.string(),
                                           "--auth-name", "admin"};
  ASSERT_EQ(::chmod(keys.c_str(), 0777), 0);
  auto [rc, out] = run("mc-store", master);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find(keys.string() + " is writable by other users (mode 777)"), std::string::npos) << out;
  EXPECT_NE(out.find("chmod 700"), std::string::npos) << out;
  ASSERT_EQ(::chmod(keys.c_str(), 0700), 0);
  ASSERT_EQ(::chmod((keys / "ids" / "alice.secret").c_str(), 0644), 0);
  auto [rc2, out2] =
      run("mc-store", {"stat", "--master", "tcp://127.0.0.1:1", "--auth-dir", keys.string(), "--auth-name", "alice"});
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("alice.secret is open to other users (mode 644)"), std::string::npos) << out2;
  EXPECT_NE(out2.find("chmod 600"), std::string::npos) << out2;
  // A roster another user owns is theirs to change, whatever its mode.
  ASSERT_EQ(::chmod((keys / "ids" / "alice.secret").c_str(), 0600), 0);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((keys / "roster").c_str(), 65534, 65534), 0);
    auto [rc3, out3] =
        run("mc-store", {"stat", "--master", "tcp://127.0.0.1:1", "--auth-dir", keys.string(), "--auth-name", "alice"});
    EXPECT_EQ(rc3, 2) << out3;
    EXPECT_NE(out3.find("roster is owned by uid 65534"), std::string::npos) << out3;
  }
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

}  // namespace MC_UNITY_ID
}  // namespace mc
