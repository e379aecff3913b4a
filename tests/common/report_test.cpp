// The report kit (report.hpp) and the shared flag groups (cli.hpp): one formatter, table, run header,
// JSON error document and host name; flags declared once with their checks and MC_* variables.
#include "mc/common/report.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <utility>

#include "mc/cli/cli.hpp"
#include "mc/common/location.hpp"
#include "mc/trace/trace_flags.hpp"

namespace mc {
namespace {

TEST(Report, FixedAndPercent) {
  EXPECT_EQ(report::fixed(12.5, 2), "12.50");
  EXPECT_EQ(report::fixed(2.0 / 3.0, 0), "1");
  EXPECT_EQ(report::pct(0.374), "37.4");
}

TEST(Report, TableAlignsFirstColumnLeftOthersRight) {
  std::ostringstream out;
  report::print_table(out, {{"name", "n"}, {"a", "1234"}, {"longer", "5"}});
  EXPECT_EQ(out.str(), "name       n\na       1234\nlonger     5\n");
}

TEST(Report, RunHeaderLineAndJson) {
  report::RunInfo info = report::run_info("mc-test");
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[0], (std::pair<std::string, std::string>{"tool", "mc-test"}));
  EXPECT_EQ(info[1].first, "build");
  report::RunInfo live = report::host_run_info("mc-test run");
  ASSERT_EQ(live.size(), 4u);
  EXPECT_EQ(live[2].first, "host");
  EXPECT_EQ(live[2].second, report::host_name());
  EXPECT_EQ(live[3].first, "time");
  EXPECT_EQ(live[3].second.size(), 20u);  // 2026-12-01T19:46:35Z
  std::ostringstream out;
  report::print_run_header(out, {{"a", "1"}, {"b", "x y"}});
  EXPECT_EQ(out.str(), "a=1  b=x y\n\n");
  std::ostringstream none;
  report::print_run_header(none, {});
  EXPECT_EQ(none.str(), "");
  EXPECT_EQ(report::run_info_json({{"a", "1"}}), (nlohmann::json{{"a", "1"}}));
}

TEST(Report, OneErrorDocumentShape) {
  const Status st(Code::kInvalidArgument, "bad --size");
  EXPECT_EQ(report::error_json(st),
            (nlohmann::json{{"error", {{"code", "invalid_argument"}, {"message", "bad --size"}}}}));
  std::ostringstream out;
  EXPECT_EQ(report::print_error(true, out, st).code(), Code::kInvalidArgument);
  EXPECT_EQ(nlohmann::json::parse(out.str())["error"]["message"], "bad --size");
  std::ostringstream text;
  EXPECT_FALSE(report::print_error(false, text, st).is_ok());
  EXPECT_EQ(text.str(), "");
  std::ostringstream ok;
  EXPECT_TRUE(report::print_error(true, ok, Status::ok()).is_ok());
  EXPECT_EQ(ok.str(), "");
}

TEST(Report, HostNameIsNeverEmpty) { EXPECT_FALSE(report::host_name().empty()); }

// Parses `args` (after the program name) into `app`; true when CLI11 accepted them.
bool parses(CLI::App& app, std::vector<std::string> args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return false;
  }
  return true;
}

TEST(CliFlags, SizeOptionTakesSuffixesAndChecksTheRange) {
  CLI::App app;
  uint64_t bytes = 4096;
  cli::add_size_option(app, "--size", bytes, "bytes", 1, 1ull << 30);
  EXPECT_NE(app.help().find("4KiB"), std::string::npos) << app.help();  // the default in units, not 4096
  EXPECT_TRUE(parses(app, {"--size", "64KiB"}));
  EXPECT_EQ(bytes, 64u << 10);
  EXPECT_FALSE(parses(app, {"--size", "0"}));
  EXPECT_FALSE(parses(app, {"--size", "2GiB"}));
  EXPECT_FALSE(parses(app, {"--size", "lots"}));
  EXPECT_FALSE(parses(app, {"--size", "-1"}));
}

