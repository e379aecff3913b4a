// mc-trace-replay (the real binary) against an in-process Conductor that speaks the real protocol
// (conductor.submit; token_event / request_done to the client endpoint, as mc-decode sends them) on
// loopback: records, summary, bad input, the field cases of DESIGN.md §13
// #16 and #18, and a conductor that is not running. The full cluster is covered by replay_e2e_test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"
#include "mc/replay/conductor_link.hpp"
#include "mc/report/report.hpp"
#include "mc/testkit/process.hpp"

namespace mc::replay {
namespace MC_UNITY_ID {

using json = nlohmann::json;
using namespace std::chrono_literals;

const std::string kTool = MC_BINARY_DIR "/bin/mc-trace-replay";
const std::string kTrace = MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl";
const std::string kData = MC_SOURCE_DIR "/tests/replay/data/";

// A Conductor + decode double: accepts every request (or rejects those with output_length 13), then,
// as mc-decode would, calls token_event on the client endpoint after 5 ms and every 1 ms after, then
// request_done with a ledger; `stop_after` ends early (the ledger then says how many were produced). A request
// with output_length 11 is accepted and then failed (request_error after 5 ms, as when its decode instance died).
class FakeConductor {
 public:
  explicit FakeConductor(int64_t stop_after = -1) : stop_after_(stop_after) {
    rpc::ServerOptions o;
    o.service = "mc-conductor (test double)";
    o.bind_endpoints = {"tcp://127.0.0.1:0"};
    server_ = std::move(rpc::RpcServer::bind(o)).value();
    server_->handle<proto::ConductorSubmitRequest>(
        [this](const proto::ConductorSubmitRequest& req,
               const rpc::CallContext& ctx) -> Result<proto::ConductorSubmitReply> {
          ++submits_;
          prompt_tokens_ += static_cast<int64_t>(req.tokens.size());
          proto::ConductorSubmitReply r;
          r.request_id = req.request_id;
          if (req.output_tokens == 13 || static_cast<int64_t>(req.tokens.size()) != req.input_tokens) {
            r.reject_reason = "ttft_slo";
            r.reason = "predicted TTFT 99999 ms > SLO";
            r.predicted_ttft_ms = 99999;
            return r;
          }
          r.accepted = true;
          r.prefill_id = "prefill-0";
          r.decode_id = "decode-1";
          r.predicted_ttft_ms = 4;
          r.hit_tokens = 512;
          const int64_t n = stop_after_ >= 0 ? std::min(stop_after_, req.output_tokens) : req.output_tokens;
          auto t = std::chrono::steady_clock::now() + 5ms;
          if (req.output_tokens == 11) {
            proto::RequestError err;
            err.request_id = req.request_id;
            err.code = static_cast<uint16_t>(Code::kUnavailable);
            err.message = "decode instance 'decode-1' missed its heartbeats";
            pending_.emplace(t, Pending{req.client_endpoint, std::nullopt, std::nullopt, err});
            return r;
          }
          for (int64_t i = 0; i < n; ++i) {
            proto::TokenEvent ev;
            ev.request_id = req.request_id;
            ev.index = i;
            ev.token = static_cast<uint32_t>(i);
            pending_.emplace(t + std::chrono::milliseconds(i),
                             Pending{req.client_endpoint, ev, std::nullopt, std::nullopt});
          }
          proto::RequestDone done;
          done.request_id = req.request_id;
          done.ledger.prompt_tokens = req.input_tokens;
          done.ledger.hit_tokens = 512;
          done.ledger.hit_tokens_local = 512;
          done.ledger.fetch_bytes = 600;
          done.ledger.kv_sent_bytes = 400;
          done.ledger.queue_ms = 1;
          done.ledger.output_tokens = n;
          done.ledger.decision = "fetch";
          pending_.emplace(t + std::chrono::milliseconds(n),
                           Pending{req.client_endpoint, std::nullopt, done, std::nullopt});
          (void)ctx;
          return r;
        });
    thread_ = std::thread([this] {
      while (!stop_) {
        (void)server_->poll_once(1);
        auto now = std::chrono::steady_clock::now();
        while (!pending_.empty() && pending_.begin()->first <= now) {
          Pending p = pending_.begin()->second;
          pending_.erase(pending_.begin());
          auto& client = clients_[p.endpoint];
          if (!client) {
            auto c = rpc::RpcClient::connect(p.endpoint);
            if (!c.is_ok()) continue;  // the test then fails on the missing tokens
            client = std::move(c).value();
          }
          if (p.token) (void)client->call(*p.token, 2000);
          if (p.done) (void)client->call(*p.done, 2000);
          if (p.error) (void)client->call(*p.error, 2000);
        }
      }
    });
  }
  ~FakeConductor() {
    stop_ = true;
    thread_.join();
  }
  std::string endpoint() const { return server_->endpoints().front(); }
  int submits() const { return submits_; }

