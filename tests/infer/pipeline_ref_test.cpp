// Chunked pipeline parallelism on the ref backend (issue 22 item 2, DESIGN.md §18): a prefill split into stages of
// layers, run chunk by chunk with only the hidden states crossing between stages, gives the KV and the greedy tokens
// of a one-process prefill: within one process and over 2 and 4 processes (fork, the hidden states through pipes),
// with and without a cached prefix (each stage holding only its own layers of it), with uneven stages.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mc/infer/backend.hpp"
#include "mc/infer/kv_buffer.hpp"
#include "mc/model/model_config.hpp"

namespace mc::infer {
namespace {

constexpr int64_t kPipelineBlock = 16;
constexpr int64_t kPrompt = 300;
constexpr int64_t kChunk = 64;
constexpr int kDecodeSteps = 8;

model::ModelConfig model() { return model::model_preset("small").value(); }  // 8 layers, hidden 256

std::unique_ptr<Backend> backend() {
  BackendOptions o;
  o.kind = "ref";
  o.model = model();
  o.seed = 7;
  o.threads = 1;
  return make_backend(o).value();
}

int64_t blocks() { return (kPrompt + kDecodeSteps + kPipelineBlock - 1) / kPipelineBlock + 1; }

std::unique_ptr<KvBuffer> buffer(const Backend& b) {
  return KvBuffer::create(b.kv_layout(kPipelineBlock), blocks()).value();
}

std::vector<int32_t> table() {
  std::vector<int32_t> t(static_cast<size_t>(blocks()));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i);
  return t;
}

std::vector<uint32_t> prompt() {
  std::mt19937 rng(42);
  std::vector<uint32_t> t(kPrompt);
  for (auto& x : t) x = rng() % static_cast<uint32_t>(model().vocab_size);
  return t;
}

// Copies layers [first, first + count) of every block from `from` to `to`.
void copy_layers(KvBuffer& from, KvBuffer& to, int64_t first, int64_t count) {
  for (int32_t b = 0; b < static_cast<int32_t>(blocks()); ++b) {
    for (int64_t l = first; l < first + count; ++l) {
      auto src = from.layer_block_span(b, l);
      std::memcpy(to.layer_block_span(b, l).data(), src.data(), src.size());
    }
  }
}

// Largest |a - b| over the K and V of tokens [0, n) in every layer.
double max_kv_diff(KvBuffer& a, KvBuffer& b, int64_t n) {
  const model::ModelConfig m = model();
  const int64_t kvd = m.num_kv_heads * m.head_dim;
  double worst = 0;
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t l = 0; l < m.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const auto* x = reinterpret_cast<const float*>(
            a.token_kv(static_cast<int32_t>(p / kPipelineBlock), l, kv, p % kPipelineBlock));
        const auto* y = reinterpret_cast<const float*>(
            b.token_kv(static_cast<int32_t>(p / kPipelineBlock), l, kv, p % kPipelineBlock));
        for (int64_t i = 0; i < kvd; ++i) worst = std::max(worst, static_cast<double>(std::fabs(x[i] - y[i])));
      }
    }
  }
  return worst;
}

// Greedy decode of kDecodeSteps tokens after the prompt from the KV in `kv`.
std::vector<uint32_t> decode(Backend& b, KvBuffer& kv, uint32_t first) {
  const std::vector<int32_t> t = table();
  std::vector<uint32_t> out = {first};
  for (int i = 0; i < kDecodeSteps; ++i) {
    DecodeSequence s{out.back(), kPrompt + i, t};
    std::vector<uint32_t> next;
    EXPECT_TRUE(b.decode_step(kv, {&s, 1}, next).is_ok());
    out.push_back(next.at(0));
  }
  return out;
}

struct Reference {
  std::unique_ptr<Backend> backend = infer::backend();
  std::unique_ptr<KvBuffer> kv = buffer(*backend);
  std::vector<uint32_t> tokens;
};

// One process, no chunks: the KV and the tokens to match.
Reference reference() {
  Reference r;
  const std::vector<uint32_t> p = prompt();
  const std::vector<int32_t> t = table();
  PrefillRequest req;
  req.tokens = p;
  req.block_table = t;
  auto res = r.backend->prefill(*r.kv, req, nullptr);
  EXPECT_TRUE(res.is_ok()) << res.status().to_string();
  r.tokens = decode(*r.backend, *r.kv, res->first_token);
  return r;
}

