// Block keys computed by the mc-store binary (`mc-store keys`) in separate processes with different
// environments and address-space layouts equal the golden ones (e2e: it starts the binary).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "block_key_golden.hpp"
#include "mc/common/block_key.hpp"

namespace mc {
namespace MC_UNITY_ID {

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

// `mc-store keys` refuses a scope no request can carry (the trace reader's and the Conductor's rules): a
// version without an adapter, a salt with a control character, an adapter name over the length limit.
TEST(BlockKey, KeysRefuseAScopeNoRequestCanCarry) {
  const std::string tool = std::string(MC_BINARY_DIR) + "/bin/mc-store";
  for (const std::string& flags : std::vector<std::string>{"--lora-version 2", "--salt $'a\\tb'",
                                                           "--lora " + std::string(kMaxKeyScopeFieldBytes + 1, 'x')}) {
    const std::string out =
        run("echo 1 2 3 | bash -c \"" + tool + " keys --block-size 2 " + flags + " 2>&1; echo rc=\\$?\"");
    EXPECT_NE(out.find("rc=2"), std::string::npos) << flags << ": " << out;
    EXPECT_NE(out.find("--lora/--lora-version/--salt"), std::string::npos) << flags << ": " << out;
  }
  EXPECT_NE(
      run("echo 1 2 3 | " + tool + " keys --block-size 2 --lora a --lora-version 2 --salt t; echo rc=$?").find("rc=0"),
      std::string::npos);
}

}  // namespace MC_UNITY_ID
}  // namespace mc