TEST(CliFlags, LocationIsHostMemoryNeverAGpuName) {
  CLI::App app;
  std::string location = "cpu:0";
  cli::add_location_option(app, location, "where");
  EXPECT_TRUE(parses(app, {"--location", "cpu:1"}));
  EXPECT_EQ(location, "cpu:1");
  EXPECT_FALSE(parses(app, {"--location", "cpu"}));
  EXPECT_FALSE(parses(app, {"--location", "cpu:x"}));
  EXPECT_FALSE(parses(app, {"--location", "tpu:0"}));
  // No GPU memory backend exists: a GPU location is refused in every build (a CUDA toolkit on the build
  // machine once made it serve host memory labelled cuda:0).
  EXPECT_FALSE(parses(app, {"--location", "cuda:0"}));
  const Status gpu = check_memory_location("cuda:3");
  EXPECT_EQ(gpu.code(), Code::kInvalidArgument);
  EXPECT_NE(gpu.message().find("'cuda:3'"), std::string::npos) << gpu.message();
  EXPECT_NE(gpu.message().find("GPU memory"), std::string::npos) << gpu.message();
  EXPECT_NE(gpu.message().find("cpu:0"), std::string::npos) << gpu.message();
  EXPECT_TRUE(check_memory_location("cpu:12").is_ok());
  EXPECT_EQ(check_memory_location("cuda:").code(), Code::kInvalidArgument);
  EXPECT_EQ(check_memory_location("").code(), Code::kInvalidArgument);
}

TEST(CliFlags, TraceWindowRefusesNegativeValues) {
  CLI::App app;
  double start_s = 0, duration_s = 0;
  int64_t max_requests = 0;
  cli::add_trace_window_flags(app, start_s, duration_s, max_requests);
  EXPECT_TRUE(parses(app, {"--start-s", "1.5", "--duration-s", "10", "--max-requests", "7"}));
  EXPECT_DOUBLE_EQ(start_s, 1.5);
  EXPECT_DOUBLE_EQ(duration_s, 10);
  EXPECT_EQ(max_requests, 7);
  EXPECT_FALSE(parses(app, {"--start-s", "-1"}));
  EXPECT_FALSE(parses(app, {"--duration-s", "-1"}));
  EXPECT_FALSE(parses(app, {"--max-requests", "-1"}));
}

TEST(CliFlags, RateScaleIsPositiveWithItsVariable) {
  CLI::App app;
  double rate_scale = 1;
  cli::add_rate_scale_option(app, rate_scale);
  EXPECT_FALSE(parses(app, {"--rate-scale", "0"}));
  EXPECT_FALSE(parses(app, {"--rate-scale", "nan"}));
  ASSERT_EQ(setenv("MC_RATE_SCALE", "4", 1), 0);
  EXPECT_TRUE(parses(app, {}));
  unsetenv("MC_RATE_SCALE");
  EXPECT_DOUBLE_EQ(rate_scale, 4);
}

// Two verbs binding one variable (as every `mc-store` verb binds --master): the flag given to the chosen verb
// beats the MC_* variable, and the variable still fills it in when the flag is absent.
TEST(CliFlags, FlagBeatsVariableWhenVerbsShareIt) {
  const auto run = [](std::vector<std::string> args) {
    CLI::App app;
    std::string master = "default";
    for (const char* verb : {"rm", "put", "stat"})
      app.add_subcommand(verb)->add_option("--master", master)->envname("MC_TEST_MASTER");
    args.insert(args.begin(), "tool");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    EXPECT_EQ(cli::parse(app, static_cast<int>(argv.size()), argv.data()), -1);
    return master;
  };
  ASSERT_EQ(setenv("MC_TEST_MASTER", "tcp://from-env:1", 1), 0);
  EXPECT_EQ(run({"rm", "--master", "tcp://flag:2"}), "tcp://flag:2");
  EXPECT_EQ(run({"put", "--master", "tcp://flag:2"}), "tcp://flag:2");
  EXPECT_EQ(run({"stat", "--master", "tcp://flag:2"}), "tcp://flag:2");
  EXPECT_EQ(run({"rm"}), "tcp://from-env:1");
  unsetenv("MC_TEST_MASTER");
  EXPECT_EQ(run({"put"}), "default");
}

