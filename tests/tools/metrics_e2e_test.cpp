// /metrics on every daemon (issue 19 item 2), end to end with the real binaries on loopback:
// examples/local-cluster.sh --metrics starts a store master, a storage node, the Conductor, a prefill and a
// decode instance (sim backend), each with --metrics-listen 127.0.0.1:0, and mc-gateway (its /metrics on its HTTP
// port); the test starts an mc-xfer serve
// with one too. A small replay then sends a few requests through the cluster.
//   EveryDaemonServesItsMetrics: GET /metrics of each (cpp-httplib's client) is the Prometheus text with the
//     daemon's known metrics (the latency histograms and the cache ledger included) and non-zero request
//     counters; other paths 404, other methods 405.
//   PrometheusScrapesEveryDaemon: a real Prometheus server (Debian's `prometheus`, skipped with the reason when
//     /usr/bin/prometheus is absent; tools/install-deps.sh installs it) scrapes them every second; its HTTP
//     API then answers up == 1 for every target and a non-zero request counter.
// Every process (the cluster's process group, mc-xfer, prometheus) is stopped and every directory removed on
// the way out, also when an assertion fails.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/testkit/local_cluster.hpp"

namespace mc {
namespace MC_UNITY_ID {

using json = nlohmann::json;
using testkit::slurp;

const char* const kPrometheus = "/usr/bin/prometheus";
const char* const kTimeScale = "10";

// The value of the first sample `name` (no labels) in a Prometheus text body; -1 when absent.
double sample(const std::string& body, const std::string& name) {
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

struct Scrape {
  int status = -1;
  std::string content_type, body, error;
};
Scrape http_get(const std::string& address, const std::string& path) {
  httplib::Client c("http://" + address);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  Scrape s;
  auto res = c.Get(path);
  if (!res) {
    s.error = httplib::to_string(res.error());
    return s;
  }
  s.status = res->status;
  s.content_type = res->get_header_value("Content-Type");
  s.body = res->body;
  return s;
}

// A loopback port nobody listens on now (the kernel's pick for a socket closed at once).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

class MetricsE2E : public testkit::LocalClusterFixture {
 protected:
  MetricsE2E() : LocalClusterFixture("metrics_e2e") {}

  void SetUp() override {
    if (::access((bin() + "/mc-xfer").c_str(), X_OK) != 0) GTEST_SKIP() << bin() << "/mc-xfer is not built";
    start_cluster({"--metrics", "--gateway", "--store-nodes", "1", "--prefill", "1", "--decode", "1", "--backend",
                   "sim", "--kv-buffer-size", "64MiB", "--dram-bytes", "64MiB", "--time-scale", kTimeScale},
                  {"master", "node0", "conductor", "prefill0", "decode0", "gateway"});
    if (HasFatalFailure() || IsSkipped()) return;
    std::string state = slurp(s_.path("state"));
    state.erase(state.find_last_not_of("\n ") + 1);
    std::istringstream lines(slurp(state + "/metrics.txt"));
    std::string name, address;
    while (lines >> name >> address) metrics_[name] = address;
    for (const char* n : {"master", "node0", "conductor", "prefill0", "decode0", "gateway"}) {
      ASSERT_TRUE(metrics_.count(n)) << n << " missing from " << state << "/metrics.txt:\n"
                                     << slurp(state + "/metrics.txt");
    }
    // The targets file local-cluster.sh exports as MC_METRICS_TARGETS: one HOST:PORT a line, the same addresses.
    std::istringstream targets(slurp(state + "/metrics-targets.txt"));
    size_t n_targets = 0;
    while (targets >> address) ++n_targets;
    EXPECT_EQ(n_targets, metrics_.size());

    testkit::ChildOptions o;
    o.stderr_path = s_.path("xfer.err");
    xfer_ = std::make_unique<testkit::Child>(
        std::vector<std::string>{bin() + "/mc-xfer", "serve", "--size", "1MiB", "--listen", "tcp://127.0.0.1:0",
                                 "--metrics-listen", "127.0.0.1:0"},
        o);
    const std::string ready = xfer_->wait_line("ready ", 30'000);
    ASSERT_FALSE(ready.empty()) << "mc-xfer serve printed no ready line:\n" << slurp(s_.path("xfer.err"));
    const size_t at = ready.find(" metrics=http://");
    ASSERT_NE(at, std::string::npos) << ready;
    metrics_["xfer"] = ready.substr(at + 16, ready.find(' ', at + 1) - at - 16);
  }

  void TearDown() override {
    xfer_.reset();
    LocalClusterFixture::TearDown();
  }

  // Replays `n` requests of 3 blocks (512 tokens each) and 4 output tokens each, the blocks of request i
  // numbered from first_id + 10 i; all must complete.
  void replay(const std::string& tag, int n, uint64_t first_id = 1000) {
    {
      std::ofstream t(s_.path(tag + ".trace.jsonl"));
      for (int i = 0; i < n; ++i) {
        const uint64_t id = first_id + 10 * static_cast<uint64_t>(i);
        t << json{{"timestamp", 0}, {"input_length", 3 * 512}, {"output_length", 4}, {"hash_ids", {id, id + 1, id + 2}}}
                 .dump()
          << '\n';
      }
    }
    auto c = testkit::start_group_child(
        {bin() + "/mc-trace-replay", s_.path(tag + ".trace.jsonl"), "--conductor", endpoints_.at("conductor"), "--json",
         "--out", s_.path(tag + ".jsonl"), "--no-progress", "--time-scale", kTimeScale, "--slo-ttft-ms", "600000",
         "--slo-tbt-ms", "600000", "--drain-timeout-s", "60", "--id-prefix", tag + "-"},
        s_.path(tag + ".out"), s_.path(tag + ".err"));
    ASSERT_EQ(c->wait_exit(120'000), 0) << slurp(s_.path(tag + ".err"));
    std::ifstream in(s_.path(tag + ".jsonl"));
    std::string line;
    int completed = 0;
    while (std::getline(in, line)) completed += json::parse(line).value("outcome", "") == "completed" ? 1 : 0;
    ASSERT_EQ(completed, n) << slurp(s_.path(tag + ".jsonl"));
  }

  std::map<std::string, std::string> metrics_;  // daemon -> HOST:PORT of its /metrics
  std::unique_ptr<testkit::Child> xfer_;
};

TEST_F(MetricsE2E, EveryDaemonServesItsMetrics) {
  ASSERT_NO_FATAL_FAILURE(replay("a", 3));
  // Each daemon's known metrics; the ones counting requests must be > 0 once the replay is through (the
  // prefill's job reply, which feeds the Conductor's ledger counters, follows the last token: wait for it).
  const std::map<std::string, std::vector<std::string>> known = {
      {"master", {"mc_store_objects", "mc_store_capacity_bytes"}},
      {"node0", {"mc_store_node_dram_capacity_bytes"}},
      {"conductor",
       {"mc_conductor_submits_total", "mc_conductor_ttft_seconds_count", "mc_conductor_prompt_tokens_total",
        "mc_conductor_computed_tokens_total", "mc_conductor_hit_tokens_local_total",
        "mc_conductor_hit_tokens_remote_total", "mc_conductor_hit_tokens_ssd_total", "mc_conductor_fetch_bytes_total"}},
      {"prefill0",
       {"mc_prefill_jobs_total", "mc_prefill_queue_seconds_count", "mc_prefill_compute_seconds_count",
        "mc_prefill_prompt_tokens_total", "mc_prefill_hit_tokens_local_total", "mc_prefill_fetch_bytes_total"}},
      {"decode0", {"mc_decode_tokens_total", "mc_decode_tbt_seconds_count", "mc_decode_step_seconds_count"}},
      {"xfer", {"mc_xfer_served_reads_total", "mc_xfer_connections_accepted_total"}},
      {"gateway", {"mc_gateway_requests_total", "mc_gateway_ttft_seconds_count", "mc_gateway_active_requests"}},
  };
  // A counter of each that must reach a value: every request counted (4 output tokens: 3 gaps each).
  const std::map<std::string, std::pair<std::string, double>> at_least = {
      {"master", {"mc_store_capacity_bytes", 1}},
      {"node0", {"mc_store_node_dram_capacity_bytes", 1}},
      {"conductor", {"mc_conductor_ttft_seconds_count", 3}},
      {"prefill0", {"mc_prefill_jobs_total", 3}},
      {"decode0", {"mc_decode_tbt_seconds_count", 9}}};
  for (const auto& entry : known) {
    const std::string& daemon = entry.first;  // not a structured binding: clang 14 cannot capture one in a lambda
    const auto& names = entry.second;
    Scrape s;
    const bool all = testkit::wait_until(
        [&] {
          s = http_get(metrics_.at(daemon), "/metrics");
          if (s.status != 200) return false;
          for (const auto& n : names) {
            if (sample(s.body, n) < 0) return false;
          }
          return !at_least.count(daemon) || sample(s.body, at_least.at(daemon).first) >= at_least.at(daemon).second;
        },
        20'000, 200);
    EXPECT_TRUE(all) << daemon << " at " << metrics_.at(daemon) << ": status " << s.status << " " << s.error << "\n"
                     << s.body;
    EXPECT_EQ(s.content_type, "text/plain; version=0.0.4") << daemon;
    EXPECT_EQ(http_get(metrics_.at(daemon), "/").status, 404) << daemon;
  }
  EXPECT_EQ(sample(http_get(metrics_.at("decode0"), "/metrics").body, "mc_decode_tbt_seconds_count"), 9);
  EXPECT_EQ(sample(http_get(metrics_.at("conductor"), "/metrics").body, "mc_conductor_prompt_tokens_total"),
            3 * 3 * 512);
  httplib::Client c("http://" + metrics_.at("conductor"));
  auto post = c.Post("/metrics", "", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);

  // The first request again once the Conductor's index holds its stored blocks: its prefix (2 blocks; never the
  // one with the last token) is fetched from the store, which the fetch histogram and the hit ledger show.
  json st;
  ASSERT_TRUE(testkit::wait_until(
      [&] {
        st = conductor_status();
        return st["index"].value("holder_entries", int64_t{0}) >= 6;
      },
      40'000, 100))
      << st.dump();
  ASSERT_NO_FATAL_FAILURE(replay("b", 1));
  auto hits = [](const std::string& body, const std::string& prefix) {
    return sample(body, prefix + "_hit_tokens_local_total") + sample(body, prefix + "_hit_tokens_remote_total") +
           sample(body, prefix + "_hit_tokens_ssd_total");
  };
  Scrape pre, con;
  EXPECT_TRUE(testkit::wait_until(
      [&] {
        pre = http_get(metrics_.at("prefill0"), "/metrics");
        con = http_get(metrics_.at("conductor"), "/metrics");
        return sample(pre.body, "mc_prefill_fetch_seconds_count") >= 1 && hits(pre.body, "mc_prefill") >= 1024 &&
               hits(con.body, "mc_conductor") >= 1024 && sample(con.body, "mc_conductor_fetch_bytes_total") > 0;
      },
      20'000, 200))
      << pre.body << "\n"
      << con.body;
}

TEST_F(MetricsE2E, PrometheusScrapesEveryDaemon) {
  if (::access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " is absent: install Debian's prometheus package (tools/install-deps.sh does)";
  }
  // One scrape config, every daemon a target labelled with its name, scraped every second.
  std::ostringstream config;
  config << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
         << "scrape_configs:\n  - job_name: mc\n    static_configs:\n";
  for (const auto& [daemon, address] : metrics_) {
    config << "      - targets: ['" << address << "']\n        labels: {daemon: '" << daemon << "'}\n";
  }
  std::ofstream(s_.path("prometheus.yml")) << config.str();

  // The server, in its own process group; its TSDB in the scratch directory (removed with it). A port taken
  // between free_port() and its bind makes it exit: then another port.
  std::unique_ptr<testkit::Child> prom;
  std::string web;
  for (int attempt = 0; attempt < 3 && !prom; ++attempt) {
    web = "127.0.0.1:" + std::to_string(free_port());
    std::filesystem::remove_all(s_.path("tsdb"));
    prom = testkit::start_group_child(
        {kPrometheus, "--config.file=" + s_.path("prometheus.yml"), "--storage.tsdb.path=" + s_.path("tsdb"),
         "--web.listen-address=" + web, "--log.level=warn"},
        s_.path("prometheus.out"), s_.path("prometheus.err"));
    bool exited = false;
    const bool ready = testkit::wait_until(
        [&] { return http_get(web, "/-/ready").status == 200 || (exited = prom->wait_exit(0) != -1); }, 60'000, 200);
    if (!ready || exited) prom.reset();
  }
  ASSERT_TRUE(prom) << "prometheus did not become ready:\n" << slurp(s_.path("prometheus.err"));

  // up == 1 for every target: each was scraped and its text parsed.
  json last;
  auto query = [&](const std::string& q) {
    Scrape s = http_get(web, "/api/v1/query?query=" + q);
    last = json::parse(s.body, nullptr, false);
    std::map<std::string, double> by_daemon;
    if (last.is_discarded() || last.value("status", "") != "success") return by_daemon;
    for (const json& r : last["data"]["result"]) {
      by_daemon[r["metric"].value("daemon", "?")] = std::stod(r["value"][1].get<std::string>());
    }
    return by_daemon;
  };
  const bool all_up = testkit::wait_until(
      [&] {
        auto up = query("up");
        if (up.size() != metrics_.size()) return false;
        for (const auto& [daemon, v] : up) {
          if (v != 1) return false;
        }
        return true;
      },
      60'000, 500);
  ASSERT_TRUE(all_up) << "up: " << last.dump() << "\n" << slurp(s_.path("prometheus.err"));

  // A few requests through the cluster; then the Conductor's and the prefill's request counters, as scraped.
  ASSERT_NO_FATAL_FAILURE(replay("p", 2));
  for (const auto& row :
       std::vector<std::pair<std::string, std::string>>{{"mc_conductor_submits_total", "conductor"},
                                                        {"mc_prefill_jobs_total", "prefill0"},
                                                        {"mc_decode_requests_done_total", "decode0"}}) {
    const std::string& metric = row.first;
    const std::string& daemon = row.second;
    const bool counted = testkit::wait_until(
        [&] {
          auto v = query(metric);
          return v.count(daemon) && v.at(daemon) >= 2;
        },
        30'000, 500);
    EXPECT_TRUE(counted) << metric << ": " << last.dump();
  }
  prom->stop();
}

}  // namespace MC_UNITY_ID
}  // namespace mc
