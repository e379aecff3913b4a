// End-to-end: the real mc-store binaries (master + storage nodes) on loopback, driven through the client
// library, raw RPC and the admin CLI. Every child is killed and every /dev/shm and SSD file removed by
// RAII guards, also when a test fails.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/common/block_key.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/store.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/store/client.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc::store {
namespace MC_UNITY_ID {

const std::string kBin = MC_BINARY_DIR "/bin/mc-store";

// An mc-store child (testkit::Child: stdout on a pipe, stopped and reaped on destruction); its stderr goes to
// /dev/null unless MC_TEST_CHILD_STDERR is set.
std::unique_ptr<testkit::Child> start_store(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kBin};
  argv.insert(argv.end(), args.begin(), args.end());
  testkit::ChildOptions o;
  if (getenv("MC_TEST_CHILD_STDERR") == nullptr) o.stderr_path = "/dev/null";
  o.stop_grace_ms = 2000;
  return std::make_unique<testkit::Child>(argv, o);
}

// Waits for the child's "ready <service> <endpoint> k=v..." line; returns its words (none on timeout).
std::vector<std::string> ready_words(testkit::Child& c, int64_t timeout_ms = 5000) {
  std::istringstream s(c.wait_line("ready ", timeout_ms));
  std::vector<std::string> words;
  for (std::string w; s >> w;) words.push_back(w);
  return words;
}

const std::string kXferBin = MC_BINARY_DIR "/bin/mc-xfer";

// Runs the tool (mc-store unless `bin` says otherwise) to completion; returns (exit code, stdout, with stderr
// appended when with_stderr).
std::pair<int, std::string> run_tool(const std::vector<std::string>& args, const std::string& stdin_file = "",
                                     bool with_stderr = false, const std::string& bin = kBin) {
  std::string cmd = bin;
  for (const auto& a : args) cmd += " '" + a + "'";
  if (!stdin_file.empty()) cmd += " < '" + stdin_file + "'";
  cmd += with_stderr ? " 2>&1" : " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// A stopped child must not outlive a failed assertion stopped: SIGCONT when the scope ends.
struct ResumeOnExit {
  explicit ResumeOnExit(testkit::Child* c) : child(c) {}
  testkit::Child* child;
  ResumeOnExit(const ResumeOnExit&) = delete;
  ResumeOnExit& operator=(const ResumeOnExit&) = delete;
  ~ResumeOnExit() { child->signal(SIGCONT); }
};

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/mc-store-e2e-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

class StoreE2E : public ::testing::Test {
 protected:
  // Starts a master with extra flags; returns its endpoint.
  void start_master(std::vector<std::string> extra = {}, const std::string& listen = "tcp://127.0.0.1:0") {
    std::vector<std::string> args = {"master", "--listen", listen, "--events", "tcp://127.0.0.1:0", "--tick-ms", "50"};
    args.insert(args.end(), extra.begin(), extra.end());
    master_ = start_store(args);
    auto w = ready_words(*master_);
    ASSERT_GE(w.size(), 4u) << "master did not print its ready line";
    endpoint_ = w[2];
    events_ = w[3].substr(std::string("events=").size());
    master_ready_.clear();
    for (const auto& word : w) master_ready_ += word + " ";
  }
  // Starts a storage node; host "" = this host (shm reachable). A simulated other host cannot share memory
  // with this process, so it runs with --no-shm: its DRAM is reached over the engine's tcp transport.
  testkit::Child* start_node(const std::string& id, const std::string& dram, const std::string& host = "",
                             const std::string& domain = "default", const std::string& ssd_bytes = "",
                             const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"serve", "--master", endpoint_, "--node-id",      prefix_ + id, "--dram-bytes",
                                     dram,    "--domain", domain,    "--heartbeat-ms", "100"};
    if (!host.empty()) args.insert(args.end(), {"--host", host, "--no-shm"});
    if (!ssd_bytes.empty()) args.insert(args.end(), {"--ssd-dir", tmp_.path.string(), "--ssd-bytes", ssd_bytes});
    args.insert(args.end(), extra.begin(), extra.end());
    nodes_.push_back(start_store(args));
    auto w = ready_words(*nodes_.back());
    EXPECT_GE(w.size(), 4u) << "node " << id << " did not print its ready line";
    if (w.size() >= 4) {
      node_rpc_[id] = w[2];
      node_xfer_[id] = w[4].substr(w[4].find('=') + 1);  // "xfer_segment=host:port"
    }
    return nodes_.back().get();
  }
  std::unique_ptr<Client> client(const std::string& id = "", uint32_t replicas = 1, const std::string& pref = "") {
    ClientOptions o;
    o.master = endpoint_;
    o.client_id = id;
    o.replicas = replicas;
    o.preferred_segment = pref.empty() ? "" : prefix_ + pref;
    auto c = Client::connect(o);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<rpc::RpcClient> raw() {
    auto c = rpc::RpcClient::connect(endpoint_);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return std::move(c).value();
  }
  proto::StoreStatReply stat() {
    auto r = raw()->call(proto::StoreStatRequest{});
    EXPECT_TRUE(r.is_ok());
    return r.value_or(proto::StoreStatReply{});
  }
  void TearDown() override {
    nodes_.clear();
    master_.reset();
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      if (e.path().filename().string().rfind("mc-store-" + prefix_, 0) == 0) std::filesystem::remove(e.path());
    }
  }

  std::string prefix_ = "e2e" + std::to_string(getpid()) + "-";
  TempDir tmp_;
  std::unique_ptr<testkit::Child> master_;
  std::vector<std::unique_ptr<testkit::Child>> nodes_;
  std::map<std::string, std::string> node_rpc_, node_xfer_;  // node id -> RPC endpoint, engine segment
  std::string endpoint_, events_, master_ready_;
};

TEST_F(StoreE2E, PutGetRoundTripsOverShmAndTcp) {
  start_master();
  start_node("n1", "32MiB");                      // this host: shm
  start_node("n2", "32MiB", "far-host-2", "r2");  // another "host": tcp
  start_node("n3", "32MiB", "far-host-3", "r3");
  auto c = client("rt", 1);
  ASSERT_TRUE(c);
  for (const auto& [seg, seed] :
       std::vector<std::pair<std::string, int>>{{"n1/dram", 1}, {"n2/dram", 2}, {"n3/dram", 3}}) {
    ClientOptions o;
    o.master = endpoint_;
    o.preferred_segment = prefix_ + seg;
    auto w = Client::connect(o).value();
    for (size_t size : {size_t{1}, size_t{4097}, size_t{(3 << 20) + 3}}) {
      std::string key = seg + "/" + std::to_string(size);
      auto data = random_bytes(size, seed * 1000 + size);
      ASSERT_TRUE(w->put(key, data).is_ok()) << key;
      std::vector<std::byte> back(size + 10, std::byte{0x5a});
      auto n = c->get(key, back);
      ASSERT_TRUE(n.is_ok()) << key << ": " << n.status().to_string();
      ASSERT_EQ(n.value(), size);
      ASSERT_EQ(0, std::memcmp(back.data(), data.data(), size)) << key << " differs";
      EXPECT_EQ(back[size], std::byte{0x5a});  // nothing written past the object
    }
  }
  EXPECT_GT(c->counters().bytes_read_shm, 0u);
  EXPECT_GT(c->counters().bytes_read_tcp, 0u);
  // The DRAM segments are served through the transfer engine only: the node's RPCs refuse them.
  auto node_rpc = rpc::RpcClient::connect(node_rpc_["n2"]).value();
  EXPECT_EQ(node_rpc->call(proto::StoreNodeReadRequest{prefix_ + "n2/dram", 0, 16}).status().code(),
            Code::kFailedPrecondition);
  // No shared-memory file is left anywhere: the DRAM is a memfd.
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(e.path().filename().string().rfind("mc-store-" + prefix_, 0), 0u) << e.path();
  }
  // Batch forms, with two replicas each on distinct nodes.
  auto c2 = client("batch", 2);
  std::vector<std::vector<std::byte>> blobs;
  std::vector<PutItem> puts;
  for (int i = 0; i < 16; ++i) blobs.push_back(random_bytes(64 * 1024 + i, 77 + i));
  for (int i = 0; i < 16; ++i) puts.push_back({"b/" + std::to_string(i), blobs[i]});
  auto ps = c2->batch_put(puts);
  ASSERT_TRUE(ps.is_ok());
  for (const auto& s : ps.value()) EXPECT_TRUE(s.is_ok()) << s.to_string();
  std::vector<std::vector<std::byte>> outs(17);
  std::vector<GetItem> gets;
  for (int i = 0; i < 16; ++i) {
    outs[i].resize(blobs[i].size());
    gets.push_back({"b/" + std::to_string(i), outs[i]});
  }
  outs[16].resize(10);
  gets.push_back({"b/absent", outs[16]});
  auto gs = c->batch_get(gets);
  ASSERT_TRUE(gs.is_ok());
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(gs.value()[i].is_ok()) << gs.value()[i].to_string();
    EXPECT_EQ(outs[i], blobs[i]);
  }
  EXPECT_EQ(gs.value()[16].code(), Code::kObjectNotFound);
  // Zero-copy: one registered buffer, the blocks read into slices of it; a slice straddling the end of
  // the registration is staged and still exact.
  std::vector<std::byte> arena(16 * 70 * 1024 + 1);
  ASSERT_TRUE(c->register_buffer(std::span<std::byte>(arena).first(8 * 70 * 1024)).is_ok());
  std::vector<GetItem> into;
  for (int i = 0; i < 16; ++i)
    into.push_back({"b/" + std::to_string(i),
                    std::span<std::byte>(arena).subspan(i * 70 * 1024 - (i == 8 ? 7 : 0), blobs[i].size())});
  auto zs = c->batch_get(into);
  ASSERT_TRUE(zs.is_ok());
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(zs.value()[i].is_ok()) << i << ": " << zs.value()[i].to_string();
    EXPECT_EQ(0, std::memcmp(into[i].buffer.data(), blobs[i].data(), blobs[i].size())) << "block " << i;
  }
  EXPECT_TRUE(c->unregister_buffer(arena.data()).is_ok());
  auto ls = c->ls("b/");
  ASSERT_TRUE(ls.is_ok());
  ASSERT_EQ(ls->objects.size(), 16u);
  for (const auto& o : ls->objects) EXPECT_EQ(o.segments.size(), 2u);
  // Putting a key again: already exists for put, ok for batch_put (content-addressed blocks).
  EXPECT_EQ(c2->put("b/0", blobs[0]).code(), Code::kAlreadyExists);
}