 private:
  int64_t stop_after_;
  std::unique_ptr<rpc::RpcServer> server_;
  struct Pending {
    std::string endpoint;
    std::optional<proto::TokenEvent> token;
    std::optional<proto::RequestDone> done;
    std::optional<proto::RequestError> error;
  };
  std::multimap<std::chrono::steady_clock::time_point, Pending> pending_;
  std::map<std::string, std::unique_ptr<rpc::RpcClient>> clients_;
  std::atomic<bool> stop_{false};
  std::atomic<int> submits_{0};
  int64_t prompt_tokens_ = 0;
  std::thread thread_;
};

struct ToolRun {
  int rc = -1;
  std::string out, err;
  double seconds = 0;
};

// Runs the tool with `args` (and optional stdin), killing it after 60 s.
ToolRun run_tool(const std::vector<std::string>& args, const std::string& stdin_text = "") {
  static int seq = 0;
  const std::string base =
      ::testing::TempDir() + "replay_tool_" + std::to_string(::getpid()) + "_" + std::to_string(++seq);
  const std::string in_path = base + ".in", out_path = base + ".out", err_path = base + ".err";
  std::ofstream(in_path) << stdin_text;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> argv = {kTool};
  argv.insert(argv.end(), args.begin(), args.end());
  testkit::ChildOptions options;
  options.stdin_path = in_path;
  options.stdout_path = out_path;
  options.stderr_path = err_path;
  ToolRun r;
  {
    testkit::Child child(argv, options);
    r.rc = child.wait_exit(60'000);
    if (r.rc >= 128) r.rc = -1;  // killed by a signal
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::stringstream o, e;
  o << std::ifstream(out_path).rdbuf();
  e << std::ifstream(err_path).rdbuf();
  r.out = o.str();
  r.err = e.str();
  std::filesystem::remove(in_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  return r;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name) : path(::testing::TempDir() + name + "_" + std::to_string(::getpid())) {}
  ~TempFile() { std::filesystem::remove(path); }
};

// --max-input-tokens cuts each prompt to its first N tokens (the fake Conductor refuses a submit whose tokens
// and input_tokens disagree, so the cut is consistent); a negative cap is bad usage.
TEST(ReplayTool, MaxInputTokensCutsEveryPrompt) {
  FakeConductor conductor;
  TempFile out("cut.jsonl");
  ToolRun r = run_tool({kTrace, "--conductor", conductor.endpoint(), "--max-requests", "20", "--speed", "200",
                        "--max-output-tokens", "4", "--max-input-tokens", "1000", "--out", out.path, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  auto recs = read_jsonl(out.path);
  ASSERT_EQ(recs.size(), 20u);
  int64_t cut = 0;
  for (const json& j : recs) {
    ASSERT_EQ(j["outcome"], "completed") << j.dump();
    EXPECT_LE(j["ledger"]["prompt_tokens"].get<int64_t>(), 1000) << j.dump();
    if (j["ledger"]["prompt_tokens"].get<int64_t>() == 1000) ++cut;
  }
  EXPECT_GT(cut, 0);  // the trace has longer prompts: they were cut
  ToolRun bad = run_tool({kTrace, "--conductor", conductor.endpoint(), "--max-input-tokens", "-1"});
  EXPECT_EQ(bad.rc, 2) << bad.err << bad.out;
}

TEST(ReplayTool, FiftyRequestsRecordsAgreeWithSummary) {
  FakeConductor conductor;
  TempFile out("records.jsonl");
  ToolRun r = run_tool({kTrace, "--conductor", conductor.endpoint(), "--max-requests", "50", "--speed", "200",
                        "--max-output-tokens", "8", "--out", out.path, "--json", "--id-prefix", "t-"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  json s = json::parse(r.out);
  auto recs = read_jsonl(out.path);
  ASSERT_EQ(recs.size(), 50u);
  EXPECT_EQ(s["requests"]["offered"], 50);
  int completed = 0;
  int64_t prompt = 0;
  for (const json& j : recs) {
    ASSERT_TRUE(record_from_json(j).is_ok()) << j.dump();
    if (j["outcome"] == "completed") {
      ++completed;
      EXPECT_EQ(j["output_tokens"], std::min<int64_t>(8, j["output_tokens_requested"].get<int64_t>()));
      EXPECT_EQ(j["output_tokens_source"], "usage");
      EXPECT_TRUE(j.contains("ttft_ms"));
      EXPECT_EQ(j["prefill_instance"], "prefill-0");
      EXPECT_EQ(j["ledger"]["decision"], "fetch");
      EXPECT_EQ(j["ledger"]["predicted_ttft_ms"], 4.0);
      EXPECT_EQ(j["ledger"]["transfer_bytes"], 1000);
      EXPECT_EQ(j["ledger"]["avoided_prefill_tokens"], 512);
      prompt += j["ledger"]["prompt_tokens"].get<int64_t>();
    } else {
      EXPECT_EQ(j["outcome"], "rejected");
      EXPECT_FALSE(j["reason"].get<std::string>().empty());
    }
  }
  EXPECT_EQ(s["requests"]["completed"], completed);
  EXPECT_EQ(s["requests"]["completed"].get<int>() + s["requests"]["rejected"].get<int>(), 50);
  EXPECT_EQ(s["cache"]["prompt_tokens"], prompt);
  EXPECT_EQ(s["ttft_ms"]["count"], completed);
  EXPECT_EQ(conductor.submits(), 50);
  // The report subcommand re-computes the same summary from the records.
  ToolRun rep = run_tool({"report", out.path, "--json"});
  ASSERT_EQ(rep.rc, 0) << rep.err;
  json s2 = json::parse(rep.out);
  for (const char* k : {"requests", "ttft_ms", "tbt_ms", "tpot_ms", "e2e_ms", "slo", "cache", "prediction"}) {
    if (std::string(k) == "requests") {
      for (const char* c : {"offered", "accepted", "rejected", "completed", "failed", "late_sends"})
        EXPECT_EQ(s2[k][c], s[k][c]) << c;
    } else if (std::string(k) == "slo") {
      for (size_t i = 0; i < s[k].size(); ++i) EXPECT_EQ(s2[k][i]["met"], s[k][i]["met"]);
    } else {
      EXPECT_EQ(s2[k], s[k]) << k;
    }
  }
  // The table names units in its headers.
  ToolRun table = run_tool({"report", out.path});
  EXPECT_NE(table.out.find("mean_ms"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("hit_%"), std::string::npos);
  // Several files: one comparison row per run, labelled by the file's stem.
  TempFile copy("other.jsonl");
  std::filesystem::copy_file(out.path, copy.path);
  ToolRun cmp = run_tool({"report", out.path, copy.path});
  ASSERT_EQ(cmp.rc, 0) << cmp.err;
  EXPECT_NE(cmp.out.find("ttft_p90_ms"), std::string::npos) << cmp.out;
  EXPECT_NE(cmp.out.find("slo_30000ms/100ms_%"), std::string::npos) << cmp.out;
  EXPECT_NE(cmp.out.find("\nrecords "), std::string::npos) << cmp.out;
  EXPECT_NE(cmp.out.find("\nother "), std::string::npos) << cmp.out;
  ToolRun cmpj = run_tool({"report", out.path, copy.path, "--json"});
  ASSERT_EQ(cmpj.rc, 0);
  json arr = json::parse(cmpj.out);
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[1]["requests"], s["requests"]);
}

// Issue 17 item 6: a run in which an accepted request failed exits 1 after its summary (naming the count and the
// reason), and so does one in which a request was lost (no terminal event by the drain timeout: the conductor
// accepts, nobody answers); --allow-failures exits 0 with the same summary. Rejections alone exit 0.
TEST(ReplayTool, ExitsOneWhenAcceptedRequestsFail) {
  FakeConductor conductor;
  TempFile trace("fail.jsonl");
  std::ofstream(trace.path) << R"({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]})"
                            << "\n"
                            << R"({"timestamp": 1, "input_length": 600, "output_length": 11, "hash_ids": [2, 3]})"
                            << "\n"
                            << R"({"timestamp": 2, "input_length": 600, "output_length": 13, "hash_ids": [4, 5]})"
                            << "\n";
  ToolRun failed = run_tool({trace.path, "--conductor", conductor.endpoint(), "--json"});
  EXPECT_EQ(failed.rc, 1) << failed.err;
  EXPECT_NE(failed.err.find("1 of 2 accepted requests failed"), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find("decode-1"), std::string::npos) << failed.err;
  json s = json::parse(failed.out, nullptr, false);  // the summary is still printed
  ASSERT_FALSE(s.is_discarded()) << failed.out;
  EXPECT_EQ(s["requests"]["failed"], 1);
  EXPECT_EQ(s["requests"]["rejected"], 1);
  ToolRun allowed = run_tool({trace.path, "--conductor", conductor.endpoint(), "--json", "--allow-failures"});
  EXPECT_EQ(allowed.rc, 0) << allowed.err;
  EXPECT_EQ(json::parse(allowed.out, nullptr, false)["requests"]["failed"], 1);

  // Lost: a conductor that accepts and never answers again.
  rpc::ServerOptions o;
  o.bind_endpoints = {"tcp://127.0.0.1:0"};
  auto silent = std::move(rpc::RpcServer::bind(o)).value();
  silent->handle<proto::ConductorSubmitRequest>(
      [](const proto::ConductorSubmitRequest& req, const rpc::CallContext&) -> Result<proto::ConductorSubmitReply> {
        proto::ConductorSubmitReply r;
        r.request_id = req.request_id;
        r.accepted = true;
        return r;
      });
  std::atomic<bool> stop{false};
  std::thread serving([&] {
    while (!stop) (void)silent->poll_once(5);
  });
  ToolRun lost = run_tool(
      {trace.path, "--conductor", silent->endpoints().front(), "--max-requests", "1", "--drain-timeout-s", "0.5"});
  stop = true;
  serving.join();
  EXPECT_EQ(lost.rc, 1) << lost.err;
  EXPECT_NE(lost.err.find("(1 lost"), std::string::npos) << lost.err;
  EXPECT_NE(lost.out.find("lost=1"), std::string::npos) << lost.out;

  // Submits that fail before any answer (a Conductor going down answers errors, or nothing): those requests were
  // never accepted (the report's submit_failed, not its accepted), and the run still exits 1.
  auto failing = std::move(rpc::RpcServer::bind(o)).value();
  failing->handle<proto::ConductorSubmitRequest>(
      [](const proto::ConductorSubmitRequest&, const rpc::CallContext&) -> Result<proto::ConductorSubmitReply> {
        return error(Code::kUnavailable, "mc-conductor: shutting down");
      });
  stop = false;
  std::thread serving_errors([&] {
    while (!stop) (void)failing->poll_once(5);
  });
  TempFile records("submit_failed.jsonl");
  ToolRun unanswered = run_tool({trace.path, "--conductor", failing->endpoints().front(), "--max-requests", "2",
                                 "--json", "--out", records.path, "--drain-timeout-s", "5"});
  stop = true;
  serving_errors.join();
  EXPECT_EQ(unanswered.rc, 1) << unanswered.err;
  EXPECT_NE(unanswered.err.find("2 submits failed before any answer"), std::string::npos) << unanswered.err;
  json u = json::parse(unanswered.out, nullptr, false);
  ASSERT_FALSE(u.is_discarded()) << unanswered.out;
  EXPECT_EQ(u["requests"]["offered"], 2);
  EXPECT_EQ(u["requests"]["accepted"], 0);
  EXPECT_EQ(u["requests"]["failed"], 2);
  EXPECT_EQ(u["requests"]["submit_failed"], 2);
  for (const json& r : read_jsonl(records.path)) {
    EXPECT_EQ(r["outcome"], "failed") << r.dump();
    EXPECT_EQ(r["accepted"], false) << r.dump();
  }
  // The report of those records says the same.
  ToolRun rep = run_tool({"report", records.path, "--json"});
  ASSERT_EQ(rep.rc, 0) << rep.err;
  EXPECT_EQ(json::parse(rep.out)["requests"]["submit_failed"], 2);
  EXPECT_EQ(json::parse(rep.out)["requests"]["accepted"], 0);
}

// Field report #16: 128 tokens requested, the server stops after 7 and says so in "done".
TEST(ReplayTool, EarlyStopReportsProducedTokens) {
  FakeConductor conductor(/*stop_after=*/7);
  TempFile trace("one.jsonl"), out("r16.jsonl");
  std::ofstream(trace.path) << R"({"timestamp": 0, "input_length": 600, "output_length": 128, "hash_ids": [0, 1]})"
                            << "\n";
  ToolRun r =
      run_tool({trace.path, "--conductor", conductor.endpoint(), "--out", out.path, "--json", "--record-token-ids"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto recs = read_jsonl(out.path);
  ASSERT_EQ(recs.size(), 1u);
  const json& j = recs[0];
  EXPECT_EQ(j["output_tokens_requested"], 128);
  EXPECT_EQ(j["output_tokens"], 7);
  EXPECT_NEAR(j["tpot_ms"].get<double>(), (j["e2e_ms"].get<double>() - j["ttft_ms"].get<double>()) / 6, 1e-9);
  EXPECT_EQ(j["tbt_gaps"], 6);
  EXPECT_EQ(j["output_token_ids"], json({0, 1, 2, 3, 4, 5, 6}));
  json s = json::parse(r.out);
  EXPECT_EQ(s["output_tokens"]["produced"], 7);
  EXPECT_EQ(s["output_tokens"]["requested"], 128);
}

// Field report #18 through the tool: strict names line 2 and exits 2; lenient replays lines 1 and 6.
TEST(ReplayTool, MalformedTraceStrictAndLenient) {
  FakeConductor conductor;
  TempFile trace("bad.jsonl");
  std::ofstream(trace.path) << "\xEF\xBB\xBF"
                            << R"({"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]})"
                            << "\r\n"
                            << R"({"timestamp": 0, "input_length": 17448, "output_length":2748 610, "hash_ids": []})"
                            << "\r\n\r\n"
                            << R"({"timestamp": 0, "input_length": 512, "output_length": 1})"
                            << "\r\n"
                            << R"({"timestamp": 0, "input_length": 512.5, "output_length": 1, "hash_ids": [0]})"
                            << "\r\n"
                            << R"({"timestamp": 3000, "input_length": 512, "output_length": 5, "hash_ids": [0]})";
  ToolRun strict = run_tool({trace.path, "--conductor", conductor.endpoint()});
  EXPECT_EQ(strict.rc, 2);
  EXPECT_NE(strict.err.find(":2:"), std::string::npos) << strict.err;
  EXPECT_EQ(conductor.submits(), 0);
  TempFile out("r18.jsonl");
  ToolRun lenient = run_tool(
      {trace.path, "--lenient", "--conductor", conductor.endpoint(), "--speed", "100", "--json", "--out", out.path});
  ASSERT_EQ(lenient.rc, 0) << lenient.err;
  json s = json::parse(lenient.out);
  EXPECT_EQ(s["requests"]["offered"], 2);
  EXPECT_EQ(s["config"]["skipped_rows"], "3");
  auto recs = read_jsonl(out.path);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0]["trace_line"], 1);
  EXPECT_EQ(recs[1]["trace_line"], 6);
  EXPECT_EQ(recs[0]["output_tokens_requested"], 10);  // never 2748, 610 or 2748610
  EXPECT_NE(lenient.err.find("3 rows skipped"), std::string::npos) << lenient.err;
  // Line 6 arrives 3.0 s of trace after line 1: scheduled 30 ms after the start at --speed 100, and an
  // open-loop replay never sends early (late is allowed and counted).
  EXPECT_GE(recs[1]["submit_ms"].get<double>(), 29.9);
}

TEST(ReplayTool, EmptyAndSingleRequestTraces) {
  FakeConductor conductor;
  ToolRun empty = run_tool({"-", "--conductor", conductor.endpoint(), "--json"}, "");
  EXPECT_EQ(empty.rc, 2);
  EXPECT_NE(empty.err.find("no request to replay"), std::string::npos) << empty.err;
  EXPECT_EQ(json::parse(empty.out)["error"]["code"], "invalid_argument");
  ToolRun one = run_tool({"-", "--conductor", conductor.endpoint(), "--json"},
                         R"({"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [42]})"
                         "\n");
  ASSERT_EQ(one.rc, 0) << one.err;
  json s = json::parse(one.out);
  EXPECT_EQ(s["requests"]["offered"], 1);
  EXPECT_EQ(s["requests"]["completed"], 1);
  EXPECT_EQ(s["tpot_ms"]["count"], 1);
  ToolRun rejected = run_tool({"-", "--conductor", conductor.endpoint(), "--json"},
                              R"({"timestamp": 0, "input_length": 100, "output_length": 13, "hash_ids": [42]})"
                              "\n");
  ASSERT_EQ(rejected.rc, 0) << rejected.err;
  json sr = json::parse(rejected.out);
  EXPECT_EQ(sr["requests"]["rejected"], 1);
  EXPECT_EQ(sr["reasons"].begin().key(), "ttft_slo: predicted TTFT 99999 ms > SLO");
}

TEST(ReplayTool, ConductorNotRunning) {
  // A port that was just free: bind, read the port, close.
  std::string endpoint;
  {
    rpc::ServerOptions o;
    o.bind_endpoints = {"tcp://127.0.0.1:0"};
    auto s = rpc::RpcServer::bind(o);
    ASSERT_TRUE(s.is_ok());
    endpoint = (*s)->endpoints().front();
  }
  ToolRun r = run_tool({kTrace, "--conductor", endpoint, "--max-requests", "3", "--connect-timeout-ms", "500"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cannot reach the conductor"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(endpoint), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 5.0);  // the connect timeout (0.5 s) plus start-up, not the submit or drain timeouts
  ToolRun usage = run_tool({kTrace, "--max-requests", "3"});
  EXPECT_EQ(usage.rc, 2);
  EXPECT_NE(usage.err.find("--conductor"), std::string::npos);
}

TEST(ReplayTool, AnalyzeCommand) {
  ToolRun r = run_tool({"analyze", kTrace, "--max-requests", "50", "--json", "--capacity-tokens", "1M,3M"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json a = json::parse(r.out);
  EXPECT_EQ(a["requests"], 50);
  EXPECT_EQ(a["lru"].size(), 2u);
  EXPECT_EQ(a["lru"][1]["capacity_tokens"], 3000000);
  ToolRun bad = run_tool({"analyze", kTrace, "--capacity-tokens", "lots"});
  EXPECT_EQ(bad.rc, 2);
  ToolRun missing = run_tool({"analyze", "/nonexistent/trace.jsonl"});
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("/nonexistent/trace.jsonl"), std::string::npos);
}

// Issue 23, trace formats: analyze reads the CSV traces (Azure, BurstGPT) through the one reader, detected from the
// header; rows without ids share nothing unless a prefix model gives them ids.
TEST(ReplayTool, AnalyzeCsvTraces) {
  ToolRun azure = run_tool({"analyze", kData + "azure_sample.csv", "--json"});
  ASSERT_EQ(azure.rc, 0) << azure.err;
  json a = json::parse(azure.out);
  EXPECT_EQ(a["requests"], 60);
  EXPECT_EQ(a["config"]["format"], "azure (detected)");
  EXPECT_EQ(a["config"]["timestamps"], "dates and times (UTC)");
  EXPECT_EQ(a["config"]["epoch_start"], "2023-11-16T18:15:46.680Z (shifted to 0)");
  EXPECT_EQ(a["config"]["synthesized_rows"], "60");
  EXPECT_EQ(a["first_timestamp_s"], 0.0);
  EXPECT_EQ(a["infinite_cache"]["hit_ratio_blocks"], 0.0);                        // unique ids: no reuse
  EXPECT_NE(azure.err.find("azure (detected)"), std::string::npos) << azure.err;  // said on stderr too
  ToolRun chat = run_tool({"analyze", kData + "azure_sample.csv", "--json", "--synthesize-prefixes", "chat"});
  ASSERT_EQ(chat.rc, 0) << chat.err;
  EXPECT_GT(json::parse(chat.out)["infinite_cache"]["hit_ratio_blocks"].get<double>(), 0.1);
  ToolRun burst = run_tool({"analyze", kData + "burstgpt_sample.csv", "--format", "burstgpt"});
  ASSERT_EQ(burst.rc, 0) << burst.err;
  EXPECT_NE(burst.out.find("format=burstgpt"), std::string::npos) << burst.out;
  EXPECT_NE(burst.out.find("timestamp_unit=s"), std::string::npos) << burst.out;
  ToolRun bad_model = run_tool({"analyze", kData + "azure_sample.csv", "--synthesize-prefixes", "chat:continue=3"});
  EXPECT_EQ(bad_model.rc, 2);
  EXPECT_NE(bad_model.err.find("continue=3"), std::string::npos) << bad_model.err;
  ToolRun wrong = run_tool({"analyze", kData + "azure_sample.csv", "--format", "burstgpt"});
  EXPECT_EQ(wrong.rc, 2);
  EXPECT_NE(wrong.err.find("azure_sample.csv:1: the burstgpt CSV header lacks column \"Request tokens\""),
            std::string::npos)
      << wrong.err;
}

// A Mooncake trace with nanosecond epoch timestamps (numbers and strings): detected by magnitude, shifted to 0, it
// is analyzed exactly as the ms original.
TEST(ReplayTool, AnalyzeNanosecondTrace) {
  ToolRun ns = run_tool({"analyze", kData + "conversation_ns.jsonl", "--json"});
  ASSERT_EQ(ns.rc, 0) << ns.err;
  ToolRun ms = run_tool({"analyze", kTrace, "--max-requests", "60", "--json"});
  ASSERT_EQ(ms.rc, 0) << ms.err;
  json a = json::parse(ns.out), b = json::parse(ms.out);
  EXPECT_EQ(a["config"]["timestamp_unit"], "ns (detected by magnitude)");
  EXPECT_EQ(a["config"]["epoch_start"], "2023-11-14T22:13:20.000Z (shifted to 0)");
  EXPECT_NE(ns.err.find("ns (detected by magnitude)"), std::string::npos) << ns.err;
  for (const char* k : {"requests", "span_s", "total_blocks", "distinct_blocks", "infinite_cache",
                        "infinite_cache_earlier_arrivals", "lru"})
    EXPECT_EQ(a[k], b[k]) << k;
  // Named as ms, the same numbers are past 2^63 ns: the message names the file, the line and the field.
  ToolRun as_ms = run_tool({"analyze", kData + "conversation_ns.jsonl", "--timestamp-unit", "ms"});
  EXPECT_EQ(as_ms.rc, 2);
  EXPECT_NE(as_ms.err.find("conversation_ns.jsonl:1: \"timestamp\" is too large"), std::string::npos) << as_ms.err;
}

// Lenient block accounting through the tool: strict names the line and the field; lenient re-cuts and counts.
TEST(ReplayTool, BlockAccounting) {
  const std::string text = R"({"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2, 3]})"
                           "\n"
                           R"({"timestamp": 5, "input_length": 900, "output_length": 3, "hash_ids": [1, 2]})"
                           "\n";
  ToolRun strict = run_tool({"analyze", "-"}, text);
  EXPECT_EQ(strict.rc, 2);
  EXPECT_NE(strict.err.find("<stdin>:1: input_length 1000 needs ceil(1000/512) = 2 hash_ids, the row has 3"),
            std::string::npos)
      << strict.err;
  ToolRun lenient = run_tool({"analyze", "-", "--block-accounting", "lenient", "--json"}, text);
  ASSERT_EQ(lenient.rc, 0) << lenient.err;
  json a = json::parse(lenient.out);
  EXPECT_EQ(a["config"]["reblocked_rows"], "1");
  EXPECT_EQ(a["total_blocks"], 4);
  // The second row has one id per block already: kept as it is. Two equal rows re-cut into equal blocks.
  ToolRun same = run_tool(
      {"analyze", "-", "--block-accounting", "lenient", "--json"},
      std::string(R"({"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2, 3]})") + "\n" +
          R"({"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2, 3]})" + "\n");
  ASSERT_EQ(same.rc, 0) << same.err;
  EXPECT_EQ(json::parse(same.out)["infinite_cache"]["hit_ratio_blocks"], 0.5);
}