// A usage error in --json mode is also the one error document on stdout (exit 2), not only CLI11's text.
TEST(CliFlags, UsageErrorInJsonModeIsTheErrorDocument) {
  CLI::App app;
  bool json = false;
  int64_t ttl_ms = 0;
  cli::add_json_flag(app, json, "JSON");
  app.add_option("--ttl-ms", ttl_ms)->check(CLI::NonNegativeNumber);
  std::vector<std::string> args = {"tool", "--json", "--ttl-ms", "soon"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream out;
  std::streambuf* saved = std::cout.rdbuf(out.rdbuf());
  const int rc = cli::parse(app, static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(saved);
  EXPECT_EQ(rc, 2);
  const nlohmann::json doc = nlohmann::json::parse(out.str(), nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << out.str();
  EXPECT_EQ(doc["error"]["code"], "invalid_argument") << out.str();
  EXPECT_NE(doc["error"]["message"].get<std::string>().find("--ttl-ms"), std::string::npos) << out.str();
}

// CLI11 alone reads "-1" into an unsigned option as 2^64 - 1, saturates a number past 64 bits and reads "010" as
// octal; parse() refuses the first two naming the flag (exit 2) and reads the third as decimal.
TEST(CliFlags, IntegerOptionsRefuseNegativeUnsignedAndOverflow) {
  const auto run = [](std::vector<std::string> args, uint64_t& seed, int64_t& offset) {
    CLI::App app;
    app.add_option("--seed", seed);
    int64_t ranged = 1;
    app.add_option("--ranged", ranged)->check(CLI::Range(1, 64));
    app.add_subcommand("gen")->add_option("--offset", offset);
    args.insert(args.begin(), "tool");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream err;
    std::streambuf* saved = std::cerr.rdbuf(err.rdbuf());
    const int rc = cli::parse(app, static_cast<int>(argv.size()), argv.data());
    std::cerr.rdbuf(saved);
    return std::make_pair(rc, err.str());
  };
  uint64_t seed = 0;
  int64_t offset = 0;
  for (const char* bad :
       {"-1", " -1", "18446744073709551616", " 99999999999999999999", "-0x1", "0x1ffffffffffffffff"}) {
    auto [rc, err] = run({"--seed", bad}, seed, offset);
    EXPECT_EQ(rc, 2) << bad;
    EXPECT_NE(err.find("--seed"), std::string::npos) << bad << ": " << err;
  }
  EXPECT_EQ(run({"--seed", "18446744073709551615"}, seed, offset).first, -1);
  EXPECT_EQ(seed, UINT64_MAX);
  EXPECT_EQ(run({"--seed", "010"}, seed, offset).first, -1);
  EXPECT_EQ(seed, 10u);
  EXPECT_EQ(run({"--seed", "0x10"}, seed, offset).first, -1);
  EXPECT_EQ(seed, 16u);
  EXPECT_EQ(run({"--seed", "-0"}, seed, offset).first, -1);
  EXPECT_EQ(seed, 0u);
  // The option's own range sees the decimal reading: "0100" is 100, past 64 (read as octal it was 64, inside).
  EXPECT_EQ(run({"--ranged", "0100"}, seed, offset).first, 2);
  EXPECT_EQ(run({"--ranged", "064"}, seed, offset).first, -1);
  EXPECT_EQ(run({"gen", "--offset", "-9223372036854775808"}, seed, offset).first, -1);
  EXPECT_EQ(offset, INT64_MIN);
  EXPECT_EQ(run({"gen", "--offset", "-007"}, seed, offset).first, -1);
  EXPECT_EQ(offset, -7);
  for (const char* bad : {"9223372036854775808", "-9223372036854775809", "abc"}) {
    auto [rc, err] = run({"gen", "--offset", bad}, seed, offset);
    EXPECT_EQ(rc, 2) << bad;
    EXPECT_NE(err.find("--offset"), std::string::npos) << bad << ": " << err;
  }
}

TEST(CliFlags, SloListsSplitOnCommasAndTakeOneArgument) {
  CLI::App app;
  std::vector<double> ttft = {30000}, tbt = {100, 200, 300};
  std::string positional;
  cli::add_slo_list_flags(app, "--slo-ttft-ms", ttft, "--slo-tbt-ms", tbt, "");
  app.add_option("trace", positional);
  EXPECT_TRUE(parses(app, {"--slo-tbt-ms", "50,60", "trace.jsonl"}));
  EXPECT_EQ(tbt, (std::vector<double>{50, 60}));
  EXPECT_EQ(ttft, (std::vector<double>{30000}));
  EXPECT_EQ(positional, "trace.jsonl");
  EXPECT_FALSE(parses(app, {"--slo-ttft-ms", "100,-1"}));
}

TEST(CliFlags, SloOverridesStayEmptyUnlessGiven) {
  CLI::App app;
  std::optional<double> ttft, tbt;
  cli::add_slo_override_flags(app, ttft, tbt, "the cluster's");
  EXPECT_TRUE(parses(app, {"--slo-ttft-ms", "500"}));
  EXPECT_EQ(ttft, 500.0);
  EXPECT_FALSE(tbt.has_value());
  EXPECT_FALSE(parses(app, {"--slo-tbt-ms", "0"}));
}

TEST(CliFlags, BlockSizeIsBoundedTheSameEverywhere) {
  CLI::App app;
  int64_t tokens = 16;
  cli::add_block_size_option(app, tokens, "--block-size", "tokens");
  EXPECT_TRUE(parses(app, {"--block-size", "1048576"}));
  EXPECT_FALSE(parses(app, {"--block-size", "1048577"}));
  EXPECT_FALSE(parses(app, {"--block-size", "0"}));
}

}  // namespace
}  // namespace mc