// The master's fast path (plain TCP frames): announced in the ready line and by store.info, used by the
// client for every metadata call; a master started with --fast-listen off serves the same client over
// ZeroMQ; garbage on the fast port is refused without disturbing the master.
TEST_F(StoreE2E, MetadataOverTheFastPathAndZmqWhenItIsOff) {
  start_master();
  ASSERT_NE(master_ready_.find("fast_port="), std::string::npos) << master_ready_;
  start_node("n1", "16MiB");
  auto info = raw()->call(proto::StoreInfoRequest{"e2e"});
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  ASSERT_NE(info->fast_port, 0u);
  EXPECT_NE(master_ready_.find("fast_port=" + std::to_string(info->fast_port)), std::string::npos);
  // Garbage, then a truncated frame, on the fast port: connections closed, master unharmed.
  for (const std::string& junk : {std::string("GET / HTTP/1.0\r\n\r\n"), std::string("\0\0\0\x10\0\0", 6)}) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(info->fast_port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    ::close(fd);
  }
  auto c = client("fast");
  ASSERT_TRUE(c);
  auto data = random_bytes(100000, 5);
  ASSERT_TRUE(c->put("f/1", data).is_ok());
  std::vector<std::byte> back(data.size());
  ASSERT_EQ(c->get("f/1", back).value_or(0), data.size());
  EXPECT_EQ(back, data);
  EXPECT_EQ(c->match_prefix({"f/1", "f/2"}).value_or(9), 1u);
  EXPECT_EQ(c->get("f/2", back).status().code(), Code::kObjectNotFound);  // a miss, carried as an error reply
  EXPECT_GE(c->counters().master_calls_fast, 5u);
  EXPECT_EQ(c->counters().master_calls_zmq, 0u);

  nodes_.clear();
  master_.reset();
  start_master({"--fast-listen", "off"});
  EXPECT_EQ(master_ready_.find("fast_port="), std::string::npos) << master_ready_;
  start_node("n1", "16MiB");
  auto z = client("zmq");
  ASSERT_TRUE(z);
  ASSERT_TRUE(z->put("z/1", data).is_ok());
  ASSERT_EQ(z->get("z/1", back).value_or(0), data.size());
  EXPECT_EQ(back, data);
  EXPECT_EQ(z->counters().master_calls_fast, 0u);
  EXPECT_GE(z->counters().master_calls_zmq, 3u);
  // Without a fast path a write-behind put commits synchronously (nothing is left to flush).
  ASSERT_TRUE(z->put("z/2", data, {false, false, false}).is_ok());
  EXPECT_EQ(z->counters().commits_behind, 0u);
  EXPECT_EQ(z->commits_pending(), 0u);
  ASSERT_EQ(z->get("z/2", back).value_or(0), data.size());
  EXPECT_TRUE(z->flush().is_ok());
}

// Write-behind commit against the real master: a put that returns before its put_end is answered is seen
// by the same client's next call (one ordered connection), byte for byte; many commits outstanding at once
// all land; the KV event announces the object; flush reports no failure.
TEST_F(StoreE2E, WriteBehindPutIsSeenByTheSameClientsNextCall) {
  start_master();
  start_node("n1", "16MiB");
  auto c = client("wb");
  ASSERT_TRUE(c);
  const WriteOptions behind{false, false, false, 0};
  std::vector<std::byte> back(65536);
  for (int i = 0; i < 20; ++i) {
    auto data = random_bytes(65536, 100 + i);
    const std::string key = "wb/" + std::to_string(i);
    ASSERT_TRUE(c->put(key, data, behind).is_ok());
    auto got = c->get(key, back);
    ASSERT_TRUE(got.is_ok()) << key << ": " << got.status().to_string();
    EXPECT_EQ(back, data) << key;
  }
  // A prefix chain of block keys written in batches without waiting; match_prefix right after sees it all.
  KeyNamespace ns;
  ns.model_id = "m";
  ns.block_size = 16;
  std::vector<uint32_t> tokens(16 * 24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7);
  std::vector<std::string> chain;
  for (uint64_t h : seq_hashes(tokens, ns)) chain.push_back(block_store_key(ns, h));
  auto block = random_bytes(4096, 7);
  for (size_t b = 0; b < chain.size(); b += 8) {
    std::vector<PutItem> items;
    for (size_t i = b; i < b + 8; ++i) items.push_back({chain[i], block});
    auto st = c->batch_put(items, behind);
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    for (const Status& s : *st) EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  EXPECT_EQ(c->match_prefix(chain).value_or(0), chain.size());
  EXPECT_TRUE(c->flush().is_ok());
  EXPECT_EQ(c->counters().commits_behind, 20u + chain.size());
  EXPECT_EQ(c->counters().commit_failures, 0u);
  EXPECT_EQ(c->commits_pending(), 0u);
  // Another client (another connection) sees them once the writer has flushed.
  auto r = client("reader");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->match_prefix(chain).value_or(0), chain.size());
  EXPECT_EQ(stat().objects, 20u + chain.size());
}

