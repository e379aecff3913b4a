#include "mc/common/metrics.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <thread>

namespace mc::metrics {
namespace {

// Labelled series (the store's per-tenant quotas): one HELP and TYPE line per family, before its first series.
TEST(Metrics, LabelledSeriesShareOneFamilyHeader) {
  Registry reg;
  reg.gauge("mc_t_bytes{tenant=\"bob\"}", "a tenant's bytes").set(2);
  reg.gauge("mc_t_bytes{tenant=\"alice\"}", "a tenant's bytes").set(1);
  reg.gauge("mc_t_bytes_limit", "plain").set(3);
  reg.counter("mc_t_refused_total{tenant=\"bob\"}", "refusals").inc();
  const std::string text = reg.prometheus_text();
  EXPECT_NE(text.find("# HELP mc_t_bytes a tenant's bytes\n# TYPE mc_t_bytes gauge\nmc_t_bytes{tenant=\"alice\"} 1\n"
                      "mc_t_bytes{tenant=\"bob\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("# TYPE mc_t_bytes gauge"), text.rfind("# TYPE mc_t_bytes gauge")) << text;
  EXPECT_NE(text.find("# TYPE mc_t_bytes_limit gauge\nmc_t_bytes_limit 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE mc_t_refused_total counter\nmc_t_refused_total{tenant=\"bob\"} 1\n"), std::string::npos)
      << text;
}

TEST(Metrics, CountersGaugesHistograms) {
  Registry reg;
  Counter& c = reg.counter("mc_test_ops_total", "Operations");
  EXPECT_EQ(&c, &reg.counter("mc_test_ops_total"));
  std::thread t1([&] {
    for (int i = 0; i < 10000; ++i) c.inc();
  });
  std::thread t2([&] {
    for (int i = 0; i < 10000; ++i) c.inc();
  });
  t1.join();
  t2.join();
  EXPECT_EQ(c.value(), 20000u);
  reg.gauge("mc_test_used_bytes").set(42);
  reg.gauge("mc_test_used_bytes").add(-2);
  Histogram& h = reg.histogram("mc_test_latency_seconds", {0.001, 0.01, 0.1});
  h.observe(0.0005);
  h.observe(0.05);
  h.observe(5);
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{1, 0, 1, 1}));

  std::string prom = reg.prometheus_text();
  EXPECT_NE(prom.find("# TYPE mc_test_ops_total counter\nmc_test_ops_total 20000\n"), std::string::npos);
  EXPECT_NE(prom.find("mc_test_used_bytes 40\n"), std::string::npos);
  EXPECT_NE(prom.find("mc_test_latency_seconds_bucket{le=\"0.01\"} 1\n"), std::string::npos);
  EXPECT_NE(prom.find("mc_test_latency_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(prom.find("mc_test_latency_seconds_count 3\n"), std::string::npos);
  // Bounds print as the shortest text that reads back (1e-05, never 1.0000000000000001e-05).
  reg.histogram("mc_test_tiny_seconds", {1e-5, 0.1 + 0.2}).observe(0);
  prom = reg.prometheus_text();
  EXPECT_NE(prom.find("mc_test_tiny_seconds_bucket{le=\"1e-05\"} 1\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("mc_test_tiny_seconds_bucket{le=\"0.30000000000000004\"} 1\n"), std::string::npos) << prom;
  // A counter mirrored from another count (Counter::set) is exported as a counter.
  reg.counter("mc_test_mirrored_total").set(7);
  EXPECT_NE(reg.prometheus_text().find("# TYPE mc_test_mirrored_total counter\nmc_test_mirrored_total 7\n"),
            std::string::npos);

  auto j = nlohmann::json::parse(reg.json());
  EXPECT_EQ(j["counters"]["mc_test_ops_total"], 20000);
  EXPECT_EQ(j["gauges"]["mc_test_used_bytes"], 40.0);
  EXPECT_EQ(j["histograms"]["mc_test_latency_seconds"]["count"], 3);
}

}  // namespace
}  // namespace mc::metrics
