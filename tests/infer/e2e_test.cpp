// End to end on loopback: real mc-decode and mc-prefill processes, a client RpcServer in the test.
// Three requests sharing a 2-block prefix: with the cache the 2nd and 3rd hit (ledger) and produce exactly the
// tokens of a prefill instance with the cache disabled (ref and sim backends). The KV goes from prefill to decode
// through the transfer engine (decode's stat: engine notifications and bytes, no kv_write call), or through
// kv_write RPCs when decode publishes no segment. Field report #14 over RPC; job reports to a conductor.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "mc/common/block_key.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/worker.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc {
namespace {

// Serves `server` on a thread of its own (a stand-in Conductor the workers register with before their ready
// line); stops and joins it on the way out, also when an assertion fails.
class ServingThread {
 public:
  explicit ServingThread(rpc::RpcServer& server) : server_(server), thread_([this] { (void)server_.serve(); }) {}
  ~ServingThread() {
    server_.stop();
    thread_.join();
  }
  ServingThread(const ServingThread&) = delete;
  ServingThread& operator=(const ServingThread&) = delete;

 private:
  rpc::RpcServer& server_;
  std::thread thread_;
};

using testkit::Child;

// argv of `binary` with `args`.
std::vector<std::string> cmd(const std::string& binary, std::vector<std::string> args) {
  args.insert(args.begin(), binary);
  return args;
}

struct Stream {
  std::vector<uint32_t> tokens;
  std::vector<int64_t> times_ns;
  std::optional<proto::RequestLedger> done;
  std::optional<proto::RequestError> error;
};

// The client endpoint: records token events on its own thread.
class ClientEndpoint {
 public:
  ClientEndpoint() {
    rpc::ServerOptions o;
    o.service = "e2e-client";
    o.bind_endpoints = {"tcp://127.0.0.1:0"};
    server_ = rpc::RpcServer::bind(o).value();
    server_->handle<proto::TokenEvent>([this](const proto::TokenEvent& e, const auto&) -> Result<proto::ClientAck> {
      std::lock_guard lock(mu_);
      auto& s = streams_[e.request_id];
      EXPECT_EQ(e.index, static_cast<int64_t>(s.tokens.size())) << "tokens out of order";
      s.tokens.push_back(e.token);
      s.times_ns.push_back(e.emitted_unix_ns);
      return proto::ClientAck{true};
    });
    server_->handle<proto::RequestDone>([this](const proto::RequestDone& d, const auto&) -> Result<proto::ClientAck> {
      std::lock_guard lock(mu_);
      streams_[d.request_id].done = d.ledger;
      return proto::ClientAck{true};
    });
    server_->handle<proto::RequestError>([this](const proto::RequestError& e, const auto&) -> Result<proto::ClientAck> {
      std::lock_guard lock(mu_);
      streams_[e.request_id].error = e;
      return proto::ClientAck{true};
    });
    thread_ = std::thread([this] { (void)server_->serve(); });
  }
  ~ClientEndpoint() {
    server_->stop();
    thread_.join();
  }
  std::string endpoint() const { return server_->endpoints().front(); }
  // Waits (bounded) until the request ended (done or error).
  Stream wait(const std::string& id, int timeout_ms = 20000) {
    testkit::wait_until(
        [&] {
          std::lock_guard lock(mu_);
          auto it = streams_.find(id);
          return it != streams_.end() && (it->second.done || it->second.error);
        },
        timeout_ms, 5);
    std::lock_guard lock(mu_);
    return streams_[id];
  }

