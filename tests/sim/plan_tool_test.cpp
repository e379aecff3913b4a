// The mc-sim and mc-plan binaries: JSON output and exit codes (e2e: it starts the binaries).
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace mc::sim {
namespace {

std::string run_tool(const std::string& cmd, int& rc) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  rc = pclose(p.release());
  return out;
}

TEST(Tools, McSimAndMcPlanPrintJsonAndMapErrorsToExitCodes) {
  const std::string sim = MC_BINARY_DIR "/bin/mc-sim";
  const std::string trace = MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl";
  int rc = 0;
  std::string out = run_tool(
      sim + " --trace " + trace + " --max-requests 50 --prefill-instances 2 --decode-instances 2 --json 2>/dev/null",
      rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["summary"]["requests"]["offered"], 50);
  EXPECT_EQ(j["instances"].size(), 4u);
  EXPECT_EQ(j["cluster"]["prefill_instances"], 2);
  EXPECT_TRUE(j["totals"].contains("prefill_gpu_s_saved"));
  run_tool(sim + " --trace " + trace + " --policy fastest 2>/dev/null", rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  run_tool(sim + " --trace /nonexistent.jsonl 2>/dev/null", rc);
  EXPECT_NE(WEXITSTATUS(rc), 0);
  out = run_tool(MC_BINARY_DIR "/bin/mc-plan threshold --json --prefix-tokens 1K,2K 2>/dev/null", rc);
  ASSERT_EQ(rc, 0);
  auto t = nlohmann::json::parse(out);
  EXPECT_EQ(t["rows"].size(), 2u);
  EXPECT_EQ(t["paper_bytes_per_s"], 6e9);
}

}  // namespace
}  // namespace mc::sim