// Field report #5 and the kill -9 scenario of the issue.
TEST_F(StoreE2E, KilledNodeLeavesWithin3sAndMatchPrefixStopsAtTheGap) {
  start_master({"--node-ttl-ms", "1000", "--node-grace-ms", "0"});  // dead at the TTL, no suspect spell
  start_node("n1", "16MiB");
  testkit::Child* n2 = start_node("n2", "16MiB", "", "default", "16MiB");
  start_node("n3", "16MiB");
  KeyNamespace ns;
  ns.model_id = "m";
  std::vector<std::string> chain;
  for (int i = 0; i < 4; ++i) chain.push_back(block_store_key(ns, 0xabc0 + i));
  const char* where[] = {"n1/dram", "n3/dram", "n2/dram", "n1/dram"};
  for (int i = 0; i < 4; ++i) {
    auto w = client("w" + std::to_string(i), 1, where[i]);
    ASSERT_TRUE(w->put(chain[i], random_bytes(4096, i)).is_ok());
  }
  auto k1w = client("k1", 1, "n2/dram");
  ASSERT_TRUE(k1w->put("K1", random_bytes(8192, 11)).is_ok());
  auto k2w = client("k2", 1, "n1/dram");
  ASSERT_TRUE(k2w->put("K2", random_bytes(8192, 12)).is_ok());
  auto c = client("reader");
  ASSERT_EQ(c->match_prefix(chain).value_or(99), 4u);

  n2->kill_hard();
  auto r = raw();
  auto names_n2 = [&] {
    proto::StoreGetReplicasRequest req;
    req.client_id = "probe";
    req.keys = {"K1", "K2", chain[2]};
    auto rep = r->call(req);
    if (!rep.is_ok()) return true;
    for (const auto& item : rep->items) {
      for (const auto& x : item.replicas) {
        if (x.node_id == prefix_ + "n2") return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(testkit::wait_until([&] { return !names_n2(); }, 3000, 50))
      << "a replica on the killed node was still returned after 3 s";
  EXPECT_EQ(c->match_prefix(chain).value_or(99), 2u);
  std::vector<std::byte> buf(8192);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->get("K1", buf).status().code(), Code::kObjectNotFound);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
  EXPECT_TRUE(c->get("K2", buf).is_ok());
  EXPECT_GE(stat().dead_nodes, 1u);
  // The master, as segment directory, no longer hands out the dead node's transfer segment.
  auto gone = r->call(proto::GetSegmentRequest{node_xfer_["n2"]});
  EXPECT_EQ(gone.status().code(), Code::kNotFound) << node_xfer_["n2"];
  EXPECT_TRUE(r->call(proto::GetSegmentRequest{node_xfer_["n1"]}).is_ok());
  // N2 comes back, fresh: K1 stays gone.
  start_node("n2", "16MiB");
  EXPECT_FALSE(c->exists({"K1"}).value().at(0));
  EXPECT_EQ(c->match_prefix(chain).value_or(99), 2u);
}

// Field report #7: a writer dies between put_start and put_end.
TEST_F(StoreE2E, StaleWriterIsTakenOverAndItsLatePutEndRefused) {
  start_master({"--put-takeover-ms", "1500", "--free-delay-ms", "500"});
  start_node("n1", "16MiB");
  auto used = [&] {
    uint64_t u = 0;
    for (const auto& s : stat().segments) u += s.used_bytes;
    return u;
  };
  uint64_t used0 = used();
  // C1: a separate process would be killed here; from the master's view it simply never comes back.
  auto c1 = raw();
  proto::StorePutStartRequest ps;
  ps.client_id = "C1";
  ps.keys = {"K"};
  ps.sizes_bytes = {65536};
  auto g1 = c1->call(ps);
  ASSERT_TRUE(g1.is_ok());
  ASSERT_EQ(g1->items[0].code, 0);
  auto c2 = client("C2");
  std::vector<std::byte> buf(65536);
  EXPECT_EQ(c2->get("K", buf).status().code(), Code::kObjectNotFound);  // step 2: miss
  auto data2 = random_bytes(65536, 2);
  Status early = c2->put("K", data2);
  EXPECT_EQ(early.code(), Code::kObjectBusy) << early.to_string();  // step 3: retryable
  EXPECT_TRUE(early.is_retryable());
  // C1's put must grow older than --put-takeover-ms (1500) before another writer may take the key over:
  // waiting out that period is what this step tests, so it is a sleep, not a wait on a condition.
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  ASSERT_TRUE(c2->put("K", data2).is_ok());  // step 4
  proto::StorePutEndRequest late{"C1", {"K"}, {g1->items[0].put_id}, {0}};
  auto le = c1->call(late);
  ASSERT_TRUE(le.is_ok());
  EXPECT_EQ(le->codes[0], static_cast<uint16_t>(Code::kFailedPrecondition));  // step 5
  ASSERT_TRUE(c2->get("K", buf).is_ok());
  EXPECT_EQ(buf, data2);
  EXPECT_TRUE(testkit::wait_until([&] { return used() == used0 + 65536; }, 3000, 50)) << "C1's range was not released";
}

// The master is the transfer engine's segment directory: nodes publish their descriptor before mounting,
// lookups by name return it, and a descriptor of an unknown format version is refused.
TEST_F(StoreE2E, MasterIsTheTransferEnginesSegmentDirectory) {
  start_master();
  start_node("n1", "8MiB");
  auto r = raw();
  auto d = r->call(proto::GetSegmentRequest{node_xfer_["n1"]});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(d->descriptor.format_version, proto::kSegmentDescriptorVersion);
  ASSERT_EQ(d->descriptor.regions.size(), 1u);
  EXPECT_EQ(d->descriptor.regions[0].length_bytes, 8u << 20);
  EXPECT_FALSE(d->descriptor.regions[0].shm_path.empty());  // memfd that same-host engines map
  EXPECT_EQ(r->call(proto::GetSegmentRequest{"127.0.0.1:1"}).status().code(), Code::kNotFound);
  proto::SegmentDescriptor future = d->descriptor;
  future.name = "127.0.0.1:2";
  future.format_version = proto::kSegmentDescriptorVersion + 1;
  EXPECT_EQ(r->call(proto::PublishSegmentRequest{future}).status().code(), Code::kProtocolMismatch);
  // A cpu segment whose engine segment was never published cannot be mounted (clients could not reach it).
  proto::StoreMountRequest m{"ghost", "ghost/dram",        "h",           "d", "cpu",
                             1 << 20, "tcp://127.0.0.1:1", "127.0.0.1:3", 0,   false};
  EXPECT_EQ(r->call(m).status().code(), Code::kNotFound);
  // Another engine may use the master as its directory too.
  future.format_version = proto::kSegmentDescriptorVersion;
  EXPECT_EQ(r->call(proto::PublishSegmentRequest{future}).value_or(proto::PublishSegmentReply{}).region_count, 1u);
  EXPECT_EQ(r->call(proto::GetSegmentRequest{"127.0.0.1:2"}).value_or(proto::GetSegmentReply{}).descriptor.name,
            "127.0.0.1:2");
  // And the data still flows: put/get through the engine, byte for byte.
  auto c = client("dir");
  auto data = random_bytes(1 << 20, 8);
  ASSERT_TRUE(c->put("x", data).is_ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(c->get("x", back).is_ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(c->counters().bytes_written_shm, data.size());
  EXPECT_EQ(c->counters().bytes_read_shm, data.size());
}

// Liveness of clients: a live writer that is idle keeps its unfinished put (its library heartbeats in
// the background); a writer that stops heartbeating loses it after the client TTL, and its late put_end
// is refused (DESIGN.md §13.7).
TEST_F(StoreE2E, ClientHeartbeatKeepsAnIdleWriterAndADeadOnesPutIsReclaimed) {
  start_master({"--client-ttl-ms", "600", "--free-delay-ms", "100"});
  start_node("n1", "8MiB");
  ClientOptions o;
  o.master = endpoint_;
  o.client_id = "live";
  o.heartbeat_ms = 100;
  auto live = Client::connect(o).value();
  auto r = raw();
  auto start = [&](const std::string& who, const std::string& key) {
    proto::StorePutStartRequest ps;
    ps.client_id = who;
    ps.keys = {key};
    ps.sizes_bytes = {4096};
    auto g = r->call(ps);
    EXPECT_TRUE(g.is_ok() && g->items[0].code == 0);
    return g.is_ok() ? g->items[0].put_id : 0;
  };
  uint64_t live_put = start("live", "L");  // the live client's put, finished much later
  uint64_t dead_put = start("dead", "D");  // a writer that never heartbeats again
  ASSERT_TRUE(testkit::wait_until([&] { return stat().reclaimed_puts >= 1; }, 3000, 50))
      << "the dead writer's put was not reclaimed";
  // The point of the test: the live writer stays idle for more than one client TTL (600 ms) and keeps its put.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto st = stat();
  EXPECT_EQ(st.reclaimed_puts, 1u);
  EXPECT_EQ(st.processing, 1u);  // L is still being written
  auto le = r->call(proto::StorePutEndRequest{"dead", {"D"}, {dead_put}, {0}});
  ASSERT_TRUE(le.is_ok());
  EXPECT_EQ(le->codes[0], static_cast<uint16_t>(Code::kFailedPrecondition));
  auto ok = r->call(proto::StorePutEndRequest{"live", {"L"}, {live_put}, {0}});
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->codes[0], 0) << (ok->messages.empty() ? "" : ok->messages[0]);
  EXPECT_TRUE(live->exists({"L"}).value().at(0));
  // Once the client is gone its heartbeats stop, and the master forgets it.
  live.reset();
  EXPECT_TRUE(testkit::wait_until([&] { return stat().clients == 0; }, 3000, 50));
}

TEST_F(StoreE2E, EvictionUnderPressureNeverTouchesAnObjectBeingRead) {
  start_master({"--lease-ms", "60000"});
  start_node("n1", "4MiB");
  auto c = client("w");
  auto keep = random_bytes(512 * 1024, 5);
  ASSERT_TRUE(c->put("keep", keep).is_ok());
  std::vector<std::byte> buf(keep.size());
  ASSERT_TRUE(c->get("keep", buf).is_ok());  // now leased for 60 s
  int stored = 0;
  for (int i = 0; i < 40; ++i) {
    if (c->put("fill/" + std::to_string(i), random_bytes(256 * 1024, 100 + i)).is_ok()) ++stored;
  }
  EXPECT_GT(stored, 8);
  EXPECT_GT(stat().evictions, 0u);
  std::fill(buf.begin(), buf.end(), std::byte{0});
  ASSERT_TRUE(c->get("keep", buf).is_ok());
  EXPECT_EQ(buf, keep);
  EXPECT_EQ(c->remove("keep").code(), Code::kObjectBusy);
}

TEST_F(StoreE2E, DramVictimsAreDemotedToSsdAndReadBack) {
  start_master({"--lease-ms", "3000"});  // no reads before the demotions; reads under load may be slow
  start_node("n1", "2MiB", "", "default", "16MiB");
  auto c = client("w");
  std::vector<std::vector<std::byte>> blobs;
  for (int i = 0; i < 12; ++i) {
    blobs.push_back(random_bytes(200 * 1024 + i * 7, 300 + i));
    Status s = c->put("d/" + std::to_string(i), blobs.back());
    ASSERT_TRUE(s.is_ok()) << i << ": " << s.to_string();
  }
  ASSERT_TRUE(testkit::wait_until([&] { return stat().demotions > 0; }, 3000, 50)) << "no demotion happened";
  auto ls = c->ls("d/");
  int on_disk = 0;
  for (const auto& o : ls->objects) {
    for (const auto& m : o.media) on_disk += m == "disk";
  }
  EXPECT_GT(on_disk, 0);
  for (int i = 0; i < 12; ++i) {
    std::vector<std::byte> buf(blobs[i].size());
    auto n = c->get("d/" + std::to_string(i), buf);
    ASSERT_TRUE(n.is_ok()) << i << ": " << n.status().to_string();
    EXPECT_EQ(buf, blobs[i]) << "object " << i << " differs after demotion";
  }
  EXPECT_GT(c->counters().bytes_read_ssd, 0u);  // SSD replicas are read through the node, and timed
  EXPECT_GT(c->counters().read_ssd_ns, 0u);
}

// Field report #3: a namespace change never hits; a size mismatch is a miss.
TEST_F(StoreE2E, NamespaceChangesNeverHitAndSizeMismatchIsAMiss) {
  start_master();
  start_node("n1", "16MiB");
  auto c = client("w");
  std::vector<uint32_t> tokens(1024);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i * 7 + 1;
  KeyNamespace base;
  base.model_id = "m";
  base.kv_dtype = "bf16";
  base.model_revision = "r1";
  base.layout = "tp1";
  auto keys_of = [&](const KeyNamespace& ns) {
    std::vector<std::string> keys;
    for (uint64_t h : seq_hashes(tokens, ns)) keys.push_back(block_store_key(ns, h));
    return keys;
  };
  auto stored = keys_of(base);
  ASSERT_EQ(stored.size(), 2u);
  for (const auto& k : stored) ASSERT_TRUE(c->put(k, random_bytes(4096, 9)).is_ok());
  EXPECT_EQ(c->match_prefix(stored).value(), 2u);
  std::vector<KeyNamespace> variants(5, base);
  variants[0].kv_dtype = "fp8";
  variants[1].model_revision = "r2";
  variants[2].block_size = 256;
  variants[3].layout = "tp8";
  variants[4].salt = "tenant-b";
  for (const auto& v : variants) EXPECT_EQ(c->match_prefix(keys_of(v)).value(), 0u) << v.canonical();
  // Step 4: the right key, but the reader expects another length -> miss, buffer untouched.
  std::vector<std::byte> wrong(8192, std::byte{0x11});
  GetItem item{stored[0], wrong};
  auto r = c->batch_get(std::span<const GetItem>(&item, 1));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value()[0].code(), Code::kObjectNotFound);
  for (auto b : wrong) ASSERT_EQ(b, std::byte{0x11});
}

TEST_F(StoreE2E, BadInputGetsErrorsAndTheMasterKeepsServing) {
  start_master();
  start_node("n1", "16MiB");
  auto r = raw();
  proto::StorePutStartRequest ps;
  ps.client_id = "bad";
  ps.keys = {"zero", "huge", "", std::string(4000, 'k'), "ok"};
  ps.sizes_bytes = {0, 1ULL << 62, 10, 10, 10};
  auto g = r->call(ps);
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->items[0].code, static_cast<uint16_t>(Code::kInvalidArgument));
  EXPECT_EQ(g->items[1].code, static_cast<uint16_t>(Code::kInvalidArgument));
  EXPECT_EQ(g->items[2].code, static_cast<uint16_t>(Code::kInvalidArgument));
  EXPECT_EQ(g->items[3].code, static_cast<uint16_t>(Code::kInvalidArgument));
  EXPECT_EQ(g->items[4].code, 0);
  ps.sizes_bytes = {1};  // arrays of different lengths
  EXPECT_EQ(r->call(ps).status().code(), Code::kInvalidArgument);
  proto::StoreGetReplicasRequest gr;
  gr.keys = {"unknown"};
  EXPECT_EQ(r->call(gr)->items[0].code, static_cast<uint16_t>(Code::kObjectNotFound));
  proto::StoreMatchPrefixRequest big;
  big.keys.assign(proto::kStoreMaxBatch + 1, "k");
  EXPECT_EQ(r->call(big).status().code(), Code::kInvalidArgument);
  // Raw frames: truncated body, wrong protocol version, unknown type, garbage header.
  zmq::socket_t s(rpc::context(), zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint_);
  auto send = [&](const std::string& h, const std::string& b) {
    s.send(zmq::buffer(h), zmq::send_flags::sndmore);
    s.send(zmq::buffer(b), zmq::send_flags::none);
  };
  std::string body = codec::pack(ps);
  send(codec::pack(proto::Header{proto::kProtocolVersion, "store.put_start", 1}), body.substr(0, body.size() / 2));
  send(codec::pack(proto::Header{proto::kProtocolVersion + 7, "store.stat", 2}),
       codec::pack(proto::StoreStatRequest{}));
  send(codec::pack(proto::Header{proto::kProtocolVersion, "store.nope", 3}), "");
  send("\xc1garbage", "x");
  // The master handles one peer's frames in order: once it answers a well-formed call sent after the bad
  // frames, it has handled them (bounded by the socket's receive timeout).
  send(codec::pack(proto::Header{proto::kProtocolVersion, "store.stat", 4}), codec::pack(proto::StoreStatRequest{}));
  s.set(zmq::sockopt::rcvtimeo, 5000);
  bool answered = false;
  while (!answered) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(s, std::back_inserter(frames)) || frames.empty()) break;  // timed out
    auto h = codec::unpack<proto::Header>(frames[0].to_string_view(), "reply header");
    answered = h.is_ok() && h->id == 4;
  }
  ASSERT_TRUE(answered) << "the master did not answer a call sent after the bad frames within 5 s";
  // Still serving, and nothing was stored by the bad calls.
  auto st = r->call(proto::StoreStatRequest{});
  ASSERT_TRUE(st.is_ok()) << st.status().to_string();
  EXPECT_EQ(st->processing, 1u);  // only "ok", never finished
  EXPECT_EQ(st->objects, 0u);
  // A node data call out of range is refused too.
  auto c = client("x");
  EXPECT_TRUE(c->put("fine", random_bytes(10, 1)).is_ok());
}

