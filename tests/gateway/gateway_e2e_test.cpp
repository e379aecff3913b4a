// mc-gateway in front of a real local cluster (examples/local-cluster.sh --gateway, sim backend): what an OpenAI
// client sees. Whole and streamed completions and chat completions with their usage (cached_tokens from the
// ledger), the SSE framing as curl receives it, every error status (400 naming the field, 404, 413, 429 with
// Retry-After on early rejection), /health, /v1/models and /metrics; and a client that disconnects mid-stream:
// the request is cancelled in the cluster and the decode instance frees its KV.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/proto/worker.hpp"
#include "mc/testkit/local_cluster.hpp"

namespace mc {
namespace {

using nlohmann::json;
using testkit::wait_until;

// A TCP connection to 127.0.0.1:port (-1 on failure).
// A TCP connection to 127.0.0.1:port (-1 on failure).
// source: the local address to connect from (any of 127.0.0.0/8; "": the kernel's choice, 127.0.0.1).
int connect_loopback(int port, const std::string& source = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    if (::inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class GatewayE2E : public testkit::LocalClusterFixture {
 protected:
  GatewayE2E() : LocalClusterFixture("gateway_e2e") {}

  void start(const std::string& time_scale, const std::string& gateway_args,
             const std::vector<std::string>& cluster_flags = {}) {
    if (::access((bin() + "/mc-gateway").c_str(), X_OK) != 0) GTEST_SKIP() << "mc-gateway is not built";
    std::vector<std::string> flags = {"--prefill",    "1",  "--decode",     "1",        "--store-nodes",  "1",
                                      "--block-size", "16", "--time-scale", time_scale, "--gateway-args", gateway_args};
    flags.insert(flags.end(), cluster_flags.begin(), cluster_flags.end());
    start_cluster(flags, {"gateway", "conductor", "decode0"});
    if (IsSkipped() || HasFatalFailure()) return;
    url_ = endpoints_.at("gateway");
    const std::string prefix = "http://";
    ASSERT_EQ(url_.rfind(prefix, 0), 0u) << url_;
    const std::string hostport = url_.substr(prefix.size());
    host_ = hostport.substr(0, hostport.rfind(':'));
    port_ = std::stoi(hostport.substr(hostport.rfind(':') + 1));
  }

  // /health answers 200 (the Conductor answers and has a live prefill and decode instance) within 30 s.
  bool healthy() {
    return wait_until(
        [&] {
          auto r = client().Get("/health");
          return r && r->status == 200;
        },
        30'000, 100);
  }

  httplib::Client client() {
    httplib::Client c(host_, port_);
    c.set_read_timeout(60, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }

  httplib::Result post(const std::string& path, const json& body) {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }

  static json body_of(const httplib::Result& r) { return json::parse(r->body, nullptr, false); }

  // A chat completion whose system prompt is long enough (3,000 tokens: about 70 ms of modelled prefill, 3.8 MB of sim
  // KV) that the Conductor fetches it from the pool rather than recompute it, even under full-suite load (a prompt of
  // 120 tokens was cheaper to recompute: scheduler.cpp plan_prefix with its refitted prefill model).
  static json long_prefix_chat() {
    return {{"model", "llama3-70b"},
            {"messages",
             {{{"role", "system"}, {"content", std::string(3000, 's')}},
              {{"role", "user"}, {"content", "What is prefill?"}}}},
            {"max_tokens", 4},
            {"ignore_eos", true}};
  }

  // The gateway's counter `name` from its /metrics (-1 when absent).
  double gateway_metric(const std::string& name) {
    auto r = client().Get("/metrics");
    if (!r || r->status != 200) return -1;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    }
    return -1;
  }

  std::string url_, host_;
  int port_ = 0;
};

TEST_F(GatewayE2E, CompletionsChatStreamsErrorsAndTheOperatorEndpoints) {
  start("20", "--max-body-bytes 64KiB --max-prompt-tokens 4000");
  if (IsSkipped() || HasFatalFailure()) return;
  // /health: the Conductor answers and has a live prefill and decode instance.
  ASSERT_TRUE(healthy()) << "gateway /health never 200";
  // Early rejection, before any request refits the Conductor's prefill model: a TTFT SLO no instance can meet is a
  // 429 with Retry-After, its message the predicted TTFT.
  auto rej = post("/v1/completions",
                  {{"model", "llama3-70b"}, {"prompt", std::string(2000, 'b')}, {"mc", {{"slo_ttft_ms", 0.01}}}});
  ASSERT_TRUE(rej);
  EXPECT_EQ(rej->status, 429) << rej->body;
  EXPECT_TRUE(rej->has_header("Retry-After"));
  EXPECT_NE(body_of(rej)["error"]["message"].get<std::string>().find("predicted TTFT"), std::string::npos) << rej->body;

  auto models = client().Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  EXPECT_EQ(body_of(models)["data"][0]["id"], "llama3-70b") << models->body;
  auto one_model = client().Get("/v1/models/llama3-70b");
  ASSERT_TRUE(one_model && one_model->status == 200);
  EXPECT_EQ(body_of(one_model)["id"], "llama3-70b") << one_model->body;
  auto no_model = client().Get("/v1/models/gpt-9");
  ASSERT_TRUE(no_model);
  EXPECT_EQ(no_model->status, 404) << no_model->body;
  EXPECT_EQ(body_of(no_model)["error"]["code"], "model_not_found") << no_model->body;
  // /health tells the cluster's shape, not the Conductor's address (the client port is anyone's).
  auto health = client().Get("/health");
  ASSERT_TRUE(health && health->status == 200);
  EXPECT_EQ(health->body.find("tcp://"), std::string::npos) << health->body;
  EXPECT_EQ(body_of(health)["prefill_instances"], 1) << health->body;
  // /tokenize and /detokenize (vLLM's shapes), byte-level here: one id per byte.
  auto tk = post("/tokenize", {{"model", "llama3-70b"}, {"prompt", "héllo"}, {"return_token_strs", true}});
  ASSERT_TRUE(tk && tk->status == 200) << (tk ? tk->body : "");
  EXPECT_EQ(body_of(tk)["count"], 6);
  EXPECT_EQ(body_of(tk)["tokens"][0], 'h');
  auto dt = post("/detokenize", {{"tokens", body_of(tk)["tokens"]}});
  ASSERT_TRUE(dt && dt->status == 200) << (dt ? dt->body : "");
  EXPECT_EQ(body_of(dt)["prompt"], "héllo");
  auto bad_dt = post("/detokenize", {{"tokens", {1, -5}}});
  ASSERT_TRUE(bad_dt);
  EXPECT_EQ(bad_dt->status, 400) << bad_dt->body;

  // A whole completion: exact prompt_tokens (bytes), max_tokens generated.
  const std::string prompt = "The KV cache is the primary object.";
  auto r =
      post("/v1/completions", {{"model", "llama3-70b"}, {"prompt", prompt}, {"max_tokens", 8}, {"ignore_eos", true}});
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  ASSERT_EQ(r->status, 200) << r->body;
  json doc = body_of(r);
  EXPECT_EQ(doc["object"], "text_completion");
  EXPECT_EQ(doc["usage"]["prompt_tokens"], static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(doc["usage"]["completion_tokens"], 8);
  EXPECT_EQ(doc["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(doc["choices"][0]["text"].get<std::string>().size(), 8u);  // sim ids: one printable character each
  // n choices: each its own cluster request, answered together.
  r = post("/v1/completions",
           {{"model", "llama3-70b"}, {"prompt", prompt}, {"max_tokens", 4}, {"n", 2}, {"ignore_eos", true}});
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  doc = body_of(r);
  ASSERT_EQ(doc["choices"].size(), 2u) << r->body;
  EXPECT_EQ(doc["choices"][1]["index"], 1);
  EXPECT_EQ(doc["usage"]["completion_tokens"], 8);

  // A chat completion; the same prompt again finds its complete blocks in the pool (cached_tokens).
  const json chat = long_prefix_chat();
  r = post("/v1/chat/completions", chat);
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  doc = body_of(r);
  EXPECT_EQ(doc["object"], "chat.completion");
  EXPECT_EQ(doc["choices"][0]["message"]["role"], "assistant");
  int64_t cached = 0;
  EXPECT_TRUE(wait_until(
      [&] {
        auto again = post("/v1/chat/completions", chat);
        if (!again || again->status != 200) return false;
        cached = body_of(again)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
        return cached > 0;
      },
      // The blocks reach the pool after the first answer (decode's store puts, then the master's KV event to the
      // Conductor's index): seconds on a loaded 2-core host.
      60'000, 200))
      << "a repeated prompt never reported cached tokens; the Conductor's decisions: "
      << conductor_status().value("decisions", json::object()).dump();
  EXPECT_EQ(cached % 16, 0) << "cached tokens are whole blocks";

  // The SSE framing as curl sees it: data: lines, a usage chunk, data: [DONE].
  const json sbody = {{"model", "llama3-70b"}, {"prompt", "stream me"}, {"max_tokens", 5},
                      {"ignore_eos", true},    {"stream", true},        {"stream_options", {{"include_usage", true}}}};
  std::ofstream(s_.path("stream.json")) << sbody.dump();
  const testkit::RunResult curl =
      testkit::run({"curl", "-sS", "-N", "--max-time", "60", "-H", "Content-Type: application/json", "--data-binary",
                    "@" + s_.path("stream.json"), url_ + "/v1/completions"},
                   90'000);
  ASSERT_EQ(curl.exit_code, 0) << curl.out;
  std::istringstream sse(curl.out);
  std::string line;
  int data_lines = 0, tokens = 0;
  bool done = false, usage = false;
  std::string finish;  // the finish_reason of the last text chunk: a stream ended by max_tokens says "length"
  while (std::getline(sse, line)) {
    if (line.empty() || line[0] == ':') continue;
    ASSERT_EQ(line.rfind("data: ", 0), 0u) << "not an SSE data line: " << line;
    ++data_lines;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    EXPECT_FALSE(done) << "data after [DONE]";
    const json chunk = json::parse(line.substr(6));
    if (chunk.contains("usage")) {
      usage = true;
      EXPECT_EQ(chunk["usage"]["completion_tokens"], 5);
      EXPECT_TRUE(chunk["choices"].empty());
    } else {
      tokens += static_cast<int>(chunk["choices"][0]["text"].get<std::string>().size());
      if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(finish, "length") << curl.out;
  EXPECT_TRUE(done) << curl.out;
  EXPECT_TRUE(usage) << curl.out;
  EXPECT_EQ(tokens, 5) << curl.out;

  // Errors in OpenAI's shape.
  auto expect_error = [&](const httplib::Result& res, int status, const std::string& param) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const json e = body_of(res);
    ASSERT_TRUE(e.contains("error")) << res->body;
    if (!param.empty()) {
      EXPECT_EQ(e["error"]["param"], param) << res->body;
    }
  };
  expect_error(post("/v1/completions", {{"model", "llama3-70b"}, {"prompt", "x"}, {"n", 17}}), 400, "n");
  expect_error(post("/v1/completions", {{"model", "gpt-9"}, {"prompt", "x"}}), 404, "model");
  expect_error(client().Get("/v1/nothing"), 404, "");
  auto wrong_method = client().Get("/v1/completions");
  expect_error(wrong_method, 405, "");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "POST");
  expect_error(post("/v1/completions", {{"model", "llama3-70b"}, {"prompt", std::string(5000, 'a')}}), 413, "prompt");
  expect_error(client().Post("/v1/completions", std::string(70 * 1024, ' '), "application/json"), 413, "");
  expect_error(client().Post("/v1/completions", "{not json", "application/json"), 400, "");
  // A bounded run of a real HTTP load generator (Debian's hey): 200 completions, 8 connections (hey sends n / c on
  // each), every one a 200.
  if (testkit::run({"hey", "-n", "1"}, 10'000).exit_code == 127) {
    ADD_FAILURE() << "hey is not installed (tools/install-deps.sh installs it)";
  } else {
    std::ofstream(s_.path("hey.json")) << json{{"model", "llama3-70b"}, {"prompt", "load"}, {"max_tokens", 2}}.dump();
    const testkit::RunResult hey =
        testkit::run({"hey", "-n", "200", "-c", "8", "-t", "60", "-m", "POST", "-T", "application/json", "-D",
                      s_.path("hey.json"), url_ + "/v1/completions"},
                     180'000);
    EXPECT_EQ(hey.exit_code, 0) << hey.out;
    EXPECT_NE(hey.out.find("[200]\t200 responses"), std::string::npos) << hey.out;
  }
  EXPECT_GE(gateway_metric("mc_gateway_requests_total"), 209);  // the body over the limit never reaches a route
  EXPECT_GE(gateway_metric("mc_gateway_rejected_total"), 1);
  EXPECT_GE(gateway_metric("mc_gateway_ttft_seconds_count"), 4);
}

TEST_F(GatewayE2E, AClientThatDisconnectsMidStreamFreesItsKvOnDecode) {
  start("1", "--heartbeat-ms 100");
  if (IsSkipped() || HasFatalFailure()) return;
  ASSERT_TRUE(healthy());
  // A long answer (4,000 decode steps of the modelled LLaMA3-70B: minutes), abandoned after its first tokens.
  const json body = {{"model", "llama3-70b"},
                     {"prompt", "a long story, please"},
                     {"max_tokens", 4000},
                     {"ignore_eos", true},
                     {"stream", true}};
  int chunks = 0;
  auto c = client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto res = c.send(req);
  EXPECT_GE(chunks, 3);
  // The decode instance held the request's KV; after the disconnect it is freed.
  auto used = [&] { return call("decode0", proto::WorkerLoadRequest{}).kv_blocks_committed; };
  EXPECT_TRUE(wait_until([&] { return used() == 0; }, 20'000, 100))
      << "decode0 still holds " << used() << " committed KV blocks after the client left";
  EXPECT_TRUE(wait_until([&] { return gateway_metric("mc_gateway_client_disconnects_total") >= 1; }, 10'000, 100));
  EXPECT_GE(gateway_metric("mc_gateway_cancels_total"), 1);
}

// The same for a whole (non-streamed) completion: the gateway has nothing to write until the answer is complete, so
// it watches the connection while it waits; a client that leaves is a disconnect, its request is cancelled and the
// decode instance frees its KV (before: the request ran to its end or --request-timeout-ms, holding the KV).
TEST_F(GatewayE2E, AClientThatLeavesAWholeCompletionFreesItsKvOnDecode) {
  start("1", "--heartbeat-ms 100");
  if (IsSkipped() || HasFatalFailure()) return;
  ASSERT_TRUE(healthy());
  const std::string body = json{
      {"model", "llama3-70b"},
      {"prompt", "a long story, please"},
      {"max_tokens", 4000},
      {"ignore_eos", true}}.dump();
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  auto used = [&] { return call("decode0", proto::WorkerLoadRequest{}).kv_blocks_committed; };
  EXPECT_TRUE(wait_until([&] { return used() > 0; }, 30'000, 50)) << "the request never reached decode0";
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return used() == 0; }, 20'000, 100))
      << "decode0 still holds " << used() << " committed KV blocks after the client left";
  EXPECT_TRUE(wait_until([&] { return gateway_metric("mc_gateway_client_disconnects_total") >= 1; }, 10'000, 100));
  EXPECT_GE(gateway_metric("mc_gateway_cancels_total"), 1);
  EXPECT_TRUE(wait_until([&] { return gateway_metric("mc_gateway_active_requests") == 0; }, 10'000, 100));
}

// The official openai npm package (tests/clients/package-lock.json, installed here with npm ci): completions and chat
// completions whole and streamed with their usage, a 429 surfacing as its RateLimitError, and an aborted stream
// whose KV the decode instance frees.
TEST_F(GatewayE2E, TheOfficialOpenAiNodeClient) {
  const testkit::RunResult node = testkit::run({"node", "--version"}, 10'000);
  if (node.exit_code != 0) GTEST_SKIP() << "node is not installed (apt-get install nodejs)";
  const std::string dir = MC_SOURCE_DIR "/tests/clients";
  const testkit::RunResult ci =
      testkit::run({"npm", "ci", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel", "error"}, 240'000);
  if (ci.exit_code != 0) GTEST_SKIP() << "npm ci in tests/clients failed (no npm, or the npm registry is unreachable)";
  start("1", "--heartbeat-ms 100");
  if (IsSkipped() || HasFatalFailure()) return;
  ASSERT_TRUE(healthy());
  auto scenario = [&](const std::string& name) {
    const testkit::RunResult r = testkit::run({"node", dir + "/openai_client.mjs", url_, "llama3-70b", name}, 120'000);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.out;
    return json::parse(r.out, nullptr, false);
  };
  const json basic = scenario("basic");
  EXPECT_EQ(basic["chat"]["completion_tokens"], 4) << basic.dump();
  const json reject = scenario("reject");
  EXPECT_EQ(reject["status"], 429) << reject.dump();
  const json abort = scenario("abort");
  EXPECT_GE(abort["aborted_after_chunks"].get<int>(), 3) << abort.dump();
  auto used = [&] { return call("decode0", proto::WorkerLoadRequest{}).kv_blocks_committed; };
  EXPECT_TRUE(wait_until([&] { return used() == 0; }, 20'000, 100))
      << "decode0 still holds " << used() << " committed KV blocks after the client aborted";
  EXPECT_TRUE(wait_until([&] { return gateway_metric("mc_gateway_client_disconnects_total") >= 1; }, 10'000, 100));
}

// A raw TCP connection to 127.0.0.1:port that sends `bytes` and reads until a reply's headers are in, the server
// closes or 2 s pass; returns what came back.
std::string raw_exchange(int port, const std::string& bytes) {
  const int fd = connect_loopback(port);
  if (fd < 0) return {};
  std::string out;
  {
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);  // no half-close: the library answers no closed peer
    pollfd p{fd, POLLIN, 0};
    char buf[4096];
    while (::poll(&p, 1, 2000) > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      if (out.find("\r\n\r\n") != std::string::npos) break;  // the status line and headers: enough
    }
  }
  ::close(fd);
  return out;
}

// mc-gateway alone (no Conductor behind it: tcp://127.0.0.1:1), for what it does before a request leaves it.
struct LoneGateway {
  // extra: more flags; log_path: its stderr there at --log-level warn (else inherited, at error).
  LoneGateway(const std::string& read_timeout_ms, const std::string& max_body_bytes,
              const std::vector<std::string>& extra = {}, const std::string& log_path = "")
      : gw(argv(read_timeout_ms, max_body_bytes, extra, log_path), options(log_path)), url(gw.wait_ready(30'000)) {
    if (url.rfind("http://127.0.0.1:", 0) == 0) port = std::stoi(url.substr(url.rfind(':') + 1));
  }
  static std::vector<std::string> argv(const std::string& read_timeout_ms, const std::string& max_body_bytes,
                                       const std::vector<std::string>& extra, const std::string& log_path) {
    std::vector<std::string> a = {bin(),
                                  "--listen",
                                  "127.0.0.1:0",
                                  "--conductor",
                                  "tcp://127.0.0.1:1",
                                  "--read-timeout-ms",
                                  read_timeout_ms,
                                  "--max-body-bytes",
                                  max_body_bytes,
                                  "--log-level",
                                  log_path.empty() ? "error" : "warn"};
    if (std::find(extra.begin(), extra.end(), "--conductor") != extra.end()) a.erase(a.begin() + 3, a.begin() + 5);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static testkit::ChildOptions options(const std::string& log_path) {
    testkit::ChildOptions o;
    o.stderr_path = log_path;
    return o;
  }
  static std::string bin() { return MC_BINARY_DIR "/bin/mc-gateway"; }
  testkit::Child gw;
  std::string url;
  int port = 0;
};

// Issue 51 item 5, on a cluster started with keys: with --api-keys every /v1/* call needs a key (401 naming the
// remedy, counted, logged with the peer), and each key's tenant has a KV namespace of its own: a prompt alice sent
// makes her next one faster (cached_tokens), never bob's, while alice's second key shares her namespace. Before,
// every gateway user shared tenant default, so cached_tokens told one user what another had sent.
TEST_F(GatewayE2E, EachApiKeyIsATenantWhosePrefixesAndCachedTokensAreItsOwn) {
  const std::string keys = s_.path("api-keys");
  const std::string alice = "sk-alice-0123456789abcdef", alice2 = "sk-alice-second-key-0000",
                    bob = "sk-bob-9876543210fedcba";
  std::ofstream(keys) << "# mc-gateway --api-keys: KEY TENANT\n"
                      << alice << " alice\n"
                      << alice2 << " alice\n"
                      << bob << " bob\n";
  ASSERT_EQ(::chmod(keys.c_str(), 0600), 0);
  start("20", "--api-keys " + keys, {"--auth"});
  if (IsSkipped() || HasFatalFailure()) return;
  ASSERT_TRUE(healthy()) << "gateway /health never 200 (it needs no key)";
  auto post_as = [&](const std::string& key, const std::string& path, const json& body) {
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    return client().Post(path.c_str(), h, body.dump(), "application/json");
  };
  const json small = {{"model", "llama3-70b"}, {"prompt", "hi"}, {"max_tokens", 2}, {"ignore_eos", true}};
  for (const auto& [key, path] : std::vector<std::pair<std::string, std::string>>{
           {"", "/v1/completions"}, {"sk-nobody-000000000000000", "/v1/completions"}, {"", "/tokenize"}}) {
    auto r = post_as(key, path, small);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path << ": " << r->body;
    EXPECT_EQ(body_of(r)["error"]["code"], "invalid_api_key") << r->body;
  }
  auto models = client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401) << models->body;
  EXPECT_GE(gateway_metric("mc_gateway_unauthorized_total"), 4);
  const std::string state = [&] {
    std::string st = testkit::slurp(s_.path("state"));
    return st.substr(0, st.find_last_not_of("\n ") + 1);
  }();
  EXPECT_NE(testkit::slurp(state + "/gateway.log").find("refused POST /v1/completions from 127.0.0.1"),
            std::string::npos)
      << testkit::slurp(state + "/gateway.log");

  // Alice's long system prompt comes back cached for her.
  const json chat = long_prefix_chat();
  auto cached_of = [&](const httplib::Result& r) -> int64_t {
    if (!r || r->status != 200) return -1;
    return body_of(r)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  auto first = post_as(alice, "/v1/chat/completions", chat);
  ASSERT_TRUE(first && first->status == 200) << (first ? first->body : httplib::to_string(first.error()));
  int64_t cached = 0;
  EXPECT_TRUE(wait_until(
      [&] {
        cached = cached_of(post_as(alice, "/v1/chat/completions", chat));
        return cached > 0;
      },
      60'000, 200))
      << "alice's repeated prompt never reported cached tokens";
  // Her second key is her tenant too.
  EXPECT_GT(cached_of(post_as(alice2, "/v1/chat/completions", chat)), 0);
  // Bob's same prompt finds nothing of hers: no hit, so no cached tokens.
  EXPECT_EQ(cached_of(post_as(bob, "/v1/chat/completions", chat)), 0);

  // An admin's replay through the gateway gives its key (mc-trace-replay --api-key); without it, it is told to.
  const std::string trace = s_.path("keyed.trace.jsonl");
  std::ofstream(trace) << R"({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1]})"
                       << "\n"
                       << R"({"timestamp": 100, "input_length": 64, "output_length": 4, "hash_ids": [2]})"
                       << "\n";
  const std::vector<std::string> replay = {bin() + "/mc-trace-replay", trace, "--target", url_,
                                           "--block-tokens",           "16",  "--json",   "--no-progress"};
  std::vector<std::string> keyed = replay;
  keyed.insert(keyed.end(), {"--api-key", bob});
  const testkit::RunResult ok = testkit::run(keyed, 120'000);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  const testkit::RunResult refused = testkit::run(replay, 60'000);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(refused.out.find("--api-key"), std::string::npos) << refused.out;
}

// 2,000 malformed or hostile HTTP requests at the gateway's port (no cluster behind it): it never crashes, answers
// each it can parse with an error, keeps its memory bounded, and still serves afterwards.
TEST(GatewayAbuse, MalformedHttpNeverCrashesTheGateway) {
  if (::access(LoneGateway::bin().c_str(), X_OK) != 0) GTEST_SKIP() << LoneGateway::bin() << " is not built";
  LoneGateway g("500", "4KiB");
  ASSERT_NE(g.port, 0) << g.url;
  testkit::Child& gw = g.gw;
  const int port = g.port;
  const std::vector<std::string> attacks = {
      "GARBAGE\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n{",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\"a\":",
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n[1]",
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
      "40\r\n\r\n{\"model\":1,\"messages\":[{\"role\":{}}]}",
      "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1\r\n" + std::string(10000, 'X') + ": y\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFF\r\nxx",
      std::string("\x00\x01\x02\xff\xfe\r\n\r\n", 9),
  };
  // 16 connections at a time (the ones the library holds for its read timeout overlap), 2,000 in all.
  std::atomic<int> answered{0}, next{0};
  std::vector<std::thread> attackers;
  for (int t = 0; t < 16; ++t) {
    attackers.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < 2000;) {
        const std::string reply = raw_exchange(port, attacks[static_cast<size_t>(i) % attacks.size()]);
        if (reply.rfind("HTTP/1.1 4", 0) == 0 || reply.rfind("HTTP/1.1 5", 0) == 0) answered.fetch_add(1);
      }
    });
  }
  for (auto& t : attackers) t.join();
  EXPECT_TRUE(gw.running());
  EXPECT_GT(answered.load(), 1900) << "every malformed request gets an error status (a few may be cut by the machine)";
  // Still serving: /health answers 503 (no Conductor behind it), a valid request a 503 with code
  // scheduler_unavailable (the Conductor's endpoint and error are the operator's: /health and the debug log).
  httplib::Client c("127.0.0.1", port);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  auto r = c.Post("/v1/completions", R"({"model":"llama3-70b","prompt":"hi"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("\"scheduler_unavailable\""), std::string::npos) << r->body;
  EXPECT_EQ(r->body.find("tcp://"), std::string::npos) << r->body;
  std::ifstream st("/proc/" + std::to_string(gw.pid()) + "/status");
  for (std::string line; std::getline(st, line);) {
    if (line.rfind("VmHWM:", 0) == 0) {
      EXPECT_LT(std::stoll(line.substr(6)), 512 * 1024) << line;  // kB
    }
  }
}

// What a security tester found on 2026-12-06, each refused with the gateway still serving: 100,000 nested
// brackets (a recursive copy of the value overflowed the stack: SIGSEGV), an 8 MiB body of empty objects or of zeros
// (500 MB parsed, held after the reply), max_tokens = INT64_MAX (prompt + max_tokens overflowed past the context
// check), and a client sending one header line every 200 ms (the read timeout was per recv(), so it held a worker
// for as long as it trickled: slowloris).
TEST(GatewayAbuse, DeepNestingHugeValueCountsOverflowAndSlowHeadersAreRefused) {
  if (::access(LoneGateway::bin().c_str(), X_OK) != 0) GTEST_SKIP() << LoneGateway::bin() << " is not built";
  LoneGateway g("1000", "8MiB");
  ASSERT_NE(g.port, 0) << g.url;
  testkit::Child& gw = g.gw;
  const int port = g.port;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto refused = [&](const std::string& body, int status, const std::string& text) {
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r) << "no answer (the gateway died?) to a body of " << body.size() << " bytes";
    EXPECT_EQ(r->status, status) << r->body.substr(0, 400);
    EXPECT_NE(r->body.find(text), std::string::npos) << r->body.substr(0, 400);
  };
  refused(R"({"model":"llama3-70b","prompt":"hi","max_tokens":)" + std::string(100000, '[') + std::string(100000, ']') +
              "}",
          400, "nested deeper than 32 levels");
  EXPECT_TRUE(gw.running());
  std::string objects = R"({"model":"llama3-70b","prompt":[)";
  while (objects.size() < (8u << 20) - 64) objects += "{},";
  refused(objects + "{}]}", 413, "JSON arrays and objects");
  std::string zeros = R"({"model":"llama3-70b","prompt":[)";
  while (zeros.size() < (8u << 20) - 64) zeros += "0,";
  refused(zeros + "0]}", 413, "JSON values");
  refused(R"({"model":"llama3-70b","prompt":"hello","max_tokens":9223372036854775807})", 400,
          "context_length_exceeded");
  refused(R"({"model":"llama3-70b","prompt":"hi","n":17})", 400, "'n' must be an integer in [1, 16]");
  refused(R"({"model":"llama3-70b","prompt":"hi","tools":[]})", 400, "'tools' is not supported");
  EXPECT_TRUE(gw.running());

  // Slowloris: the headers never end; the connection is closed at the 1 s deadline, not kept while it trickles.
  const int fd = connect_loopback(port);
  ASSERT_GE(fd, 0);
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 50 && !closed; ++i) {  // 10 s of trickling at most
    const std::string line = "X-Slow-" + std::to_string(i) + ": y\r\n";
    if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) < 0) closed = true;
    pollfd p{fd, POLLIN, 0};
    if (!closed && ::poll(&p, 1, 200) > 0) {
      char b[256];
      closed = ::recv(fd, b, sizeof b, 0) <= 0;
    }
  }
  const auto held_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_TRUE(closed) << "the gateway kept a connection whose headers never ended for " << held_ms << " ms";
  EXPECT_LT(held_ms, 6000) << "closed only after " << held_ms << " ms (deadline 1,000 ms)";
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);  // no Conductor behind it
  std::ifstream st("/proc/" + std::to_string(gw.pid()) + "/status");
  for (std::string line; std::getline(st, line);) {
    if (line.rfind("VmHWM:", 0) == 0) {
      EXPECT_LT(std::stoll(line.substr(6)), 256 * 1024) << line;  // kB: bodies of 8 MiB, not their parses
    }
  }
}

// The status line and headers of what arrives on fd within timeout_ms ("" when nothing, or the peer closed first).
std::string read_head(int fd, int timeout_ms) {
  std::string out;
  pollfd p{fd, POLLIN, 0};
  char buf[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (out.find("\r\n\r\n") == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Issue 51 item 3 at the HTTP port: one client address holds at most --max-connections-per-address of the workers (a
// further connection is answered 429 without a byte read and closed, counted, logged with the address) while
// another address is served; a slot comes back when its connection closes. Before, one address holding idle
// keep-alive connections took every worker (--max-connections), and nobody else was served.
TEST(GatewayAbuse, OneAddressHoldsAtMostItsCapOfTheWorkers) {
  if (::access(LoneGateway::bin().c_str(), X_OK) != 0) GTEST_SKIP() << LoneGateway::bin() << " is not built";
  testkit::Scratch scratch("gateway_address_cap");
  LoneGateway g("5000", "1MiB",
                {"--max-connections", "8", "--max-connections-per-address", "2", "--keep-alive-timeout-s", "60"},
                scratch.path("gateway.log"));
  ASSERT_NE(g.port, 0) << g.url;
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  // Two kept-alive connections from 127.0.0.2, each answered (so each holds a worker).
  int held[2];
  for (int& fd : held) {
    fd = connect_loopback(g.port, "127.0.0.2");
    ASSERT_GE(fd, 0) << "cannot connect from 127.0.0.2";
    ASSERT_EQ(::send(fd, health.data(), health.size(), MSG_NOSIGNAL), static_cast<ssize_t>(health.size()));
    const std::string head = read_head(fd, 10'000);
    ASSERT_EQ(head.rfind("HTTP/1.1 503", 0), 0u) << head;  // served: no Conductor behind it
  }
  // A third from 127.0.0.2 is told why and closed, before it sends a byte.
  const int third = connect_loopback(g.port, "127.0.0.2");
  ASSERT_GE(third, 0);
  const std::string refused = read_head(third, 10'000);
  ::close(third);
  EXPECT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  // 127.0.0.1 is served meanwhile.
  httplib::Client c("127.0.0.1", g.port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_NE(c.Get("/metrics")->body.find("mc_gateway_address_refused_connections_total 1"), std::string::npos);
  // One of 127.0.0.2's connections closes: its slot comes back.
  ::close(held[0]);
  EXPECT_TRUE(wait_until(
      [&] {
        const int fd = connect_loopback(g.port, "127.0.0.2");
        if (fd < 0) return false;
        (void)!::send(fd, health.data(), health.size(), MSG_NOSIGNAL);
        const std::string head = read_head(fd, 5'000);
        ::close(fd);
        return head.rfind("HTTP/1.1 503", 0) == 0;
      },
      10'000, 50))
      << "127.0.0.2 was not served again after one of its connections closed";
  ::close(held[1]);
  const std::string log = testkit::slurp(scratch.path("gateway.log"));
  EXPECT_NE(log.find("refused a connection from 127.0.0.2: it holds 2 already"), std::string::npos) << log;
}

// Issue 51 item 3, the per-identity cap: with --api-keys a tenant has at most --max-requests-per-tenant generation
// requests in flight (beyond: 429 too_many_requests with Retry-After, counted, logged with the tenant), another
// tenant's request still takes a slot, and the slot comes back when the request ends. The Conductor here is a TCP
// port that never answers, so each request holds its slot for --submit-timeout-ms, then gets 503.
TEST(GatewayAbuse, OneTenantHoldsAtMostItsCapOfTheRequestSlots) {
  if (::access(LoneGateway::bin().c_str(), X_OK) != 0) GTEST_SKIP() << LoneGateway::bin() << " is not built";
  testkit::Scratch scratch("gateway_tenant_cap");
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);  // accepts connections (the kernel's), says nothing
  ASSERT_GE(silent, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(silent, 16), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string keys = scratch.path("api-keys");
  const std::string alice = "sk-alice-0123456789abcdef", bob = "sk-bob-9876543210fedcba";
  std::ofstream(keys) << alice << " alice\n" << bob << " bob\n";
  ASSERT_EQ(::chmod(keys.c_str(), 0600), 0);
  LoneGateway g("5000", "1MiB",
                {"--conductor", "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)), "--api-keys", keys,
                 "--max-requests-per-tenant", "1", "--submit-timeout-ms", "3000"},
                scratch.path("gateway.log"));
  ASSERT_NE(g.port, 0) << g.url;
  const std::string body = R"({"model":"llama3-70b","prompt":"hi","max_tokens":2})";
  auto post_as = [&](const std::string& key) {
    httplib::Client c("127.0.0.1", g.port);
    c.set_read_timeout(30, 0);
    return c.Post("/v1/completions", {{"Authorization", "Bearer " + key}}, body, "application/json");
  };
  auto active = [&] {
    httplib::Client c("127.0.0.1", g.port);
    auto r = c.Get("/metrics");
    const std::string name = "mc_gateway_active_requests ";
    const size_t at = r ? r->body.find("\n" + name) : std::string::npos;
    return at == std::string::npos ? -1.0 : std::stod(r->body.substr(at + 1 + name.size()));
  };
  int first_status = 0, bob_status = 0;
  std::thread first([&] {
    auto r = post_as(alice);
    first_status = r ? r->status : -1;
  });
  ASSERT_TRUE(wait_until([&] { return active() == 1.0; }, 10'000, 20)) << "alice's first request never in flight";
  // Alice's second, while her first waits: refused at once, naming the cap.
  auto second = post_as(alice);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 429) << second->body;
  EXPECT_EQ(second->get_header_value("Retry-After"), "1");
  EXPECT_NE(second->body.find("\"too_many_requests\""), std::string::npos) << second->body;
  // Bob's takes a slot of his own meanwhile.
  std::thread other([&] {
    auto r = post_as(bob);
    bob_status = r ? r->status : -1;
  });
  EXPECT_TRUE(wait_until([&] { return active() == 2.0; }, 10'000, 20)) << "bob's request never in flight";
  first.join();
  other.join();
  EXPECT_EQ(first_status, 503);  // the silent Conductor: scheduler_unavailable after --submit-timeout-ms
  EXPECT_EQ(bob_status, 503);
  // Her slot came back: her next request is not refused by the cap.
  auto third = post_as(alice);
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 503) << third->body;
  ::close(silent);
  httplib::Client c("127.0.0.1", g.port);
  EXPECT_NE(c.Get("/metrics")->body.find("mc_gateway_tenant_limited_total 1"), std::string::npos);
  const std::string log = testkit::slurp(scratch.path("gateway.log"));
  EXPECT_NE(log.find("refused a request of tenant 'alice' from 127.0.0.1"), std::string::npos) << log;
}

}  // namespace
}  // namespace mc
