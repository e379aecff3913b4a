// The pictures' pure parts (mc/report/chart.hpp, page.hpp, run_charts.hpp): the series computed from small
// hand-made records, the gnuplot script (hostile text cannot become a command), the page's escaping and data
// attributes. Drawing with gnuplot and loading in Chromium: tests/tools/html_report_e2e_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "mc/report/chart.hpp"
#include "mc/report/page.hpp"
#include "mc/report/run_charts.hpp"

namespace mc::replay {
namespace {

using mc::report::Chart;
using mc::report::Series;
using mc::report::SeriesStyle;

RequestRecord completed(const std::string& id, double submit_ms, double ttft_ms, double e2e_ms,
                        const std::string& prefill, const std::string& decode, double queue_ms) {
  RequestRecord r;
  r.request_id = id;
  r.outcome = Outcome::kCompleted;
  r.submit_ms = submit_ms;
  r.ttft_ms = ttft_ms;
  r.e2e_ms = e2e_ms;
  r.prefill_instance = prefill;
  r.decode_instance = decode;
  r.ledger.queue_ms = queue_ms;
  return r;
}

TEST(HtmlReportSeries, CdfKeepsFirstAndLastAndThins) {
  Points p = cdf_points({3, 1, 2, 4});
  ASSERT_EQ(p.size(), 4u);
  EXPECT_DOUBLE_EQ(p[0].first, 1);
  EXPECT_DOUBLE_EQ(p[0].second, 25);
  EXPECT_DOUBLE_EQ(p[3].first, 4);
  EXPECT_DOUBLE_EQ(p[3].second, 100);
  std::vector<double> many;
  for (int i = 1; i <= 1000; ++i) many.push_back(i);
  Points thin = cdf_points(many, 11);
  ASSERT_EQ(thin.size(), 11u);
  EXPECT_DOUBLE_EQ(thin.front().first, 1);
  EXPECT_DOUBLE_EQ(thin.back().first, 1000);
  EXPECT_DOUBLE_EQ(thin.back().second, 100);
  for (size_t i = 1; i < thin.size(); ++i) EXPECT_GT(thin[i].first, thin[i - 1].first);
  EXPECT_TRUE(cdf_points({}).empty());
  EXPECT_EQ(cdf_points({NAN, 5}).size(), 1u);
}

TEST(HtmlReportSeries, MeanOccupancyIsTimeWeighted) {
  // [0, 1) and [0.5, 2) over [0, 2) in 2 bins: bin 0 holds 1 + 0.5 s -> 1.5; bin 1 holds 1 s -> 1.
  Points p = mean_occupancy({{0, 1}, {0.5, 2}, {3, 2}}, 2, 2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_DOUBLE_EQ(p[0].first, 0.5);
  EXPECT_DOUBLE_EQ(p[0].second, 1.5);
  EXPECT_DOUBLE_EQ(p[1].first, 1.5);
  EXPECT_DOUBLE_EQ(p[1].second, 1.0);
  EXPECT_TRUE(mean_occupancy({{0, 1}}, 0, 4).empty());
}

TEST(HtmlReportSeries, HitRatioSplitsTiersPerBin) {
  RequestRecord a = completed("a", 100, 10, 20, "p0", "d0", 0);
  a.ledger.prompt_tokens = 1000;
  a.ledger.hit_tokens_local = 100;
  a.ledger.hit_tokens_remote = 400;
  RequestRecord b = completed("b", 1500, 10, 20, "p0", "d0", 0);
  b.ledger.prompt_tokens = 500;
  b.ledger.hit_tokens_local = 0;
  b.ledger.hit_tokens_remote = 250;
  HitRatioSeries h = hit_ratio_over_time({a, b}, 2.0, 2);
  ASSERT_EQ(h.local.size(), 2u);
  ASSERT_EQ(h.remote.size(), 2u);
  EXPECT_TRUE(h.ssd.empty());  // no record reports an SSD tier
  EXPECT_DOUBLE_EQ(h.local[0].second, 10);
  EXPECT_DOUBLE_EQ(h.remote[0].second, 40);
  EXPECT_DOUBLE_EQ(h.remote[1].second, 50);
}

TEST(HtmlReportSeries, GpuSecondsFromLedger) {
  RequestRecord a = completed("a", 0, 10, 20, "p0", "d0", 0);
  a.ledger.prefill_ms = 1000;
  a.ledger.prompt_tokens = 1000;
  a.ledger.avoided_prefill_tokens = 500;  // 500 computed in 1 s -> 500 avoided ~ 1 s
  auto g = gpu_seconds({a}, 8);
  ASSERT_TRUE(g);
  EXPECT_DOUBLE_EQ(g->spent, 8);
  EXPECT_DOUBLE_EQ(g->saved, 8);
  EXPECT_FALSE(gpu_seconds({completed("b", 0, 1, 2, "p", "d", 0)}, 8));
}

TEST(HtmlReportSeries, RunChartsOfTwoRuns) {
  std::vector<RequestRecord> on = {completed("1", 0, 100, 300, "prefill-0", "decode-0", 50),
                                   completed("2", 1000, 200, 500, "prefill-1", "decode-0", 0)};
  on[0].ledger.prefill_ms = 40;
  on[0].ledger.prompt_tokens = 100;
  on[0].ledger.hit_tokens_local = 50;
  on[0].ledger.avoided_prefill_tokens = 50;
  on[0].tbt = TbtStats{2, 10, 12, 12};
  RequestRecord rejected;
  rejected.request_id = "3";
  rejected.outcome = Outcome::kRejected;
  rejected.submit_ms = 1500;
  on.push_back(rejected);
  std::vector<RequestRecord> off = {completed("1", 0, 300, 600, "prefill-0", "decode-0", 10)};
  SummaryOptions so;
  so.slo_ttft_ms = {150, 1000};
  so.slo_tbt_ms = {100};
  std::vector<RunRecords> runs = {{"on", on, summarize(on, so), std::nullopt},
                                  {"off", off, summarize(off, so), std::nullopt}};
  std::vector<std::string> notes;
  std::vector<Chart> charts = run_charts(runs, {}, notes);
  std::map<std::string, const Chart*> by_id;
  for (const Chart& c : charts) by_id[c.id] = &c;
  for (const char* id :
       {"ttft_cdf", "tbt_cdf", "ttft_time", "queue_1", "load_1", "queue_2", "load_2", "hit_time", "gpu_s", "slo"}) {
    EXPECT_TRUE(by_id.count(id)) << id;
  }
  EXPECT_EQ(by_id["ttft_cdf"]->series.size(), 2u);  // a curve per run
  EXPECT_EQ(by_id["ttft_cdf"]->series[0].points.size(), 2u);
  EXPECT_EQ(by_id["tbt_cdf"]->series.size(), 1u);  // only "on" has a TBT
  // TTFT over time: on completed (2), on rejected (1, at 0), off completed (1).
  const Chart& t = *by_id["ttft_time"];
  ASSERT_EQ(t.series.size(), 3u);
  EXPECT_EQ(t.series[1].title, "on: rejected (at 0)");
  EXPECT_EQ(t.series[1].points, (Points{{1.5, 0}}));
  EXPECT_EQ(by_id["queue_1"]->series.size(), 2u);  // prefill-0, prefill-1
  EXPECT_EQ(by_id["load_1"]->series.size(), 3u);   // prefill-0, prefill-1, decode-0
  // SLO: two thresholds, a bar per run at each; "on" meets TTFT <= 150 ms with 1 of 3 offered.
  const Chart& slo = *by_id["slo"];
  ASSERT_EQ(slo.categories.size(), 2u);
  ASSERT_EQ(slo.series.size(), 2u);
  EXPECT_NEAR(slo.series[0].points[0].second, 100.0 / 3, 1e-9);
  EXPECT_EQ(by_id["gpu_s"]->series.size(), 2u);            // spent, saved
  EXPECT_EQ(by_id["gpu_s"]->series[0].points.size(), 1u);  // "off" has no prefill_ms
  // Every chart's script is valid for gnuplot_script.
  EXPECT_TRUE(mc::report::gnuplot_script(charts).is_ok());
}

TEST(HtmlReportChart, HostileTextCannotBecomeACommand) {
  EXPECT_EQ(mc::report::chart_text("run'; system('rm -rf /') #`x`\"\\@$"), "run_; system(_rm -rf /_) __x_____");
  EXPECT_EQ(mc::report::chart_text("TTFT ≤ 30 s"), "TTFT ≤ 30 s");
  EXPECT_EQ(mc::report::chart_text(std::string(500, 'a')).size(), 120u);
  Chart c;
  c.id = "x";
  c.title = "t'\nplot '/etc/passwd";
  Series s;
  s.title = "a'b";
  s.points = {{1, 2}};
  c.series.push_back(s);
  auto script = mc::report::gnuplot_script({c});
  ASSERT_TRUE(script.is_ok()) << script.status().message();
  EXPECT_EQ(script->find("'/etc/passwd"), std::string::npos);
  EXPECT_NE(script->find("title 'a_b'"), std::string::npos);
  // Bad charts are refused, naming the chart.
  Chart bad = c;
  bad.id = "../x";
  EXPECT_FALSE(mc::report::gnuplot_script({bad}).is_ok());
  bad = c;
  bad.series[0].points = {{NAN, 1}};
  EXPECT_FALSE(mc::report::gnuplot_script({bad}).is_ok());
  bad = c;
  bad.log_x = true;
  bad.series[0].points = {{0, 1}};
  EXPECT_FALSE(mc::report::gnuplot_script({bad}).is_ok());
  bad = c;
  bad.series[0].points.clear();
  EXPECT_FALSE(mc::report::gnuplot_script({bad}).is_ok());
}

TEST(HtmlReportPage, EscapesAndTagsCharts) {
  mc::report::Page page;
  page.title = "<script>alert(1)</script>";
  page.info = {{"records", "a\"b.jsonl"}};
  page.table = {{"run"}, {"<b>x</b>"}};
  Chart c;
  c.id = "ttft_cdf";
  c.caption = "x & y";
  Series s1, s2;
  s1.points = {{1, 1}, {2, 2}};
  s2.points = {{1, 1}};
  c.series = {s1, s2};
  page.charts.push_back(c);
  const std::string svg =
      "<?xml version=\"1.0\"?>\n<svg><defs><circle id='gpDot'/><path id='gpPt0'/>"
      "<use xlink:href='#gpPt0' id='gpPt6'/></defs><g id=\"gnuplot_plot_1\"><use xlink:href='#gpPt6'/></g></svg>";
  auto html = mc::report::page_html(page, {svg});
  ASSERT_TRUE(html.is_ok());
  EXPECT_EQ(html->find("<script>"), std::string::npos);
  EXPECT_NE(html->find("&lt;script&gt;"), std::string::npos);
  EXPECT_NE(html->find("a&quot;b.jsonl"), std::string::npos);
  EXPECT_NE(html->find("&lt;b&gt;x&lt;/b&gt;"), std::string::npos);
  EXPECT_NE(html->find("data-series=\"2\" data-points=\"3\" data-series-points=\"2,1\""), std::string::npos);
  EXPECT_EQ(html->find("<?xml"), std::string::npos);
  EXPECT_NE(html->find("id='ttft_cdf-gpPt6'"), std::string::npos);
  EXPECT_NE(html->find("href='#ttft_cdf-gpPt6'"), std::string::npos);
  EXPECT_NE(html->find("id=\"ttft_cdf-gnuplot_plot_1\""), std::string::npos);
  EXPECT_FALSE(mc::report::page_html(page, {}).is_ok());
}

TEST(HtmlReportChart, MissingGnuplotSaysHowToInstallIt) {
  auto found = mc::report::find_gnuplot("/nonexistent/gnuplot");
  ASSERT_FALSE(found.is_ok());
  EXPECT_EQ(found.status().code(), Code::kNotFound);
  EXPECT_NE(found.status().message().find("apt-get install gnuplot-nox"), std::string::npos);
}

}  // namespace
}  // namespace mc::replay
