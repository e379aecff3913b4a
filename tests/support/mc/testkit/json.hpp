// e2e tests: a tool's --json output parsed, failing the current test (with the output) when it is not JSON.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mc/testkit/process.hpp"

namespace mc::testkit {

inline nlohmann::json parse_json(const RunResult& r) {
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << e.what() << "\n" << r.out;
    return nlohmann::json::object();
  }
}

}  // namespace mc::testkit
