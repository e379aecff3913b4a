// End-to-end: the same mistake gets the same exit code from every tool (issue 17 item 6; DESIGN.md §12:
// 0 ok, 1 runtime error, 2 usage or bad input). Each tool is run with a missing input file, an empty
// trace (or records file) and a malformed endpoint; each must exit 2 and name the object on stderr.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mc/testkit/process.hpp"

namespace MC_UNITY_ID {

const std::string kBin = MC_BINARY_DIR "/bin/";

// A scratch directory removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/mc-exit-codes-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = (path / name).string();
    std::ofstream(p) << text;
    return p;
  }
};

struct Outcome {
  int code = -1;
  std::string err;
};

// Runs a tool (stdout discarded, stderr captured), killed after 60 s.
Outcome run(const TempDir& dir, const std::vector<std::string>& argv) {
  mc::testkit::ChildOptions o;
  o.stdout_path = "/dev/null";
  o.stderr_path = (dir.path / "stderr.txt").string();
  o.stdin_path = "/dev/null";
  Outcome r;
  {
    std::vector<std::string> full = argv;
    full[0] = kBin + full[0];
    mc::testkit::Child c(full, o);
    r.code = c.wait_exit(60000);
  }
  std::ifstream in(o.stderr_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

struct Case {
  std::vector<std::string> argv;
  std::string names;  // the object the message must name
};

void expect_usage_exit(const TempDir& dir, const std::vector<Case>& cases, const std::string& mistake) {
  for (const Case& c : cases) {
    std::string cmd;
    for (const auto& a : c.argv) cmd += a + " ";
    const Outcome r = run(dir, c.argv);
    EXPECT_EQ(r.code, 2) << mistake << ": " << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << mistake << ": " << cmd << " does not name " << c.names << ":\n"
                                                      << r.err;
  }
}

const std::string kNoConductor = "tcp://127.0.0.1:9";  // never contacted: each case fails before

TEST(ExitCodes, MissingFileIsUsageEverywhere) {
  TempDir dir;
  const std::string f = (dir.path / "missing.jsonl").string();
  expect_usage_exit(dir,
                    {
                        {{"mc-trace-replay", f, "--conductor", kNoConductor}, f},
                        {{"mc-trace-replay", "analyze", f}, f},
                        {{"mc-trace-replay", "report", f}, f},
                        {{"mc-sim", "--trace", f}, f},
                        {{"mc-plan", "capacity", "--trace", f}, f},
                        {{"mc-plan", "threshold", "--model", f}, f},
                        {{"mc-conductor", "replay-decisions", f}, f},
                        {{"mc-store", "put", "--master", kNoConductor, "key", f}, f},
                    },
                    "missing file");
}

// Issue 17 item 5: an input with no newline (/dev/zero) is refused after one bounded line (16 MiB), in every
// line-oriented reader, instead of growing without end; each says which line and why.
TEST(ExitCodes, EndlessLineIsUsageEverywhere) {
  TempDir dir;
  const std::string f = "/dev/zero";
  expect_usage_exit(dir,
                    {
                        {{"mc-trace-replay", f, "--conductor", kNoConductor}, "longer than 16 MiB"},
                        {{"mc-trace-replay", "analyze", f}, "longer than 16 MiB"},
                        {{"mc-trace-replay", "report", f}, "longer than 16 MiB"},
                        {{"mc-sim", "--trace", f}, "longer than 16 MiB"},
                        {{"mc-conductor", "replay-decisions", f}, "longer than 16 MiB"},
                    },
                    "endless line");
}

TEST(ExitCodes, EmptyTraceIsUsageEverywhere) {
  TempDir dir;
  const std::string f = dir.file("empty.jsonl", "");
  expect_usage_exit(dir,
                    {
                        {{"mc-trace-replay", f, "--conductor", kNoConductor}, f},
                        {{"mc-trace-replay", "analyze", f}, f},
                        {{"mc-trace-replay", "report", f}, f},
                        {{"mc-sim", "--trace", f}, f},
                        {{"mc-plan", "capacity", "--trace", f}, f},
                        {{"mc-conductor", "replay-decisions", f}, f},
                    },
                    "empty trace");
}

TEST(ExitCodes, BadEndpointIsUsageEverywhere) {
  TempDir dir;
  const std::string trace = dir.file("one.jsonl",
                                     "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, "
                                     "\"hash_ids\": [1]}\n");
  const std::string bad = "bogus-endpoint";
  expect_usage_exit(dir,
                    {
                        {{"mc-trace-replay", trace, "--conductor", bad}, bad},
                        {{"mc-store", "stat", "--master", bad}, bad},
                        {{"mc-store", "put", "--master", bad, "key", trace}, bad},
                        {{"mc-conductor", "stat", "--endpoint", bad}, bad},
                        {{"mc-xfer", "stat", "--endpoint", bad}, bad},
                        {{"mc-xfer", "read", "--target", bad, "--length", "4096"}, bad},
                    },
                    "bad endpoint");
}

}  // namespace MC_UNITY_ID
