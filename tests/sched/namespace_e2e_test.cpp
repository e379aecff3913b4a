// The KV namespace per request, end to end with the real daemons (issue 16 item 2, DESIGN.md §4.1):
// examples/local-cluster.sh starts a store master, a storage node, mc-conductor (given --lora house
// --lora-version 1, the default scope of requests that name none), one prefill and one decode instance
// with the ref backend (a real tiny transformer whose LoRA adapters are seeded low-rank deltas). The test
// replays one-row traces through mc-trace-replay, one after another, all with the same tokens, and checks:
//   - requests of equal scope share their blocks: the later one reuses the prefix (a prefix hit) and
//     stores nothing new;
//   - requests whose adapter, adapter version or salt differ never do: no hit, their blocks are stored
//     again under another namespace digest;
//   - the KV bytes of different adapters or versions really differ for the same tokens, and a salt alone
//     changes the keys but not the bytes (it isolates tenants, it does not change the model).
// Only loopback. The cluster script runs in its own process group; a guard ends it (and so every daemon,
// its state directory and /dev/shm files) on the way out, also when an assertion fails.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mc/net/rpc.hpp"
#include "mc/proto/store.hpp"
#include "mc/testkit/local_cluster.hpp"

namespace mc::sched {
namespace MC_UNITY_ID {

using json = nlohmann::json;
using testkit::slurp;

const std::string kBin = MC_BINARY_DIR "/bin";
constexpr int64_t kBlockTokens = 16;

// One trace row of 2 complete blocks and a partial one (40 tokens; the same ids, so the same tokens, in
// every row), with the given key-scope fields (absent when empty).
std::string trace_row(const std::string& lora_name, const std::string& lora_version, const std::string& salt) {
  json j = {{"timestamp", 0}, {"input_length", 40}, {"output_length", 3}, {"hash_ids", {11, 12, 13}}};
  if (!lora_name.empty()) j["lora_name"] = lora_name;
  if (!lora_version.empty()) j["lora_version"] = lora_version;
  if (!salt.empty()) j["salt"] = salt;
  return j.dump();
}

class NamespaceE2E : public testkit::LocalClusterFixture {
 protected:
  NamespaceE2E() : LocalClusterFixture("namespace_e2e") {}
  void SetUp() override {
    start_cluster({"--store-nodes", "1", "--prefill", "1", "--decode", "1", "--backend", "ref", "--model", "tiny",
                   "--block-size", std::to_string(kBlockTokens), "--kv-buffer-size", "16MiB", "--policy", "cache_aware",
                   "--conductor-args", "--lora house --lora-version 1"},
                  {"master", "conductor", "prefill0", "decode0"});
  }

