// infer_bench: the two figures of issue 5 (docs/BENCHMARKS.md, "Compute backends").
//  1. ref prefill of an N-token input with 0 %, 50 %, 95 % of it cached: time as a fraction of the uncached time,
//     beside the fraction of FLOPs avoided (cost_model.hpp model::prefill_flops) — the limit the time should follow.
//  2. Layer-wise streaming to a decode worker served in this process (its RPC endpoint on loopback): time from the
//     last prefill layer to "all KV at decode" as a fraction of the prefill time, and the KV bytes moved, for the
//     transfer-engine path (WRITE into decode's published KV segment + layer notification; shm on one host) and,
//     side by side, the kv_write RPC fallback. The limit beside it: one layer's KV copied by memcpy (the least a
//     tail can be when the last layer is only sent after it is computed).
// Usage: infer_bench [--model small] [--tokens 4096] [--threads 1] [--streaming-only] [--json]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "mc/common/daemon.hpp"
#include "mc/infer/decode_worker.hpp"
#include "mc/infer/prefill_worker.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/worker.hpp"

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
  bool json = false, streaming_only = false;
  app.add_option("--model", model_name, "Model preset or JSON file")->capture_default_str();
  app.add_option("--tokens", tokens, "Prompt tokens")->capture_default_str();
  app.add_option("--block-size", block, "Tokens per KV block")->capture_default_str();
  app.add_option("--threads", threads, "OpenBLAS threads")->capture_default_str();
  app.add_option("--repeats", repeats, "Runs per point (the minimum is reported)")->capture_default_str();
  app.add_flag("--json", json, "One JSON document instead of the table");
  app.add_flag("--streaming-only", streaming_only, "Skip the cached-fraction sweep (figure 1)");
  CLI11_PARSE(app, argc, argv);

  auto model = model::load_model(model_name);
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
  for (int64_t i = 0; i < tokens; ++i)
    prompt[static_cast<size_t>(i)] = static_cast<uint32_t>((i * 7919 + 13) % model->vocab_size);
  auto table = kv->allocate((tokens + block - 1) / block).value();

  // Full prefill first (fills the KV of every token, which the cached runs then reuse in place).
  nlohmann::json out = {{"model", model->name}, {"tokens", tokens}, {"threads", threads}, {"block_tokens", block}};
  double full_s = 0;
  std::vector<nlohmann::json> rows;
  for (double pct : {0.0, 0.5, 0.95}) {
    if (streaming_only) break;
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
    const double flops = model::prefill_flops(*model, tokens - cached, cached);
    const double flops_full = model::prefill_flops(*model, tokens, 0);
    rows.push_back({{"cached_fraction", static_cast<double>(cached) / static_cast<double>(tokens)},
                    {"cached_tokens", cached},
                    {"prefill_s", best},
                    {"time_fraction_of_uncached", best / full_s},
                    {"flops", flops},
                    {"flops_avoided_fraction", 1.0 - flops / flops_full},
                    {"achieved_flops_per_s", flops / best}});
  }
  out["prefill"] = rows;

  // Layer-wise streaming: a decode worker (KV segment published on loopback) served in this process; one prefill
  // worker writes through the transfer engine, another through kv_write RPCs.
  DecodeWorkerOptions dopt;
  dopt.block_tokens = block;
  dopt.kv_blocks = (tokens + block - 1) / block + 64;
  auto decode = DecodeWorker::create(dopt, make_backend(bo).value(), std::make_unique<NullSink>()).value();
  transfer::EngineOptions eo;
  eo.listen = {"tcp://127.0.0.1:0"};
  if (Status st = decode->publish_kv_segment(eo); !st.is_ok()) {
    std::fprintf(stderr, "infer_bench: %s\n", st.to_string().c_str());
    return 1;
  }
  std::string transport = "?";
  if (auto probe = transfer::TransferEngine::create({}); probe.is_ok()) {
    if (auto h = (*probe)->open_segment(decode->kv_segment()); h.is_ok()) {
      transport = (*probe)->segment_transport(h.value()).value_or("?");
    }
  }
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
  std::thread server([&] { (void)serve_decode(*decode, endpoint); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PrefillWorkerOptions popt;
  popt.block_tokens = block;
  popt.kv_blocks = (tokens + block - 1) / block + 1;
  popt.kv_transfer_timeout_ms = 30000;
  auto engine_prefill =
      PrefillWorker::create(popt, make_backend(bo).value(), nullptr, make_rpc_decode_link(30000)).value();
  popt.kv_engine = false;
  auto rpc_prefill =
      PrefillWorker::create(popt, make_backend(bo).value(), nullptr, make_rpc_decode_link(30000)).value();
  // The limit: one layer's KV (every block of the prompt) copied once by memcpy.
  const int64_t layer_bytes = ((tokens + block - 1) / block) * backend->kv_layout(block).layer_block_bytes();
  double memcpy_layer_s = 1e30;
  {
    std::vector<char> src(static_cast<size_t>(layer_bytes), 1), dst(static_cast<size_t>(layer_bytes), 0);
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), src.size());
      memcpy_layer_s = std::min(memcpy_layer_s, seconds_since(t0));
    }
  }
  auto dclient = rpc::RpcClient::connect(endpoint);
  if (!dclient.is_ok()) {
    std::fprintf(stderr, "infer_bench: %s\n", dclient.status().to_string().c_str());
    daemon::request_stop();
    server.join();
    return 1;
  }
  // Runs the job `repeats` times on `prefill`; the run with the smallest tail (exact, from the worker's
  // mc_prefill_kv_tail_seconds histogram) is reported.
  auto stream_runs = [&](PrefillWorker& prefill, const std::string& path) -> nlohmann::json {
    nlohmann::json best;
    double best_tail_s = 1e30;
    auto& tails = prefill.metrics().histogram("mc_prefill_kv_tail_seconds", metrics::latency_buckets_s());
    for (int r = 0; r < repeats; ++r) {
      // The previous run's sequence finishes on the decode step thread: wait (bounded) until its KV is free.
      for (int i = 0; i < 500 && !decode->idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      auto res = (*dclient)->call(proto::DecodeReserveRequest{"bench", tokens, 1, "tcp://127.0.0.1:1", 0}, 5000);
      if (!res.is_ok()) {
        std::fprintf(stderr, "infer_bench: %s\n", res.status().to_string().c_str());
        break;
      }
      proto::PrefillJobRequest job;
      job.request_id = "bench";
      job.tokens = prompt;
      job.decode_endpoint = endpoint;
      job.reservation_id = res->reservation_id;
      job.decode_block_offsets_bytes = res->block_offsets_bytes;
      job.decode_kv_segment = res->kv_segment;
      job.decode_kv_grant = res->kv_grant;
      const double tail_sum_before = tails.sum();
      auto reply = prefill.run_job(job);
      (void)(*dclient)->call(proto::DecodeReleaseRequest{res->reservation_id}, 2000);
      if (!reply.is_ok()) {
        std::fprintf(stderr, "infer_bench: %s: %s\n", path.c_str(), reply.status().to_string().c_str());
        break;
      }
      const double tail_s = tails.sum() - tail_sum_before;
      const auto& l = reply->ledger;
      if (tail_s < best_tail_s) {
        best_tail_s = tail_s;
        best = {{"path", path},
                {"prefill_ms", l.prefill_ms},
                {"kv_tail_s", tail_s},
                {"tail_fraction_of_prefill", tail_s / std::max(1e-9, static_cast<double>(l.prefill_ms) * 1e-3)},
                {"tail_vs_memcpy_of_one_layer", tail_s / memcpy_layer_s},
                {"kv_sent_bytes", l.kv_sent_bytes},
                {"layers", model->num_layers}};
      }
    }
    return best;
  };
  nlohmann::json stream = nlohmann::json::array();
  stream.push_back(stream_runs(*engine_prefill, "transfer engine (" + transport + ")"));
  stream.push_back(stream_runs(*rpc_prefill, "kv_write RPC"));
  out["layerwise_streaming"] = stream;
  out["memcpy_one_layer_s"] = memcpy_layer_s;
  out["one_layer_bytes"] = layer_bytes;
  out["decode_kv_engine_bytes"] = decode->metrics().counter("mc_decode_kv_engine_bytes_total").value();
  out["decode_kv_write_calls"] = decode->metrics().counter("mc_decode_kv_write_calls_total").value();
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
  std::printf("\nlayer-wise streaming (limit: memcpy of one layer's %lld B = %.3f ms)\n",
              static_cast<long long>(layer_bytes), memcpy_layer_s * 1e3);
  std::printf("%-26s %-12s %-20s %-22s %-20s %-14s\n", "path", "prefill_ms", "last_layer->all_KV_ms", "tail/prefill",
              "tail/memcpy_layer", "KV_bytes");
  for (const auto& r : stream) {
    if (r.empty()) continue;
    std::printf("%-26s %-12lld %-20.3f %-22.5f %-20.1f %-14lld\n", r["path"].get<std::string>().c_str(),
                static_cast<long long>(r["prefill_ms"].get<int64_t>()), r["kv_tail_s"].get<double>() * 1e3,
                r["tail_fraction_of_prefill"].get<double>(), r["tail_vs_memcpy_of_one_layer"].get<double>(),
                static_cast<long long>(r["kv_sent_bytes"].get<int64_t>()));
  }
  return 0;
}