// Stage s's part of the prefill from token `cached` on: for each chunk, reads the hidden states in (a callback) and
// hands them on. Returns the first token when s is the last stage.
Result<uint32_t> run_stage(Backend& b, KvBuffer& kv, int64_t first_layer, int64_t layers, int64_t cached,
                           const std::function<Status(std::vector<float>&)>& read_in,
                           const std::function<Status(const std::vector<float>&)>& write_out) {
  const std::vector<uint32_t> p = prompt();
  const std::vector<int32_t> t = table();
  uint32_t first = 0;
  for (int64_t begin = cached; begin < kPrompt; begin += kChunk) {
    std::vector<float> in;
    if (first_layer > 0) MC_RETURN_IF_ERROR(read_in(in));
    StageRequest req;
    req.tokens = p;
    req.block_table = t;
    req.token_begin = begin;
    req.token_end = std::min(kPrompt, begin + kChunk);
    req.first_layer = first_layer;
    req.num_layers = layers;
    req.hidden_in = in;
    MC_ASSIGN_OR_RETURN(StageResult r, b.prefill_stage(kv, req, nullptr));
    if (!r.hidden_out.empty()) MC_RETURN_IF_ERROR(write_out(r.hidden_out));
    if (req.token_end == kPrompt) first = r.first_token;
  }
  return first;
}

// The stages in one process, one after the other (stage s computes every chunk from what stage s-1 handed on); the
// stages' layers assembled into one buffer.
uint32_t pipeline_in_process(const std::vector<int64_t>& stage_layers, int64_t cached, Reference& ref, KvBuffer& out) {
  std::deque<std::vector<float>> passed;  // the previous stage's hidden states, one entry per chunk
  uint32_t token = 0;
  int64_t first = 0;
  for (size_t s = 0; s < stage_layers.size(); ++s) {
    auto b = backend();
    auto kv = buffer(*b);
    // The cached prefix: this stage's own layers of it only (what it fetches from the pool).
    if (cached > 0) copy_layers(*ref.kv, *kv, first, stage_layers[s]);
    std::deque<std::vector<float>> next;
    auto read_in = [&](std::vector<float>& v) -> Status {
      if (passed.empty()) return error(Code::kInternal, "no hidden states from the previous stage");
      v = std::move(passed.front());
      passed.pop_front();
      return Status::ok();
    };
    auto write_out = [&](const std::vector<float>& v) -> Status {
      next.push_back(v);
      return Status::ok();
    };
    auto t = run_stage(*b, *kv, first, stage_layers[s], cached, read_in, write_out);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    if (!t.is_ok()) return 0;
    token = t.value();
    copy_layers(*kv, out, first, stage_layers[s]);
    passed = std::move(next);
    first += stage_layers[s];
  }
  return token;
}

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The stages as processes: stage s reads its chunk's hidden states from a pipe from stage s-1 and writes its own to
// stage s+1; at the end each sends its layers' KV (and the last one the first token) to this process.
uint32_t pipeline_in_processes(const std::vector<int64_t>& stage_layers, int64_t cached, Reference& ref,
                               KvBuffer& out) {
  const size_t x = stage_layers.size();
  std::vector<int64_t> first(x);
  for (size_t s = 1; s < x; ++s) first[s] = first[s - 1] + stage_layers[s - 1];
  std::vector<std::array<int, 2>> link(x), result(x);
  for (size_t s = 0; s < x; ++s) {
    EXPECT_EQ(::pipe(link[s].data()), 0);
    EXPECT_EQ(::pipe(result[s].data()), 0);
  }
  std::vector<pid_t> pids;
  for (size_t s = 0; s < x; ++s) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The stage: its own backend (the same seeded weights) and KV buffer, its own layers of the cached prefix.
      for (size_t o = 0; o < x; ++o) {
        if (o != s) ::close(link[o][1]);
        if (o + 1 != s) ::close(link[o][0]);
        if (o != s) ::close(result[o][1]);
        ::close(result[o][0]);
      }
      auto b = backend();
      auto kv = buffer(*b);
      if (cached > 0) copy_layers(*ref.kv, *kv, first[s], stage_layers[s]);
      const int in = s > 0 ? link[s - 1][0] : -1, next = link[s][1];
      auto read_in = [&](std::vector<float>& v) -> Status {
        uint64_t count = 0;
        if (!read_all(in, &count, sizeof count) || count > (1u << 24)) return error(Code::kIo, "short read");
        v.resize(count);
        return read_all(in, v.data(), count * sizeof(float)) ? Status::ok() : error(Code::kIo, "short read");
      };
      auto write_out = [&](const std::vector<float>& v) -> Status {
        const uint64_t count = v.size();
        return write_all(next, &count, sizeof count) && write_all(next, v.data(), count * sizeof(float))
                   ? Status::ok()
                   : error(Code::kIo, "short write");
      };
      auto token = run_stage(*b, *kv, first[s], stage_layers[s], cached, read_in, write_out);
      if (!token.is_ok()) ::_exit(1);
      const uint32_t t = token.value();
      if (!write_all(result[s][1], &t, sizeof t)) ::_exit(1);
      for (int32_t blk = 0; blk < static_cast<int32_t>(blocks()); ++blk) {
        for (int64_t l = first[s]; l < first[s] + stage_layers[s]; ++l) {
          auto span = kv->layer_block_span(blk, l);
          if (!write_all(result[s][1], span.data(), span.size())) ::_exit(1);
        }
      }
      ::_exit(0);
    }
    EXPECT_GT(pid, 0);
    pids.push_back(pid);
  }
  for (size_t s = 0; s < x; ++s) {
    ::close(link[s][0]);
    ::close(link[s][1]);
    ::close(result[s][1]);
  }
  uint32_t token = 0;
  for (size_t s = 0; s < x; ++s) {
    uint32_t t = 0;
    EXPECT_TRUE(read_all(result[s][0], &t, sizeof t)) << "stage " << s << " sent nothing";
    if (s + 1 == x) token = t;
    for (int32_t blk = 0; blk < static_cast<int32_t>(blocks()); ++blk) {
      for (int64_t l = first[s]; l < first[s] + stage_layers[s]; ++l) {
        auto span = out.layer_block_span(blk, l);
        EXPECT_TRUE(read_all(result[s][0], span.data(), span.size())) << "stage " << s << " KV";
      }
    }
    ::close(result[s][0]);
  }
  for (pid_t pid : pids) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a stage process failed";
  }
  return token;
}