// convert writes any accepted format as Mooncake JSONL: analyze of the converted file gives the numbers of the
// original (ids and timestamps carried over exactly), and the JSONL original converts to itself.
TEST(ReplayTool, ConvertThenAnalyze) {
  TempFile out("converted.jsonl");
  ToolRun conv = run_tool({"convert", kData + "azure_sample.csv", "--synthesize-prefixes", "chat", "--out", out.path});
  ASSERT_EQ(conv.rc, 0) << conv.err;
  EXPECT_NE(conv.err.find("converted 60 rows"), std::string::npos) << conv.err;
  ToolRun direct = run_tool({"analyze", kData + "azure_sample.csv", "--synthesize-prefixes", "chat", "--json"});
  ToolRun via = run_tool({"analyze", out.path, "--json"});
  ASSERT_EQ(direct.rc, 0) << direct.err;
  ASSERT_EQ(via.rc, 0) << via.err;
  json a = json::parse(direct.out), b = json::parse(via.out);
  for (const char* k : {"requests", "span_s", "input_tokens", "output_tokens", "total_blocks", "distinct_blocks",
                        "infinite_cache", "lru"})
    EXPECT_EQ(a[k], b[k]) << k;
  // The ns trace converts to the ms original's rows.
  ToolRun ns = run_tool({"convert", kData + "conversation_ns.jsonl"});
  ASSERT_EQ(ns.rc, 0) << ns.err;
  std::istringstream got(ns.out);
  std::ifstream want(kTrace);
  std::string g, w;
  int n = 0;
  while (std::getline(got, g) && std::getline(want, w)) {
    json jg = json::parse(g), jw = json::parse(w);
    EXPECT_EQ(jg, jw) << n;
    ++n;
  }
  EXPECT_EQ(n, 60);
  // The window flags cut what is converted.
  ToolRun cut = run_tool({"convert", kTrace, "--max-requests", "5"});
  ASSERT_EQ(cut.rc, 0) << cut.err;
  EXPECT_EQ(std::count(cut.out.begin(), cut.out.end(), '\n'), 5);
  // Converting a file onto itself is refused before anything is truncated (an attacker's or a slip's).
  auto read_all = [](const std::string& path) {
    std::ostringstream text;
    text << std::ifstream(path).rdbuf();
    return text.str();
  };
  const std::string before = read_all(out.path);
  ToolRun self = run_tool({"convert", out.path, "--out", out.path});
  EXPECT_EQ(self.rc, 2) << self.err;
  EXPECT_NE(self.err.find("is the input trace"), std::string::npos) << self.err;
  EXPECT_EQ(read_all(out.path), before);
}

