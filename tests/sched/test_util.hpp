// Shared helpers of the sched tests: a scheduler on a ManualClock with hand-built instances.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "mc/common/clock.hpp"
#include "mc/sched/scheduler.hpp"

namespace mc::sched::testing {

inline std::unique_ptr<Scheduler> make_scheduler(const Clock* clock, SchedulerConfig cfg = {},
                                                 PrefillCostPrior prefill = {}, DecodeCostPrior decode = {},
                                                 BandwidthPriors bw = {}) {
  auto s = Scheduler::create(std::move(cfg), clock, prefill, decode, bw);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

inline InstanceInfo prefill_info(const std::string& id, const std::string& host) {
  InstanceInfo i;
  i.id = id;
  i.role = Role::kPrefill;
  i.host = host;
  i.endpoint = "tcp://127.0.0.1:1";
  return i;
}

inline InstanceInfo decode_info(const std::string& id, const std::string& host, int64_t kv_capacity_tokens) {
  InstanceInfo i;
  i.id = id;
  i.role = Role::kDecode;
  i.host = host;
  i.endpoint = "tcp://127.0.0.1:2";
  i.kv_capacity_tokens = kv_capacity_tokens;
  return i;
}

// Hashes 1..n: distinct, arbitrary (the index does not care how they were made).
inline std::vector<uint64_t> hashes(int n, uint64_t base = 1000) {
  std::vector<uint64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(base + static_cast<uint64_t>(i));
  return v;
}

inline Request request(const std::string& id, int64_t input_tokens, int64_t output_tokens, int blocks,
                       uint64_t base = 1000) {
  Request r;
  r.request_id = id;
  r.input_tokens = input_tokens;
  r.output_tokens = output_tokens;
  r.block_hashes = hashes(blocks, base);
  return r;
}

}  // namespace mc::sched::testing