TEST_F(StoreE2E, KvEventsAndAdminCliJson) {
  start_master({"--lease-ms", "100"});
  start_node("n1", "16MiB");
  auto sub = rpc::EventSubscriber::connect(events_).value();
  // PUB/SUB join: ZeroMQ tells neither end when a subscription has reached the publisher, so there is no
  // condition to wait on; events published before it are dropped (and the test would miss the first).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  KeyNamespace ns;
  ns.model_id = "m";
  std::string k0 = block_store_key(ns, 0x1111), k1 = block_store_key(ns, 0x2222);
  std::string file = (tmp_.path / "blob").string();
  const auto written = random_bytes(100000, 4);
  {
    FILE* f = fopen(file.c_str(), "wb");
    fwrite(written.data(), 1, written.size(), f);
    fclose(f);
  }
  EXPECT_EQ(run_tool({"put", "--master", endpoint_, k0, file}).first, 0);
  EXPECT_EQ(run_tool({"put", "--master", endpoint_, k1, "-"}, file).first, 0);
  auto [rc, bytes] = run_tool({"get", "--master", endpoint_, k0});
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(bytes.size(), 100000u);
  EXPECT_EQ(std::memcmp(bytes.data(), written.data(), written.size()), 0) << "get returns the bytes put";
  EXPECT_EQ(run_tool({"get", "--master", endpoint_, "absent"}).first, 1);
  auto [lrc, ls] = run_tool({"ls", "--master", endpoint_, "--prefix", "kv/", "--json"});
  ASSERT_EQ(lrc, 0);
  auto lj = nlohmann::json::parse(ls);
  ASSERT_EQ(lj["objects"].size(), 2u);
  EXPECT_EQ(lj["objects"][0]["size_bytes"], 100000);
  auto [src, st] = run_tool({"stat", "--master", endpoint_, "--json"});
  ASSERT_EQ(src, 0);
  auto sj = nlohmann::json::parse(st);
  EXPECT_EQ(sj["objects"], 2);
  EXPECT_EQ(sj["hits"], 1) << "one `get` is one lookup: one hit";
  EXPECT_EQ(sj["misses"], 1) << "the absent key";
  EXPECT_EQ(sj["segments"][0]["medium"], "cpu");
  EXPECT_GE(sj["segments"][0]["used_bytes"].get<uint64_t>(), 200000u);
  // The get leased k0 for --lease-ms (100); rm refuses a leased object.
  auto leased = [&] {
    uint64_t n = 0;
    for (const auto& seg : stat().segments) n += seg.leased_objects;
    return n;
  };
  ASSERT_TRUE(testkit::wait_until([&] { return leased() == 0; }, 3000, 20)) << "k0's lease never ended";
  EXPECT_EQ(run_tool({"rm", "--master", endpoint_, k0}).first, 0);
  // Events: stored k0, stored k1, removed k0, with consecutive ids.
  std::vector<proto::KvEvent> got;
  for (int i = 0; i < 40 && got.size() < 3; ++i) {
    auto e = sub->next(100);
    if (e.is_ok() && e->has_value()) got.push_back(**e);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, "stored");
  EXPECT_EQ(got[0].seq_hashes, std::vector<uint64_t>{0x1111});
  EXPECT_EQ(got[0].backend_id, prefix_ + "n1/dram");
  EXPECT_EQ(got[0].medium, "cpu");
  EXPECT_EQ(got[2].type, "removed");
  EXPECT_EQ(got[1].event_id, got[0].event_id + 1);
  EXPECT_EQ(got[2].event_id, got[1].event_id + 1);
  // watch prints the same stream as JSONL.
  std::pair<int, std::string> watched;
  std::thread th([&] { watched = run_tool({"watch", "--events", events_, "--count", "1", "--timeout-ms", "3000"}); });
  // The watch process's subscription has to reach the publisher before the put (PUB/SUB join, see above):
  // nothing observable says when, so this is a sleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(run_tool({"put", "--master", endpoint_, block_store_key(ns, 0x3333), file}).first, 0);
  th.join();
  EXPECT_EQ(watched.first, 0);
  auto wj = nlohmann::json::parse(watched.second);
  EXPECT_EQ(wj["type"], "stored");
  EXPECT_EQ(wj["seq_hashes"][0], 0x3333);
  EXPECT_EQ(wj["event_id"], got[2].event_id + 1);
}