  // The store's complete KV objects: key -> bytes (read with `mc-store get`, as a user would).
  std::map<std::string, std::string> store_objects() {
    proto::StoreLsRequest ls;
    ls.prefix = "kv/";
    ls.limit = 1000;
    std::map<std::string, std::string> out;
    for (const auto& o : call("master", ls).objects) {
      if (!o.complete) continue;
      auto c = testkit::start_group_child({kBin + "/mc-store", "get", "--master", endpoints_.at("master"), o.key},
                                          s_.path("get.out"), s_.path("get.err"));
      const int rc = c->wait_exit(30'000);
      EXPECT_EQ(rc, 0) << o.key << ": " << slurp(s_.path("get.err"));
      out[o.key] = slurp(s_.path("get.out"));
    }
    return out;
  }
  // Waits until the prefill instance has no job queued or running and the Conductor's index holds at least
  // `blocks` blocks: the prefill stores a request's new blocks after its first token, so the next request
  // must not be sent before they are indexed.
  bool wait_settled(int64_t blocks, json* last) {
    return testkit::wait_until(
        [&] {
          *last = conductor_status();
          bool idle = last->value("requests_dispatching", 1) == 0;
          for (const json& inst : (*last)["instances"]) idle = idle && inst.value("queue_ms", 0.0) == 0.0;
          return idle && (*last)["index"].value("blocks", int64_t{0}) >= blocks;
        },
        40'000, 100);
  }

  // Replays one row and returns its record.
  json replay(const std::string& tag, const std::string& row) {
    std::ofstream(s_.path(tag + ".trace.jsonl")) << row << '\n';
    auto c = testkit::start_group_child({kBin + "/mc-trace-replay",
                                         s_.path(tag + ".trace.jsonl"),
                                         "--conductor",
                                         endpoints_.at("conductor"),
                                         "--json",
                                         "--out",
                                         s_.path(tag + ".jsonl"),
                                         "--no-progress",
                                         "--trace-block-size",
                                         std::to_string(kBlockTokens),
                                         "--block-tokens",
                                         std::to_string(kBlockTokens),
                                         "--vocab-size",
                                         "256",
                                         "--slo-ttft-ms",
                                         "600000",
                                         "--slo-tbt-ms",
                                         "600000",
                                         "--drain-timeout-s",
                                         "60",
                                         "--id-prefix",
                                         tag + "-"},
                                        s_.path(tag + ".out"), s_.path(tag + ".err"));
    const int rc = c->wait_exit(120'000);
    EXPECT_EQ(rc, 0) << tag << ":\n" << slurp(s_.path(tag + ".err"));
    std::ifstream in(s_.path(tag + ".jsonl"));
    std::string line;
    json record;
    while (std::getline(in, line)) {
      if (!line.empty()) record = json::parse(line);
    }
    EXPECT_EQ(record.value("outcome", ""), "completed") << tag << ": " << record.dump() << "\n"
                                                        << slurp(s_.path(tag + ".err"));
    return record;
  }
};

// The namespace digest of a block key "kv/<digest>/<seq hash>".
std::string digest_of(const std::string& key) { return key.substr(3, 16); }

TEST_F(NamespaceE2E, EqualScopesShareBlocksOthersNever) {
  json st;
  // Each phase: a row, whether it must reuse the prefix of an earlier one, and the blocks the index then holds.
  struct Phase {
    std::string tag, lora, version, salt;
    bool hit;
    int64_t index_blocks;
  };
  const std::vector<Phase> phases = {
      {"default", "", "", "", false, 2},             // the Conductor's default scope, house@1
      {"default-again", "", "", "", true, 2},        // equal: a prefix hit
      {"a1", "a", "1", "", false, 4},                // another adapter
      {"a2", "a", "2", "", false, 6},                // another version of it
      {"a1-salted", "a", "1", "t1", false, 8},       // the same adapter, another tenant
      {"a1-again", "a", "1", "", true, 8},           // equal to a1
      {"house-explicit", "house", "1", "", true, 8}  // naming the default scope is the default scope
  };
  std::map<std::string, std::set<std::string>> digests_of;  // phase -> namespace digests it added
  std::set<std::string> before;
  for (const Phase& p : phases) {
    const json r = replay(p.tag, trace_row(p.lora, p.version, p.salt));
    // The Conductor's prefix match in the request's namespace (whether the policy then fetches or recomputes
    // that prefix is its pricing, tested in tests/sched); another scope's blocks are never reused.
    const int64_t pool = r.value("ledger", json::object()).value("pool_prefix_tokens", int64_t{-1});
    EXPECT_EQ(pool, p.hit ? 2 * kBlockTokens : 0) << p.tag << ": " << r.dump();
    if (!p.hit) {
      EXPECT_EQ(hit_tokens(r), 0) << p.tag << " shared a block of another scope: " << r.dump();
    }
    ASSERT_TRUE(wait_settled(p.index_blocks, &st)) << p.tag << ": " << st.dump();
    std::set<std::string> now;
    for (const auto& [key, bytes] : store_objects()) now.insert(key);
    for (const auto& key : now) {
      if (!before.count(key)) digests_of[p.tag].insert(digest_of(key));
    }
    EXPECT_EQ(static_cast<int64_t>(now.size()), p.index_blocks) << p.tag;
    if (p.hit) {
      EXPECT_TRUE(digests_of[p.tag].empty()) << p.tag << " stored blocks again";
    } else {
      EXPECT_EQ(digests_of[p.tag].size(), 1u) << p.tag << " should store its 2 blocks in a new namespace";
    }
    before = now;
  }

  // Bytes by namespace: the blocks of house@1, a@1 and a@2 pairwise differ; a@1 salted holds a@1's bytes.
  const auto objects = store_objects();
  std::map<std::string, std::multiset<std::string>> bytes_of;  // digest -> block contents
  for (const auto& [key, bytes] : objects) {
    EXPECT_FALSE(bytes.empty()) << key;
    bytes_of[digest_of(key)].insert(bytes);
  }
  auto only = [&](const std::string& tag) {
    return digests_of[tag].empty() ? std::string() : *digests_of[tag].begin();
  };
  const std::string house = only("default"), a1 = only("a1"), a2 = only("a2"), salted = only("a1-salted");
  ASSERT_EQ((std::set<std::string>{house, a1, a2, salted}).size(), 4u);
  for (const auto& [x, y] : std::vector<std::pair<std::string, std::string>>{{house, a1}, {house, a2}, {a1, a2}}) {
    for (const std::string& b : bytes_of[x]) {
      EXPECT_EQ(bytes_of[y].count(b), 0u) << "namespaces " << x << " and " << y << " hold equal KV bytes";
    }
  }
  EXPECT_EQ(bytes_of[salted], bytes_of[a1]) << "a salt must change the keys, not the model's KV";
}

}  // namespace MC_UNITY_ID
}  // namespace mc::sched
