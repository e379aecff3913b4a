// mc-conductor end to end on loopback (issue 6): the real daemon, fake workers speaking the worker and
// Conductor sections of protocol.hpp from this test, and a KV-event publisher standing in for the store.
// Requests are spread over 2 prefill instances; a repeated prefix goes where the cache is; an oversized
// request is rejected before any prefill starts; a refused reservation is a rejection; stat reports it.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <httplib.h>

#include "mc/common/block_key.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/worker.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc {
namespace MC_UNITY_ID {

constexpr uint32_t kBlock = 16;

using testkit::Child;

// A fake worker: an RpcServer on its own thread recording the jobs it gets. Prefill jobs are never
// answered (they stay queued at the Conductor, which makes placement deterministic); reservations are
// granted unless the request id starts with "refuse".
// An RpcServer on its own thread, polled until stop(); install() adds the handlers before it serves. A derived
// class calls stop() in its destructor, before the members its handlers use are gone.
class ServerThread {
 public:
  ServerThread() = default;
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;
  ~ServerThread() { stop(); }
  const std::string& endpoint() const { return endpoint_; }

 protected:
  void start(const std::string& service, std::function<void(rpc::RpcServer&)> install) {
    std::promise<std::string> ep;
    auto fut = ep.get_future();
    thread_ = std::thread([this, service, install = std::move(install), ep = std::move(ep)]() mutable {
      rpc::ServerOptions o;
      o.service = service;
      o.bind_endpoints = {"tcp://127.0.0.1:0"};
      auto server = rpc::RpcServer::bind(o);
      if (!server.is_ok()) {
        ep.set_value("");
        return;
      }
      install(**server);
      ep.set_value((*server)->endpoints().front());
      while (!stop_.load()) (void)(*server)->poll_once(10);
    });
    endpoint_ = fut.get();
  }
  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
  }

 private:
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::string endpoint_;
};

// A fake worker recording the jobs it gets. Prefill jobs are never answered (they stay queued at the Conductor,
// which makes placement deterministic); reservations are granted unless the request id starts with "refuse", or
// starts with "once" and was reserved before; a release always finds its reservation unconsumed.
class FakeWorker : public ServerThread {
 public:
  FakeWorker() {
    start("fake worker", [this](rpc::RpcServer& server) {
      server.handle<proto::DecodeReserveRequest>(
          [this](const proto::DecodeReserveRequest& r, const rpc::CallContext&) -> Result<proto::DecodeReserveReply> {
            std::lock_guard<std::mutex> lock(mu_);
            reserves_.push_back(r);
            const bool again = std::count_if(reserves_.begin(), reserves_.end(),
                                             [&](const auto& x) { return x.request_id == r.request_id; }) > 1;
            if (r.request_id.rfind("refuse", 0) == 0 || (again && r.request_id.rfind("once", 0) == 0)) {
              return error(Code::kRejected, "decode-0: KV full (test)");
            }
            proto::DecodeReserveReply rep;
            rep.reservation_id = reserves_.size();
            rep.block_offsets_bytes = {0, 4096};
            return rep;
          });
      server.handle<proto::DecodeReleaseRequest>(
          [](const proto::DecodeReleaseRequest&, const rpc::CallContext&) -> Result<proto::DecodeReleaseReply> {
            return proto::DecodeReleaseReply{true, 0};
          });
      server.handle<proto::PrefillJobRequest>(
          [this](const proto::PrefillJobRequest& j, const rpc::CallContext& ctx) -> Result<proto::PrefillJobReply> {
            std::lock_guard<std::mutex> lock(mu_);
            jobs_.push_back(j);
            ctx.defer();
            return proto::PrefillJobReply{};
          });
    });
  }
  ~FakeWorker() { stop(); }
  // Closes the server socket (as if the process died); the recorded calls stay readable.
  void shut() { stop(); }
  std::vector<proto::PrefillJobRequest> jobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_;
  }
  std::vector<proto::DecodeReserveRequest> reserves() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserves_;
  }

 private:
  std::mutex mu_;
  std::vector<proto::PrefillJobRequest> jobs_;
  std::vector<proto::DecodeReserveRequest> reserves_;
};

std::vector<uint32_t> prompt(uint32_t base, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<uint32_t>(i * 7 % 1000);
  return t;
}