struct Case {
  std::vector<int64_t> stages;
  int64_t cached;
};

class PipelineRef : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineRef, SameKvAndTokensAsOneProcess) {
  const Case c = GetParam();
  Reference ref = reference();
  for (bool processes : {false, true}) {
    SCOPED_TRACE(processes ? "stages as processes" : "stages in one process");
    auto b = backend();
    auto out = buffer(*b);
    if (c.cached > 0) copy_layers(*ref.kv, *out, 0, model().num_layers);  // tokens < cached: the pool's
    const uint32_t first = processes ? pipeline_in_processes(c.stages, c.cached, ref, *out)
                                     : pipeline_in_process(c.stages, c.cached, ref, *out);
    EXPECT_LE(max_kv_diff(*ref.kv, *out, kPrompt), 1e-5);
    EXPECT_EQ(decode(*b, *out, first), ref.tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, PipelineRef,
                         ::testing::Values(Case{{4, 4}, 0}, Case{{2, 2, 2, 2}, 0}, Case{{3, 5}, 0},
                                           Case{{1, 2, 2, 3}, 0}, Case{{5, 3}, 128}, Case{{2, 1, 3, 2}, 160}),
                         // Stable test names: "layers_4_4_cached_0" (ctest lists them; no pointer bytes).
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = "layers";
                           for (int64_t l : info.param.stages) name += "_" + std::to_string(l);
                           return name + "_cached_" + std::to_string(info.param.cached);
                         });

TEST(PipelineRefErrors, BadStagesAreRefused) {
  auto b = backend();
  auto kv = buffer(*b);
  const std::vector<uint32_t> p = prompt();
  const std::vector<int32_t> t = table();
  StageRequest req;
  req.tokens = p;
  req.block_table = t;
  req.token_begin = 0;
  req.token_end = 10;
  req.first_layer = 6;
  req.num_layers = 3;  // past the 8 layers
  EXPECT_EQ(b->prefill_stage(*kv, req, nullptr).status().code(), Code::kInvalidArgument);
  req.first_layer = 2;
  req.num_layers = 2;  // no hidden_in after layer 0
  EXPECT_EQ(b->prefill_stage(*kv, req, nullptr).status().code(), Code::kInvalidArgument);
  req.token_end = kPrompt + 1;
  EXPECT_EQ(b->prefill_stage(*kv, req, nullptr).status().code(), Code::kInvalidArgument);
  BackendOptions o;
  o.kind = "sim";
  o.model = model();
  o.time_scale = 1e6;
  o.kv_bytes_per_token = 512;  // an eighth of the model's: hidden states of 32 floats a token, not 256
  auto sim = make_backend(o).value();
  auto skv = KvBuffer::create(sim->kv_layout(kPipelineBlock), blocks()).value();
  // The sim backend runs stages and refuses the same bad shapes (its hidden states are its own size).
  req.first_layer = 0;
  req.token_end = 10;
  auto ok = sim->prefill_stage(*skv, req, nullptr);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(static_cast<int64_t>(ok->hidden_out.size()), 10 * sim->stage_hidden_floats());
  req.first_layer = 2;  // no hidden_in after layer 0
  EXPECT_EQ(sim->prefill_stage(*skv, req, nullptr).status().code(), Code::kInvalidArgument);
  std::vector<float> rows(static_cast<size_t>(10 * model().hidden_size));  // the ref backend's rows
  req.hidden_in = rows;
  EXPECT_EQ(sim->prefill_stage(*skv, req, nullptr).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace mc::infer
