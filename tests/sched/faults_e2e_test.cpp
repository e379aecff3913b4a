// Worker faults with the real daemons (issue 17 items 1 and 5): examples/local-cluster.sh starts a store master,
// 2 storage nodes, mc-conductor, 2 prefill and 2 decode instances (sim backend) on loopback, and mc-trace-replay
// replays a trace the test writes against it.
//   * kill -9 of one prefill instance mid-replay, then (another cluster) of one decode instance: every accepted
//     request still gets a terminal event well within the replay's drain timeout (lost = 0); the Conductor
//     re-dispatches or fails the dead instance's requests (naming it) and releases their reservations, and
//     mc-trace-replay exits 1 when some failed;
//   * hostile values: decode_reserve with ttl_ms = 2^62 is refused while real reservations still succeed; a
//     heartbeat with a negative queue length and a job report with event_unix_ns = 2^63-1 are refused and
//     counted, and the predictions stay sane (requests are still accepted).
// Every wait is bounded; the cluster script runs in its own process group and is stopped on the way out.
#include <signal.h>
#include <sys/types.h>

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/protocol.hpp"
#include "mc/common/rpc.hpp"
#include "mc/testkit/local_cluster.hpp"

namespace mc::sched {
namespace {

using json = nlohmann::json;
using testkit::slurp;

const std::string kBin = MC_BINARY_DIR "/bin";
constexpr int64_t kBlockTokens = 512;
// Lost requests wait out this drain timeout; today's code lost them for good (the reservation TTL is 180 s).
constexpr const char* kDrainTimeoutS = "60";

class FaultsFixture : public testkit::LocalClusterFixture {
 protected:
  FaultsFixture() : LocalClusterFixture("faults_e2e") {}

  void SetUp() override {
    start_cluster({"--store-nodes", "2", "--prefill", "2", "--decode", "2", "--backend", "sim", "--time-scale", "2",
                   "--kv-buffer-size", "128MiB"},
                  {"master", "conductor", "prefill0", "prefill1", "decode0", "decode1"});
  }

  // The pid of `name` in the cluster's cluster.txt.
  pid_t pid_of(const std::string& name) {
    if (auto it = pids_.find(name); it != pids_.end()) return it->second;
    ADD_FAILURE() << name << " not in cluster.txt";
    return 0;
  }

  // `n` requests 100 ms apart, each of `blocks` distinct blocks (no shared prefix) and `output` tokens.
  std::string write_trace(const std::string& tag, int n, int blocks, int output) {
    const std::string path = s_.path(tag + ".trace.jsonl");
    std::ofstream t(path);
    for (int i = 0; i < n; ++i) {
      std::vector<uint64_t> ids(static_cast<size_t>(blocks));
      for (int b = 0; b < blocks; ++b) ids[static_cast<size_t>(b)] = static_cast<uint64_t>(i) * 1000 + b + 1;
      t << json{{"timestamp", i * 100},
                {"input_length", blocks * kBlockTokens},
                {"output_length", output},
                {"hash_ids", ids}}
               .dump()
        << '\n';
    }
    return path;
  }

