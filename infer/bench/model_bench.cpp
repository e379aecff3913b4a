// model_bench: the CPU engine's figures of issue 49 (docs/BENCHMARKS.md "The CPU engine on a checkpoint"), each beside
// the limit measured in the same run:
//  1. Prefill of N-token prompts (no cache): tokens/s and FLOP/s, against OpenBLAS sgemm's rate on the model's own
//     GEMM shapes (M = N; q, k, v, o, gate, up, down; fp32, all threads), the compute limit. FLOPs counted are those
//     the engine does: 2·N·(layer weights) + causal attention 2·N²·head_dim per head and layer + the last token's
//     logits 2·vocab·hidden.
//  2. Decode steps of a batch of B sequences (each after a prefill of --context tokens): tokens/s against the
//     memory-bandwidth bound: every weight matrix (the layers and lm_head, as stored: bf16 = 2 B a weight) is read
//     once per step, so steps/s <= memcpy bytes/s (all threads, measured here) / weight bytes per step.
// Usage: model_bench --model DIR [--threads N] [--tokens 512,2048] [--batch 1,8] [--steps 16] [--json]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "mc/infer/backend.hpp"

using namespace mc;
using namespace mc::infer;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stoll(item));
  return v;
}

// memcpy bytes/s with `threads` threads, each copying its share of a 512 MiB buffer (best of 5).
double memcpy_bytes_per_s(int threads) {
  const size_t bytes = size_t{512} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    const size_t per = bytes / static_cast<size_t>(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] { std::memcpy(b.data() + t * per, a.data() + t * per, per); });
    }
    for (auto& t : ts) t.join();
    best = std::min(best, seconds_since(t0));
  }
  return static_cast<double>(bytes) / best;
}