// The endpoint in a started mc-conductor's ready line ("" when it did not start).
std::string conductor_endpoint(Child& conductor) {
  const std::string ready = conductor.read_line(10'000);
  const bool ok = ready.rfind("ready mc-conductor tcp://", 0) == 0;
  EXPECT_TRUE(ok) << "ready line: '" << ready << "'";
  return ok ? ready.substr(19, ready.find(' ', 19) - 19) : "";
}

// Registers P0 (host h0, no cache of its own) and P1 (host h1, its own cache "gpu-P1") as prefill instances; the
// workers do not tell their key namespace (empty digest, chain seed 0).
bool register_prefill_pair(rpc::RpcClient& c, FakeWorker& p0, FakeWorker& p1) {
  return c.call(proto::ConductorRegisterRequest{"P0", "prefill", "h0", p0.endpoint(), "", 0, kBlock, "", 0}).is_ok() &&
         c.call(proto::ConductorRegisterRequest{"P1", "prefill", "h1", p1.endpoint(), "gpu-P1", 0, kBlock, "", 0})
             .is_ok();
}

// Submits a 4-token request for TOKENS (the reply; a failed call fails the test and gives an empty reply). The
// client endpoint is a port nobody listens on: the fake workers never answer, so nothing is sent there.
proto::ConductorSubmitReply submit4(rpc::RpcClient& c, const std::string& id, const std::vector<uint32_t>& tokens,
                                    double slo_ttft_ms = 0) {
  proto::ConductorSubmitRequest sr;
  sr.request_id = id;
  sr.tokens = tokens;
  sr.input_tokens = static_cast<int64_t>(tokens.size());
  sr.output_tokens = 4;
  sr.slo_ttft_ms = slo_ttft_ms;
  sr.client_endpoint = "tcp://127.0.0.1:9";
  auto r = c.call(sr, 5000);
  EXPECT_TRUE(r.is_ok()) << id << ": " << r.status().to_string();
  return r.is_ok() ? r.value() : proto::ConductorSubmitReply{};
}

// mc-conductor serve on an ephemeral loopback port, warnings only, kBlock-token blocks of 1,024 bytes a token, then
// EXTRA.
std::vector<std::string> conductor_argv(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {MC_BINARY_DIR "/bin/mc-conductor",
                                   "--log-level",
                                   "warn",
                                   "serve",
                                   "--listen",
                                   "tcp://127.0.0.1:0",
                                   "--block-size",
                                   std::to_string(kBlock),
                                   "--kv-bytes-per-token",
                                   "1024"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Registers D0 (host h2) as a decode instance of CAPACITY KV tokens.
bool register_decode(rpc::RpcClient& c, FakeWorker& d0, int64_t capacity_tokens) {
  return c
      .call(proto::ConductorRegisterRequest{"D0", "decode", "h2", d0.endpoint(), "", capacity_tokens, kBlock, "", 0})
      .is_ok();
}

// An mc-conductor started with ARGV, a client connected to it, and fake workers registered: P0 and P1
// (register_prefill_pair) and D0 (register_decode with the given capacity). ready() does the connecting and
// registering and says whether it all worked (failures are reported as test failures).
struct Rig {
  explicit Rig(const std::vector<std::string>& argv) : conductor(argv) {}
  bool ready(int64_t decode_capacity_tokens) {
    endpoint = conductor_endpoint(conductor);
    if (endpoint.empty()) return false;
    auto c = rpc::RpcClient::connect(endpoint);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    if (!c.is_ok()) return false;
    client = std::move(c).value();
    return register_prefill_pair(*client, p0, p1) && register_decode(*client, d0, decode_capacity_tokens);
  }
  Child conductor;
  FakeWorker p0, p1, d0;
  std::unique_ptr<rpc::RpcClient> client;
  std::string endpoint;  // the Conductor's, once ready()
};

nlohmann::json status(rpc::RpcClient& c) {
  auto r = c.call(proto::ConductorStatusRequest{true}, 2000);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? nlohmann::json::parse(r->status_json) : nlohmann::json{};
}

TEST(ConductorE2E, SpreadsRequestsFollowsTheCacheAndRejectsEarly) {
  auto pub = rpc::EventPublisher::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(pub.is_ok()) << pub.status().to_string();
  const std::string decisions = ::testing::TempDir() + "/conductor_e2e_decisions.jsonl";
  std::remove(decisions.c_str());
  Child conductor({MC_BINARY_DIR "/bin/mc-conductor", "--log-level", "warn", "serve", "--listen", "tcp://127.0.0.1:0",
                   "--kv-events", (*pub)->endpoint(), "--block-size", std::to_string(kBlock), "--kv-bytes-per-token",
                   "1024", "--slo-ttft-ms", "60000", "--decisions", decisions});
  const std::string endpoint = conductor_endpoint(conductor);
  ASSERT_FALSE(endpoint.empty());

  FakeWorker p0, p1, d0;
  auto client = rpc::RpcClient::connect(endpoint);
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  rpc::RpcClient& c = **client;
  ASSERT_TRUE(register_prefill_pair(c, p0, p1));
  auto reg = c.call(proto::ConductorRegisterRequest{"D0", "decode", "h2", d0.endpoint(), "", 100'000, kBlock, "", 0});
  ASSERT_TRUE(reg.is_ok()) << reg.status().to_string();
  EXPECT_EQ(reg->block_size_tokens, kBlock);
  // A worker with another block size is refused, naming both sizes.
  auto bad = c.call(proto::ConductorRegisterRequest{"PX", "prefill", "h9", p0.endpoint(), "", 0, 512, "", 0});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);

  // P1's own cache holds the first 3 blocks of prompt X: publish until the index has them (a
  // subscriber joining late misses the first messages; the event-id gap is logged and tolerated).
  KeyNamespace ns;
  ns.block_size = kBlock;
  const std::vector<uint32_t> x = prompt(1, 4 * kBlock + 5);
  const std::vector<uint64_t> keys = seq_hashes(x, ns);
  ASSERT_EQ(keys.size(), 4u);
  proto::KvEvent e;
  e.type = proto::kKvEventStored;
  e.seq_hashes = {keys[0], keys[1], keys[2]};
  e.backend_id = "gpu-P1";
  e.medium = "gpu";
  Status published;
  const bool indexed = testkit::wait_until(
      [&] {
        published = (*pub)->publish(e);
        return !published.is_ok() || status(c)["index"]["blocks"] == 3;
      },
      4000, 20);
  ASSERT_TRUE(published.is_ok()) << published.to_string();
  ASSERT_TRUE(indexed) << "the Conductor never indexed the published blocks";

  auto submit = [&](const std::string& id, const std::vector<uint32_t>& tokens, int64_t output) {
    proto::ConductorSubmitRequest s;
    s.request_id = id;
    s.tokens = tokens;
    s.input_tokens = static_cast<int64_t>(tokens.size());
    s.output_tokens = output;
    s.client_endpoint = "tcp://127.0.0.1:9";
    auto r = c.call(s, 5000);
    EXPECT_TRUE(r.is_ok()) << id << ": " << r.status().to_string();
    return r.is_ok() ? r.value() : proto::ConductorSubmitReply{};
  };

  // 1. The repeated prefix goes where the cache is, and the job says how much to fetch.
  proto::ConductorSubmitReply rx = submit("x", x, 8);
  ASSERT_TRUE(rx.accepted) << rx.reason;
  EXPECT_EQ(rx.prefill_id, "P1");
  EXPECT_EQ(rx.decode_id, "D0");
  EXPECT_EQ(rx.hit_tokens, 3 * kBlock);

  // 2. Long fresh prompts are spread over both prefill instances (queued work counts).
  std::vector<std::string> placed;
  for (int i = 0; i < 4; ++i) {
    proto::ConductorSubmitReply r = submit("s" + std::to_string(i), prompt(5000 + 10 * i, 8192), 4);
    ASSERT_TRUE(r.accepted) << r.reason;
    placed.push_back(r.prefill_id);
  }
  EXPECT_NE(std::count(placed.begin(), placed.end(), "P0"), 0) << "all on P1";
  EXPECT_NE(std::count(placed.begin(), placed.end(), "P1"), 0) << "all on P0";

  // 3. Oversized: 100,000 KV tokens on the only decode instance; rejected before any work.
  proto::ConductorSubmitReply big = submit("big", prompt(9, 64), 200'000);
  EXPECT_FALSE(big.accepted);
  EXPECT_EQ(big.reject_reason, "kv_capacity");
  EXPECT_NE(big.reason.find("100000"), std::string::npos) << big.reason;

  // 4. A refused reservation is a rejection too, and no prefill job is sent for it.
  proto::ConductorSubmitReply ref = submit("refuse-1", prompt(77, 40), 4);
  EXPECT_FALSE(ref.accepted);
  EXPECT_EQ(ref.reject_reason, "decode_refused");
  EXPECT_NE(ref.reason.find("KV full"), std::string::npos) << ref.reason;

  // 5. Bad input is an error reply naming the request, never a crash.
  proto::ConductorSubmitRequest empty;
  empty.request_id = "empty";
  empty.output_tokens = 1;
  auto er = c.call(empty, 2000);
  EXPECT_EQ(er.status().code(), Code::kInvalidArgument);
  EXPECT_NE(er.status().message().find("empty"), std::string::npos);
  // Keys that are not its tokens' (here X's cached keys sent with another prompt, claiming P1's prefix) are refused
  // before any placement, naming the first that differs.
  proto::ConductorSubmitRequest forged;
  forged.request_id = "forged";
  forged.tokens = prompt(4242, 4 * kBlock);
  forged.input_tokens = static_cast<int64_t>(forged.tokens.size());
  forged.output_tokens = 4;
  forged.block_hashes = {keys[0], keys[1], keys[2]};
  forged.client_endpoint = "tcp://127.0.0.1:9";
  auto fr = c.call(forged, 2000);
  EXPECT_EQ(fr.status().code(), Code::kInvalidArgument) << fr.status().to_string();
  EXPECT_NE(fr.status().message().find("block_hashes[0]"), std::string::npos) << fr.status().message();
  // Every key is checked, not the first alone: X's own tokens with its first key right and its second wrong.
  forged.request_id = "forged-2";
  forged.tokens = x;
  forged.input_tokens = static_cast<int64_t>(x.size());
  forged.block_hashes = {keys[0], keys[2]};
  fr = c.call(forged, 2000);
  EXPECT_EQ(fr.status().code(), Code::kInvalidArgument) << fr.status().to_string();
  EXPECT_NE(fr.status().message().find("block_hashes[1]"), std::string::npos) << fr.status().message();
  // Keys without tokens are refused too: there is nothing to check them against, and no prompt to prefill.
  forged.request_id = "forged-3";
  forged.tokens.clear();
  fr = c.call(forged, 2000);
  EXPECT_EQ(fr.status().code(), Code::kInvalidArgument) << fr.status().to_string();
  EXPECT_NE(fr.status().message().find("no tokens"), std::string::npos) << fr.status().message();

  // The workers saw exactly the accepted requests.
  auto wait_jobs = [&](FakeWorker& w, size_t n) {
    testkit::wait_until([&] { return w.jobs().size() >= n; }, 2000);
    return w.jobs();
  };
  std::vector<proto::PrefillJobRequest> j1 = wait_jobs(p1, 1);
  ASSERT_FALSE(j1.empty());
  EXPECT_EQ(j1[0].request_id, "x");
  EXPECT_EQ(j1[0].fetch_prefix_blocks, 3);
  EXPECT_EQ(j1[0].tokens, x);
  EXPECT_EQ(j1[0].decode_endpoint, d0.endpoint());
  EXPECT_EQ(j1[0].client_endpoint, "tcp://127.0.0.1:9");
  EXPECT_EQ(j1[0].reservation_id, 1u);
  // prefill_job is sent right after the submit is answered: wait for all five.
  size_t jobs_total = 0;
  testkit::wait_until([&] { return (jobs_total = p0.jobs().size() + p1.jobs().size()) >= 5; }, 3000);
  EXPECT_EQ(jobs_total, 5u);
  for (auto* w : {&p0, &p1}) {
    for (const auto& j : w->jobs()) {
      EXPECT_NE(j.request_id, "big");
      EXPECT_NE(j.request_id, "refuse-1");
    }
  }
  std::vector<proto::DecodeReserveRequest> res = d0.reserves();
  EXPECT_EQ(res.size(), 6u);  // 5 accepted + the refused one; none for "big"
  for (const auto& r : res) EXPECT_NE(r.request_id, "big");

  // stat: the real binary, JSON.
  {
    std::string cmd = std::string(MC_BINARY_DIR "/bin/mc-conductor stat --json --endpoint ") + endpoint;
    FILE* f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
    EXPECT_EQ(pclose(f), 0);
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_EQ(j["instances"].size(), 3u);
    EXPECT_EQ(j["decisions"]["total"], 7);
    EXPECT_EQ(j["decisions"]["accepted"], 6);  // the refused reservation was accepted by the policy
    EXPECT_EQ(j["decisions"]["rejected"]["kv_capacity"], 1);
    EXPECT_EQ(j["index"]["blocks"], 3);
    for (const auto& i : j["instances"]) EXPECT_EQ(i["state"], "unknown");  // no load report yet (#12)
  }
  EXPECT_EQ(conductor.stop(), 0);

  // Every decision is in the log with its inputs.
  std::ifstream log(decisions);
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_TRUE(j["request"].contains("block_hashes"));
    EXPECT_TRUE(j["decision"].contains("predicted_ttft_ms"));
    ++lines;
  }
  EXPECT_EQ(lines, 7);
  std::remove(decisions.c_str());
}

// Pending prefixes through the real Conductor (DESIGN.md §10 "Pending prefixes"): a session's next turn arrives while
// its previous turn still waits at its prefill instance (the fake workers never answer). With pending prefixes (the
// kvcache default) it goes behind that turn and is told to read every block the turn computes; with --pending-prefix
// off, only what the pool holds. The flags are checked, and stat shows the placement settings and the count.
TEST(ConductorE2E, ASessionsNextTurnReusesThePrefixItsPreviousTurnIsComputing) {
  for (const std::string mode : {"default", "off"}) {
    SCOPED_TRACE(mode);
    auto pub = rpc::EventPublisher::bind("tcp://127.0.0.1:0");
    ASSERT_TRUE(pub.is_ok()) << pub.status().to_string();
    std::vector<std::string> argv = conductor_argv({"--kv-events", (*pub)->endpoint(), "--slo-ttft-ms", "60000"});
    if (mode == "off") argv.insert(argv.end(), {"--pending-prefix", "off"});
    Rig rig(argv);
    ASSERT_TRUE(rig.ready(1'000'000));
    Child& conductor = rig.conductor;
    FakeWorker& p1 = rig.p1;
    rpc::RpcClient& c = *rig.client;
    // P1's own cache holds the first 2 blocks of the session's prompt.
    KeyNamespace ns;
    ns.block_size = kBlock;
    const std::vector<uint32_t> turn1 = prompt(1, 12 * kBlock + 5);
    std::vector<uint32_t> turn2 = turn1;
    for (uint32_t t : prompt(900, 20)) turn2.push_back(t);
    const std::vector<uint64_t> keys = seq_hashes(turn1, ns);
    proto::KvEvent e;
    e.type = proto::kKvEventStored;
    e.seq_hashes = {keys[0], keys[1]};
    e.backend_id = "gpu-P1";
    e.medium = "gpu";
    Status published;
    ASSERT_TRUE(testkit::wait_until(
        [&] {
          published = (*pub)->publish(e);
          return !published.is_ok() || status(c)["index"]["blocks"] == 2;
        },
        4000, 20))
        << "the Conductor never indexed the published blocks: " << published.to_string();
    auto submit = [&](const std::string& id, const std::vector<uint32_t>& tokens) { return submit4(c, id, tokens); };
    // A long fresh prompt keeps P0 busy; the session's first turn goes to P1 (its 2 blocks) and waits there.
    ASSERT_EQ(submit("fresh", prompt(5000, 4096)).prefill_id, "P0");
    proto::ConductorSubmitReply r1 = submit("turn1", turn1);
    ASSERT_TRUE(r1.accepted) << r1.reason;
    ASSERT_EQ(r1.prefill_id, "P1");
    EXPECT_EQ(r1.hit_tokens, 2 * kBlock);
    proto::ConductorSubmitReply r2 = submit("turn2", turn2);
    ASSERT_TRUE(r2.accepted) << r2.reason;
    EXPECT_EQ(r2.prefill_id, "P1");
    const int64_t want_blocks = mode == "off" ? 2 : 12;
    EXPECT_EQ(r2.hit_tokens, want_blocks * kBlock) << r2.reason;
    EXPECT_EQ(r2.reason.find("computed first by a request queued there") != std::string::npos, mode != "off")
        << r2.reason;
    ASSERT_TRUE(testkit::wait_until([&] { return p1.jobs().size() >= 2; }, 3000));
    EXPECT_EQ(p1.jobs()[1].request_id, "turn2");
    EXPECT_EQ(p1.jobs()[1].fetch_prefix_blocks, want_blocks);
    nlohmann::json st = status(c);
    EXPECT_EQ(st["placement"]["pending_prefix"], mode != "off") << st.dump();
    EXPECT_EQ(st["placement"]["load_weight"], 1.0) << st.dump();
    EXPECT_EQ(st["decisions"]["fetch_pending"], mode == "off" ? 0 : 1) << st.dump();
    // A request id is bounded (it is copied into every ledger and job): 1,025 bytes is refused, naming the bound.
    proto::ConductorSubmitRequest long_id;
    long_id.request_id = std::string(1025, 'x');
    long_id.tokens = prompt(7, 40);
    long_id.input_tokens = 40;
    long_id.output_tokens = 1;
    auto refused = c.call(long_id, 2000);
    EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().to_string();
    EXPECT_NE(refused.status().message().find("at most 1024"), std::string::npos) << refused.status().to_string();
    EXPECT_EQ(conductor.stop(), 0);
  }
  // Bad values are usage errors, naming the flag.
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--pending-prefix", "maybe"},
                                              std::vector<std::string>{"--placement-load-weight", "5000"}}) {
    std::vector<std::string> argv = {MC_BINARY_DIR "/bin/mc-conductor", "serve", "--listen", "tcp://127.0.0.1:0"};
    argv.insert(argv.end(), bad.begin(), bad.end());
    testkit::RunResult r = testkit::run(argv, 10'000);
    EXPECT_EQ(r.exit_code, 2) << bad[0];
  }
}

// SLO headroom through the real Conductor (DESIGN.md §10 "SLO headroom"): by default (kvcache, headroom 0.2) a
// request predicted past 0.8 x its TTFT SLO after waiting more than 0.2 x the SLO is rejected although it would
// meet the SLO itself, naming the target; with --slo-headroom 0 (the paper's rule) the same request is accepted.
// A long prompt whose own prefill is past the target is still admitted on an idle instance (no wait). The fake
// workers never answer, so every queue is exactly what the Conductor booked; FCFS queues keep the overtaking
// estimate out. Each SLO is set per request from a probe the Conductor rejected (a 1 ms SLO), which books nothing.
TEST(ConductorE2E, SloHeadroomTurnsAwayALongWaitButNotALongPrefill) {
  for (const std::string headroom : {"default", "0"}) {
    SCOPED_TRACE(headroom);
    std::vector<std::string> argv = conductor_argv({"--queue", "fcfs"});
    if (headroom != "default") argv.insert(argv.end(), {"--slo-headroom", headroom});
    Rig rig(argv);
    ASSERT_TRUE(rig.ready(10'000'000));
    Child& conductor = rig.conductor;
    rpc::RpcClient& c = *rig.client;
    auto submit = [&](const std::string& id, const std::vector<uint32_t>& tokens, double slo_ttft_ms) {
      return submit4(c, id, tokens, slo_ttft_ms);
    };
    // A long prompt on an idle instance: its predicted TTFT is its own prefill, past the target of an SLO 1/0.9 of
    // it, and it waits for nothing: admitted either way.
    // 16 K tokens: seconds of predicted prefill, so the milliseconds between a probe and its request do not matter.
    const std::vector<uint32_t> long_prompt = prompt(7000, 16'384);
    proto::ConductorSubmitReply probe = submit("long-probe", long_prompt, 1);
    ASSERT_FALSE(probe.accepted);
    ASSERT_GT(probe.predicted_ttft_ms, 1'000) << probe.reason;
    proto::ConductorSubmitReply lone = submit("long", long_prompt, probe.predicted_ttft_ms / 0.9);
    EXPECT_TRUE(lone.accepted) << lone.reason;
    // The other instance gets the same work: both queues now hold about one long prefill.
    EXPECT_TRUE(submit("long-2", prompt(9000, 16'384), 600'000).accepted);
    // A short prompt now waits a long prefill: predicted TTFT T, SLO T / 0.9 (target 0.8 x SLO < T, and its wait,
    // about T, more than 0.2 x SLO).
    const std::vector<uint32_t> short_prompt = prompt(11000, 64);
    probe = submit("short-probe", short_prompt, 1);
    ASSERT_FALSE(probe.accepted);
    ASSERT_GT(probe.predicted_ttft_ms, 1'000) << probe.reason;
    const double slo_ms = probe.predicted_ttft_ms / 0.9;
    proto::ConductorSubmitReply r = submit("short", short_prompt, slo_ms);
    if (headroom == "default") {
      EXPECT_FALSE(r.accepted) << r.reason;
      EXPECT_EQ(r.reject_reason, "ttft_slo");
      EXPECT_NE(r.reason.find("exceeds the target"), std::string::npos) << r.reason;
      EXPECT_NE(r.reason.find("20 % headroom"), std::string::npos) << r.reason;
    } else {
      EXPECT_TRUE(r.accepted) << r.reason;
    }
    nlohmann::json st = status(c);
    EXPECT_EQ(st["placement"]["slo_headroom"], headroom == "default" ? 0.2 : 0.0) << st.dump();
    EXPECT_EQ(conductor.stop(), 0);
  }
  // Out of [0, 0.9] is a usage error.
  for (const char* bad : {"-0.1", "0.95", "x"}) {
    testkit::RunResult r = testkit::run(
        {MC_BINARY_DIR "/bin/mc-conductor", "serve", "--listen", "tcp://127.0.0.1:0", "--slo-headroom", bad}, 10'000);
    EXPECT_EQ(r.exit_code, 2) << bad;
  }
}

// Load shedding through the real Conductor and mc-gateway (DESIGN.md §10 step 5a, the kvcache default): in a burst
// (64 short requests queued on the two prefill instances: the fake workers never answer, so the queues are exactly
// what the Conductor booked) a long prompt whose own TTFT is admissible (it asks for a 10-minute SLO) is turned away
// because its prefill would hold up the requests queued after it: the load ratio (mean queue / mean service, about
// 32 here) times its service (seconds) is more than 0.5 x the Conductor's 10 s TTFT SLO. A client of mc-gateway reads
// a 429 with Retry-After and code load_shed, and nothing of the placement; a short prompt in the same burst is still
// admitted; stat and the decision log count the shed. With --shed-limit 0 the same long prompt is admitted.
TEST(ConductorE2E, LoadSheddingTurnsAwayALongPromptInABurstAndTheGatewayAnswers429) {
  const std::string gateway_bin = MC_BINARY_DIR "/bin/mc-gateway";
  if (::access(gateway_bin.c_str(), X_OK) != 0) GTEST_SKIP() << "mc-gateway is not built";
  for (const std::string limit : {"0.5", "0"}) {
    SCOPED_TRACE("--shed-limit " + limit);
    const std::string decisions =
        ::testing::TempDir() + "/conductor_e2e_shed_decisions_" + std::to_string(::getpid()) + ".jsonl";
    std::remove(decisions.c_str());
    // The fake workers send no heartbeats: a long timeout keeps them registered while the gateway starts.
    Rig rig(conductor_argv({"--slo-ttft-ms", "10000", "--shed-limit", limit, "--decisions", decisions,
                            "--heartbeat-timeout-ms", "60000"}));
    ASSERT_TRUE(rig.ready(100'000'000));
    rpc::RpcClient& c = *rig.client;
    // The burst: 64 short prompts, every one admitted (shedding waits for 64 jobs of mean service).
    for (int i = 0; i < 64; ++i) {
      proto::ConductorSubmitReply r = submit4(c, "burst-" + std::to_string(i), prompt(20'000 + 100 * i, 64));
      ASSERT_TRUE(r.accepted) << r.reason;
    }
    // The long prompt through mc-gateway (its byte-level tokenizer: 16 K characters, 16 K tokens).
    Child gateway({gateway_bin, "--log-level", "warn", "--listen", "127.0.0.1:0", "--conductor", rig.endpoint,
                   "--submit-timeout-ms", "5000", "--request-timeout-ms", "1500", "--drain-timeout-s", "1"});
    const std::string ready = gateway.read_line(10'000);
    ASSERT_EQ(ready.rfind("ready mc-gateway http://127.0.0.1:", 0), 0u) << ready;
    // "ready mc-gateway http://127.0.0.1:PORT <token-event endpoint>"
    const std::string prefix = "ready mc-gateway http://127.0.0.1:";
    const int port = std::stoi(ready.substr(prefix.size(), ready.find(' ', prefix.size()) - prefix.size()));
    httplib::Client http("127.0.0.1", port);
    http.set_read_timeout(30, 0);
    const nlohmann::json body = {{"model", "llama3-70b"},
                                 {"prompt", std::string(16'384, 'q')},
                                 {"max_tokens", 1},
                                 {"mc", {{"slo_ttft_ms", 600'000}}}};
    auto res = http.Post("/v1/completions", body.dump(), "application/json");
    if (limit == "0") {
      // Admitted: the gateway waits for its first token (the fake prefill never answers) until its request timeout.
      ASSERT_TRUE(res) << httplib::to_string(res.error());
      EXPECT_EQ(res->status, 504) << res->body;
    } else {
      ASSERT_TRUE(res) << httplib::to_string(res.error());
      EXPECT_EQ(res->status, 429) << res->body;
      EXPECT_TRUE(res->has_header("Retry-After")) << res->body;
      const nlohmann::json err = nlohmann::json::parse(res->body, nullptr, false);
      ASSERT_FALSE(err.is_discarded()) << res->body;
      EXPECT_EQ(err["error"]["code"], "load_shed") << res->body;
      EXPECT_EQ(err["error"]["type"], "rate_limit_error") << res->body;
      const std::string message = err["error"]["message"].get<std::string>();
      for (const char* placement : {"P0", "P1", "h0", "h1", "gpu-P1"}) {
        EXPECT_EQ(message.find(placement), std::string::npos) << placement << " in " << message;
      }
      // A short prompt in the same burst is still admitted: it adds little waiting.
      proto::ConductorSubmitReply short_one = submit4(c, "short-after", prompt(90'000, 64));
      EXPECT_TRUE(short_one.accepted) << short_one.reason;
    }
    EXPECT_EQ(gateway.stop(), 0);
    nlohmann::json st = status(c);
    EXPECT_EQ(st["decisions"]["rejected"].value("load_shed", 0), limit == "0" ? 0 : 1) << st.dump();
    EXPECT_EQ(rig.conductor.stop(), 0);
    // The decision log has the shed with the ratio and the limit it was judged by.
    std::ifstream log(decisions);
    std::string line;
    int shed = 0;
    while (std::getline(log, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << line;
      const nlohmann::json& reason = j["decision"]["reject_reason"];
      if (!reason.is_string() || reason != "load_shed") continue;
      ++shed;
      EXPECT_GT(j["decision"].value("load_ratio", 0.0), 1.0) << line;
      EXPECT_EQ(j["decision"].value("shed_limit", 0.0), 0.5) << line;
    }
    EXPECT_EQ(shed, limit == "0" ? 0 : 1);
    std::remove(decisions.c_str());
  }
}

// The registry is bounded (--max-instances): a new id beyond it is refused and counted, a known id may register
// again from its endpoint but not from another while it is alive. A worker whose process goes away (here: its server
// socket closes) is lost at once from its watched connection (faults.connection_lost), which frees its place.
// A client endpoint that leaves the first request_error of each request unanswered (busy, or cut off for a moment)
// and acknowledges the later ones; it records every one it receives.
class StallingClient : public ServerThread {
 public:
  StallingClient() {
    start("stalling client", [this](rpc::RpcServer& server) {
      server.handle<proto::RequestError>(
          [this](const proto::RequestError& e, const rpc::CallContext& ctx) -> Result<proto::ClientAck> {
            std::lock_guard<std::mutex> lock(mu_);
            const bool first = std::count(errors_.begin(), errors_.end(), e.request_id) == 0;
            errors_.push_back(e.request_id);
            if (first) ctx.defer();  // never answered
            return proto::ClientAck{};
          });
    });
  }
  ~StallingClient() { stop(); }
  size_t errors_of(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(std::count(errors_.begin(), errors_.end(), id));
  }

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
};

// Every accepted request ends with a terminal event: a request the Conductor fails (here its instances went silent
// and no other pair could take it) is told to its client at least once. The client leaves the first request_error
// unanswered; the Conductor sends it again a second later, and the client has it.
TEST(ConductorE2E, AFailedRequestsErrorReachesAClientThatMissedIt) {
  Child conductor({MC_BINARY_DIR "/bin/mc-conductor", "--log-level", "warn", "serve", "--listen", "tcp://127.0.0.1:0",
                   "--block-size", std::to_string(kBlock), "--kv-bytes-per-token", "1024", "--slo-ttft-ms", "60000",
                   "--heartbeat-timeout-ms", "1000", "--reserve-timeout-ms", "500"});
  const std::string ready = conductor.read_line(10'000);
  ASSERT_EQ(ready.rfind("ready mc-conductor tcp://", 0), 0u) << "ready line: '" << ready << "'";
  const std::string endpoint = ready.substr(19, ready.find(' ', 19) - 19);
  FakeWorker p0, d0;
  StallingClient client;
  auto c = rpc::RpcClient::connect(endpoint);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_TRUE(
      (*c)->call(proto::ConductorRegisterRequest{"P0", "prefill", "h0", p0.endpoint(), "", 0, kBlock, "", 0}).is_ok());
  ASSERT_TRUE(
      (*c)->call(proto::ConductorRegisterRequest{"D0", "decode", "h1", d0.endpoint(), "", 100'000, kBlock, "", 0})
          .is_ok());
  proto::ConductorSubmitRequest s;
  s.request_id = "r1";
  s.tokens = prompt(3, 40);
  s.input_tokens = 40;
  s.output_tokens = 4;
  s.client_endpoint = client.endpoint();
  auto r = (*c)->call(s, 5000);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(r->accepted) << r->reason;
  // P0 and D0 never heartbeat: removed after 1 s, r1 cannot go anywhere else and fails; its first request_error
  // times out unanswered (500 ms), the second is acknowledged.
  EXPECT_TRUE(testkit::wait_until([&] { return client.errors_of("r1") >= 2; }, 15'000, 20))
      << client.errors_of("r1") << " request_error(s) received";
}

// A request re-dispatched after its prefill instance died, whose new decode reservation is then refused, still ends
// with a terminal event: its submit was answered (accepted) long before, so the client hears a request_error (before
// the fix the refusal went to the submit's reply, already sent, and the request was left without an owner: the
// fault matrix's uplink-cut row lost requests that way).
TEST(ConductorE2E, ARedispatchWhoseReservationIsRefusedTellsItsClient) {
  Rig rig(
      conductor_argv({"--slo-ttft-ms", "60000", "--heartbeat-timeout-ms", "60000", "--reserve-timeout-ms", "2000"}));
  ASSERT_TRUE(rig.ready(100'000));
  StallingClient client;
  proto::ConductorSubmitRequest s;
  s.request_id = "once-1";
  s.tokens = prompt(5, 40);
  s.input_tokens = 40;
  s.output_tokens = 4;
  s.client_endpoint = client.endpoint();
  auto r = rig.client->call(s, 5000);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(r->accepted) << r->reason;
  // The prefill instance that holds the job goes away (its socket closes): the Conductor releases the reservation
  // and decides again; D0 refuses the second reservation of once-1.
  ASSERT_TRUE(testkit::wait_until([&] { return rig.p0.jobs().size() + rig.p1.jobs().size() == 1; }, 10'000, 5));
  (rig.p0.jobs().size() == 1 ? rig.p0 : rig.p1).shut();
  EXPECT_TRUE(testkit::wait_until([&] { return client.errors_of("once-1") >= 1; }, 15'000, 20))
      << "no request_error for the re-dispatched request; D0 saw " << rig.d0.reserves().size() << " reservation(s)";
  EXPECT_EQ(rig.d0.reserves().size(), 2u);
}

TEST(ConductorE2E, RegistryIsBoundedIdsAreNotTakenOverAndAWorkerGoneFreesItsPlace) {
  Child conductor({MC_BINARY_DIR "/bin/mc-conductor", "--log-level", "error", "serve", "--listen", "tcp://127.0.0.1:0",
                   "--block-size", std::to_string(kBlock), "--max-instances", "2"});
  const std::string ready = conductor.read_line(10'000);
  ASSERT_EQ(ready.rfind("ready mc-conductor tcp://", 0), 0u) << "ready line: '" << ready << "'";
  const std::string endpoint = ready.substr(19, ready.find(' ', 19) - 19);
  auto p0 = std::make_unique<FakeWorker>();
  FakeWorker d0, p1;
  auto client = rpc::RpcClient::connect(endpoint);
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  rpc::RpcClient& c = **client;
  auto reg = [&](const char* id, const char* role, const std::string& ep) {
    return c.call(proto::ConductorRegisterRequest{id, role, "h0", ep, "", 100'000, kBlock, "", 0});
  };
  ASSERT_TRUE(reg("P0", "prefill", p0->endpoint()).is_ok());
  ASSERT_TRUE(reg("D0", "decode", d0.endpoint()).is_ok());
  auto third = reg("P1", "prefill", p1.endpoint());
  ASSERT_FALSE(third.is_ok());
  EXPECT_EQ(third.status().code(), Code::kResourceExhausted) << third.status().to_string();
  EXPECT_NE(third.status().message().find("--max-instances"), std::string::npos) << third.status().message();
  EXPECT_TRUE(reg("D0", "decode", d0.endpoint()).is_ok());  // known id: registers again
  // The same id from another endpoint while D0 is alive (a second worker with its --instance-id, or an impostor)
  // would take over D0's requests: refused, naming both endpoints.
  auto twin = reg("D0", "decode", p1.endpoint());
  ASSERT_FALSE(twin.is_ok());
  EXPECT_EQ(twin.status().code(), Code::kAlreadyExists) << twin.status().to_string();
  EXPECT_NE(twin.status().message().find(d0.endpoint()), std::string::npos) << twin.status().message();
  EXPECT_GE(status(c)["faults"].value("refused_register", 0), 1) << status(c).dump();

  p0.reset();  // P0's process is gone: its connection closes
  nlohmann::json st;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        st = status(c);
        return st["faults"].value("connection_lost", 0) == 1 && st["instances"].size() == 1;
      },
      10'000, 20))
      << st.dump();
  EXPECT_TRUE(reg("P1", "prefill", p1.endpoint()).is_ok());
}

}  // namespace MC_UNITY_ID
}  // namespace mc