  std::unique_ptr<testkit::Child> start_replay(const std::string& tag, const std::string& trace,
                                               std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {kBin + "/mc-trace-replay",
                                     trace,
                                     "--conductor",
                                     endpoints_.at("conductor"),
                                     "--json",
                                     "--out",
                                     s_.path(tag + ".jsonl"),
                                     "--no-progress",
                                     "--time-scale",
                                     "2",
                                     "--slo-ttft-ms",
                                     "600000",
                                     "--slo-tbt-ms",
                                     "600000",
                                     "--drain-timeout-s",
                                     kDrainTimeoutS,
                                     "--id-prefix",
                                     tag + "-"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testkit::start_group_child(argv, s_.path(tag + ".out"), s_.path(tag + ".err"));
  }

  std::vector<json> records(const std::string& tag) {
    std::vector<json> out;
    std::ifstream in(s_.path(tag + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) out.push_back(json::parse(line));
    }
    return out;
  }

  json faults() { return conductor_status().value("faults", json::object()); }

  // Checks that every accepted request of the run ended with a terminal event of its own (completed, or failed
  // with a reason other than the drain timeout): nothing lost. Returns the failed records' reasons.
  std::vector<std::string> expect_nothing_lost(const std::string& tag, size_t offered) {
    std::vector<json> recs = records(tag);
    EXPECT_EQ(recs.size(), offered) << slurp(s_.path(tag + ".err"));
    std::vector<std::string> failed;
    for (const json& r : recs) {
      const std::string outcome = r.value("outcome", "");
      const std::string reason = r.value("reason", "");
      EXPECT_TRUE(outcome == "completed" || outcome == "failed" || outcome == "rejected") << r.dump();
      EXPECT_EQ(reason.find("drain timeout"), std::string::npos) << "lost: " << r.dump();
      if (outcome == "failed") failed.push_back(reason);
    }
    json summary = json::parse(slurp(s_.path(tag + ".out")), nullptr, false);
    EXPECT_FALSE(summary.is_discarded()) << slurp(s_.path(tag + ".out"));
    return failed;
  }
};

using FaultsE2E = FaultsFixture;

// kill -9 of prefill0 while jobs are queued on it: they are re-dispatched to prefill1 (nothing had reached their
// clients) and their decode reservations are released at once.
TEST_F(FaultsE2E, PrefillKilledMidReplayLosesNothing) {
  const int n = 24;
  auto replay = start_replay("pkill", write_trace("pkill", n, 16, 8));
  // prefill0 holds queued jobs (16 blocks prefill for ~0.4 s wall each, 10 requests/s offered).
  json last;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        last = conductor_status();
        for (const json& i : last.value("instances", json::array())) {
          if (i.value("id", "") == "prefill0" && i.value("queued_jobs", 0) >= 2) return true;
        }
        return false;
      },
      60'000, 20))
      << last.dump();
  const pid_t victim_pid = pid_of("prefill0");
  ASSERT_GT(victim_pid, 0);  // never kill(0): that is the test's own process group
  ASSERT_EQ(::kill(victim_pid, SIGKILL), 0);
  const int rc = replay->wait_exit(150'000);
  EXPECT_TRUE(rc == 0 || rc == 1) << rc << slurp(s_.path("pkill.err"));
  const std::vector<std::string> failed = expect_nothing_lost("pkill", n);
  const json f = faults();
  EXPECT_GE(f.value("redispatched", 0) + f.value("failed_by_instance_death", 0), 2) << f.dump();
  EXPECT_GE(f.value("reservations_released", 0), 1) << f.dump();
  for (const std::string& why : failed) EXPECT_NE(why.find("prefill0"), std::string::npos) << why;
  EXPECT_EQ(rc, failed.empty() ? 0 : 1) << slurp(s_.path("pkill.err"));
  // prefill0 is gone from the Conductor's registry.
  for (const json& i : conductor_status().value("instances", json::array())) EXPECT_NE(i.value("id", ""), "prefill0");
}

// kill -9 of decode0 while it streams tokens: its streaming requests fail, naming it, with the tokens that
// arrived counted; the others complete on decode1; mc-trace-replay exits 1 (--allow-failures: 0).
TEST_F(FaultsE2E, DecodeKilledMidReplayFailsItsRequestsAndLosesNothing) {
  const int n = 24;
  auto replay = start_replay("dkill", write_trace("dkill", n, 2, 400));
  proto::WorkerLoadReply load;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        load = call("decode0", proto::WorkerLoadRequest{});
        return load.batch_size >= 2;
      },
      60'000, 20))
      << load.batch_size;
  const pid_t victim_pid = pid_of("decode0");
  ASSERT_GT(victim_pid, 0);  // never kill(0): that is the test's own process group
  ASSERT_EQ(::kill(victim_pid, SIGKILL), 0);
  const int rc = replay->wait_exit(150'000);
  const std::vector<std::string> failed = expect_nothing_lost("dkill", n);
  ASSERT_GE(failed.size(), 2u);
  for (const std::string& why : failed) EXPECT_NE(why.find("decode0"), std::string::npos) << why;
  EXPECT_EQ(rc, 1) << slurp(s_.path("dkill.err"));
  EXPECT_NE(slurp(s_.path("dkill.err")).find("accepted requests failed"), std::string::npos);
  int64_t partial = 0;  // failed while streaming: the tokens that arrived are in the record
  for (const json& r : records("dkill")) {
    if (r.value("outcome", "") == "failed" && r.value("output_tokens", int64_t{0}) > 0) ++partial;
  }
  EXPECT_GE(partial, 1);
  EXPECT_GE(faults().value("failed_by_instance_death", 0), 2) << faults().dump();

  // The same replay once more on the surviving instances, failures allowed: everything completes, exit 0.
  auto again = start_replay("after", write_trace("after", 4, 2, 8), {"--allow-failures"});
  EXPECT_EQ(again->wait_exit(120'000), 0) << slurp(s_.path("after.err"));
  for (const json& r : records("after")) EXPECT_EQ(r.value("outcome", ""), "completed") << r.dump();
}

// A call that may fail (the fixture's call() expects success).
template <typename Req>
Result<typename Req::Reply> try_call(const std::string& endpoint, const Req& req) {
  rpc::ClientOptions o;
  o.client_name = "faults_e2e";
  o.connect_timeout_ms = 10'000;
  MC_ASSIGN_OR_RETURN(auto client, rpc::RpcClient::connect(endpoint, o));
  return client->call(req, 10'000);
}

TEST_F(FaultsE2E, HostileValuesAreRefusedAndPredictionsStaySane) {
  // decode_reserve with ttl_ms = 2^62: refused; a real reservation still succeeds (and is released).
  proto::DecodeReserveRequest hostile;
  hostile.request_id = "hostile";
  hostile.input_length_tokens = 1024;
  hostile.output_length_tokens = 16;
  hostile.client_endpoint = "tcp://127.0.0.1:9";
  hostile.ttl_ms = int64_t{1} << 62;
  auto refused = try_call(endpoints_.at("decode0"), hostile);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("ttl_ms"), std::string::npos) << refused.status().message();
  proto::DecodeReserveRequest real = hostile;
  real.request_id = "real";
  real.ttl_ms = 0;
  auto held = try_call(endpoints_.at("decode0"), real);
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  EXPECT_TRUE(call("decode0", proto::DecodeReleaseRequest{held->reservation_id}).released);

  // A heartbeat with a negative queue length for a live instance, and one with an absurd decode step.
  proto::ConductorHeartbeatRequest hb;
  hb.instance_id = "prefill0";
  hb.queued_prefill_tokens = -(int64_t{1} << 40);
  hb.queued_prefill_jobs = -5;
  auto hb_reply = try_call(endpoints_.at("conductor"), hb);
  ASSERT_FALSE(hb_reply.is_ok());
  EXPECT_EQ(hb_reply.status().code(), Code::kInvalidArgument);
  EXPECT_NE(hb_reply.status().message().find("queued_prefill_tokens"), std::string::npos);
  proto::ConductorHeartbeatRequest steps;
  steps.instance_id = "decode0";
  steps.decode_step_samples.push_back(proto::DecodeStepSample{4, 4096, 1e15});
  EXPECT_FALSE(try_call(endpoints_.at("conductor"), steps).is_ok());

  // Job reports with event_unix_ns = 2^63 - 1, for an unknown request and for one in flight.
  proto::ConductorJobReportRequest rep;
  rep.request_id = "nobody";
  rep.instance_id = "decode0";
  rep.phase = proto::kPhaseFirstToken;
  rep.event_unix_ns = std::numeric_limits<int64_t>::max();
  auto rep_reply = try_call(endpoints_.at("conductor"), rep);
  ASSERT_FALSE(rep_reply.is_ok());
  EXPECT_EQ(rep_reply.status().code(), Code::kInvalidArgument);
  EXPECT_NE(rep_reply.status().message().find("future"), std::string::npos) << rep_reply.status().message();

  // Requests are still accepted and predicted sanely; the refusals are counted.
  const int n = 6;
  auto replay = start_replay("sane", write_trace("sane", n, 2, 8));
  // While they run, a poisoned first_token report for each (the ids are "sane-<line>").
  for (int line = 1; line <= n; ++line) {
    proto::ConductorJobReportRequest poison = rep;
    poison.request_id = "sane-" + std::to_string(line);
    (void)try_call(endpoints_.at("conductor"), poison);
  }
  EXPECT_EQ(replay->wait_exit(120'000), 0) << slurp(s_.path("sane.err"));
  for (const json& r : records("sane")) {
    EXPECT_EQ(r.value("outcome", ""), "completed") << r.dump();
    const double predicted = r["ledger"].value("predicted_ttft_ms", -1.0);
    EXPECT_TRUE(predicted >= 0 && predicted < 600'000) << r.dump();
  }
  const json st = conductor_status();
  const json f = st.value("faults", json::object());
  EXPECT_GE(f.value("refused_heartbeat", 0), 2) << f.dump();
  EXPECT_GE(f.value("refused_job_report", 0), 1 + n) << f.dump();
  const double ttft_err = st["ttft_error"].value("mean_abs_ms", 0.0);
  EXPECT_TRUE(std::isfinite(ttft_err) && ttft_err < 600'000) << st["ttft_error"].dump();
  for (const json& i : st.value("instances", json::array())) {
    if (i.value("role", "") == "prefill") {
      EXPECT_LT(i.value("queue_ms", 0.0), 600'000) << i.dump();
    }
  }
}

}  // namespace
}  // namespace mc::sched