// OpenBLAS sgemm FLOP/s over the model's layer GEMM shapes at M rows (best of 3 per shape).
double sgemm_flops_per_s(const model::ModelConfig& m, int64_t rows, int threads) {
  openblas_set_num_threads(threads);
  const int64_t h = m.hidden_size, qd = m.num_heads * m.head_dim, kvd = m.num_kv_heads * m.head_dim;
  const std::pair<int64_t, int64_t> shapes[] = {{h, qd},         {h, kvd},        {h, kvd},       {qd, h},
                                                {h, m.ffn_size}, {h, m.ffn_size}, {m.ffn_size, h}};
  double flops = 0, seconds = 0;
  for (const auto& [in, out] : shapes) {
    std::vector<float> x(static_cast<size_t>(rows * in), 0.5f), w(static_cast<size_t>(in * out), 0.25f),
        y(static_cast<size_t>(rows * out));
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(out),
                  static_cast<int>(in), 1.0f, x.data(), static_cast<int>(in), w.data(), static_cast<int>(in), 0.0f,
                  y.data(), static_cast<int>(out));
      best = std::min(best, seconds_since(t0));
    }
    flops += 2.0 * static_cast<double>(rows * in * out);
    seconds += best;
  }
  return flops / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"model_bench: the CPU engine's prefill and decode rates on a checkpoint, beside sgemm and memcpy"};
  std::string model_dir, tokens_list = "512,2048", batch_list = "1,8", kv_dtype = "auto";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t steps = 16, context = 64, repeats = 2;
  bool json = false;
  app.add_option("--model", model_dir, "Hugging Face model directory (mc-model init makes one)")->required();
  app.add_option("--threads", threads, "Engine and limit threads")->capture_default_str();
  app.add_option("--tokens", tokens_list, "Prompt lengths to prefill, comma-separated")->capture_default_str();
  app.add_option("--batch", batch_list, "Decode batch sizes, comma-separated")->capture_default_str();
  app.add_option("--steps", steps, "Decode steps timed per batch size")->capture_default_str();
  app.add_option("--context", context, "Prompt tokens of each decode sequence")->capture_default_str();
  app.add_option("--repeats", repeats, "Prefill runs per length (the minimum is reported)")->capture_default_str();
  app.add_option("--kv-dtype", kv_dtype, "KV element type")->capture_default_str();
  app.add_flag("--json", json, "One JSON document instead of the table");
  CLI11_PARSE(app, argc, argv);

  auto model = model::load_model(model_dir);
  if (!model.is_ok()) {
    std::fprintf(stderr, "model_bench: %s\n", model.status().to_string().c_str());
    return 2;
  }
  const model::ModelConfig& m = *model;
  const std::vector<int64_t> lengths = parse_list(tokens_list), batches = parse_list(batch_list);
  const double memcpy_bps = memcpy_bytes_per_s(threads);
  std::vector<std::pair<int64_t, double>> sgemm_rates;
  for (int64_t n : lengths) sgemm_rates.emplace_back(n, sgemm_flops_per_s(m, n, threads));

  BackendOptions bo;
  bo.kind = "ref";
  bo.model = m;
  bo.threads = threads;
  bo.kv_dtype = kv_dtype;
  auto made = make_backend(bo);
  if (!made.is_ok()) {
    std::fprintf(stderr, "model_bench: %s\n", made.status().to_string().c_str());
    return 1;
  }
  Backend& backend = **made;
  constexpr int64_t kBlock = 16;
  const int64_t max_len = std::max(*std::max_element(lengths.begin(), lengths.end()),
                                   *std::max_element(batches.begin(), batches.end()) * (context + steps + kBlock));
  auto kv = KvBuffer::create(backend.kv_layout(kBlock), max_len / kBlock + 64).value();
  const int64_t h = m.hidden_size, qd = m.num_heads * m.head_dim, kvd = m.num_kv_heads * m.head_dim;
  const double layer_params = static_cast<double>(h * qd + 2 * h * kvd + qd * h + 3 * h * m.ffn_size);
  nlohmann::json out = {{"model", m.name},
                        {"revision", backend.weights_revision(0)},
                        {"kv_dtype", backend.kv_encoding()},
                        {"threads", threads},
                        {"memcpy_gb_per_s", memcpy_bps / 1e9}};

  nlohmann::json prefill = nlohmann::json::array();
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t n = lengths[i];
    std::vector<uint32_t> prompt(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t)
      prompt[static_cast<size_t>(t)] = static_cast<uint32_t>((t * 7919 + 13) % m.vocab_size);
    auto table = kv->allocate(kv->layout().blocks_for_tokens(n)).value();
    double best = 1e30;
    for (int64_t r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto res = backend.prefill(*kv, PrefillRequest{prompt, 0, table, 0}, nullptr);
      if (!res.is_ok()) {
        std::fprintf(stderr, "model_bench: %s\n", res.status().to_string().c_str());
        return 1;
      }
      best = std::min(best, seconds_since(t0));
    }
    kv->free(table);
    const double nn = static_cast<double>(n);
    const double flops = 2.0 * nn * layer_params * static_cast<double>(m.num_layers) +
                         2.0 * nn * nn * static_cast<double>(m.head_dim * m.num_heads * m.num_layers) +
                         2.0 * static_cast<double>(m.vocab_size * h);
    prefill.push_back({{"tokens", n},
                       {"seconds", best},
                       {"tokens_per_s", nn / best},
                       {"flops_per_s", flops / best},
                       {"sgemm_flops_per_s", sgemm_rates[i].second},
                       {"ratio", flops / best / sgemm_rates[i].second}});
  }
  out["prefill"] = prefill;

  const double weight_bytes =
      (layer_params * static_cast<double>(m.num_layers) + static_cast<double>(m.vocab_size * h)) *
      static_cast<double>(m.dtype_bytes);
  nlohmann::json decode = nlohmann::json::array();
  for (int64_t b : batches) {
    std::vector<std::vector<int32_t>> tables;
    std::vector<DecodeSequence> seqs;
    std::vector<uint32_t> prompt(static_cast<size_t>(context));
    for (int64_t s = 0; s < b; ++s) {
      for (int64_t t = 0; t < context; ++t) {
        prompt[static_cast<size_t>(t)] = static_cast<uint32_t>((s * 131 + t * 7919 + 13) % m.vocab_size);
      }
      tables.push_back(kv->allocate(kv->layout().blocks_for_tokens(context + steps + 1)).value());
      auto res = backend.prefill(*kv, PrefillRequest{prompt, 0, tables.back(), 0}, nullptr);
      if (!res.is_ok()) {
        std::fprintf(stderr, "model_bench: %s\n", res.status().to_string().c_str());
        return 1;
      }
      seqs.push_back(DecodeSequence{res->first_token, context, {}});
    }
    for (int64_t s = 0; s < b; ++s) seqs[static_cast<size_t>(s)].block_table = tables[static_cast<size_t>(s)];
    std::vector<uint32_t> next;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < steps; ++step) {
      if (!backend.decode_step(*kv, seqs, next).is_ok()) {
        std::fprintf(stderr, "model_bench: decode step failed\n");
        return 1;
      }
      for (int64_t s = 0; s < b; ++s) {
        seqs[static_cast<size_t>(s)].last_token = next[static_cast<size_t>(s)];
        seqs[static_cast<size_t>(s)].position += 1;
      }
    }
    const double secs = seconds_since(t0);
    for (auto& t : tables) kv->free(t);
    const double tps = static_cast<double>(b * steps) / secs;
    const double bound = static_cast<double>(b) * memcpy_bps / weight_bytes;
    decode.push_back({{"batch", b},
                      {"tokens_per_s", tps},
                      {"weight_bytes_per_step", weight_bytes},
                      {"bound_tokens_per_s", bound},
                      {"ratio", tps / bound}});
  }
  out["decode"] = decode;

  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("model %s (%s), KV %s, %d threads, memcpy %.1f GB/s\n", m.name.c_str(),
              out["revision"].get<std::string>().c_str(), out["kv_dtype"].get<std::string>().c_str(), threads,
              memcpy_bps / 1e9);
  std::printf("%-22s %10s %12s %14s %14s %7s\n", "prefill", "seconds", "tokens/s", "GFLOP/s", "sgemm GFLOP/s", "ratio");
  for (const auto& p : prefill) {
    std::printf("%-22s %10.3f %12.1f %14.2f %14.2f %7.2f\n",
                (std::to_string(p["tokens"].get<int64_t>()) + " tokens").c_str(), p["seconds"].get<double>(),
                p["tokens_per_s"].get<double>(), p["flops_per_s"].get<double>() / 1e9,
                p["sgemm_flops_per_s"].get<double>() / 1e9, p["ratio"].get<double>());
  }
  std::printf("%-22s %12s %14s %14s %7s\n", "decode", "tokens/s", "MB/step", "bound tok/s", "ratio");
  for (const auto& d : decode) {
    std::printf("%-22s %12.2f %14.1f %14.2f %7.2f\n", ("batch " + std::to_string(d["batch"].get<int64_t>())).c_str(),
                d["tokens_per_s"].get<double>(), d["weight_bytes_per_step"].get<double>() / 1e6,
                d["bound_tokens_per_s"].get<double>(), d["ratio"].get<double>());
  }
  return 0;
}
