// Tokenizer throughput (issue 50): encode ~1 MB of English (this repository's docs, repeated) with the tokenizers
// tests/text/make_tokenizers.py trains (byte-level Llama 3 style, SentencePiece style), against a memcpy of the
// same bytes in the same run; decode and streaming decode per token. MC_TOKENIZER=<tokenizer.json or model
// directory> adds a real checkpoint's tokenizer as "env".
// Counters: bytes_per_second (MB/s of text), tokens/s.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "mc/text/tokenizer.hpp"

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string& text_1mb() {
  static const std::string text = [] {
    const std::string src =
        read(std::string(MC_SOURCE_DIR) + "/docs/DESIGN.md") + read(std::string(MC_SOURCE_DIR) + "/README.md");
    std::string t;
    while (t.size() < (1u << 20)) t += src;
    t.resize(1u << 20);
    while (!t.empty() && (static_cast<unsigned char>(t.back()) & 0xC0) == 0x80) t.pop_back();
    if (!t.empty() && static_cast<unsigned char>(t.back()) >= 0xC0) t.pop_back();
    return t;
  }();
  return text;
}

// name -> tokenizer.json text (trained once per process into a temporary directory).
const std::map<std::string, std::string>& json_texts() {
  static const auto all = [] {
    std::map<std::string, std::string> m;
    const std::string dir =
        std::filesystem::temp_directory_path().string() + "/mc_tokenizer_bench_" + std::to_string(::getpid());
    const std::string cmd = "/usr/bin/python3 " + std::string(MC_SOURCE_DIR) + "/tests/text/make_tokenizers.py " + dir;
    if (std::system(cmd.c_str()) == 0) {
      for (const char* n : {"bytelevel", "sp"}) m.emplace(n, read(dir + "/" + n + "/tokenizer.json"));
    }
    std::filesystem::remove_all(dir);
    if (const char* env = std::getenv("MC_TOKENIZER")) {
      std::string path = env;
      if (std::filesystem::is_directory(path)) path += "/tokenizer.json";
      m.emplace("env", read(path));
    }
    return m;
  }();
  return all;
}

// A tokenizer loaded once per process (its word cache warms over the iterations).
const mc::text::Tokenizer* tokenizer(const std::string& name) {
  static std::map<std::string, mc::text::Tokenizer> loaded;
  if (auto it = loaded.find(name); it != loaded.end()) return &it->second;
  auto j = json_texts().find(name);
  if (j == json_texts().end()) return nullptr;
  auto t = mc::text::Tokenizer::from_json(j->second, name);
  if (!t.is_ok()) {
    std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
    return nullptr;
  }
  return &loaded.emplace(name, *t).first->second;
}

void BM_Memcpy1MB(benchmark::State& state) {
  const std::string& text = text_1mb();
  std::string dst(text.size(), '\0');
  for (auto _ : state) {
    std::memcpy(dst.data(), text.data(), text.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_Memcpy1MB);

void BM_Encode1MB(benchmark::State& state, const std::string& name) {
  const auto* tok = tokenizer(name);
  if (tok == nullptr) {
    state.SkipWithError(("no tokenizer " + name).c_str());
    return;
  }
  const std::string& text = text_1mb();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, true, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens) * static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

// Every iteration on a freshly loaded tokenizer: the word cache starts empty (the load is not timed).
void BM_Encode1MBColdCache(benchmark::State& state, const std::string& name) {
  auto j = json_texts().find(name);
  if (j == json_texts().end()) {
    state.SkipWithError(("no tokenizer " + name).c_str());
    return;
  }
  const std::string& text = text_1mb();
  size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = mc::text::Tokenizer::from_json(j->second, name);
    state.ResumeTiming();
    auto ids = tok->encode(text, true, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens) * static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

void BM_Load(benchmark::State& state, const std::string& name) {
  auto j = json_texts().find(name);
  if (j == json_texts().end()) {
    state.SkipWithError(("no tokenizer " + name).c_str());
    return;
  }
  for (auto _ : state) {
    auto tok = mc::text::Tokenizer::from_json(j->second, name);
    benchmark::DoNotOptimize(tok.is_ok());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * j->second.size()));
}

void BM_Decode1MB(benchmark::State& state, const std::string& name) {
  const auto* tok = tokenizer(name);
  if (tok == nullptr) {
    state.SkipWithError(("no tokenizer " + name).c_str());
    return;
  }
  const auto ids = tok->encode(text_1mb(), false, false);
  for (auto _ : state) {
    auto s = tok->decode(ids, false);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text_1mb().size()));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(ids.size()) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_DecodeStream1MB(benchmark::State& state, const std::string& name) {
  const auto* tok = tokenizer(name);
  if (tok == nullptr) {
    state.SkipWithError(("no tokenizer " + name).c_str());
    return;
  }
  const auto ids = tok->encode(text_1mb(), false, false);
  for (auto _ : state) {
    mc::text::DecodeStream ds(*tok, true);
    size_t n = 0;
    for (uint32_t id : ids) n += ds.feed(id).size();
    n += ds.finish().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text_1mb().size()));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(ids.size()) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Encode1MB, bytelevel, std::string("bytelevel"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode1MB, sp, std::string("sp"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode1MB, env, std::string("env"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode1MBColdCache, bytelevel, std::string("bytelevel"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode1MBColdCache, sp, std::string("sp"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode1MBColdCache, env, std::string("env"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Load, bytelevel, std::string("bytelevel"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Load, env, std::string("env"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode1MB, bytelevel, std::string("bytelevel"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode1MB, sp, std::string("sp"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DecodeStream1MB, bytelevel, std::string("bytelevel"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DecodeStream1MB, sp, std::string("sp"))->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