// Issue 16 item 4, through the binaries: put --pin keeps an object in a pool filled far past its capacity
// while unpinned ones are evicted; unpin, fill again, it goes; a soft pin (--pin-ttl-ms) expires on the
// master's clock and its object goes too; pinning a missing key is exit 1 naming it; stat counts the pins.
TEST_F(StoreE2E, PinsSurviveEvictionUntilUnpinnedOrExpired) {
  start_master({"--lease-ms", "50"});
  start_node("n1", "1MiB");  // 16 objects of 64 KiB
  const size_t kObj = 64 << 10;
  const std::string file = (tmp_.path / "obj").string();
  {
    const auto bytes = random_bytes(kObj, 16);
    FILE* f = fopen(file.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
  }
  ASSERT_EQ(run_tool({"put", "--master", endpoint_, "--pin", "hard", file}).first, 0);
  ASSERT_EQ(run_tool({"put", "--master", endpoint_, "--pin", "--pin-ttl-ms", "1500", "soft", file}).first, 0);
  auto stat_json = [&] {
    auto [rc, out] = run_tool({"stat", "--master", endpoint_, "--json"});
    EXPECT_EQ(rc, 0) << out;
    return nlohmann::json::parse(out, nullptr, false);
  };
  nlohmann::json st = stat_json();
  EXPECT_GE(st.value("pinned_objects", 0), 1) << st.dump();
  EXPECT_GE(st.value("pinned_bytes", 0), static_cast<int64_t>(kObj)) << st.dump();
  // A pin of a missing key is a runtime error naming it; the other keys are still pinned.
  auto [mrc, missing] = run_tool({"pin", "--master", endpoint_, "--json", "hard", "no-such-key"});
  EXPECT_EQ(mrc, 1) << missing;
  EXPECT_NE(missing.find("no-such-key"), std::string::npos) << missing;
  EXPECT_EQ(run_tool({"unpin", "--master", endpoint_, "no-such-key"}).first, 1);
  auto c = client("pin-filler");
  ASSERT_TRUE(c);
  const auto data = random_bytes(kObj, 17);
  auto fill = [&](const std::string& tag) {
    for (int i = 0; i < 40; ++i) {
      Status s = c->put(tag + std::to_string(i), data);
      ASSERT_TRUE(s.is_ok()) << tag << i << ": " << s.to_string();
    }
  };
  auto exists = [&](const std::string& key) {
    auto e = c->exists({key});
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e.is_ok() && e->at(0);
  };
  fill("a");
  EXPECT_TRUE(exists("hard")) << "a pinned object was evicted";
  EXPECT_FALSE(exists("a0")) << "the pool holds 16 objects: the oldest unpinned ones go";
  st = stat_json();
  EXPECT_GT(st.value("evictions", 0), 0) << st.dump();
  auto [lrc, ls] = run_tool({"ls", "--master", endpoint_, "--prefix", "hard", "--json"});
  ASSERT_EQ(lrc, 0);
  EXPECT_EQ(nlohmann::json::parse(ls)["objects"][0]["pinned"], true) << ls;
  // The soft pin runs out on the master's clock.
  ASSERT_TRUE(testkit::wait_until([&] { return stat_json().value("expired_pins", 0) == 1; }, 10000, 100))
      << stat_json().dump();
  st = stat_json();
  EXPECT_EQ(st.value("pinned_objects", -1), 1) << st.dump();
  EXPECT_EQ(st.value("pinned_bytes", -1), static_cast<int64_t>(kObj)) << st.dump();
  // Unpinned, the object is evicted like any other.
  auto [urc, unpinned] = run_tool({"unpin", "--master", endpoint_, "--json", "hard"});
  ASSERT_EQ(urc, 0) << unpinned;
  EXPECT_EQ(nlohmann::json::parse(unpinned)["unpinned"][0], "hard") << unpinned;
  EXPECT_EQ(stat_json().value("pinned_objects", -1), 0);
  fill("b");
  EXPECT_FALSE(exists("hard")) << "unpinned, it should have been evicted";
  EXPECT_FALSE(exists("soft")) << "its soft pin expired, it should have been evicted";
  // pin KEY... pins existing objects again (and --ttl-ms makes it soft).
  auto [prc, pinned] = run_tool({"pin", "--master", endpoint_, "--ttl-ms", "60000", "--json", "b39"});
  ASSERT_EQ(prc, 0) << pinned;
  EXPECT_EQ(nlohmann::json::parse(pinned)["ttl_ms"], 60000) << pinned;
  EXPECT_EQ(stat_json().value("pinned_objects", -1), 1);
  // --pin-ttl-ms without --pin is a usage error.
  EXPECT_EQ(run_tool({"put", "--master", endpoint_, "--pin-ttl-ms", "10", "x", file}).first, 2);
}

// Issue 16 item 8: a storage node answers `stat` with its own counters (mc-store stat --node).
TEST_F(StoreE2E, NodeAnswersStatWithItsCounters) {
  start_master();
  start_node("n1", "4MiB", "far-host-1", "r1", "8MiB");  // another "host": its DRAM is served over tcp
  ASSERT_EQ(node_rpc_.count("n1"), 1u);
  const std::string node = node_rpc_["n1"];
  auto node_stat = [&] {
    auto [rc, out] = run_tool({"stat", "--node", node, "--json"});
    EXPECT_EQ(rc, 0) << out;
    return nlohmann::json::parse(out, nullptr, false);
  };
  auto gauge = [](const nlohmann::json& j, const std::string& name) {  // a gauge, or a counter (the *_total)
    if (!j.contains("metrics")) return -1.0;
    const char* kind = name.ends_with("_total") ? "counters" : "gauges";
    return j["metrics"].value(kind, nlohmann::json::object()).value(name, -1.0);
  };
  nlohmann::json j = node_stat();
  ASSERT_FALSE(j.is_discarded());
  EXPECT_NE(j.value("service", "").find(prefix_ + "n1"), std::string::npos) << j.dump();
  EXPECT_EQ(gauge(j, "mc_store_node_dram_capacity_bytes"), 4.0 * (1 << 20)) << j.dump();
  EXPECT_EQ(gauge(j, "mc_store_node_ssd_capacity_bytes"), 8.0 * (1 << 20)) << j.dump();
  auto c = client("node-stat");
  ASSERT_TRUE(c);
  const auto data = random_bytes(300000, 8);
  ASSERT_TRUE(c->put("blob", data).is_ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(c->get("blob", back).is_ok());
  // The master's view arrives with the next heartbeat (100 ms); the engine's counts are immediate.
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        nlohmann::json now = node_stat();
        return gauge(now, "mc_store_node_dram_objects") == 1 && gauge(now, "mc_store_node_dram_used_bytes") >= 300000 &&
               gauge(now, "mc_store_node_dram_hits_total") == 1;
      },
      5000, 50))
      << node_stat().dump();
  j = node_stat();
  EXPECT_GE(gauge(j, "mc_xfer_served_written_bytes_total"), 300000.0) << j.dump();
  EXPECT_GE(gauge(j, "mc_xfer_served_read_bytes_total"), 300000.0) << j.dump();
  EXPECT_GE(gauge(j, "mc_xfer_served_reads_total"), 1.0) << j.dump();
  EXPECT_EQ(j["metrics"]["counters"].value("mc_store_node_ssd_reads_total", -1), 0) << j.dump();
  // The table, and the master's stat is unchanged by --node's existence.
  auto [trc, table] = run_tool({"stat", "--node", node});
  ASSERT_EQ(trc, 0) << table;
  EXPECT_NE(table.find("mc_store_node_dram_used_bytes"), std::string::npos) << table;
  EXPECT_NE(table.find("mc_xfer_served_read_bytes_total"), std::string::npos) << table;
  auto [mrc, master] = run_tool({"stat", "--master", endpoint_, "--json"});
  ASSERT_EQ(mrc, 0);
  EXPECT_EQ(nlohmann::json::parse(master)["objects"], 1) << master;
  // An unreachable node is a runtime error naming it.
  auto [brc, bad] = run_tool({"stat", "--node", "tcp://127.0.0.1:1", "--json"});
  EXPECT_EQ(brc, 1) << bad;
  EXPECT_NE(bad.find("127.0.0.1:1"), std::string::npos) << bad;
}

// ---- Issue 17: faults lose nothing (the store's part) ----

// A node's gauge from `mc-store stat --node EP --json` (-1 when absent or unreadable).
double node_gauge(const std::string& node_rpc, const std::string& name) {
  auto [rc, out] = run_tool({"stat", "--node", node_rpc, "--json"});
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("metrics")) return -1;
  return j["metrics"]["gauges"].value(name, -1.0);
}

const proto::StoreSegmentStat* find_segment(const proto::StoreStatReply& s, const std::string& name) {
  for (const auto& g : s.segments) {
    if (g.segment == name) return &g;
  }
  return nullptr;
}

// Issue 17 item 3: bytes changed in a storage node's memory (an mc-xfer write into its DRAM segment, through
// the real binaries) are never returned: the read is a miss, the bad replica is dropped and counted, and an
// object with a second, intact replica is still read right.
TEST_F(StoreE2E, ChangedBytesInANodesMemoryAreAMissNeverData) {
  start_master();
  start_node("n1", "4MiB");
  start_node("n2", "4MiB");
  const auto data = random_bytes(64 * 1024, 17);
  const std::string file = (tmp_.path / "obj").string();
  {
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  ASSERT_EQ(run_tool({"put", "--master", endpoint_, "one", file}).first, 0);
  auto two = client("two", 2);
  ASSERT_TRUE(two->put("two", data).is_ok());
  // Where the replicas lie in the nodes' transfer segments.
  proto::StoreGetReplicasRequest req;
  req.client_id = "probe";
  req.keys = {"one", "two"};
  auto where = raw()->call(req);
  ASSERT_TRUE(where.is_ok()) << where.status().to_string();
  ASSERT_EQ(where->items.at(0).replicas.size(), 1u);
  ASSERT_EQ(where->items.at(1).replicas.size(), 2u);
  auto corrupt = [&](const proto::StoreReplica& r) {
    auto [rc, out] = run_tool({"write", "--target", r.xfer_segment, "--offset",
                               std::to_string(r.xfer_offset_bytes + 512), "--length", "4096"},
                              "", true, kXferBin);
    ASSERT_EQ(rc, 0) << out;
  };
  corrupt(where->items[0].replicas[0]);
  corrupt(where->items[1].replicas[0]);
  // The changed object is a miss: exit 1, nothing on stdout; its replica is gone from the metadata.
  auto [rc, out] = run_tool({"get", "--master", endpoint_, "one"});
  EXPECT_EQ(rc, 1);
  EXPECT_TRUE(out.empty()) << out.size() << " bytes written for a corrupt object";
  auto c = client("reader");
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(c->get("one", back).status().code(), Code::kObjectNotFound);
  // The object with an intact second replica reads right, and the bad one is dropped.
  auto n = c->get("two", back);
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  EXPECT_EQ(back, data);
  proto::StoreStatReply st = stat();
  EXPECT_EQ(st.corrupt_replicas, 2u);
  EXPECT_EQ(st.objects, 1u);
  auto ls = c->ls("");
  ASSERT_TRUE(ls.is_ok());
  ASSERT_EQ(ls->objects.size(), 1u);
  EXPECT_EQ(ls->objects[0].key, "two");
  EXPECT_EQ(ls->objects[0].segments.size(), 1u);
  auto [src, stat_json] = run_tool({"stat", "--master", endpoint_, "--json"});
  ASSERT_EQ(src, 0);
  EXPECT_EQ(nlohmann::json::parse(stat_json).value("corrupt_replicas", -1), 2) << stat_json;
}

// Ranges (issue 22: a pipeline stage reads its layers of each prefix block): an object put with part checksums
// gives a part-aligned range by moving only those bytes, checked part by part; a range of an object without parts,
// or not on part boundaries, is read whole and cut (same bytes, more moved); a range past the object is refused;
// a changed byte is a miss for every range that covers it (and the replica is dropped), never data.
TEST_F(StoreE2E, RangesMoveOnlyTheirPartsAndAChangedPartIsAMiss) {
  start_master();
  start_node("n1", "4MiB");
  constexpr uint64_t kPart = 8192, kSize = 8 * kPart;
  const auto data = random_bytes(kSize, 29);
  auto w = client("writer");
  WriteOptions parts;
  parts.part_bytes = kPart;
  ASSERT_TRUE(w->put("layers", data, parts).is_ok());
  ASSERT_TRUE(w->put("plain", data).is_ok());
  auto c = client("stage");
  const auto read_bytes = [&] { return c->counters().bytes_read_shm + c->counters().bytes_read_tcp; };
  const auto expect_range = [&](const std::string& key, uint64_t offset, uint64_t length, uint64_t moved) {
    std::vector<std::byte> got(length);
    const uint64_t before = read_bytes();
    GetItem item{key, got, offset, kSize};
    auto st = c->batch_get(std::span<const GetItem>(&item, 1));
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    ASSERT_TRUE(st->at(0).is_ok()) << key << " [" << offset << ", +" << length << "): " << st->at(0).to_string();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + static_cast<std::ptrdiff_t>(offset)))
        << key << " [" << offset << ", +" << length << ")";
    EXPECT_EQ(read_bytes() - before, moved) << key << " [" << offset << ", +" << length << ")";
  };
  expect_range("layers", 2 * kPart, 3 * kPart, 3 * kPart);  // parts 2..4 alone
  expect_range("layers", 7 * kPart, kPart, kPart);          // the last part
  expect_range("plain", 2 * kPart, 3 * kPart, kSize);       // no parts: the whole object, cut
  expect_range("layers", 100, kPart, kSize);                // off the part boundaries: the whole object, cut
  // Refused ranges and sizes.
  std::vector<std::byte> buf(kPart);
  GetItem past{"layers", buf, kSize - 10, kSize};
  auto st = c->batch_get(std::span<const GetItem>(&past, 1));
  ASSERT_TRUE(st.is_ok());
  EXPECT_EQ(st->at(0).code(), Code::kInvalidArgument) << st->at(0).to_string();
  GetItem other_size{"layers", buf, 0, kSize + kPart};
  st = c->batch_get(std::span<const GetItem>(&other_size, 1));
  ASSERT_TRUE(st.is_ok());
  EXPECT_EQ(st->at(0).code(), Code::kObjectNotFound) << st->at(0).to_string();
  // Change 16 bytes of part 5 in the node's memory: a range of parts 0..1 still reads (its bytes are intact), a
  // range over part 5 is a miss, and the replica is then gone for everyone.
  proto::StoreGetReplicasRequest req;
  req.client_id = "probe";
  req.keys = {"layers"};
  auto where = raw()->call(req);
  ASSERT_TRUE(where.is_ok()) << where.status().to_string();
  ASSERT_EQ(where->items.at(0).replicas.size(), 1u);
  const proto::StoreReplica& r = where->items[0].replicas[0];
  auto [rc, out] = run_tool({"write", "--target", r.xfer_segment, "--offset",
                             std::to_string(r.xfer_offset_bytes + 5 * kPart + 64), "--length", "16"},
                            "", true, kXferBin);
  ASSERT_EQ(rc, 0) << out;
  expect_range("layers", 0, 2 * kPart, 2 * kPart);
  std::vector<std::byte> over(2 * kPart);
  GetItem bad{"layers", over, 4 * kPart, kSize};
  st = c->batch_get(std::span<const GetItem>(&bad, 1));
  ASSERT_TRUE(st.is_ok());
  EXPECT_EQ(st->at(0).code(), Code::kObjectNotFound) << st->at(0).to_string();
  EXPECT_EQ(c->counters().corrupt_replicas, 1u);
  EXPECT_EQ(stat().corrupt_replicas, 1u);
  GetItem good{"layers", over, 0, kSize};
  st = c->batch_get(std::span<const GetItem>(&good, 1));
  ASSERT_TRUE(st.is_ok());
  EXPECT_EQ(st->at(0).code(), Code::kObjectNotFound) << "the dropped replica was offered again";
}

