// infer_bench: the two figures of issue 5 (docs/BENCHMARKS.md, "Compute backends").
//  1. ref prefill of an N-token input with 0 %, 50 %, 95 % of it cached: time as a fraction of the uncached time,
//     beside the fraction of FLOPs avoided (cost_model.hpp prefill_flops) — the limit the time should follow.
//  2. Layer-wise streaming over loopback TCP (kv_write RPCs to a decode worker in this process): time from the last
//     prefill layer to "all KV at decode" as a fraction of the prefill time, and the KV bytes moved.
// Usage: infer_bench [--model small] [--tokens 4096] [--threads 1] [--json]
#include <chrono>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "mc/common/daemon.hpp"
#include "mc/common/rpc.hpp"
#include "mc/infer/decode_worker.hpp"
#include "mc/infer/prefill_worker.hpp"

using namespace mc;
using namespace mc::infer;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class NullSink final : public TokenSink {
 public:
  Status token(const std::string&, const proto::TokenEvent&) override { return Status::ok(); }
  Status done(const std::string&, const proto::RequestDone&) override { return Status::ok(); }
  Status fail(const std::string&, const proto::RequestError&) override { return Status::ok(); }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"infer_bench: ref prefill time vs cached fraction, and layer-wise streaming overlap"};
  std::string model_name = "small";
  int64_t tokens = 4096, block = 64;
  int threads = 1, repeats = 2;
  bool json = false;
  app.add_option("--model", model_name, "Model preset or JSON file")->capture_default_str();
  app.add_option("--tokens", tokens, "Prompt tokens")->capture_default_str();
  app.add_option("--block-size", block, "Tokens per KV block")->capture_default_str();
  app.add_option("--threads", threads, "OpenBLAS threads")->capture_default_str();
  app.add_option("--repeats", repeats, "Runs per point (the minimum is reported)")->capture_default_str();
  app.add_flag("--json", json, "One JSON document instead of the table");
  CLI11_PARSE(app, argc, argv);

  auto model = load_model(model_name);
  if (!model.is_ok()) {
    std::fprintf(stderr, "infer_bench: %s\n", model.status().to_string().c_str());
    return 2;
  }
  model->max_context_tokens = std::max(model->max_context_tokens, tokens);
  BackendOptions bo;
  bo.kind = "ref";
  bo.model = *model;
  bo.threads = threads;
  auto backend = make_backend(bo).value();
  auto kv = KvBuffer::create(backend->kv_layout(block), 2 * ((tokens + block - 1) / block) + 2).value();
  std::vector<uint32_t> prompt(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) prompt[static_cast<size_t>(i)] = static_cast<uint32_t>((i * 7919 + 13) % model->vocab_size);
  auto table = kv->allocate((tokens + block - 1) / block).value();

  // Full prefill first (fills the KV of every token, which the cached runs then reuse in place).
  nlohmann::json out = {{"model", model->name}, {"tokens", tokens}, {"threads", threads}, {"block_tokens", block}};
  double full_s = 0;
  std::vector<nlohmann::json> rows;
  for (double pct : {0.0, 0.5, 0.95}) {
    const int64_t cached = static_cast<int64_t>(pct * static_cast<double>(tokens)) / block * block;
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto res = backend->prefill(*kv, {prompt, cached, table, 0}, nullptr);
      if (!res.is_ok()) {
        std::fprintf(stderr, "infer_bench: %s\n", res.status().to_string().c_str());
        return 1;
      }
      best = std::min(best, seconds_since(t0));
    }
    if (cached == 0) full_s = best;
    const double flops = prefill_flops(*model, tokens - cached, cached);
    const double flops_full = prefill_flops(*model, tokens, 0);
    rows.push_back({{"cached_fraction", static_cast<double>(cached) / static_cast<double>(tokens)},
                    {"cached_tokens", cached},
                    {"prefill_s", best},
                    {"time_fraction_of_uncached", best / full_s},
                    {"flops", flops},
                    {"flops_avoided_fraction", 1.0 - flops / flops_full},
                    {"achieved_flops_per_s", flops / best}});
  }
  out["prefill"] = rows;

  // Layer-wise streaming: a decode worker served over loopback TCP in this process.
  DecodeWorkerOptions dopt;
  dopt.block_tokens = block;
  dopt.kv_blocks = (tokens + block - 1) / block + 64;
  auto decode = DecodeWorker::create(dopt, make_backend(bo).value(), std::make_unique<NullSink>()).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
  std::thread server([&] { (void)serve_decode(*decode, endpoint); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PrefillWorkerOptions popt;
  popt.block_tokens = block;
  popt.kv_blocks = (tokens + block - 1) / block + 1;
  auto prefill = PrefillWorker::create(popt, make_backend(bo).value(), nullptr, make_rpc_decode_link(30000)).value();
  auto dclient = rpc::RpcClient::connect(endpoint);
  if (!dclient.is_ok()) {
    std::fprintf(stderr, "infer_bench: %s\n", dclient.status().to_string().c_str());
    daemon::request_stop();
    server.join();
    return 1;
  }
  nlohmann::json stream;
  double best_tail = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto res = (*dclient)->call(proto::DecodeReserveRequest{"bench", tokens, 1, "tcp://127.0.0.1:1", 0}, 5000).value();
    proto::PrefillJobRequest job;
    job.request_id = "bench";
    job.tokens = prompt;
    job.decode_endpoint = endpoint;
    job.reservation_id = res.reservation_id;
    job.decode_block_offsets_bytes = res.block_offsets_bytes;
    auto reply = prefill->run_job(job);
    (void)(*dclient)->call(proto::DecodeReleaseRequest{res.reservation_id}, 2000);
    if (!reply.is_ok()) {
      std::fprintf(stderr, "infer_bench: %s\n", reply.status().to_string().c_str());
      break;
    }
    const auto& l = reply->ledger;
    if (static_cast<double>(l.kv_tail_ms) < best_tail) {
      best_tail = static_cast<double>(l.kv_tail_ms);
      stream = {{"prefill_ms", l.prefill_ms},
                {"kv_tail_ms", l.kv_tail_ms},
                {"tail_fraction_of_prefill", static_cast<double>(l.kv_tail_ms) / std::max<int64_t>(1, l.prefill_ms)},
                {"kv_sent_bytes", l.kv_sent_bytes},
                {"layers", model->num_layers}};
    }
  }
  out["layerwise_streaming"] = stream;
  daemon::request_stop();
  server.join();

  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("infer_bench: ref backend, model %s, %lld-token prompt, %d OpenBLAS thread(s)\n", model->name.c_str(),
              static_cast<long long>(tokens), threads);
  std::printf("%-12s %-14s %-12s %-22s %-20s %-14s\n", "cached_%", "cached_tokens", "prefill_s", "time_vs_uncached",
              "flops_avoided_%", "GFLOP/s");
  for (const auto& r : rows) {
    std::printf("%-12.0f %-14lld %-12.3f %-22.3f %-20.1f %-14.2f\n", 100 * r["cached_fraction"].get<double>(),
                static_cast<long long>(r["cached_tokens"].get<int64_t>()), r["prefill_s"].get<double>(),
                r["time_fraction_of_uncached"].get<double>(), 100 * r["flops_avoided_fraction"].get<double>(),
                r["achieved_flops_per_s"].get<double>() / 1e9);
  }
  if (!stream.empty()) {
    std::printf("layer-wise streaming: prefill %lld ms, last layer -> all KV at decode %lld ms (%.3f of prefill), "
                "%lld KV bytes over loopback TCP\n",
                static_cast<long long>(stream["prefill_ms"].get<int64_t>()),
                static_cast<long long>(stream["kv_tail_ms"].get<int64_t>()),
                stream["tail_fraction_of_prefill"].get<double>(),
                static_cast<long long>(stream["kv_sent_bytes"].get<int64_t>()));
  }
  return 0;
}