// gen refuses arrivals no trace can carry (a tiny rate over many sessions) instead of writing negative timestamps.
TEST(ReplayTool, GenRefusesArrivalsPastTheTimestampRange) {
  ToolRun g = run_tool({"gen", "--sessions", "3", "--session-rate", "1e-300", "--seed", "1"});
  EXPECT_EQ(g.rc, 2) << g.err;
  EXPECT_NE(g.err.find("raise --session-rate"), std::string::npos) << g.err;
  EXPECT_EQ(g.out.find("-9223372036854775808"), std::string::npos) << g.out;
}

// A seed no 64-bit unsigned holds is a usage error naming the flag, never a silent 2^64 - 1 (the CLI kit's check,
// through the binary); mc-sim takes its seed override the same way.
TEST(ReplayTool, GenRefusesASeedPast64Bits) {
  for (const char* seed : {"-1", "18446744073709551616"}) {
    ToolRun g = run_tool({"gen", "--sessions", "2", "--seed", seed});
    EXPECT_EQ(g.rc, 2) << seed << ": " << g.err;
    EXPECT_NE(g.err.find("--seed"), std::string::npos) << g.err;
    EXPECT_TRUE(g.out.empty()) << g.out;
  }
  ToolRun ok = run_tool({"gen", "--sessions", "2", "--seed", "18446744073709551615"});
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.err.find("seed 18446744073709551615"), std::string::npos) << ok.err;
}

