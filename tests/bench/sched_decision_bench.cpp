// Decision time of the Conductor (issue 6): one Scheduler::decide() for a 24-block request with
// 16 / 64 / 256 prefill instances (8 per host), 16 decode instances and 1 M indexed blocks, per policy.
// The reference beside it (the limit of any decision) is the prefix-index lookup of the same 24 blocks
// alone: decide() = lookup + pricing every instance + the decode choice. The kvcache_paths rows add measured
// host-to-host paths (DESIGN.md §16 "Bandwidth decides, live"): one sample from host-0 to every host, so that every
// host gets its own plan (without them the hosts holding none of the prefix share one).
//   build/bench/sched_decision_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/sched/scheduler.hpp"

namespace {

using namespace mc::sched;

constexpr int kBlocks = 24;
constexpr int64_t kIndexedBlocks = 1'000'000;
constexpr int kInstancesPerHost = 8;
constexpr int kDecodes = 16;

struct Cluster {
  mc::ManualClock clock{1'000'000'000};
  std::unique_ptr<Scheduler> sched;
  Request request;
};

// 1 M blocks spread over the hosts' DRAM segments (and 1 in 8 also on an SSD); the request's first
// 16 blocks are cached on two hosts (one of them also holds 8 more on SSD), the last 8 nowhere.
std::unique_ptr<Cluster> make_cluster(int prefill_instances, const std::string& policy, bool paths = false) {
  auto c = std::make_unique<Cluster>();
  SchedulerConfig cfg;
  cfg.policy = policy;
  auto s = Scheduler::create(cfg, &c->clock);
  if (!s.is_ok()) return nullptr;
  c->sched = std::move(s).value();
  Scheduler& sch = *c->sched;
  const int hosts = std::max(1, prefill_instances / kInstancesPerHost);
  for (int i = 0; i < prefill_instances; ++i) {
    InstanceInfo info;
    info.id = "prefill-" + std::to_string(i);
    info.role = Role::kPrefill;
    info.host = "host-" + std::to_string(i / kInstancesPerHost);
    info.endpoint = "tcp://127.0.0.1:1";
    (void)sch.register_instance(info);
    LoadReport load;
    load.queued_prefill_tokens = (i * 7919) % 20'000;
    (void)sch.heartbeat(info.id, load);
  }
  for (int i = 0; i < kDecodes; ++i) {
    InstanceInfo info;
    info.id = "decode-" + std::to_string(i);
    info.role = Role::kDecode;
    info.host = "dhost-" + std::to_string(i / kInstancesPerHost);
    info.endpoint = "tcp://127.0.0.1:2";
    info.kv_capacity_tokens = 1'000'000;
    (void)sch.register_instance(info);
  }
  for (int h = 0; h < hosts; ++h) sch.set_backend_host("seg-" + std::to_string(h), "host-" + std::to_string(h));
  sch.set_backend_host("ssd-0", "host-0");
  sch.index().reserve(static_cast<size_t>(kIndexedBlocks));
  std::mt19937_64 rng(7);
  for (int64_t b = 0; b < kIndexedBlocks; ++b) {
    uint64_t h = rng();
    sch.index().add(h, "seg-" + std::to_string(b % hosts), mc::Medium::kCpu);
    if (b % 8 == 0) sch.index().add(h, "ssd-0", mc::Medium::kDisk);
  }
  Request& r = c->request;
  r.request_id = "bench";
  r.input_tokens = kBlocks * 512 + 100;
  r.output_tokens = 256;
  for (int i = 0; i < kBlocks; ++i) r.block_hashes.push_back(0xC0FFEE00ULL + static_cast<uint64_t>(i));
  for (int i = 0; i < 16; ++i) {
    sch.index().add(r.block_hashes[static_cast<size_t>(i)], "seg-0", mc::Medium::kCpu);
    sch.index().add(r.block_hashes[static_cast<size_t>(i)], "seg-" + std::to_string(hosts / 2), mc::Medium::kCpu);
  }
  for (int i = 16; i < 24 && i < kBlocks; ++i) {
    if (i < 20) sch.index().add(r.block_hashes[static_cast<size_t>(i)], "ssd-0", mc::Medium::kDisk);
  }
  for (int h = 0; paths && h < hosts; ++h) {
    PrefillReport rep{"sample-" + std::to_string(h),
                      "prefill-" + std::to_string(h * kInstancesPerHost),
                      512,
                      512,
                      50,
                      {0, 167'772'160, 0},
                      {0, 20'000'000, 0},
                      true,
                      "host-0"};
    sch.on_prefill_done(rep);
  }
  return c;
}

void BM_Decide(benchmark::State& state, const std::string& variant) {
  const bool paths = variant == "kvcache_paths";
  const std::string policy = paths ? "kvcache" : variant;
  static std::unique_ptr<Cluster> cached;
  static std::string cached_key;
  const auto n = static_cast<int>(state.range(0));
  const std::string key = variant + "/" + std::to_string(n);
  if (cached_key != key) {
    cached.reset();
    cached = make_cluster(n, policy, paths);
    cached_key = key;
  }
  Cluster& c = *cached;
  int64_t accepted = 0;
  for (auto _ : state) {
    Decision d = c.sched->decide(c.request);
    accepted += d.accepted ? 1 : 0;
    benchmark::DoNotOptimize(d);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["prefill_instances"] = n;
  state.counters["indexed_blocks"] = static_cast<double>(c.sched->index().blocks());
  state.counters["accepted_fraction"] = static_cast<double>(accepted) / static_cast<double>(state.iterations());
}

void BM_IndexLookup24(benchmark::State& state) {
  static std::unique_ptr<Cluster> c = make_cluster(64, "kvcache");
  std::vector<std::span<const Holder>> out;
  for (auto _ : state) {
    c->sched->index().lookup(c->request.block_hashes, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_IndexLookup24);
BENCHMARK_CAPTURE(BM_Decide, kvcache, std::string("kvcache"))->Arg(16)->Arg(64)->Arg(256);
BENCHMARK_CAPTURE(BM_Decide, kvcache_paths, std::string("kvcache_paths"))->Arg(16)->Arg(64)->Arg(256);
BENCHMARK_CAPTURE(BM_Decide, cache_aware, std::string("cache_aware"))->Arg(64);
BENCHMARK_CAPTURE(BM_Decide, least_loaded, std::string("least_loaded"))->Arg(64);
BENCHMARK_CAPTURE(BM_Decide, random, std::string("random"))->Arg(64);

}  // namespace

BENCHMARK_MAIN();