// Issue 17 item 2a and field report 20 (a restarted node becomes a hotspot): a node paused past its TTL
// (SIGSTOP) is suspect — its replicas not offered, not dropped — and after SIGCONT re-reports its objects and
// serves them again, full, so new puts keep spreading over both nodes instead of piling onto an "empty" one.
TEST_F(StoreE2E, PausedNodeIsSuspectThenComesBackWithItsCache) {
  start_master({"--node-ttl-ms", "1000", "--node-grace-ms", "60000"});
  start_node("n1", "16MiB");
  testkit::Child* n2 = start_node("n2", "16MiB");
  const ResumeOnExit resume{n2};
  std::vector<std::vector<std::byte>> blobs;
  for (const char* where : {"n1/dram", "n2/dram"}) {
    auto w = client(std::string("w-") + where[1], 1, where);
    for (int i = 0; i < 20; ++i) {
      blobs.push_back(random_bytes(64 * 1024, blobs.size()));
      ASSERT_TRUE(w->put(std::string(where) + "/" + std::to_string(i), blobs.back()).is_ok());
    }
  }
  // The node's object table follows the master's heartbeat replies.
  ASSERT_TRUE(
      testkit::wait_until([&] { return node_gauge(node_rpc_["n2"], "mc_store_node_objects_known") == 20; }, 5000, 50));
  const proto::StoreStatReply before = stat();
  ASSERT_NE(find_segment(before, prefix_ + "n2/dram"), nullptr);
  const uint64_t used_before = find_segment(before, prefix_ + "n2/dram")->used_bytes;
  n2->signal(SIGSTOP);
  auto n2_suspect = [&] {
    const proto::StoreStatReply now = stat();
    const proto::StoreSegmentStat* g = find_segment(now, prefix_ + "n2/dram");
    return g != nullptr && g->suspect;
  };
  ASSERT_TRUE(testkit::wait_until(n2_suspect, 5000, 50)) << "n2 never suspect";
  auto c = client("reader");
  std::vector<std::byte> buf(64 * 1024);
  EXPECT_EQ(c->get("n2/dram/0", buf).status().code(), Code::kObjectNotFound);  // not offered ...
  proto::StoreStatReply during = stat();
  EXPECT_EQ(during.objects, 40u);  // ... but kept
  EXPECT_EQ(during.dead_nodes, 0u);
  ASSERT_NE(find_segment(during, prefix_ + "n2/dram"), nullptr);
  EXPECT_TRUE(find_segment(during, prefix_ + "n2/dram")->suspect);
  EXPECT_TRUE(c->get("n1/dram/0", buf).is_ok());
  n2->signal(SIGCONT);
  ASSERT_TRUE(testkit::wait_until([&] { return c->get("n2/dram/0", buf).is_ok(); }, 10000, 50))
      << "n2's objects never offered again";
  for (int i = 0; i < 20; ++i) {
    auto n = c->get("n2/dram/" + std::to_string(i), buf);
    ASSERT_TRUE(n.is_ok()) << i << ": " << n.status().to_string();
    EXPECT_EQ(buf, blobs[20 + i]) << i;
  }
  // (A loaded machine may delay n1's heartbeats too: it would be suspect for a moment and come back likewise.)
  ASSERT_TRUE(testkit::wait_until([&] { return stat().suspect_nodes == 0; }, 5000, 50));
  proto::StoreStatReply after = stat();
  EXPECT_EQ(after.dead_nodes, 0u);
  EXPECT_GE(after.returned_nodes, 1u);
  EXPECT_GE(after.reported_replicas, 20u);
  ASSERT_NE(find_segment(after, prefix_ + "n2/dram"), nullptr);
  EXPECT_EQ(find_segment(after, prefix_ + "n2/dram")->used_bytes, used_before);
  // Field report 20: 20 new puts without a preference spread over both nodes (fair share 10, margin 2).
  auto w = client("spread");
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(w->put("new/" + std::to_string(i), random_bytes(64 * 1024, 900 + i)).is_ok());
  auto ls = c->ls("new/");
  ASSERT_TRUE(ls.is_ok());
  int on_n2 = 0;
  for (const auto& o : ls->objects) on_n2 += o.segments.at(0) == prefix_ + "n2/dram";
  EXPECT_LE(on_n2, 12) << "the returning node took " << on_n2 << " of 20 new puts";
  EXPECT_GE(on_n2, 8);
}

// Issue 17 item 2b and field report 24 (the store side of a stale index after a restart): kill -9 of the
// master and a restart on the same port rebuild the pool's metadata from the nodes' reports without any
// client's help; every key is readable again, and a client that lived through it is back on the fast path.
TEST_F(StoreE2E, MasterKilledAndRestartedRebuildsThePoolFromTheNodes) {
  start_master();
  start_node("n1", "16MiB", "", "default", "8MiB");
  start_node("n2", "16MiB");
  auto c = client("survivor", 1);
  std::vector<std::vector<std::byte>> blobs;
  for (int i = 0; i < 20; ++i) {
    blobs.push_back(random_bytes(32 * 1024 + i, 500 + i));
    ASSERT_TRUE(c->put("k/" + std::to_string(i), blobs.back()).is_ok());
  }
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        return node_gauge(node_rpc_["n1"], "mc_store_node_objects_known") +
                   node_gauge(node_rpc_["n2"], "mc_store_node_objects_known") ==
               20;
      },
      5000, 50));
  const std::string listen = endpoint_;
  master_->kill_hard();
  start_master({}, listen);
  ASSERT_EQ(endpoint_, listen);
  // No client call: the nodes' heartbeats alone rebuild the metadata.
  ASSERT_TRUE(testkit::wait_until([&] { return stat().objects == 20; }, 10000, 50))
      << "objects after the restart: " << stat().objects;
  proto::StoreStatReply st = stat();
  EXPECT_GE(st.reported_replicas, 20u);
  EXPECT_EQ(st.refused_reports, 0u);
  EXPECT_EQ(st.nodes, 2u);
  // The surviving client: its first call may fail on the broken fast connection; then every key reads right.
  std::vector<std::byte> buf;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        buf.resize(blobs[0].size());
        return c->get("k/0", buf).is_ok();
      },
      10000, 100));
  for (int i = 0; i < 20; ++i) {
    buf.resize(blobs[i].size());
    auto n = c->get("k/" + std::to_string(i), buf);
    ASSERT_TRUE(n.is_ok()) << i << ": " << n.status().to_string();
    EXPECT_EQ(buf, blobs[i]) << i;
  }
  // ... and back on the fast path: further metadata calls go there, not to ZeroMQ.
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        const uint64_t fast = c->counters().master_calls_fast;
        (void)c->exists({"k/0"});
        return c->counters().master_calls_fast > fast;
      },
      5000, 200))
      << "the client stayed on ZeroMQ";
  // New puts land beside the restored objects, never over them.
  ASSERT_TRUE(c->put("after", random_bytes(32 * 1024, 7)).is_ok());
  for (int i = 0; i < 20; ++i) {
    buf.resize(blobs[i].size());
    ASSERT_TRUE(c->get("k/" + std::to_string(i), buf).is_ok());
    EXPECT_EQ(buf, blobs[i]) << i;
  }
}