// gen writes a session trace, the same for the same seed, which analyze (and every trace reader) accepts.
TEST(ReplayTool, GenThenAnalyze) {
  ToolRun a = run_tool({"gen", "--sessions", "30", "--seed", "5", "--block-size", "512"});
  ToolRun b = run_tool({"gen", "--sessions", "30", "--seed", "5", "--block-size", "512"});
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("30 sessions"), std::string::npos) << a.err;
  ToolRun an = run_tool({"analyze", "-", "--json"}, a.out);
  ASSERT_EQ(an.rc, 0) << an.err;
  json j = json::parse(an.out);
  EXPECT_GE(j["requests"].get<int64_t>(), 30);
  EXPECT_GT(j["infinite_cache"]["hit_ratio_blocks"].get<double>(), 0.3);
  ToolRun bad = run_tool({"gen", "--arrival", "uniform"});
  EXPECT_EQ(bad.rc, 2);
  ToolRun bad2 = run_tool({"gen", "--turns-mean", "0"});
  EXPECT_EQ(bad2.rc, 2);
  EXPECT_NE(bad2.err.find("--turns-mean"), std::string::npos) << bad2.err;
}

// gen --max-input-tokens as its man page says: a first prompt is cut to it (every session writes a row), a longer
// later prompt ends the session.
TEST(ReplayTool, GenCutsFirstPromptsToMaxInputTokens) {
  ToolRun g = run_tool({"gen", "--sessions", "20", "--turns-mean", "5", "--system-tokens", "1024", "--max-input-tokens",
                        "100", "--block-size", "16", "--seed", "3"});
  ASSERT_EQ(g.rc, 0) << g.err;
  std::istringstream rows(g.out);
  int64_t n = 0;
  for (std::string line; std::getline(rows, line);) {
    if (line.empty()) continue;
    EXPECT_EQ(json::parse(line)["input_length"].get<int64_t>(), 100) << line;
    ++n;
  }
  EXPECT_EQ(n, 20);
}

