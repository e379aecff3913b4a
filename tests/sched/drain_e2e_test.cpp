// Graceful drain on SIGTERM (issue 19 item 3, field report 23) with the real daemons on loopback: mc-conductor,
// mc-prefill and mc-decode instances (sim backend, no store), and a client in this test (an RpcServer for the token
// events, an RpcClient that submits).
//   * a prefill instance SIGTERMed while its jobs run: every request it held completes with request_done (its KV
//     reached decode), it exits 0 once they are done, the Conductor places nothing new on it after the notice and
//     counts a drain, not a death;
//   * a decode instance SIGTERMed mid-stream: its streams finish with request_done, then it exits 0; new requests
//     go to the other decode instance;
//   * with --drain-timeout-s 1, a long prefill and a long stream end with a terminal request_error (kUnavailable,
//     naming the drain) instead of hanging, and both processes exit 0.
// Every wait is bounded (testkit::wait_until); the daemons are stopped on the way out.
#include <signal.h>

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"
#include "mc/testkit/client_endpoint.hpp"
#include "mc/testkit/process.hpp"
#include "mc/testkit/wait.hpp"

namespace mc {
namespace MC_UNITY_ID {

using testkit::ClientEndpoint;
using testkit::Stream;

using json = nlohmann::json;
using testkit::Child;

const std::string kBin = MC_BINARY_DIR "/bin/";
constexpr int64_t kBlockTokens = 16;

struct WorkerSpec {
  std::string tool;  // mc-prefill | mc-decode
  std::string id;
  double time_scale = 1.0;
  int64_t drain_timeout_s = 30;
};

class DrainE2E : public ::testing::Test {
 protected:
  void TearDown() override {
    conductor_client_.reset();
    for (auto& [id, w] : workers_) w->kill_now(SIGKILL, 0);
    if (conductor_) conductor_->stop();
    client_.reset();
  }

  // The Conductor, then the workers registered with it (their ready lines come once registered).
  void start(const std::vector<WorkerSpec>& specs) {
    client_ = std::make_unique<ClientEndpoint>();
    conductor_ = std::make_unique<Child>(std::vector<std::string>{
        kBin + "mc-conductor", "--log-level", "warn", "serve", "--listen", "tcp://127.0.0.1:0", "--block-size",
        std::to_string(kBlockTokens), "--slo-ttft-ms", "600000", "--slo-tbt-ms", "600000"});
    conductor_ep_ = conductor_->wait_ready();
    ASSERT_FALSE(conductor_ep_.empty()) << "mc-conductor gave no ready line";
    for (const WorkerSpec& w : specs) {
      std::vector<std::string> argv = {kBin + w.tool,
                                       "--listen",
                                       "tcp://127.0.0.1:0",
                                       "--backend",
                                       "sim",
                                       "--model",
                                       "llama3-70b",
                                       "--time-scale",
                                       std::to_string(w.time_scale),
                                       "--kv-bytes-per-token",
                                       "64",
                                       "--block-size",
                                       std::to_string(kBlockTokens),
                                       "--kv-blocks",
                                       "4096",
                                       "--conductor",
                                       conductor_ep_,
                                       "--instance-id",
                                       w.id,
                                       "--drain-timeout-s",
                                       std::to_string(w.drain_timeout_s),
                                       "--log-level",
                                       "warn"};
      if (w.tool == "mc-prefill") argv.insert(argv.end(), {"--store", "none"});
      workers_[w.id] = std::make_unique<Child>(argv);
      endpoints_[w.id] = workers_[w.id]->wait_ready();
      ASSERT_FALSE(endpoints_[w.id].empty()) << w.tool << " " << w.id << " gave no ready line";
    }
    auto c = rpc::RpcClient::connect(conductor_ep_);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    conductor_client_ = std::move(c).value();
  }