// Issue 20 item 4 (metadata never offers an unreachable replica for long): a node the master still hears but this
// client cannot reach (here: SIGSTOPped, the master's TTL long) costs the client one transfer timeout per
// ClientOptions::unreachable_cooldown_ms, not one per read: its replicas are passed over at once, a read with no
// other replica is a miss at once, and one with another replica reads that.
TEST_F(StoreE2E, AnUnreachableSegmentCostsOneTimeoutPerCooldown) {
  start_master({"--node-ttl-ms", "60000", "--node-grace-ms", "60000"});
  start_node("n1", "16MiB");
  testkit::Child* n2 = start_node("n2", "16MiB");
  const ResumeOnExit resume{n2};
  const auto both = random_bytes(64 * 1024, 1), only = random_bytes(64 * 1024, 2);
  ASSERT_TRUE(client("w2", 2)->put("both", both).is_ok());
  ASSERT_TRUE(client("w1", 1, "n2/dram")->put("only-n2", only).is_ok());
  ClientOptions o;
  o.master = endpoint_;
  o.client_id = "reader";
  o.transports = {"tcp"};  // shared memory would read a stopped node's DRAM
  o.transfer_timeout_ms = 500;
  o.node_timeout_ms = 300;
  o.unreachable_cooldown_ms = 60000;
  auto c = Client::connect(o);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  std::vector<std::byte> buf(64 * 1024);
  ASSERT_TRUE((*c)->get("only-n2", buf).is_ok());  // connected to both nodes while they answer
  ASSERT_TRUE((*c)->get("both", buf).is_ok());
  auto where = (*c)->ls("only-n2");
  ASSERT_TRUE(where.is_ok() && where->objects.size() == 1) << where.status().to_string();
  ASSERT_EQ(where->objects[0].segments, std::vector<std::string>{prefix_ + "n2/dram"}) << "placed elsewhere";
  n2->signal(SIGSTOP);
  auto stopped = [pid = n2->pid()] {  // the state field of /proc/PID/stat, after "(comm)"
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    const std::string st((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t paren = st.rfind(')');
    return paren != std::string::npos && paren + 2 < st.size() && st[paren + 2] == 'T';
  };
  ASSERT_TRUE(testkit::wait_until(stopped, 5000, 5)) << "n2 did not stop";
  // The first read of n2's only replica waits for its timeout and fails; n2's segment cools down.
  auto first = (*c)->get("only-n2", buf);
  EXPECT_FALSE(first.is_ok());
  EXPECT_EQ((*c)->counters().unreachable_segments, 1u);
  // Then: at once, and without another transfer.
  const auto t0 = std::chrono::steady_clock::now();
  auto again = (*c)->get("only-n2", buf);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), Code::kUnavailable) << again.status().to_string();
  EXPECT_NE(again.status().message().find("could not reach"), std::string::npos) << again.status().to_string();
  EXPECT_LT(ms, o.transfer_timeout_ms) << "the second read waited for a transfer";
  EXPECT_GE((*c)->counters().unreachable_skips, 1u);
  // The object with a replica on n1 reads from there (n2's passed over, or failed once and cooled down).
  for (int i = 0; i < 3; ++i) {
    auto r = (*c)->get("both", buf);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(buf, both);
  }
  EXPECT_EQ((*c)->counters().unreachable_segments, 1u);
}

// Issue 17 (a miss may cost time, never a request): a master that stops answering costs a client one timeout,
// not one per call. After the first timeout the client's calls fail at once (counted) until the back-off window
// ends or a heartbeat gets through; once the master answers again, so does every call.
TEST_F(StoreE2E, SilentMasterCostsOneTimeoutNotOnePerCall) {
  start_master();
  start_node("n1", "16MiB");
  auto c = client("patient");
  ASSERT_NE(c, nullptr);
  const auto blob = random_bytes(4096, 3);
  ASSERT_TRUE(c->put("k", blob).is_ok());
  std::vector<std::byte> buf(blob.size());
  master_->signal(SIGSTOP);
  struct Resume {
    testkit::Child* m;
    ~Resume() { m->signal(SIGCONT); }
  } resume{master_.get()};
  auto first = c->get("k", buf);
  ASSERT_FALSE(first.is_ok());
  EXPECT_EQ(first.status().code(), Code::kTimeout) << first.status().to_string();
  for (int i = 0; i < 5; ++i) {
    auto again = c->get("k", buf);
    ASSERT_FALSE(again.is_ok());
    EXPECT_EQ(again.status().code(), Code::kUnavailable) << again.status().to_string();
    EXPECT_NE(again.status().message().find("did not answer"), std::string::npos) << again.status().to_string();
    EXPECT_FALSE(c->put("k2", blob).is_ok());
  }
  EXPECT_EQ(c->counters().master_fast_failures, 10u);
  master_->signal(SIGCONT);
  ASSERT_TRUE(testkit::wait_until([&] { return c->get("k", buf).is_ok(); }, 20'000, 50))
      << "calls never reached the master again";
  EXPECT_EQ(buf, blob);
  EXPECT_TRUE(c->put("k2", blob).is_ok());
}

// Issue 17 item 4: an SSD tier larger than the file system's free space is refused at start (exit 2),
// naming the directory, the free bytes and the flag.
TEST_F(StoreE2E, SsdBytesBeyondTheFreeSpaceAreRefusedAtStart) {
  auto [rc, out] = run_tool({"serve", "--master", "tcp://127.0.0.1:1", "--dram-bytes", "1MiB", "--ssd-dir",
                             tmp_.path.string(), "--ssd-bytes", "1000TiB", "--node-id", prefix_ + "big"},
                            "", true);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--ssd-bytes"), std::string::npos) << out;
  EXPECT_NE(out.find(tmp_.path.string()), std::string::npos) << out;
  EXPECT_NE(out.find("bytes free"), std::string::npos) << out;
}

// A small tmpfs for the SSD tier, unmounted (lazily, even while a node still holds its file) on scope exit.
struct TmpfsMount {
  std::filesystem::path path;
  bool mounted = false;
  TmpfsMount(const std::filesystem::path& p, const std::string& size) : path(p) {
    std::filesystem::create_directories(path);
    mounted =
        std::system(("mount -t tmpfs -o size=" + size + " tmpfs '" + path.string() + "' 2>/dev/null").c_str()) == 0;
  }
  ~TmpfsMount() {
    if (mounted) (void)std::system(("umount -l '" + path.string() + "' 2>/dev/null").c_str());
  }
};

// Issue 17 item 4: the SSD file system fills up under demotions (ENOSPC, on a real 3 MiB tmpfs filled by
// another file): the tier becomes read-only, eviction takes over, and every put keeps succeeding.
TEST_F(StoreE2E, FullSsdBecomesReadOnlyAndPutsKeepSucceeding) {
  TmpfsMount fs(tmp_.path / "ssd", "3m");
  if (!fs.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN): ENOSPC not testable";
  start_master({"--lease-ms", "3000"});
  std::vector<std::string> args = {"serve",        "--master",       endpoint_,   "--node-id",      prefix_ + "n1",
                                   "--dram-bytes", "2MiB",           "--ssd-dir", fs.path.string(), "--ssd-bytes",
                                   "2MiB",         "--heartbeat-ms", "100"};
  nodes_.push_back(start_store(args));
  auto w = ready_words(*nodes_.back());
  ASSERT_GE(w.size(), 3u);
  const std::string node_rpc = w[2];
  // Another writer fills the file system, leaving 64 KiB.
  {
    struct statvfs v {};
    ASSERT_EQ(statvfs(fs.path.c_str(), &v), 0);
    const uint64_t free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    ASSERT_GT(free_bytes, 64u * 1024);
    std::ofstream filler(fs.path / "filler", std::ios::binary);
    std::vector<char> chunk(64 * 1024, 'x');
    for (uint64_t left = free_bytes - 64 * 1024; left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, chunk.size());
      filler.write(chunk.data(), static_cast<std::streamsize>(n));
      left -= n;
    }
  }
  auto c = client("filler");
  std::vector<std::vector<std::byte>> blobs;
  for (int i = 0; i < 40; ++i) {
    blobs.push_back(random_bytes(128 * 1024, 40 + i));
    Status s = c->put("full/" + std::to_string(i), blobs.back());
    ASSERT_TRUE(s.is_ok()) << "put " << i << " failed: " << s.to_string();
  }
  proto::StoreStatReply st = stat();
  EXPECT_GE(st.ssd_failures, 1u);
  const proto::StoreSegmentStat* ssd = find_segment(st, prefix_ + "n1/ssd");
  ASSERT_NE(ssd, nullptr);
  EXPECT_TRUE(ssd->read_only);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(node_gauge(node_rpc, "mc_store_node_ssd_read_only"), 1.0);
  auto [rc, table] = run_tool({"stat", "--master", endpoint_});
  EXPECT_NE(table.find("read-only"), std::string::npos) << table;
  // What is still held reads right (DRAM or the read-only SSD); the rest is a miss, never an error.
  for (int i = 0; i < 40; ++i) {
    std::vector<std::byte> buf(blobs[i].size());
    auto n = c->get("full/" + std::to_string(i), buf);
    if (n.is_ok()) {
      EXPECT_EQ(buf, blobs[i]) << i;
    } else {
      EXPECT_EQ(n.status().code(), Code::kObjectNotFound) << i << ": " << n.status().to_string();
    }
  }
}

// Issue 17 item 4: the SSD directory is removed while serving: the node detects it, unmounts the tier, and
// its objects leave the metadata (a get is a miss, never an error); puts keep succeeding.
TEST_F(StoreE2E, VanishedSsdDirectoryIsDetectedAndItsObjectsDropped) {
  start_master({"--lease-ms", "3000"});
  const std::filesystem::path dir = tmp_.path / "ssd-gone";
  std::filesystem::create_directories(dir);
  std::vector<std::string> args = {"serve",        "--master",       endpoint_,   "--node-id",  prefix_ + "n1",
                                   "--dram-bytes", "2MiB",           "--ssd-dir", dir.string(), "--ssd-bytes",
                                   "16MiB",        "--heartbeat-ms", "100"};
  nodes_.push_back(start_store(args));
  auto w = ready_words(*nodes_.back());
  ASSERT_GE(w.size(), 3u);
  const std::string node_rpc = w[2];
  auto c = client("w");
  std::vector<std::vector<std::byte>> blobs;
  for (int i = 0; i < 24; ++i) {
    blobs.push_back(random_bytes(128 * 1024, 60 + i));
    ASSERT_TRUE(c->put("v/" + std::to_string(i), blobs.back()).is_ok()) << i;
  }
  ASSERT_TRUE(testkit::wait_until([&] { return stat().demotions >= 4; }, 5000, 50)) << "no demotions";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(testkit::wait_until([&] { return find_segment(stat(), prefix_ + "n1/ssd") == nullptr; }, 5000, 50))
      << "the SSD segment is still mounted after its directory vanished";
  EXPECT_EQ(node_gauge(node_rpc, "mc_store_node_ssd_lost"), 1.0);
  // Demotions cut short by the unmount leave DRAM above the high watermark until the next tick evicts: wait
  // for that, so that the counts below do not move under the reads.
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        const proto::StoreStatReply now = stat();
        const proto::StoreSegmentStat* dram = find_segment(now, prefix_ + "n1/dram");
        return dram != nullptr && dram->used_bytes <= dram->capacity_bytes * 9 / 10;
      },
      5000, 50));
  proto::StoreStatReply st = stat();
  EXPECT_LT(st.objects, 24u);  // the SSD-only objects are gone from the metadata
  int held = 0;
  std::string misses;
  for (int i = 0; i < 24; ++i) {
    std::vector<std::byte> buf(blobs[i].size());
    auto n = c->get("v/" + std::to_string(i), buf);
    if (n.is_ok()) {
      ++held;
      EXPECT_EQ(buf, blobs[i]) << i;
    } else {
      EXPECT_EQ(n.status().code(), Code::kObjectNotFound) << i << ": " << n.status().to_string();
      misses += n.status().message() + "\n";
    }
  }
  EXPECT_EQ(static_cast<uint64_t>(held), st.objects) << misses;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(c->put("after/" + std::to_string(i), blobs[i]).is_ok()) << i;
}

