// The request-cancel path with the real daemons on loopback (issue 19): mc-conductor, one mc-prefill and one
// mc-decode (sim backend, no store), and a client in this test (an RpcServer for the token events, an RpcClient
// that submits and cancels).
//   * a request cancelled while it streams: the reply says "decoding", the decode instance frees its KV blocks at
//     once, the client gets request_error kCancelled and never request_done, stat counts the cancel; a second one
//     cancelled with `mc-conductor cancel` (exit 0, its output), and a third cancel of it is "unknown";
//   * a request cancelled while its prefill job is still queued behind others on the one prefill instance: the
//     prefill instance drops it (stage "dispatching", its counter), its decode reservation is freed, and the other
//     requests complete normally;
//   * with keys (mc-auth init): another tenant's cancel is refused (kPermissionDenied naming it), the submitter's
//     and an admin's are not.
// Every wait is bounded (testkit::wait_until); the daemons are stopped on the way out.
#include <stdlib.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/net/auth.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/envelope.hpp"
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

class CancelE2E : public ::testing::Test {
 protected:
  void TearDown() override {
    client_.reset();
    conductor_client_.reset();
    if (!keys_.empty()) {
      (void)auth::set_process_keyring(nullptr);
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::path(keys_).parent_path(), ec);
    }
  }

  // --auth-dir and --auth-name `name` when the test runs with keys.
  std::vector<std::string> auth_flags(const std::string& name) const {
    if (keys_.empty()) return {};
    return {"--auth-dir", keys_, "--auth-name", name};
  }

  // Keys for the conductor, decode0, prefill0 and the tenants alice and bob; this process is alice.
  void make_keys() {
    char tmpl[] = "/tmp/mc-cancel-e2e.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    keys_ = std::string(tmpl) + "/keys";
    const testkit::RunResult init = testkit::run({kBin + "mc-auth", "init", keys_, "--tenant", "alice", "--tenant",
                                                  "bob", "--worker", "decode0", "--worker", "prefill0"},
                                                 30'000);
    ASSERT_EQ(init.exit_code, 0) << init.out;
    auto ring = auth::Keyring::load(keys_, "alice");
    ASSERT_TRUE(ring.is_ok()) << ring.status().to_string();
    ASSERT_TRUE(auth::set_process_keyring(ring.value()).is_ok());
  }

  // The Conductor, then decode and prefill registered with it (their ready lines come once registered).
  // `prefill_time_scale` < 1 makes prefills slower than modelled (queues build up).
  void start(double prefill_time_scale) {
    client_ = std::make_unique<ClientEndpoint>(/*own_key=*/!keys_.empty());
    std::vector<std::string> conductor_argv = {kBin + "mc-conductor",
                                               "--log-level",
                                               "warn",
                                               "serve",
                                               "--listen",
                                               "tcp://127.0.0.1:0",
                                               "--block-size",
                                               std::to_string(kBlockTokens),
                                               "--slo-ttft-ms",
                                               "600000",
                                               "--slo-tbt-ms",
                                               "600000"};
    for (const std::string& f : auth_flags("conductor")) conductor_argv.push_back(f);
    conductor_ = std::make_unique<Child>(conductor_argv);
    conductor_ep_ = conductor_->wait_ready();
    ASSERT_FALSE(conductor_ep_.empty()) << "mc-conductor gave no ready line";
    auto worker = [&](const std::string& tool, const std::string& id, double time_scale) {
      std::vector<std::string> argv = {kBin + tool,
                                       "--listen",
                                       "tcp://127.0.0.1:0",
                                       "--backend",
                                       "sim",
                                       "--model",
                                       "llama3-70b",
                                       "--time-scale",
                                       std::to_string(time_scale),
                                       "--kv-bytes-per-token",
                                       "64",
                                       "--block-size",
                                       std::to_string(kBlockTokens),
                                       "--kv-blocks",
                                       "2048",
                                       "--conductor",
                                       conductor_ep_,
                                       "--instance-id",
                                       id,
                                       "--log-level",
                                       "warn"};
      if (tool == "mc-prefill") argv.insert(argv.end(), {"--store", "none"});
      for (const std::string& f : auth_flags(id)) argv.push_back(f);
      return std::make_unique<Child>(argv);
    };
    decode_ = worker("mc-decode", "decode0", 1.0);
    decode_ep_ = decode_->wait_ready();
    ASSERT_FALSE(decode_ep_.empty()) << "mc-decode gave no ready line";
    prefill_ = worker("mc-prefill", "prefill0", prefill_time_scale);
    prefill_ep_ = prefill_->wait_ready();
    ASSERT_FALSE(prefill_ep_.empty()) << "mc-prefill gave no ready line";
    auto c = rpc::RpcClient::connect(conductor_ep_);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    conductor_client_ = std::move(c).value();
  }

  template <typename Req>
  Result<typename Req::Reply> call(const std::string& endpoint, const Req& req, int timeout_ms = 10'000) {
    auto client = rpc::RpcClient::connect(endpoint);
    if (!client.is_ok()) return client.status();
    return (*client)->call(req, timeout_ms);
  }

  Result<proto::ConductorSubmitReply> submit(const std::string& id, int64_t input_tokens, int64_t output_tokens) {
    proto::ConductorSubmitRequest r;
    r.request_id = id;
    for (int64_t i = 0; i < input_tokens; ++i) r.tokens.push_back(static_cast<uint32_t>((i * 31 + id.size()) % 1000));
    r.input_tokens = input_tokens;
    r.output_tokens = output_tokens;
    r.client_endpoint = client_->endpoint();
    return conductor_client_->call(r, 30'000);
  }

  json conductor_status() {
    auto r = conductor_client_->call(proto::ConductorStatusRequest{true}, 10'000);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? json::parse(r->status_json, nullptr, false) : json::object();
  }
  // A counter of a daemon's `stat` (0 when never incremented).
  uint64_t stat_counter(const std::string& endpoint, const std::string& name) {
    auto stat = call(endpoint, proto::StatRequest{});
    EXPECT_TRUE(stat.is_ok()) << stat.status().to_string();
    if (!stat.is_ok()) return 0;
    const json j = json::parse(stat->metrics_json);
    return j["counters"].contains(name) ? j["counters"][name].get<uint64_t>() : 0;
  }
  proto::WorkerLoadReply decode_load() {
    auto l = call(decode_ep_, proto::WorkerLoadRequest{});
    EXPECT_TRUE(l.is_ok()) << l.status().to_string();
    return l.is_ok() ? l.value() : proto::WorkerLoadReply{};
  }

  std::string keys_;  // with keys: the mc-auth init directory
  std::unique_ptr<ClientEndpoint> client_;
  std::unique_ptr<Child> conductor_, decode_, prefill_;
  std::string conductor_ep_, decode_ep_, prefill_ep_;
  std::unique_ptr<rpc::RpcClient> conductor_client_;
};

TEST_F(CancelE2E, CancelWhileDecodingFreesTheKvAndEndsTheStream) {
  ASSERT_NO_FATAL_FAILURE(start(/*prefill_time_scale=*/1.0));
  // 3000 output tokens: a sim decode step of llama3-70b on a800x8 takes ~10 ms, so the stream lasts half a minute.
  for (const std::string id : {"long-a", "long-b"}) {
    auto accepted = submit(id, 64, 3000);
    ASSERT_TRUE(accepted.is_ok()) << accepted.status().to_string();
    ASSERT_TRUE(accepted->accepted) << accepted->reason;
  }
  ASSERT_TRUE(testkit::wait_until(
      [&] { return client_->get("long-a").tokens >= 3 && client_->get("long-b").tokens >= 3; }, 30'000, 10))
      << client_->get("long-a").tokens << " tokens";
  ASSERT_GT(decode_load().kv_blocks_used, 0);

  auto reply = conductor_client_->call(proto::ConductorCancelRequest{"long-a"}, 10'000);
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  EXPECT_EQ(reply->request_id, "long-a");
  EXPECT_EQ(reply->stage, "decoding");
  // The client hears kCancelled, with the tokens it got; never request_done.
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("long-a").error.has_value(); }, 10'000, 5));
  const Stream a = client_->get("long-a");
  EXPECT_EQ(a.error->code, static_cast<uint16_t>(Code::kCancelled)) << a.error->message;
  EXPECT_EQ(a.error->output_tokens, a.tokens);
  EXPECT_FALSE(a.done);
  EXPECT_LT(a.tokens, 3000);
  json st = conductor_status();
  EXPECT_EQ(st["cancels"].value("cancelled", 0), 1) << st["cancels"].dump();
  EXPECT_EQ(st["cancels"].value("decoding", 0), 1) << st["cancels"].dump();
  EXPECT_EQ(stat_counter(decode_ep_, "mc_decode_cancelled_total"), 1u);

  // The second one through the operator's CLI.
  const testkit::RunResult cli = testkit::run(
      {kBin + "mc-conductor", "--log-level", "warn", "cancel", "--endpoint", conductor_ep_, "long-b"}, 30'000);
  EXPECT_EQ(cli.exit_code, 0) << cli.out;
  EXPECT_NE(cli.out.find("long-b: cancelled while decoding"), std::string::npos) << cli.out;
  // Its KV blocks and every promise of them are freed within a bounded time (one decode step).
  proto::WorkerLoadReply load;
  EXPECT_TRUE(testkit::wait_until(
      [&] {
        load = decode_load();
        return load.kv_blocks_used == 0 && load.kv_blocks_committed == 0 && load.batch_size == 0;
      },
      5'000, 10))
      << "kv_blocks_used " << load.kv_blocks_used << ", committed " << load.kv_blocks_committed << ", batch "
      << load.batch_size;
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("long-b").error.has_value(); }, 10'000, 5));
  EXPECT_EQ(client_->get("long-b").error->code, static_cast<uint16_t>(Code::kCancelled));
  // Again, now that nothing of it is left: unknown, not an error (and --json).
  const testkit::RunResult again = testkit::run(
      {kBin + "mc-conductor", "--log-level", "warn", "cancel", "--endpoint", conductor_ep_, "long-b", "--json"},
      30'000);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  const json j = json::parse(again.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << again.out;
  EXPECT_EQ(j.value("stage", ""), "unknown") << again.out;
  st = conductor_status();
  EXPECT_EQ(st["cancels"].value("cancelled", 0), 2) << st["cancels"].dump();
  EXPECT_EQ(st["cancels"].value("unknown", 0), 1) << st["cancels"].dump();
  EXPECT_EQ(st.value("requests_decoding", -1), 0) << st.dump();
  EXPECT_EQ(st.value("requests_dispatching", -1), 0) << st.dump();
  // The table shows the count too.
  const testkit::RunResult table =
      testkit::run({kBin + "mc-conductor", "--log-level", "warn", "stat", "--endpoint", conductor_ep_}, 30'000);
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("cancelled by clients: 2 (dispatching 0, prefilling 0, decoding 2)"), std::string::npos)
      << table.out;
  EXPECT_FALSE(client_->get("long-a").done);
  EXPECT_FALSE(client_->get("long-b").done);
}

TEST_F(CancelE2E, CancelOfAQueuedPrefillDropsItAndTheOthersComplete) {
  // Prefills 4 times slower than modelled: each 4096-token prompt takes about 2 s, so the third waits in the queue.
  ASSERT_NO_FATAL_FAILURE(start(/*prefill_time_scale=*/0.25));
  const std::vector<std::string> ids = {"q-0", "q-1", "q-2"};
  for (const std::string& id : ids) {
    auto accepted = submit(id, 4096, 8);
    ASSERT_TRUE(accepted.is_ok()) << accepted.status().to_string();
    ASSERT_TRUE(accepted->accepted) << accepted->reason;
  }
  EXPECT_EQ(decode_load().reservations, 3);
  auto reply = conductor_client_->call(proto::ConductorCancelRequest{"q-2"}, 10'000);
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  // Dropped from the prefill queue ("dispatching"); "prefilling" only if the machine was so slow that it started.
  ASSERT_TRUE(reply->stage == "dispatching" || reply->stage == "prefilling") << reply->stage;
  RecordProperty("cancel_stage", reply->stage);
  const uint64_t dropped = reply->stage == "dispatching" ? 1 : 0;
  EXPECT_EQ(stat_counter(prefill_ep_, "mc_prefill_cancelled_total"), dropped);
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("q-2").error.has_value(); }, 60'000, 10));
  EXPECT_EQ(client_->get("q-2").error->code, static_cast<uint16_t>(Code::kCancelled))
      << client_->get("q-2").error->message;
  for (const std::string id : {"q-0", "q-1"}) {
    EXPECT_TRUE(testkit::wait_until([&] { return client_->get(id).done || client_->get(id).error; }, 60'000, 10)) << id;
    EXPECT_TRUE(client_->get(id).done) << id << ": " << (client_->get(id).error ? client_->get(id).error->message : "");
    EXPECT_EQ(client_->get(id).tokens, 8) << id;
  }
  EXPECT_FALSE(client_->get("q-2").done);
  EXPECT_EQ(client_->get("q-2").tokens, 0);
  // Everything of the three is freed at decode: the cancelled reservation too.
  proto::WorkerLoadReply load;
  EXPECT_TRUE(testkit::wait_until(
      [&] {
        load = decode_load();
        return load.reservations == 0 && load.kv_blocks_used == 0 && load.kv_blocks_committed == 0;
      },
      10'000, 10))
      << "reservations " << load.reservations << ", kv_blocks_used " << load.kv_blocks_used << ", committed "
      << load.kv_blocks_committed;
  const json st = conductor_status();
  EXPECT_EQ(st["cancels"].value("cancelled", 0), 1) << st["cancels"].dump();
  EXPECT_EQ(st["cancels"].value(reply->stage, 0), 1) << st["cancels"].dump();
  // The cancelled job's end was no fault: nothing re-dispatched, no instance lost.
  EXPECT_EQ(st["faults"].value("redispatched", 0), 0) << st["faults"].dump();
  EXPECT_EQ(st["faults"].value("failed_by_instance_death", 0), 0) << st["faults"].dump();
  EXPECT_EQ(st["decisions"].value("total", 0), 3) << st["decisions"].dump();
  EXPECT_TRUE(
      testkit::wait_until([&] { return conductor_status().value("requests_dispatching", -1) == 0; }, 10'000, 20));
  EXPECT_EQ(st["instances"].size(), 2u) << st.dump();
}

// With keys: only the submitter (or an admin) cancels a request; another tenant is refused, naming itself.
TEST_F(CancelE2E, AnotherTenantCannotCancel) {
  ASSERT_NO_FATAL_FAILURE(make_keys());
  ASSERT_NO_FATAL_FAILURE(start(/*prefill_time_scale=*/1.0));
  for (const std::string id : {"mine", "mine-too"}) {
    auto accepted = submit(id, 64, 3000);
    ASSERT_TRUE(accepted.is_ok()) << accepted.status().to_string();
    ASSERT_TRUE(accepted->accepted) << accepted->reason;
  }
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("mine").tokens >= 1; }, 30'000, 10));
  auto cancel_as = [&](const std::string& who, const std::string& id) {
    std::vector<std::string> argv = {kBin + "mc-conductor", "cancel", "--endpoint", conductor_ep_, id, "--json"};
    for (const std::string& f : auth_flags(who)) argv.push_back(f);
    return testkit::run(argv, 30'000);
  };
  const testkit::RunResult bob = cancel_as("bob", "mine");
  EXPECT_EQ(bob.exit_code, 1) << bob.out;
  EXPECT_NE(bob.out.find("bob"), std::string::npos) << bob.out;
  EXPECT_NE(bob.out.find("only its submitter"), std::string::npos) << bob.out;
  EXPECT_FALSE(client_->get("mine").error.has_value());
  // The submitter itself (this process, alice).
  auto mine = conductor_client_->call(proto::ConductorCancelRequest{"mine"}, 10'000);
  ASSERT_TRUE(mine.is_ok()) << mine.status().to_string();
  EXPECT_EQ(mine->stage, "decoding");
  // An admin key cancels anyone's.
  const testkit::RunResult admin = cancel_as("admin", "mine-too");
  EXPECT_EQ(admin.exit_code, 0) << admin.out;
  EXPECT_NE(admin.out.find("\"decoding\""), std::string::npos) << admin.out;
  for (const std::string id : {"mine", "mine-too"}) {
    ASSERT_TRUE(testkit::wait_until([&] { return client_->get(id).error.has_value(); }, 10'000, 5)) << id;
    EXPECT_EQ(client_->get(id).error->code, static_cast<uint16_t>(Code::kCancelled)) << id;
  }
  EXPECT_EQ(conductor_status()["cancels"].value("cancelled", 0), 2);
}

// Issue 51 item 1: request ids are their submitter's. Bob, with a legitimate client key, submits the id of alice's
// request while it decodes, naming alice's token-event server as his client endpoint, then cancels that id: his
// request runs apart under an alias, the cancel ends only his, and alice's stream gets every token and its done,
// never an event of bob's. Before, the resubmit was accepted into alice's id, its cancel cancelled hers, and the
// Conductor and decode reached her server with bob's key from then on (her stream cut with no error).
TEST_F(CancelE2E, AnotherTenantsRequestOfTheSameIdRunsApart) {
  ASSERT_NO_FATAL_FAILURE(make_keys());
  ASSERT_NO_FATAL_FAILURE(start(/*prefill_time_scale=*/1.0));
  constexpr int64_t kTokens = 1500;
  auto accepted = submit("victim", 64, kTokens);
  ASSERT_TRUE(accepted.is_ok()) << accepted.status().to_string();
  ASSERT_TRUE(accepted->accepted) << accepted->reason;
  ASSERT_TRUE(testkit::wait_until([&] { return client_->get("victim").tokens >= 2; }, 30'000, 10));
  // Alice's own duplicate is still refused.
  auto again = submit("victim", 64, 8);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists) << again.status().to_string();

  const std::string tenant_client = MC_BINARY_DIR "/tests/bin/mc_test_tenant_client";
  const testkit::RunResult bob = testkit::run(
      {tenant_client, keys_, "bob", conductor_ep_, "victim", "64", std::to_string(kTokens), client_->endpoint()},
      60'000);
  ASSERT_EQ(bob.exit_code, 0) << bob.out;
  const json bob_reply = json::parse(bob.out.substr(bob.out.find('{')), nullptr, false);
  EXPECT_EQ(bob_reply.value("request_id", ""), "victim") << bob.out;  // his own id, as he named it
  ASSERT_TRUE(testkit::wait_until([&] { return conductor_status().value("requests_decoding", 0) >= 2; }, 30'000, 20))
      << conductor_status().dump();
  std::vector<std::string> argv = {kBin + "mc-conductor", "cancel", "--endpoint", conductor_ep_, "victim", "--json"};
  for (const std::string& f : auth_flags("bob")) argv.push_back(f);
  const testkit::RunResult cancel = testkit::run(argv, 30'000);
  EXPECT_EQ(cancel.exit_code, 0) << cancel.out;
  EXPECT_NE(cancel.out.find("\"decoding\""), std::string::npos) << cancel.out;
  // Decode reports the end of bob's request under the Conductor's id (his alias), never the client's: alice's stays
  // in the Conductor's books (before: his "failed" report closed hers, and her own cancel then found nothing).
  ASSERT_TRUE(
      testkit::wait_until([&] { return stat_counter(decode_ep_, "mc_decode_cancelled_total") >= 1; }, 10'000, 20));
  EXPECT_FALSE(testkit::wait_until([&] { return conductor_status().value("requests_decoding", 0) == 0; }, 2'000, 50))
      << "bob's reports closed alice's request: " << conductor_status().dump();
  // A second cancel finds nothing of bob's left: alice's is not his to name, and is refused naming him.
  const testkit::RunResult cancel2 = testkit::run(argv, 30'000);
  EXPECT_EQ(cancel2.exit_code, 1) << cancel2.out;
  EXPECT_NE(cancel2.out.find("from bob"), std::string::npos) << cancel2.out;
  EXPECT_NE(cancel2.out.find("only its submitter"), std::string::npos) << cancel2.out;

  ASSERT_TRUE(testkit::wait_until(
      [&] { return client_->get("victim").done || client_->get("victim").error.has_value(); }, 120'000, 20));
  const Stream victim = client_->get("victim");
  EXPECT_FALSE(victim.error.has_value()) << victim.error->message;
  EXPECT_TRUE(victim.done);
  EXPECT_EQ(victim.tokens, kTokens);
  EXPECT_EQ(conductor_status()["cancels"].value("cancelled", 0), 1);
}

}  // namespace MC_UNITY_ID
}  // namespace mc