  proto::ConductorSubmitReply submit(const std::string& id, int64_t input_tokens, int64_t output_tokens) {
    proto::ConductorSubmitRequest r;
    r.request_id = id;
    for (int64_t i = 0; i < input_tokens; ++i) r.tokens.push_back(static_cast<uint32_t>((i * 31 + id.size()) % 1000));
    r.input_tokens = input_tokens;
    r.output_tokens = output_tokens;
    r.client_endpoint = client_->endpoint();
    auto reply = conductor_client_->call(r, 30'000);
    EXPECT_TRUE(reply.is_ok()) << reply.status().to_string();
    if (!reply.is_ok()) return {};
    EXPECT_TRUE(reply->accepted) << id << ": " << reply->reason;
    return reply.value();
  }

  json conductor_status() {
    auto r = conductor_client_->call(proto::ConductorStatusRequest{true}, 10'000);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? json::parse(r->status_json, nullptr, false) : json::object();
  }
  std::string instance_state(const std::string& id) {
    const json st = conductor_status();
    for (const auto& i : st.value("instances", json::array())) {
      if (i.value("id", "") == id) return i.value("state", "");
    }
    return "absent";
  }
  proto::WorkerLoadReply load(const std::string& id) {
    auto client = rpc::RpcClient::connect(endpoints_.at(id));
    if (!client.is_ok()) return {};
    auto l = (*client)->call(proto::WorkerLoadRequest{}, 5'000);
    return l.is_ok() ? l.value() : proto::WorkerLoadReply{};
  }
  bool finished(const std::string& id) {
    const Stream s = client_->get(id);
    return s.done || s.error.has_value();
  }

  std::unique_ptr<ClientEndpoint> client_;
  std::unique_ptr<Child> conductor_;
  std::string conductor_ep_;
  std::map<std::string, std::unique_ptr<Child>> workers_;
  std::map<std::string, std::string> endpoints_;
  std::unique_ptr<rpc::RpcClient> conductor_client_;
};

TEST_F(DrainE2E, APrefillInstanceFinishesItsJobsThenExits) {
  // Prefills 4 times slower than modelled: a 4096-token prompt takes about 2 s, so each instance queues jobs.
  ASSERT_NO_FATAL_FAILURE(start(
      {{"mc-decode", "decode0", 1.0, 30}, {"mc-prefill", "prefill0", 0.25, 30}, {"mc-prefill", "prefill1", 0.25, 30}}));
  std::vector<std::string> on_p0, all;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "first-" + std::to_string(i);
    const proto::ConductorSubmitReply r = submit(id, 4096, 20);
    ASSERT_TRUE(r.accepted);
    all.push_back(id);
    if (r.prefill_id == "prefill0") on_p0.push_back(id);
  }
  ASSERT_GE(on_p0.size(), 2u) << "the placement put fewer than 2 of 6 jobs on prefill0";
  ASSERT_TRUE(testkit::wait_until([&] { return load("prefill0").running_tokens > 0; }, 30'000, 10));
  workers_["prefill0"]->signal(SIGTERM);
  ASSERT_TRUE(testkit::wait_until([&] { return instance_state("prefill0") == "draining"; }, 10'000, 10))
      << instance_state("prefill0");
  // Placed after the notice: never on prefill0.
  for (int i = 0; i < 4; ++i) {
    const std::string id = "after-" + std::to_string(i);
    const proto::ConductorSubmitReply r = submit(id, 1024, 20);
    ASSERT_TRUE(r.accepted);
    EXPECT_EQ(r.prefill_id, "prefill1") << id << " was placed on a draining instance";
    all.push_back(id);
  }
  // prefill0 exits 0 once its jobs are done; by then each of them reached decode.
  EXPECT_EQ(workers_["prefill0"]->wait_exit(60'000), 0);
  for (const std::string& id : on_p0) {
    EXPECT_TRUE(testkit::wait_until([&] { return client_->get(id).tokens > 0 || finished(id); }, 10'000, 10)) << id;
  }
  for (const std::string& id : all) {
    ASSERT_TRUE(testkit::wait_until([&] { return finished(id); }, 60'000, 10)) << id << " never ended";
    const Stream s = client_->get(id);
    EXPECT_TRUE(s.done) << id << ": " << (s.error ? s.error->message : "");
    EXPECT_FALSE(s.error.has_value()) << id << ": " << s.error->message;
    EXPECT_EQ(s.tokens, 20) << id;
  }
  // A drain, not a death.
  ASSERT_TRUE(testkit::wait_until([&] { return instance_state("prefill0") == "absent"; }, 10'000, 10));
  const json f = conductor_status()["faults"];
  EXPECT_EQ(f.value("instances_drained", -1), 1) << f.dump();
  EXPECT_EQ(f.value("drain_notices", -1), 1) << f.dump();
  EXPECT_EQ(f.value("connection_lost", -1), 0) << f.dump();
  EXPECT_EQ(f.value("failed_by_instance_death", -1), 0) << f.dump();
  EXPECT_EQ(f.value("redispatched", -1), 0) << f.dump();
  const testkit::RunResult table =
      testkit::run({kBin + "mc-conductor", "--log-level", "warn", "stat", "--endpoint", conductor_ep_}, 30'000);
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("instance drains: notices 1, drained (exited) 1, draining now 0"), std::string::npos)
      << table.out;
}

TEST_F(DrainE2E, ADecodeInstanceFinishesItsStreamsThenExits) {
  ASSERT_NO_FATAL_FAILURE(start(
      {{"mc-decode", "decode0", 1.0, 30}, {"mc-decode", "decode1", 1.0, 30}, {"mc-prefill", "prefill0", 1.0, 30}}));
  // 250 output tokens: a sim decode step of llama3-70b takes ~10 ms, so each stream lasts a few seconds.
  std::vector<std::string> on_d0, all;
  for (int i = 0; i < 4; ++i) {
    const std::string id = "stream-" + std::to_string(i);
    const proto::ConductorSubmitReply r = submit(id, 256, 250);
    ASSERT_TRUE(r.accepted);
    all.push_back(id);
    if (r.decode_id == "decode0") on_d0.push_back(id);
  }
  ASSERT_FALSE(on_d0.empty()) << "no stream was placed on decode0";
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        for (const std::string& id : on_d0) {
          if (client_->get(id).tokens < 3) return false;
        }
        return true;
      },
      30'000, 10));
  workers_["decode0"]->signal(SIGTERM);
  ASSERT_TRUE(testkit::wait_until([&] { return instance_state("decode0") == "draining"; }, 10'000, 10))
      << instance_state("decode0");
  for (const std::string& id : on_d0) EXPECT_FALSE(finished(id)) << id << " ended before the drain was seen";
  for (int i = 0; i < 3; ++i) {
    const std::string id = "after-" + std::to_string(i);
    const proto::ConductorSubmitReply r = submit(id, 256, 20);
    ASSERT_TRUE(r.accepted);
    EXPECT_EQ(r.decode_id, "decode1") << id << " was placed on a draining instance";
    all.push_back(id);
  }
  EXPECT_EQ(workers_["decode0"]->wait_exit(60'000), 0);
  // It exited after its streams finished: each already ended with request_done.
  for (const std::string& id : on_d0) {
    const Stream s = client_->get(id);
    EXPECT_TRUE(s.done) << id << " not done when decode0 exited";
    EXPECT_EQ(s.tokens, 250) << id;
  }
  for (const std::string& id : all) {
    ASSERT_TRUE(testkit::wait_until([&] { return finished(id); }, 60'000, 10)) << id << " never ended";
    const Stream s = client_->get(id);
    EXPECT_TRUE(s.done) << id;
    EXPECT_FALSE(s.error.has_value()) << id << ": " << s.error->message;
  }
  ASSERT_TRUE(testkit::wait_until([&] { return instance_state("decode0") == "absent"; }, 10'000, 10));
  const json f = conductor_status()["faults"];
  EXPECT_EQ(f.value("instances_drained", -1), 1) << f.dump();
  EXPECT_EQ(f.value("connection_lost", -1), 0) << f.dump();
  EXPECT_EQ(f.value("failed_by_instance_death", -1), 0) << f.dump();
}

TEST_F(DrainE2E, TheDrainTimeoutEndsLongRequestsWithAnError) {
  // prefill0 at 1/50 of the modelled speed: a 4096-token prompt takes about 25 s; its drain timeout is 1 s.
  ASSERT_NO_FATAL_FAILURE(start({{"mc-decode", "decode0", 1.0, 1}, {"mc-prefill", "prefill0", 0.02, 1}}));
  // A stream of 3000 tokens (half a minute) and a prefill of ~25 s.
  ASSERT_TRUE(submit("long-stream", 64, 3000).accepted);
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("long-stream").tokens >= 3; }, 30'000, 10));
  ASSERT_TRUE(submit("long-prefill", 4096, 10).accepted);
  ASSERT_TRUE(testkit::wait_until([&] { return load("prefill0").running_tokens > 0; }, 30'000, 10));

  workers_["prefill0"]->signal(SIGTERM);
  // The running job fails at its next layer after 1 s: decode_abort, so the client hears a terminal error.
  ASSERT_TRUE(testkit::wait_until([&] { return finished("long-prefill"); }, 15'000, 10)) << "long-prefill hangs";
  Stream p = client_->get("long-prefill");
  ASSERT_TRUE(p.error.has_value());
  EXPECT_FALSE(p.done);
  EXPECT_EQ(p.error->code, static_cast<uint16_t>(Code::kUnavailable)) << p.error->message;
  EXPECT_NE(p.error->message.find("drain"), std::string::npos) << p.error->message;
  EXPECT_EQ(workers_["prefill0"]->wait_exit(15'000), 0);

  workers_["decode0"]->signal(SIGTERM);
  ASSERT_TRUE(testkit::wait_until([&] { return finished("long-stream"); }, 15'000, 10)) << "long-stream hangs";
  const Stream d = client_->get("long-stream");
  ASSERT_TRUE(d.error.has_value());
  EXPECT_FALSE(d.done);
  EXPECT_EQ(d.error->code, static_cast<uint16_t>(Code::kUnavailable)) << d.error->message;
  EXPECT_NE(d.error->message.find("drain"), std::string::npos) << d.error->message;
  EXPECT_LT(d.tokens, 3000);
  EXPECT_EQ(workers_["decode0"]->wait_exit(15'000), 0);
  ASSERT_TRUE(
      testkit::wait_until([&] { return conductor_status()["faults"].value("instances_drained", 0) == 2; }, 10'000, 10))
      << conductor_status()["faults"].dump();
  EXPECT_EQ(conductor_status()["faults"].value("connection_lost", -1), 0);
}

// A second signal does not wait for the drain timeout: what is left ends at once with a terminal error.
TEST_F(DrainE2E, ASecondSignalEndsTheDrainAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start({{"mc-decode", "decode0", 1.0, 600}, {"mc-prefill", "prefill0", 1.0, 600}}));
  ASSERT_TRUE(submit("long-stream", 64, 3000).accepted);
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("long-stream").tokens >= 3; }, 30'000, 10));
  workers_["decode0"]->signal(SIGTERM);
  ASSERT_TRUE(testkit::wait_until([&] { return instance_state("decode0") == "draining"; }, 10'000, 10));
  EXPECT_FALSE(finished("long-stream"));
  workers_["decode0"]->signal(SIGINT);
  ASSERT_TRUE(testkit::wait_until([&] { return finished("long-stream"); }, 10'000, 10)) << "long-stream hangs";
  const Stream d = client_->get("long-stream");
  ASSERT_TRUE(d.error.has_value());
  EXPECT_EQ(d.error->code, static_cast<uint16_t>(Code::kUnavailable)) << d.error->message;
  EXPECT_NE(d.error->message.find("second signal"), std::string::npos) << d.error->message;
  EXPECT_EQ(workers_["decode0"]->wait_exit(10'000), 0);
}

}  // namespace MC_UNITY_ID
}  // namespace mc