// Issue 19 item 3: a storage node scaled down with SIGTERM drains first. The objects only it holds — in its DRAM
// and, demoted, on its SSD — are copied to the other node through the transfer engine before it unmounts; it
// exits 0, every object reads back with its bytes, and the master counts a drained node, not a dead one.
TEST_F(StoreE2E, SigtermDrainsTheNodesObjectsToTheOtherNodeBeforeItLeaves) {
  start_master();
  testkit::Child* a = start_node("a", "1MiB", "", "default", "16MiB", {"--drain-timeout-s", "20"});
  start_node("b", "32MiB", "far-host-b", "r2");
  std::map<std::string, std::vector<std::byte>> blobs;
  auto wa = client("wa", 1, "a/dram");
  ASSERT_TRUE(wa);
  for (int i = 0; i < 10; ++i) {  // past A's DRAM high watermark: the oldest are demoted to its SSD
    const std::string key = "only-a/" + std::to_string(i);
    blobs[key] = random_bytes(100 * 1024 + i, 500 + i);
    ASSERT_TRUE(wa->put(key, blobs[key]).is_ok()) << key;
  }
  ASSERT_TRUE(testkit::wait_until([&] { return stat().demotions > 0; }, 5000, 50)) << "nothing was demoted to SSD";
  auto w2 = client("w2", 2, "a/dram");
  for (int i = 0; i < 4; ++i) {  // one replica on each node: nothing to move
    const std::string key = "both/" + std::to_string(i);
    blobs[key] = random_bytes(4096 + i, 900 + i);
    ASSERT_TRUE(w2->put(key, blobs[key]).is_ok()) << key;
  }
  // What only A holds (whatever its tier), from the master's listing.
  auto reader = client("reader");
  auto ls = reader->ls("");
  ASSERT_TRUE(ls.is_ok());
  uint64_t only_a = 0;
  bool on_ssd = false;
  for (const auto& o : ls->objects) {
    bool all_a = !o.segments.empty();
    for (size_t i = 0; i < o.segments.size(); ++i) {
      all_a = all_a && o.segments[i].rfind(prefix_ + "a/", 0) == 0;
      on_ssd = on_ssd || (o.segments[i] == prefix_ + "a/ssd" && o.segments.size() == 1);
    }
    only_a += all_a ? 1 : 0;
  }
  EXPECT_GT(only_a, 0u);
  EXPECT_TRUE(on_ssd) << "no object lives only on A's SSD: the SSD source path is not exercised";

  a->signal(SIGTERM);
  ASSERT_EQ(a->wait_exit(25000), 0) << "the draining node did not exit 0 in time";
  proto::StoreStatReply st = stat();
  EXPECT_EQ(st.nodes_drained, 1u);
  EXPECT_EQ(st.drain_moved_objects, only_a);
  EXPECT_GT(st.drain_moved_bytes, 0u);
  EXPECT_EQ(st.drain_dropped_objects, 0u);
  EXPECT_EQ(st.dead_nodes, 0u);
  EXPECT_EQ(st.nodes, 1u);
  for (const auto& g : st.segments) EXPECT_EQ(g.node_id, prefix_ + "b");
  for (const auto& [key, bytes] : blobs) {
    std::vector<std::byte> back(bytes.size());
    auto n = reader->get(key, back);
    ASSERT_TRUE(n.is_ok()) << key << ": " << n.status().to_string();
    ASSERT_EQ(n.value(), bytes.size());
    EXPECT_TRUE(back == bytes) << key << " differs after the drain";
  }
  // The CLI reads a moved object too, and its stat shows the drain counters.
  auto [rc, out] = run_tool({"get", "--master", endpoint_, "only-a/0"});
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out.size(), blobs["only-a/0"].size());
  EXPECT_EQ(0, std::memcmp(out.data(), blobs["only-a/0"].data(), out.size()));
  auto [src, js] = run_tool({"stat", "--master", endpoint_, "--json"});
  ASSERT_EQ(src, 0);
  auto j = nlohmann::json::parse(js);
  EXPECT_EQ(j["nodes_drained"], 1);
  EXPECT_EQ(j["drain_moved_objects"], only_a);
  EXPECT_EQ(j["dead_nodes"], 0);
}

// A drain whose objects fit nowhere else drops them (counted), moves the rest, and the node still exits 0.
TEST_F(StoreE2E, DrainDropsWhatTheOtherNodeCannotHoldAndCountsIt) {
  start_master();
  testkit::Child* a = start_node("a", "32MiB", "", "default", "", {"--drain-timeout-s", "10"});
  start_node("b", "2MiB", "far-host-b", "r2");
  auto wa = client("wa", 1, "a/dram");
  std::map<std::string, std::vector<std::byte>> small;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(wa->put("big/" + std::to_string(i), random_bytes(3 << 20, 70 + i)).is_ok());
    small["small/" + std::to_string(i)] = random_bytes(64 * 1024, 80 + i);
    ASSERT_TRUE(wa->put("small/" + std::to_string(i), small["small/" + std::to_string(i)]).is_ok());
  }
  a->signal(SIGTERM);
  ASSERT_EQ(a->wait_exit(15000), 0);
  proto::StoreStatReply st = stat();
  EXPECT_EQ(st.nodes_drained, 1u);
  EXPECT_EQ(st.drain_moved_objects, 3u);
  EXPECT_EQ(st.drain_dropped_objects, 3u);
  EXPECT_EQ(st.dead_nodes, 0u);
  auto reader = client("reader");
  for (const auto& [key, bytes] : small) {
    std::vector<std::byte> back(bytes.size());
    ASSERT_TRUE(reader->get(key, back).is_ok()) << key;
    EXPECT_TRUE(back == bytes) << key;
  }
  std::vector<std::byte> buf(3 << 20);
  EXPECT_EQ(reader->get("big/0", buf).status().code(), Code::kObjectNotFound);
}

// The drain is bounded: with the master frozen (SIGSTOP) the node gives up after --drain-timeout-s, unmounts
// as best it can and exits 0; a node started with --drain-timeout-s 0 leaves at once, as before the drain.
TEST_F(StoreE2E, DrainGivesUpAtItsTimeoutAndTheNodeStillExits) {
  // Nodes are dead at the TTL: whatever the frozen master missed (A's unmount) ends within a second of SIGCONT.
  start_master({"--node-ttl-ms", "1000", "--node-grace-ms", "0"});
  testkit::Child* a = start_node("a", "16MiB", "", "default", "", {"--drain-timeout-s", "1"});
  start_node("b", "16MiB", "far-host-b", "r2");
  auto wa = client("wa", 1, "a/dram");
  ASSERT_TRUE(wa->put("k", random_bytes(4096, 1)).is_ok());
  master_->signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  a->signal(SIGTERM);
  const int rc = a->wait_exit(15000);
  master_->signal(SIGCONT);
  EXPECT_EQ(rc, 0);
  // 1 s of drain, then at most ~1 s for the last drain call and ~1 s per unmount call.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  testkit::Child* c = start_node("c", "16MiB", "", "default", "", {"--drain-timeout-s", "0"});
  auto wc = client("wc", 1, "c/dram");
  ASSERT_TRUE(wc->put("kc", random_bytes(4096, 2)).is_ok());
  c->signal(SIGTERM);
  EXPECT_EQ(c->wait_exit(5000), 0);
  ASSERT_TRUE(testkit::wait_until([&] { return stat().nodes == 1; }, 5000, 50));
  EXPECT_EQ(stat().drain_moved_objects, 0u);
}

}  // namespace MC_UNITY_ID
}  // namespace mc::store