TEST(ReplayTool, ConductorEventsMapOntoTheRecord) {
  proto::RequestLedger l;  // times -1: never measured
  Ledger g = to_ledger(l);
  EXPECT_FALSE(g.transfer_ms);
  EXPECT_FALSE(g.queue_ms);
  EXPECT_FALSE(g.prefill_ms);
  EXPECT_FALSE(g.decision);
  EXPECT_EQ(g.hit_tokens_ssd, 0);  // the SSD tier is reported like the other two
  l.queue_ms = 0;                  // measured 0 stays 0
  l.fetch_ms = 3;
  l.kv_tail_ms = 2;
  l.hit_tokens = 1024;
  l.fetch_bytes = 10;
  l.kv_sent_bytes = 5;
  l.hit_tokens_remote = 512;
  l.hit_tokens_ssd = 512;
  g = to_ledger(l);
  EXPECT_EQ(*g.hit_tokens_remote, 512);
  EXPECT_EQ(*g.hit_tokens_ssd, 512);
  EXPECT_EQ(*g.queue_ms, 0.0);
  EXPECT_EQ(*g.transfer_ms, 5.0);
  EXPECT_EQ(*g.avoided_prefill_tokens, 1024);
  EXPECT_EQ(*g.transfer_bytes, 15);
  proto::RequestDone done;
  EXPECT_FALSE(to_done_report(done).output_tokens);  // no count sent: the replay counts and flags
  done.ledger.output_tokens = 7;
  EXPECT_EQ(*to_done_report(done).output_tokens, 7);
  proto::ConductorSubmitReply rej;
  rej.reject_reason = "kv_capacity";
  rej.reason = "decode-0 has 12 free blocks, needs 40";
  Admission a = to_admission(rej);
  EXPECT_FALSE(a.accepted);
  EXPECT_FALSE(a.predicted_tbt_ms);  // a rejection predicts no TBT
  EXPECT_EQ(a.reason, "kv_capacity: decode-0 has 12 free blocks, needs 40");
  Submission sub;
  sub.request_id = "x";
  sub.tokens = {1, 2, 3};
  sub.output_length_tokens = 9;
  auto req = to_submit_request(sub, 16);
  EXPECT_EQ(req.input_tokens, 3);
  EXPECT_EQ(req.block_size_tokens, 16);
  EXPECT_EQ(req.output_tokens, 9);
  sub.client_endpoint = "tcp://127.0.0.1:5";
  EXPECT_EQ(to_submit_request(sub, 0).client_endpoint, "tcp://127.0.0.1:5");
  EXPECT_TRUE(req.lora_name.empty() && req.lora_version.empty() && req.salt.empty());
  // The row's key scope goes with the request.
  trace::Request row;
  row.hash_ids = {4};
  row.scope = {"sql", "2", "tenant-7"};
  sub.row = &row;
  auto scoped = to_submit_request(sub, 16);
  EXPECT_EQ(scoped.hash_ids, row.hash_ids);
  EXPECT_EQ(scoped.lora_name, "sql");
  EXPECT_EQ(scoped.lora_version, "2");
  EXPECT_EQ(scoped.salt, "tenant-7");
}

}  // namespace MC_UNITY_ID
}  // namespace mc::replay
