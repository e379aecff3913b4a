#include "mc/common/status.hpp"

#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"

namespace mc {
namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return Status(Code::kInvalidArgument, "x=" + std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> quarter(int x) {
  MC_ASSIGN_OR_RETURN(int h, half(x));
  MC_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

TEST(Status, OkAndError) {
  Status ok;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(ok.to_string(), "ok");
  Status e(Code::kTimeout, "no reply from tcp://127.0.0.1:1");
  EXPECT_FALSE(e.is_ok());
  EXPECT_TRUE(e.is_retryable());
  EXPECT_EQ(e.to_string(), "timeout: no reply from tcp://127.0.0.1:1");
  EXPECT_EQ(e.with_context("get k").message(), "get k: no reply from tcp://127.0.0.1:1");
  EXPECT_EQ(e.with_context("get k").code(), Code::kTimeout);
  EXPECT_FALSE(Status(Code::kInvalidArgument, "x").is_retryable());
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(quarter(8).value(), 2);
  Result<int> r = quarter(6);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "x=3 is odd");
  EXPECT_EQ(r.value_or(-1), -1);
}

TEST(Result, OkStatusIsNotAValue) {
  Result<int> r = Status::ok();
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r = Status(Code::kNotFound, "key k");
  EXPECT_DEATH((void)r.value(), "key k");
}

TEST(Clock, ManualClockMovesOnlyForward) {
  ManualClock c(1000);
  EXPECT_EQ(c.now_ns(), 1000);
  c.advance_ms(2);
  EXPECT_EQ(c.now_ns(), 2'001'000);
  c.set_ns(5);
  EXPECT_EQ(c.now_ns(), 2'001'000);
  c.set_ns(3'000'000);
  EXPECT_EQ(c.now_ms(), 3);
  EXPECT_GT(RealClock::instance().now_ns(), 0);
}

TEST(Log, ParsesLevels) {
  EXPECT_EQ(log::parse_level("debug").value(), log::Level::kDebug);
  EXPECT_EQ(log::parse_level("warning").value(), log::Level::kWarn);
  auto bad = log::parse_level("loud");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
  log::set_level(log::Level::kError);
  EXPECT_FALSE(log::enabled(log::Level::kInfo));
  EXPECT_TRUE(log::enabled(log::Level::kError));
  log::set_level(log::Level::kInfo);
}

// Issue 51: a message type, a name or a path a peer sent, written into a log line, never starts a line of its own.
TEST(Log, ControlCharactersInAMessageAreEscapedSoOneRecordIsOneLine) {
  char path[] = "/tmp/mc-log-test.XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const int saved = ::dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(::dup2(fd, STDERR_FILENO), STDERR_FILENO);
  MC_LOG_ERROR << "unknown message type 'x\n2026-12-07T00:00:00.000Z E mc-store[1] forged.cpp:1] admin ok\r\x1b[2J'";
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::close(fd);
  ::unlink(path);
  const std::string s = text.str();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1) << s;
  EXPECT_EQ(s.back(), '\n');
  EXPECT_NE(s.find("type 'x\\n2026-12-07T00:00:00.000Z E mc-store[1] forged.cpp:1] admin ok\\r\\x1b[2J'"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace mc
