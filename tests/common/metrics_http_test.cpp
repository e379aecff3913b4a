// The /metrics exporter (mc/net/metrics_http.hpp) over real loopback HTTP with cpp-httplib's client: the
// Prometheus text of a registry with its content type, the refresh callback before each render, 404 for other
// paths, 405 for other methods, 413/414 for oversized requests, bind failures and the loopback rule, the
// address grammar, and --metrics-listen's parse-time check (exit 2).
#include "mc/net/metrics_http.hpp"

#include "mc/cli/cli.hpp"
#include "mc/net/flags.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "mc/cli/cli.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/flags.hpp"

namespace mc::metrics {
namespace {

std::unique_ptr<HttpExporter> start_or_die(const Registry* registry, const std::string& listen,
                                           std::function<void()> refresh = nullptr) {
  HttpExporterOptions o;
  o.listen = listen;
  o.service = "metrics_http_test";
  auto e = HttpExporter::start(registry, o, std::move(refresh));
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

httplib::Client client_of(const HttpExporter& e) {
  httplib::Client c("http://" + e.address());
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(5, 0);
  return c;
}

TEST(MetricsHttp, ServesThePrometheusTextOfTheRegistry) {
  Registry r;
  r.counter("mc_test_requests_total", "requests").inc(3);
  r.histogram("mc_test_latency_seconds", latency_buckets_s(), "latency").observe(0.002);
  auto e = start_or_die(&r, "127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->address().rfind("127.0.0.1:", 0), 0u) << e->address();
  EXPECT_NE(e->address(), "127.0.0.1:0");
  EXPECT_EQ(e->url(), "http://" + e->address());

  auto c = client_of(*e);
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_NE(res->body.find("# TYPE mc_test_requests_total counter\nmc_test_requests_total 3\n"), std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("# TYPE mc_test_latency_seconds histogram"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("mc_test_latency_seconds_bucket{le=\"+Inf\"} 1\n"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("mc_test_latency_seconds_count 1\n"), std::string::npos) << res->body;
  EXPECT_EQ(e->scrapes(), 1u);

  auto head = c.Head("/metrics");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
}

TEST(MetricsHttp, RefreshRunsBeforeEachRender) {
  Registry r;
  int calls = 0;
  auto e = start_or_die(&r, "127.0.0.1:0", [&] { r.gauge("mc_test_refreshes").set(++calls); });
  ASSERT_NE(e, nullptr);
  auto c = client_of(*e);
  for (int i = 1; i <= 2; ++i) {
    auto res = c.Get("/metrics");
    ASSERT_TRUE(res);
    EXPECT_NE(res->body.find("mc_test_refreshes " + std::to_string(i) + "\n"), std::string::npos) << res->body;
  }
}

TEST(MetricsHttp, OtherPathsAre404AndOtherMethods405) {
  Registry r;
  auto e = start_or_die(&r, "127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  auto c = client_of(*e);
  for (const char* path : {"/", "/metrics/x", "/stat", "/metricsx"}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 404) << path;
  }
  auto post = c.Post("/metrics", "x=1", "application/x-www-form-urlencoded");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  auto del = client_of(*e).Delete("/metrics");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  auto put = client_of(*e).Put("/other", "", "text/plain");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 405);
  EXPECT_EQ(e->scrapes(), 0u);
}

TEST(MetricsHttp, OversizedRequestsAreRefused) {
  Registry r;
  auto e = start_or_die(&r, "127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  // A body over max_request_body_bytes (4 KiB): 413 before it is read.
  httplib::Request big;
  big.method = "GET";
  big.path = "/metrics";
  big.body.assign(64 * 1024, 'x');
  big.set_header("Content-Type", "text/plain");
  auto res = client_of(*e).send(big);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413);
  // A request line over the library's 8 KiB limit.
  auto uri = client_of(*e).Get("/metrics?" + std::string(16 * 1024, 'a'));
  ASSERT_TRUE(uri) << httplib::to_string(uri.error());
  EXPECT_EQ(uri->status, 414);
  EXPECT_EQ(e->scrapes(), 0u);
  // Still serving.
  auto ok = client_of(*e).Get("/metrics");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(MetricsHttp, ManyClientsAtOnceAreAllAnswered) {
  Registry r;
  r.counter("mc_test_requests_total").inc();
  auto e = start_or_die(&r, "127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&] {
      auto res = client_of(*e).Get("/metrics");
      if (res && res->status == 200) ok.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 24);
}

// Slowloris: clients that send a header line every 100 ms and never finish held both workers for as long as they
// trickled (the library's read timeout is per recv()). Each request's bytes now have read_timeout_ms from their
// first byte: the slow connections are closed and a scrape behind them is answered.
TEST(MetricsHttp, ClientsTricklingTheirHeadersAreClosedAtTheDeadline) {
  Registry r;
  r.counter("mc_test_requests_total").inc();
  HttpExporterOptions o;
  o.listen = "127.0.0.1:0";
  o.service = "metrics_http_test";
  o.threads = 2;
  o.read_timeout_ms = 500;
  auto started = HttpExporter::start(&r, o);
  ASSERT_TRUE(started.is_ok()) << started.status().to_string();
  const std::unique_ptr<HttpExporter> e = std::move(started).value();
  const std::string addr = e->address();
  const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
  std::atomic<int> lines{0}, closed{0};
  std::vector<std::thread> slow;
  for (int k = 0; k < 2; ++k) {  // as many as the workers
    slow.emplace_back([&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
      const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
      (void)!::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
      for (int i = 0; i < 100; ++i) {  // 10 s at most, or until the exporter closes the connection
        const std::string line = "X-Slow-" + std::to_string(i) + ": y\r\n";
        if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) < 0) {
          closed.fetch_add(1);
          break;
        }
        lines.fetch_add(1);
        pollfd p{fd, POLLIN, 0};
        char b[64];
        if (::poll(&p, 1, 100) > 0 && ::recv(fd, b, sizeof b, 0) <= 0) {
          closed.fetch_add(1);
          break;
        }
      }
      ::close(fd);
    });
  }
  // Both workers are taken once each slow client has sent a few header lines (well inside the 500 ms deadline).
  for (int i = 0; i < 500 && lines.load() < 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto c = client_of(*e);
  c.set_read_timeout(8, 0);
  auto res = c.Get("/metrics");
  for (auto& t : slow) t.join();
  ASSERT_TRUE(res) << "the scrape was not answered while two clients trickled their headers";
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(closed.load(), 2) << "the exporter kept connections whose headers never ended";
  EXPECT_LT(lines.load(), 60) << "the slow clients trickled " << lines.load() << " lines before being closed";
}

TEST(MetricsHttp, StopsWhenDestroyed) {
  Registry r;
  auto e = start_or_die(&r, "127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  const std::string address = e->address();
  e.reset();
  httplib::Client c("http://" + address);
  c.set_connection_timeout(2, 0);
  auto res = c.Get("/metrics");
  EXPECT_FALSE(res);
}

TEST(MetricsHttp, BindFailureNamesTheAddressAndTheRemedy) {
  Registry r;
  auto first = start_or_die(&r, "127.0.0.1:0");
  ASSERT_NE(first, nullptr);
  HttpExporterOptions o;
  o.listen = first->address();
  o.service = "mc-test";
  auto second = HttpExporter::start(&r, o);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable);
  EXPECT_NE(second.status().message().find(first->address()), std::string::npos) << second.status().message();
  EXPECT_NE(second.status().message().find("--metrics-listen"), std::string::npos) << second.status().message();

  std::vector<std::pair<std::string, std::string>> extra;
  auto daemon = start_daemon_exporter(first->address(), "mc-test", &r, &extra);
  ASSERT_FALSE(daemon.is_ok());
  EXPECT_NE(daemon.status().message().find("--metrics-listen " + first->address()), std::string::npos);
  EXPECT_TRUE(extra.empty());
}

TEST(MetricsHttp, DaemonExporterIsOffWhenEmptyAndNamesItselfInTheReadyLine) {
  Registry r;
  std::vector<std::pair<std::string, std::string>> extra;
  auto off = start_daemon_exporter("", "mc-test", &r, &extra);
  ASSERT_TRUE(off.is_ok());
  EXPECT_EQ(off.value(), nullptr);
  EXPECT_TRUE(extra.empty());
  auto on = start_daemon_exporter("localhost:0", "mc-test", &r, &extra);
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  ASSERT_EQ(extra.size(), 1u);
  EXPECT_EQ(extra[0].first, "metrics");
  EXPECT_EQ(extra[0].second, (*on)->url());
  // localhost is reported as the address it resolved to.
  EXPECT_EQ((*on)->address().find("localhost"), std::string::npos) << (*on)->address();
}

TEST(MetricsHttp, Ipv6Loopback) {
  Registry r;
  HttpExporterOptions o;
  o.listen = "[::1]:0";
  auto e = HttpExporter::start(&r, o);
  if (!e.is_ok()) GTEST_SKIP() << "no IPv6 loopback here: " << e.status().message();
  EXPECT_EQ((*e)->address().rfind("[::1]:", 0), 0u) << (*e)->address();
  auto res = client_of(**e).Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST(MetricsHttp, NonLoopbackNeedsAllowUnauthenticated) {
  Registry r;
  HttpExporterOptions o;
  o.listen = "0.0.0.0:0";
  o.service = "mc-test";
  auth::set_allow_unauthenticated(false);
  auto refused = HttpExporter::start(&r, o);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--allow-unauthenticated"), std::string::npos);
  EXPECT_NE(refused.status().message().find("0.0.0.0"), std::string::npos);
  auth::set_allow_unauthenticated(true);
  auto allowed = HttpExporter::start(&r, o);
  auth::set_allow_unauthenticated(false);
  EXPECT_TRUE(allowed.is_ok()) << allowed.status().to_string();
}

TEST(MetricsHttp, ListenAddressGrammar) {
  for (const char* ok : {"127.0.0.1:9400", "[::1]:0", "localhost:0", "0.0.0.0:65535"}) {
    EXPECT_TRUE(parse_listen_address(ok).is_ok()) << ok;
  }
  EXPECT_EQ(parse_listen_address("[::1]:9400")->host, "::1");
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", ":9400", "127.0.0.1:70000", "127.0.0.1:x",
                          "http://127.0.0.1:9400", "tcp://127.0.0.1:9400", "::1:9400"}) {
    auto r = parse_listen_address(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("ADDR:PORT"), std::string::npos) << r.status().message();
  }
}

int parse_flag(const std::vector<std::string>& args, std::string& listen) {
  CLI::App app{"t"};
  cli::add_metrics_flags(app, listen);
  std::vector<char*> argv;
  std::string prog = "metrics_http_test";
  argv.push_back(prog.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  return cli::parse(app, static_cast<int>(argv.size()), argv.data());
}

TEST(MetricsHttp, FlagRefusesAMalformedAddressWithExit2) {
  std::string listen;
  EXPECT_EQ(parse_flag({"--metrics-listen", "127.0.0.1:0"}, listen), -1);
  EXPECT_EQ(listen, "127.0.0.1:0");
  listen.clear();
  EXPECT_EQ(parse_flag({}, listen), -1);
  EXPECT_EQ(listen, "");
  EXPECT_EQ(parse_flag({"--metrics-listen", "http://127.0.0.1:9400"}, listen), cli::kExitUsage);
  EXPECT_EQ(parse_flag({"--metrics-listen", "nonsense"}, listen), cli::kExitUsage);
}

}  // namespace
}  // namespace mc::metrics
