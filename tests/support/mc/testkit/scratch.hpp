// testkit::Scratch: a test's scratch directory (header-only; tests only).
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace mc::testkit {

// A scratch directory under the test's temporary directory, removed with everything in it.
struct Scratch {
  std::string dir;
  explicit Scratch(const std::string& tag) {
    dir = ::testing::TempDir() + tag + "_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
  }
  // Removed with the test, unless the test failed: then kept (its path on stderr) for the post-mortem.
  ~Scratch() {
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "scratch directory kept for the failed test: %s\n", dir.c_str());
      return;
    }
    std::filesystem::remove_all(dir);
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

}  // namespace mc::testkit
