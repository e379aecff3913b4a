// The cluster e2e tests' fixture (cluster_e2e_test.cpp, cluster_placement_e2e_test.cpp): examples/local-cluster.sh
// started per test with the Conductor's and the store's RPC at hand, trace rows of chosen block hashes, replays.
#pragma once
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/store.hpp"
#include "mc/testkit/local_cluster.hpp"

namespace mc::sched::cluster_e2e {

using json = nlohmann::json;
using testkit::slurp;

// The cluster runs 2x faster than the hardware it models: phase (r)'s long job then keeps the holder busy
// for about 4.5 s of wall time, far longer than a sanitizer build on a loaded machine takes to send the
// next request (at 20x it lasted 0.45 s, and a late sender found the holder idle again).
inline const char* const kTimeScale = "2";
inline const std::string kBin = MC_BINARY_DIR "/bin";
inline constexpr int64_t kBlockTokens = 512;

// One trace row: `ids` full blocks of 512 tokens.
inline std::string trace_row(int64_t timestamp_ms, const std::vector<uint64_t>& ids, int64_t output_tokens = 2) {
  json j = {{"timestamp", timestamp_ms},
            {"input_length", static_cast<int64_t>(ids.size()) * kBlockTokens},
            {"output_length", output_tokens},
            {"hash_ids", ids}};
  return j.dump();
}

inline std::vector<uint64_t> ids_range(uint64_t first, size_t n) {
  std::vector<uint64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

inline std::vector<uint64_t> concat(std::vector<uint64_t> a, const std::vector<uint64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A cluster started by local-cluster.sh with `flags` (after --bin and --ready-timeout-s), its daemons running
// `time_scale` times faster than the hardware they model; replays use the same scale.
class ClusterFixture : public testkit::LocalClusterFixture {
 protected:
  ClusterFixture() : LocalClusterFixture("cluster_e2e") {}
  void start_cluster(std::vector<std::string> flags, const std::string& time_scale) {
    time_scale_ = time_scale;
    flags.insert(flags.end(), {"--time-scale", time_scale});
    LocalClusterFixture::start_cluster(flags, {"master", "conductor", "prefill0", "prefill1", "decode0", "decode1"});
  }

  double counter(const std::string& daemon, const std::string& name) {
    json m = json::parse(call(daemon, proto::StatRequest{}).metrics_json, nullptr, false);
    if (m.is_discarded() || !m["counters"].contains(name)) return 0;
    return m["counters"][name].get<double>();
  }
  double prefill_jobs() {
    return counter("prefill0", "mc_prefill_jobs_total") + counter("prefill1", "mc_prefill_jobs_total");
  }
  // Polls the Conductor until its prefix index holds at least `entries` (block, holder) pairs.
  bool wait_index(int64_t entries, json* last) {
    return testkit::wait_until(
        [&] {
          *last = conductor_status();
          return (*last)["index"].value("holder_entries", int64_t{0}) >= entries;
        },
        40'000, 100);
  }
  // Polls the Conductor until nothing is queued or dispatching: a replay ends at the last token, and the
  // prefill's job reply (which ends its queue entry) comes after it stored the new blocks.
  bool wait_idle(json* last) {
    return testkit::wait_until(
        [&] {
          *last = conductor_status();
          bool idle = last->value("requests_dispatching", 1) == 0;
          for (const json& inst : (*last)["instances"]) idle = idle && inst.value("queue_ms", 0.0) == 0.0;
          return idle;
        },
        40'000, 100);
  }
  // The store's objects of the KV namespace, key -> segments of its complete replicas.
  std::map<std::string, std::vector<std::string>> store_objects() {
    proto::StoreLsRequest ls;
    ls.prefix = "kv/";
    std::map<std::string, std::vector<std::string>> out;
    for (int page = 0; page < 100; ++page) {  // pages of proto::kStoreLsPageObjects
      const proto::StoreLsReply reply = call("master", ls);
      for (const auto& o : reply.objects) {
        if (o.complete) out[o.key] = o.segments;
      }
      if (!reply.truncated || reply.objects.empty()) break;
      ls.start_after = reply.objects.back().key;
    }
    return out;
  }

  // Replays `rows` (one phase) and returns the records by trace line (1-based).
  std::map<int64_t, json> replay(const std::string& tag, const std::vector<std::string>& rows) {
    {
      std::ofstream t(s_.path(tag + ".trace.jsonl"));
      for (const auto& r : rows) t << r << '\n';
    }
    auto c = testkit::start_group_child(
        {kBin + "/mc-trace-replay", s_.path(tag + ".trace.jsonl"), "--conductor", endpoints_.at("conductor"), "--json",
         "--out", s_.path(tag + ".jsonl"), "--no-progress", "--time-scale", time_scale_, "--slo-ttft-ms", "600000",
         "--slo-tbt-ms", "600000", "--drain-timeout-s", "60", "--id-prefix", tag + "-",
         // One sender: submissions in trace order (a long prompt takes longer to synthesize and send).
         "--senders", "1"},
        s_.path(tag + ".out"), s_.path(tag + ".err"));
    const int rc = c->wait_exit(120'000);
    EXPECT_EQ(rc, 0) << tag << ":\n" << slurp(s_.path(tag + ".err"));
    std::map<int64_t, json> records;
    std::ifstream in(s_.path(tag + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json j = json::parse(line);
      records[j.value("trace_line", int64_t{0})] = j;
    }
    EXPECT_EQ(records.size(), rows.size()) << tag << ":\n" << slurp(s_.path(tag + ".err"));
    return records;
  }
  // Runs one of the tools to its end (60 s at most); its exit status, stdout and stderr.
  struct ToolRun {
    int rc = -1;
    std::string out, err;
  };
  ToolRun run_tool(const std::string& tag, const std::vector<std::string>& argv) {
    auto c = testkit::start_group_child(argv, s_.path(tag + ".out"), s_.path(tag + ".err"));
    ToolRun r;
    r.rc = c->wait_exit(60'000);
    r.out = slurp(s_.path(tag + ".out"));
    r.err = slurp(s_.path(tag + ".err"));
    return r;
  }
  std::string why(const std::string& tag) {
    return "\nreplay stderr:\n" + slurp(s_.path(tag + ".err")) + "\nconductor: " + conductor_status().dump();
  }

  std::string time_scale_;
};

}  // namespace mc::sched::cluster_e2e