 private:
  std::unique_ptr<rpc::RpcServer> server_;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, Stream> streams_;
};

const std::string kBin = MC_BINARY_DIR "/bin/";

struct RequestRun {
  Result<proto::PrefillJobReply> job = Status(Code::kInternal, "not run");
  Stream stream;
};

RequestRun run_request(rpc::RpcClient& decode, const std::string& decode_ep, rpc::RpcClient& prefill,
                       ClientEndpoint& client, const std::string& id, const std::vector<uint32_t>& prompt,
                       int64_t output, int64_t fail_after_layers = -1, const RequestKeyScope& reserve_scope = {},
                       const RequestKeyScope& job_scope = {}) {
  RequestRun run;
  proto::DecodeReserveRequest rr{id, static_cast<int64_t>(prompt.size()), output, client.endpoint(), 10000};
  rr.lora_name = reserve_scope.lora_name;
  rr.lora_version = reserve_scope.lora_version;
  rr.salt = reserve_scope.salt;
  auto res = decode.call(rr, 5000);
  if (!res.is_ok()) {
    run.job = res.status();
    return run;
  }
  proto::PrefillJobRequest job;
  job.request_id = id;
  job.tokens = prompt;
  job.output_length_tokens = output;
  job.decode_endpoint = decode_ep;
  job.reservation_id = res->reservation_id;
  job.decode_block_offsets_bytes = res->block_offsets_bytes;
  job.client_endpoint = client.endpoint();
  job.fail_after_layers = fail_after_layers;
  job.lora_name = job_scope.lora_name;
  job.lora_version = job_scope.lora_version;
  job.salt = job_scope.salt;
  run.job = prefill.call(job, 20000);
  run.stream = client.wait(id);
  return run;
}

std::vector<uint32_t> prompt_with_shared_prefix(int64_t block, int64_t tail, uint32_t salt) {
  std::vector<uint32_t> p;
  for (int64_t i = 0; i < 2 * block; ++i) p.push_back(static_cast<uint32_t>((i * 37 + 11) % 256));
  for (int64_t i = 0; i < tail; ++i) p.push_back(static_cast<uint32_t>((salt * 53 + i * 7 + 3) % 256));
  return p;
}

// A counter of a worker's `stat` reply (0 when never incremented).
uint64_t stat_counter(rpc::RpcClient& worker, const std::string& name) {
  auto stat = worker.call(proto::StatRequest{}, 2000);
  EXPECT_TRUE(stat) << stat.status().to_string();
  if (!stat) return 0;
  const auto j = nlohmann::json::parse(stat->metrics_json);
  return j["counters"].contains(name) ? j["counters"][name].get<uint64_t>() : 0;
}

enum class KvPath { kEngine, kRpc };

void shared_prefix_e2e(const std::vector<std::string>& backend_args, KvPath path = KvPath::kEngine) {
  const int64_t block = 16;
  std::vector<std::string> common = backend_args;
  common.insert(common.end(), {"--block-size", "16", "--kv-blocks", "256", "--seed", "5", "--log-level", "warn"});
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Child decode(cmd(
      kBin + "mc-decode",
      with(path == KvPath::kEngine ? std::vector<std::string>{} : std::vector<std::string>{"--kv-listen", "none"})));
  Child cached(cmd(kBin + "mc-prefill", with({"--store", "mem", "--chunk-tokens", "20"})));
  Child uncached(cmd(kBin + "mc-prefill", with({"--store", "none"})));
  const std::string dep = decode.wait_ready(), cep = cached.wait_ready(), uep = uncached.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(cep.empty());
  ASSERT_FALSE(uep.empty());
  auto d = rpc::RpcClient::connect(dep).value();
  auto pc = rpc::RpcClient::connect(cep).value();
  auto pu = rpc::RpcClient::connect(uep).value();
  ClientEndpoint client;
  const std::vector<int64_t> tails = {9, 21, 5};
  int64_t sent_bytes = 0;
  for (size_t i = 0; i < tails.size(); ++i) {
    const auto prompt = prompt_with_shared_prefix(block, tails[i], static_cast<uint32_t>(i));
    const std::string id = "req-" + std::to_string(i);
    RequestRun hit = run_request(*d, dep, *pc, client, id + "-cache", prompt, 10);
    RequestRun ref = run_request(*d, dep, *pu, client, id + "-nocache", prompt, 10);
    ASSERT_TRUE(hit.job) << hit.job.status().to_string();
    ASSERT_TRUE(ref.job) << ref.job.status().to_string();
    ASSERT_TRUE(hit.stream.done.has_value()) << id;
    ASSERT_TRUE(ref.stream.done.has_value()) << id;
    EXPECT_EQ(hit.stream.tokens.size(), 10u);
    EXPECT_EQ(hit.stream.tokens, ref.stream.tokens) << id << ": the cached run produced different tokens";
    EXPECT_EQ(hit.stream.done->hit_tokens, i == 0 ? 0 : 2 * block) << id;
    EXPECT_EQ(hit.stream.done->decision, i == 0 ? "recompute" : "fetch");
    EXPECT_EQ(ref.stream.done->hit_tokens, 0);
    EXPECT_EQ(hit.stream.done->prompt_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_GT(hit.stream.done->kv_sent_bytes, 0);
    sent_bytes += hit.stream.done->kv_sent_bytes + ref.stream.done->kv_sent_bytes;
    for (size_t k = 1; k < hit.stream.times_ns.size(); ++k)
      EXPECT_GE(hit.stream.times_ns[k], hit.stream.times_ns[k - 1]);
  }
  auto load = d->call(proto::WorkerLoadRequest{}, 2000);
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kv_blocks_committed, 0);
  EXPECT_EQ(load->kv_blocks_used, 0);
  auto stat = d->call(proto::StatRequest{}, 2000);
  ASSERT_TRUE(stat);
  EXPECT_NE(stat->metrics_json.find("mc_decode_tokens_total"), std::string::npos);
  // Where the bytes went: every KV byte the prefills sent arrived, over the path the decode instance offered.
  EXPECT_EQ(stat_counter(*d, "mc_decode_kv_received_bytes_total"), static_cast<uint64_t>(sent_bytes));
  if (path == KvPath::kEngine) {
    EXPECT_FALSE(load->kv_segment.empty()) << "mc-decode published no KV segment";
    EXPECT_EQ(stat_counter(*d, "mc_decode_kv_write_calls_total"), 0u) << "KV went over kv_write RPCs";
    EXPECT_EQ(stat_counter(*d, "mc_decode_kv_engine_bytes_total"), static_cast<uint64_t>(sent_bytes));
    EXPECT_GE(stat_counter(*d, "mc_decode_kv_notifications_total"), 6u);
    EXPECT_EQ(stat_counter(*d, "mc_decode_kv_notifications_rejected_total"), 0u);
  } else {
    EXPECT_TRUE(load->kv_segment.empty());
    EXPECT_GT(stat_counter(*d, "mc_decode_kv_write_calls_total"), 0u);
    EXPECT_EQ(stat_counter(*d, "mc_decode_kv_engine_bytes_total"), 0u);
  }
  EXPECT_EQ(decode.stop(), 0) << "mc-decode did not exit cleanly on SIGTERM";
  EXPECT_EQ(cached.stop(), 0);
}

TEST(InferE2E, SharedPrefixRefBackend) { shared_prefix_e2e({"--backend", "ref", "--model", "tiny"}); }

TEST(InferE2E, SharedPrefixRefBackendKvWriteFallback) {
  shared_prefix_e2e({"--backend", "ref", "--model", "tiny"}, KvPath::kRpc);
}

TEST(InferE2E, SharedPrefixSimBackendScaledKv) {
  shared_prefix_e2e(
      {"--backend", "sim", "--model", "llama3-70b", "--kv-bytes-per-token", "8192", "--time-scale", "100"});
}

// mc-decode refuses KV of another key namespace than the request's (DESIGN.md §4.1): a prefill started with
// another --seed (another model), or a job run with another adapter or salt than the reservation's, never
// becomes tokens; the client gets request_error naming both namespaces, and the reservation is freed.
TEST(InferE2E, DecodeRefusesKvOfAnotherNamespace) {
  const std::vector<std::string> common = {"--backend", "ref",         "--model", "tiny",        "--block-size",
                                           "16",        "--kv-blocks", "256",     "--log-level", "error"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Child decode(cmd(kBin + "mc-decode", with({"--seed", "5"})));
  Child same(cmd(kBin + "mc-prefill", with({"--seed", "5"})));
  Child other(cmd(kBin + "mc-prefill", with({"--seed", "6"})));
  const std::string dep = decode.wait_ready(), sep = same.wait_ready(), oep = other.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(sep.empty());
  ASSERT_FALSE(oep.empty());
  auto d = rpc::RpcClient::connect(dep).value();
  auto ps = rpc::RpcClient::connect(sep).value();
  auto po = rpc::RpcClient::connect(oep).value();
  ClientEndpoint client;
  const auto prompt = prompt_with_shared_prefix(16, 5, 1);
  const RequestKeyScope a1{"a", "1", ""}, a2{"a", "2", ""}, a1t{"a", "1", "t"};
  struct Case {
    std::string id;
    rpc::RpcClient* prefill;
    RequestKeyScope reserve, job;
    bool ok;
  };
  const std::vector<Case> cases = {{"seed", po.get(), {}, {}, false},  {"version", ps.get(), a1, a2, false},
                                   {"salt", ps.get(), a1, a1t, false}, {"no-adapter", ps.get(), a1, {}, false},
                                   {"equal", ps.get(), a1, a1, true},  {"base", ps.get(), {}, {}, true}};
  for (const Case& c : cases) {
    RequestRun run = run_request(*d, dep, *c.prefill, client, c.id, prompt, 4, -1, c.reserve, c.job);
    if (c.ok) {
      ASSERT_TRUE(run.job) << c.id << ": " << run.job.status().to_string();
      ASSERT_TRUE(run.stream.done.has_value()) << c.id;
      EXPECT_EQ(run.stream.tokens.size(), 4u) << c.id;
      continue;
    }
    ASSERT_FALSE(run.job) << c.id << ": decode accepted KV of another namespace";
    EXPECT_NE(run.job.status().message().find("key namespace"), std::string::npos)
        << c.id << ": " << run.job.status().message();
    ASSERT_TRUE(run.stream.error.has_value()) << c.id;
    EXPECT_EQ(run.stream.error->code, static_cast<uint16_t>(Code::kFailedPrecondition)) << c.id;
    EXPECT_NE(run.stream.error->message.find(c.reserve.describe()), std::string::npos) << run.stream.error->message;
    EXPECT_TRUE(run.stream.tokens.empty()) << c.id << ": tokens generated from foreign KV";
  }
  auto load = d->call(proto::WorkerLoadRequest{}, 2000);
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kv_blocks_committed, 0);
}

// A real store (master + one node): the second request hits the prefix in the store; the node is then killed
// with SIGKILL, so the master still lists its replicas when the third request's prefill asks for the prefix:
// the fetch fails during the request, the prefill recomputes, and the tokens are exactly those of a cache-less
// instance.
TEST(InferE2E, StoreHitThenNodeKilledRecomputes) {
  const int64_t block = 16;
  Child master(cmd(kBin + "mc-store", {"--log-level", "warn", "master", "--listen", "tcp://127.0.0.1:0"}));
  const std::string mep = master.wait_ready();
  ASSERT_FALSE(mep.empty());
  auto node = std::make_unique<Child>(
      cmd(kBin + "mc-store", {"--log-level", "warn", "serve", "--master", mep, "--dram-bytes", "16MiB", "--no-shm"}));
  ASSERT_FALSE(node->wait_ready().empty());
  const std::vector<std::string> common = {"--backend", "ref", "--block-size", "16",   "--kv-blocks", "256",
                                           "--seed",    "9",   "--log-level",  "error"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Child decode(cmd(kBin + "mc-decode", with({})));
  Child cached(cmd(kBin + "mc-prefill", with({"--store", mep})));
  Child uncached(cmd(kBin + "mc-prefill", with({"--store", "none"})));
  const std::string dep = decode.wait_ready(), cep = cached.wait_ready(), uep = uncached.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(cep.empty()) << "mc-prefill could not reach the store master";
  ASSERT_FALSE(uep.empty());
  auto d = rpc::RpcClient::connect(dep).value();
  auto pc = rpc::RpcClient::connect(cep).value();
  auto pu = rpc::RpcClient::connect(uep).value();
  ClientEndpoint client;
  for (int i = 0; i < 3; ++i) {
    if (i == 2) node->kill_hard();  // the node's replicas are gone, the master does not know yet
    const auto prompt = prompt_with_shared_prefix(block, 7 + i, static_cast<uint32_t>(i));
    const std::string id = "s" + std::to_string(i);
    RequestRun hit = run_request(*d, dep, *pc, client, id + "-store", prompt, 8);
    RequestRun ref = run_request(*d, dep, *pu, client, id + "-none", prompt, 8);
    ASSERT_TRUE(hit.job) << hit.job.status().to_string();
    ASSERT_TRUE(ref.job) << ref.job.status().to_string();
    ASSERT_TRUE(hit.stream.done.has_value()) << id;
    EXPECT_EQ(hit.stream.tokens, ref.stream.tokens) << id;
    if (i == 0) {
      EXPECT_GE(hit.job->ledger.stored_blocks, 2);
    }
    EXPECT_EQ(hit.job->ledger.hit_tokens, i == 1 ? 2 * block : 0) << id;
    if (i == 1) {
      EXPECT_EQ(hit.job->ledger.fetch_bytes, 2 * block * 1024);  // tiny: 1 KiB of KV per token
      // --no-shm: read through the node over tcp, but from this host: a local hit (the ledger splits by host).
      EXPECT_EQ(hit.job->ledger.hit_tokens_local, 2 * block);
      EXPECT_EQ(hit.job->ledger.hit_tokens_remote, 0);
    }
  }
}

// Workers register with the conductor and heartbeat their load (a stand-in conductor in the test). They print
// their ready line only once registered, so the stand-in serves on its own thread from the start.
// At least once, in order, whatever the client's pace (issue 20 item 4, field report of the uplink cut): a client
// that stops answering while a fast request streams thousands of tokens fills mc-decode's limit of calls in flight to
// it (4096) before the first call times out; those calls are refused locally (resource_exhausted) and must wait in
// the backlog like the ones that timed out, not be dropped. The client here blocks 3 s on its first token, then
// answers; it keeps each token index once (a message sent again after a timeout may arrive twice), and gets every
// token and the done.
TEST(InferE2E, AClientThatStallsGetsEveryTokenAndTheDone) {
  const std::vector<std::string> common = {
      "--backend", "sim",          "--model", "llama3-70b",  "--kv-bytes-per-token",
      "8192",      "--time-scale", "400",     "--log-level", "error"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Child decode(cmd(kBin + "mc-decode", with({})));
  Child prefill(cmd(kBin + "mc-prefill", with({})));
  const std::string dep = decode.wait_ready(), pep = prefill.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(pep.empty());
  auto d = rpc::RpcClient::connect(dep).value();
  auto p = rpc::RpcClient::connect(pep).value();

  struct Seen {
    std::mutex mu;
    int64_t tokens = 0, duplicates = 0;
    bool done = false, error = false, out_of_order = false;
  } seen;
  std::atomic<bool> stalled{false};
  rpc::ServerOptions o;
  o.service = "stalling-client";
  o.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto server = rpc::RpcServer::bind(o).value();
  server->handle<proto::TokenEvent>([&](const proto::TokenEvent& e, const auto&) -> Result<proto::ClientAck> {
    if (!stalled.exchange(true)) std::this_thread::sleep_for(std::chrono::seconds(3));  // the stall: once
    std::lock_guard lock(seen.mu);
    if (e.index < seen.tokens) {
      ++seen.duplicates;
    } else if (e.index == seen.tokens) {
      ++seen.tokens;
    } else {
      seen.out_of_order = true;
    }
    return proto::ClientAck{true};
  });
  server->handle<proto::RequestDone>([&](const proto::RequestDone&, const auto&) -> Result<proto::ClientAck> {
    std::lock_guard lock(seen.mu);
    seen.done = true;
    return proto::ClientAck{true};
  });
  server->handle<proto::RequestError>([&](const proto::RequestError&, const auto&) -> Result<proto::ClientAck> {
    std::lock_guard lock(seen.mu);
    seen.error = true;
    return proto::ClientAck{true};
  });
  std::thread serving([&] { (void)server->serve(); });
  struct Stop {
    rpc::RpcServer* s;
    std::thread* t;
    ~Stop() {
      s->stop();
      t->join();
    }
  } stop{server.get(), &serving};

  constexpr int64_t kOutput = 8000;
  const std::string client_ep = server->endpoints().front();
  const std::vector<uint32_t> prompt(64, 7);
  proto::DecodeReserveRequest rr{"flood", static_cast<int64_t>(prompt.size()), kOutput, client_ep, 10000};
  auto res = d->call(rr, 5000);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  proto::PrefillJobRequest job;
  job.request_id = "flood";
  job.tokens = prompt;
  job.output_length_tokens = kOutput;
  job.decode_endpoint = dep;
  job.reservation_id = res->reservation_id;
  job.decode_block_offsets_bytes = res->block_offsets_bytes;
  job.client_endpoint = client_ep;
  auto ran = p->call(job, 20000);
  ASSERT_TRUE(ran.is_ok()) << ran.status().to_string();
  const bool ended = testkit::wait_until(
      [&] {
        std::lock_guard lock(seen.mu);
        return seen.done || seen.error;
      },
      90'000, 20);
  std::lock_guard lock(seen.mu);
  EXPECT_TRUE(ended) << "no terminal event; " << seen.tokens << " tokens";
  EXPECT_TRUE(seen.done) << "error instead of done";
  EXPECT_FALSE(seen.out_of_order) << "a token index was skipped";
  EXPECT_EQ(seen.tokens, kOutput) << seen.duplicates << " duplicates";
}

TEST(InferE2E, WorkersRegisterAndHeartbeat) {
  rpc::ServerOptions o;
  o.service = "fake-conductor";
  o.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto conductor = rpc::RpcServer::bind(o).value();
  std::mutex mu;
  std::vector<proto::ConductorRegisterRequest> registered;
  std::vector<proto::ConductorHeartbeatRequest> beats;
  conductor->handle<proto::ConductorRegisterRequest>(
      [&](const proto::ConductorRegisterRequest& r, const auto&) -> Result<proto::ConductorRegisterReply> {
        std::lock_guard lock(mu);
        registered.push_back(r);
        return proto::ConductorRegisterReply{100, 1000, 16};
      });
  conductor->handle<proto::ConductorHeartbeatRequest>(
      [&](const proto::ConductorHeartbeatRequest& h, const auto&) -> Result<proto::ConductorHeartbeatReply> {
        std::lock_guard lock(mu);
        beats.push_back(h);
        return proto::ConductorHeartbeatReply{true};
      });
  ServingThread serving(*conductor);
  const std::string cep = conductor->endpoints().front();
  Child decode(cmd(kBin + "mc-decode",
                   {"--conductor", cep, "--instance-id", "decode-a", "--kv-blocks", "100", "--log-level", "error"}));
  Child prefill(cmd(kBin + "mc-prefill", {"--conductor", cep, "--instance-id", "prefill-a", "--log-level", "error"}));
  const std::string dep = decode.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(prefill.wait_ready().empty());
  EXPECT_TRUE(testkit::wait_until(
      [&] {
        std::lock_guard lock(mu);
        return registered.size() >= 2 && beats.size() >= 4;
      },
      10'000, 20));
  decode.stop();
  prefill.stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(registered.size(), 2u);
  std::map<std::string, proto::ConductorRegisterRequest> by_id;
  for (const auto& r : registered) by_id[r.instance_id] = r;
  ASSERT_TRUE(by_id.count("decode-a"));
  ASSERT_TRUE(by_id.count("prefill-a"));
  EXPECT_EQ(by_id["decode-a"].role, "decode");
  EXPECT_EQ(by_id["decode-a"].endpoint, dep);
  EXPECT_EQ(by_id["decode-a"].kv_capacity_tokens, 100 * 16);
  EXPECT_EQ(by_id["decode-a"].block_size_tokens, 16);
  EXPECT_EQ(by_id["prefill-a"].role, "prefill");
  EXPECT_GE(beats.size(), 4u);
  for (const auto& h : beats) EXPECT_TRUE(h.instance_id == "decode-a" || h.instance_id == "prefill-a");
}

// Issue 17 item 6: a worker whose --conductor cannot be reached at start retries for --conductor-wait-ms, then
// exits 1 naming the address and the reason, without a ready line (it used to start and warn forever); a
// malformed endpoint is a usage error (2).
TEST(InferE2E, UnreachableConductorAtStartExitsOne) {
  int port = 0;
  {  // a loopback port nobody listens on: bound, then closed
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  const std::string base = ::testing::TempDir() + "conductor_wait_" + std::to_string(::getpid());
  auto run = [&](const std::string& tool, const std::vector<std::string>& args, std::string* out, std::string* err) {
    testkit::ChildOptions o;
    o.stdin_path = "/dev/null";
    o.stdout_path = base + ".out";
    o.stderr_path = base + ".err";
    int rc = -1;
    {
      Child c(cmd(kBin + tool, args), o);
      rc = c.wait_exit(60'000);  // -1 when it is still running (the old behaviour): the child is then stopped
    }
    std::stringstream so, se;
    so << std::ifstream(base + ".out").rdbuf();
    se << std::ifstream(base + ".err").rdbuf();
    *out = so.str();
    *err = se.str();
    std::remove((base + ".out").c_str());
    std::remove((base + ".err").c_str());
    return rc;
  };
  for (const std::string tool : {"mc-decode", "mc-prefill"}) {
    std::string out, err;
    EXPECT_EQ(run(tool, {"--conductor", ep, "--conductor-wait-ms", "1500", "--log-level", "error"}, &out, &err), 1)
        << tool << ": " << err;
    EXPECT_NE(err.find(ep), std::string::npos) << tool << ": " << err;
    EXPECT_NE(err.find("could not register"), std::string::npos) << tool << ": " << err;
    EXPECT_EQ(out.find("ready "), std::string::npos) << tool << ": " << out;
    EXPECT_EQ(run(tool, {"--conductor", "bogus", "--log-level", "error"}, &out, &err), 2) << tool << ": " << err;
    EXPECT_NE(err.find("--conductor 'bogus'"), std::string::npos) << tool << ": " << err;
  }
}

// A Conductor that refuses the registration itself (here: another block size, as a newcomer met it by pasting the
// README) is not an unreachable one: the worker exits 1 at once naming the refusal and the remedy, instead of
// retrying for --conductor-wait-ms and blaming the Conductor's absence.
TEST(InferE2E, ARefusedRegistrationExitsAtOnceNamingTheReason) {
  rpc::ServerOptions o;
  o.service = "fake-conductor";
  o.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto conductor = rpc::RpcServer::bind(o).value();
  conductor->handle<proto::ConductorRegisterRequest>(
      [](const proto::ConductorRegisterRequest& r, const auto&) -> Result<proto::ConductorRegisterReply> {
        return Status(Code::kInvalidArgument, "register '" + r.instance_id + "': block size " +
                                                  std::to_string(r.block_size_tokens) +
                                                  " differs from the Conductor's 512");
      });
  ServingThread serving(*conductor);
  const std::string cep = conductor->endpoints().front();
  const std::string base = ::testing::TempDir() + "conductor_refused_" + std::to_string(::getpid());
  for (const std::string tool : {"mc-decode", "mc-prefill"}) {
    testkit::ChildOptions co;
    co.stdin_path = "/dev/null";
    co.stdout_path = base + ".out";
    co.stderr_path = base + ".err";
    int rc = -1;
    {
      // --conductor-wait-ms 600000: only the refusal can end the start within the 60 s waited here.
      Child c(cmd(kBin + tool, {"--conductor", cep, "--conductor-wait-ms", "600000", "--log-level", "error"}), co);
      rc = c.wait_exit(60'000);
    }
    std::stringstream se;
    se << std::ifstream(base + ".err").rdbuf();
    std::remove((base + ".out").c_str());
    std::remove((base + ".err").c_str());
    EXPECT_EQ(rc, 1) << tool << ": " << se.str();
    EXPECT_NE(se.str().find("refused the registration"), std::string::npos) << tool << ": " << se.str();
    EXPECT_NE(se.str().find("differs from the Conductor's 512"), std::string::npos) << tool << ": " << se.str();
    EXPECT_EQ(se.str().find("is mc-conductor running there"), std::string::npos) << tool << ": " << se.str();
  }
}

// mc-decode reports first_token / done / failed to the conductor (conductor.job_report); a stand-in conductor
// serving on its own thread records them.
TEST(InferE2E, DecodeSendsJobReportsToTheConductor) {
  rpc::ServerOptions o;
  o.service = "fake-conductor";
  o.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto conductor = rpc::RpcServer::bind(o).value();
  std::mutex mu;
  std::vector<proto::ConductorJobReportRequest> reports;
  conductor->handle<proto::ConductorRegisterRequest>(
      [](const proto::ConductorRegisterRequest&, const auto&) -> Result<proto::ConductorRegisterReply> {
        return proto::ConductorRegisterReply{1000, 10000, 16};
      });
  conductor->handle<proto::ConductorHeartbeatRequest>(
      [](const proto::ConductorHeartbeatRequest&, const auto&) -> Result<proto::ConductorHeartbeatReply> {
        return proto::ConductorHeartbeatReply{true};
      });
  conductor->handle<proto::ConductorJobReportRequest>(
      [&](const proto::ConductorJobReportRequest& r, const auto&) -> Result<proto::ConductorJobReportReply> {
        std::lock_guard lock(mu);
        reports.push_back(r);
        return proto::ConductorJobReportReply{true};
      });
  ServingThread serving(*conductor);
  const std::string cep = conductor->endpoints().front();
  Child decode(cmd(kBin + "mc-decode", {"--conductor", cep, "--instance-id", "decode-r", "--log-level", "error"}));
  Child prefill(cmd(kBin + "mc-prefill", {"--allow-fault-injection", "--log-level", "error"}));
  const std::string dep = decode.wait_ready(), pep = prefill.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(pep.empty());
  auto d = rpc::RpcClient::connect(dep).value();
  auto p = rpc::RpcClient::connect(pep).value();
  ClientEndpoint client;
  const std::vector<uint32_t> prompt(40, 3);
  RequestRun ok = run_request(*d, dep, *p, client, "rep-ok", prompt, 6);
  ASSERT_TRUE(ok.job) << ok.job.status().to_string();
  RequestRun bad = run_request(*d, dep, *p, client, "rep-bad", prompt, 6, /*fail_after_layers=*/1);
  ASSERT_FALSE(bad.job);
  std::map<std::string, proto::ConductorJobReportRequest> by_phase;
  testkit::wait_until(
      [&] {
        std::lock_guard lock(mu);
        for (const auto& r : reports) by_phase[r.request_id + "/" + r.phase] = r;
        return by_phase.size() >= 3;
      },
      10'000, 20);
  ASSERT_EQ(by_phase.size(), 3u);
  const auto& first = by_phase["rep-ok/first_token"];
  const auto& done = by_phase["rep-ok/done"];
  const auto& failed = by_phase["rep-bad/failed"];
  EXPECT_EQ(first.instance_id, "decode-r");
  EXPECT_EQ(first.event_unix_ns, ok.stream.times_ns.front()) << "first_token must carry the first token's time";
  EXPECT_EQ(done.output_tokens, 6);
  EXPECT_GE(done.event_unix_ns, ok.stream.times_ns.back());
  EXPECT_EQ(failed.instance_id, "decode-r");
  EXPECT_FALSE(failed.message.empty());
}

TEST(InferE2E, FieldReport14OverRpc) {
  std::vector<std::string> args = {"--backend",   "ref",  "--block-size", "16",
                                   "--kv-blocks", "4096", "--log-level",  "error"};
  Child decode(cmd(kBin + "mc-decode", args));
  args.push_back("--allow-fault-injection");
  Child prefill(cmd(kBin + "mc-prefill", args));
  const std::string dep = decode.wait_ready(), pep = prefill.wait_ready();
  ASSERT_FALSE(dep.empty());
  ASSERT_FALSE(pep.empty());
  auto d = rpc::RpcClient::connect(dep).value();
  auto p = rpc::RpcClient::connect(pep).value();
  ClientEndpoint client;
  const auto baseline = d->call(proto::WorkerLoadRequest{}, 2000).value();
  // Step 1: longer than the 32,768-token context: refused before any allocation.
  auto too_long = d->call(proto::DecodeReserveRequest{"long", 32777, 100, client.endpoint(), 0}, 2000);
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.status().code(), Code::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("input too long"), std::string::npos);
  // Step 2: zero, negative, 2^31.
  for (int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{1} << 31}) {
    EXPECT_EQ(d->call(proto::DecodeReserveRequest{"bad", bad, 10, client.endpoint(), 0}, 2000).status().code(),
              Code::kInvalidArgument);
  }
  // Step 3: prefill fails after a partial transfer.
  std::vector<uint32_t> prompt(70, 7);
  RequestRun failed = run_request(*d, dep, *p, client, "partial", prompt, 20, /*fail_after_layers=*/2);
  ASSERT_FALSE(failed.job);
  EXPECT_EQ(failed.job.status().code(), Code::kAborted);
  ASSERT_TRUE(failed.stream.error.has_value());
  EXPECT_FALSE(failed.stream.done.has_value());
  EXPECT_TRUE(failed.stream.tokens.empty());
  const auto after = d->call(proto::WorkerLoadRequest{}, 2000).value();
  EXPECT_EQ(after.kv_blocks_free, baseline.kv_blocks_free);
  EXPECT_EQ(after.kv_blocks_used, baseline.kv_blocks_used);
  // And the instance still serves a legal request.
  RequestRun ok = run_request(*d, dep, *p, client, "fine", prompt, 4);
  ASSERT_TRUE(ok.job) << ok.job.status().to_string();
  EXPECT_TRUE(ok.stream.done.has_value());
}

}  // namespace
}  // namespace mc
