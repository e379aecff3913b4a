// Helpers the store's e2e programs share: a scratch directory and one tool run to completion.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mc::store_e2e {

// A directory /tmp/mc-<tag>.XXXXXX, removed with everything in it on the way out.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "store-e2e") {
    std::string tmpl = "/tmp/mc-" + tag + ".XXXXXX";
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Runs MC_BINARY_DIR/bin/TOOL ARGS... to completion (stdin /dev/null): (exit code, stdout + stderr).
inline std::pair<int, std::string> run(const std::string& tool, const std::vector<std::string>& args) {
  std::string cmd = std::string(MC_BINARY_DIR "/bin/") + tool;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1 < /dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace mc::store_e2e
