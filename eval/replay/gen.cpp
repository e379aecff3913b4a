#include "mc/replay/gen.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <queue>
#include <unordered_map>
#include <vector>

#include "mc/common/splitmix.hpp"
#include "mc/trace/trace.hpp"
#include "mc/trace/trace_prefix.hpp"

namespace mc::replay {
namespace {

constexpr double kTwoPi = 6.283185307179586;
constexpr int64_t kMaxTurns = 10000;

// Random variates from one SplitMix64 stream (own code: the standard library's distributions differ by vendor).
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}
  double uniform() { return trace::uniform01(state_); }
  // (0, 1]: safe for log().
  double open_uniform() { return 1.0 - uniform(); }
  double exponential(double mean) { return -mean * std::log(open_uniform()); }
  double normal() { return std::sqrt(-2.0 * std::log(open_uniform())) * std::cos(kTwoPi * uniform()); }
  // Lognormal with this mean: exp(mu + sigma Z), mu = ln(mean) - sigma^2 / 2.
  double lognormal(double mean, double sigma) {
    return std::exp(std::log(mean) - sigma * sigma / 2 + sigma * normal());
  }
  // Gamma(shape, scale) by Marsaglia and Tsang (2000); shape < 1 through Gamma(shape + 1) x U^(1/shape).
  double gamma(double shape, double scale) {
    if (shape < 1) return gamma(shape + 1, scale) * std::pow(open_uniform(), 1.0 / shape);
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      double x = normal();
      double v = 1.0 + c * x;
      if (v <= 0) continue;
      v = v * v * v;
      const double u = open_uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
    }
  }
  // Geometric on {1, 2, ...} with this mean.
  int64_t geometric(double mean) {
    if (mean <= 1) return 1;
    const double p = 1.0 / mean;
    const double k = std::floor(std::log(open_uniform()) / std::log1p(-p));
    return 1 + static_cast<int64_t>(std::min(k, static_cast<double>(kMaxTurns - 1)));
  }

 private:
  uint64_t state_;
};

uint64_t stream(uint64_t seed, uint64_t kind, uint64_t index) {
  uint64_t state = seed ^ kind;
  uint64_t h = splitmix64(state);
  state = h ^ index;
  return splitmix64(state);
}

int64_t tokens(double x, int64_t cap) {
  if (!(x >= 1)) return 1;
  return static_cast<int64_t>(std::min(std::llround(x), static_cast<long long>(cap)));
}

struct Session {
  int64_t index = 0;
  double time_s = 0;  // of its next turn
  int64_t turns_left = 0;
  int64_t turn = 0;
  int64_t input_length = 0;  // of its next turn
  std::vector<uint64_t> shared;
  int64_t shared_tokens = 0;
  Rng rng{0};
};

struct Later {
  bool operator()(const Session* a, const Session* b) const {
    return a->time_s != b->time_s ? a->time_s > b->time_s : a->index > b->index;
  }
};

Status bad(const std::string& why) { return Status(Code::kInvalidArgument, "gen: " + why); }

}  // namespace

Status GenOptions::validate() const {
  auto finite = [](double v) { return std::isfinite(v); };
  if (sessions < 1 || sessions > 10'000'000) return bad("--sessions must be in [1, 10000000]");
  if (!finite(session_rate) || session_rate <= 0 || session_rate > 1e6)
    return bad("--session-rate must be in (0, 1000000] sessions per second");
  if (arrival != "poisson" && arrival != "bursty") return bad("--arrival must be poisson or bursty");
  if (!finite(burst_cv) || burst_cv < 1 || burst_cv > 100) return bad("--burst-cv must be in [1, 100]");
  if (!finite(turns_mean) || turns_mean < 1 || turns_mean > 1000) return bad("--turns-mean must be in [1, 1000]");
  if (!finite(think_s) || think_s < 0 || think_s > 1e6) return bad("--think-s must be in [0, 1000000] seconds");
  if (system_prompts < 0 || system_prompts > 100000) return bad("--system-prompts must be in [0, 100000]");
  if (system_tokens < 0 || system_tokens > (int64_t{1} << 24)) return bad("--system-tokens must be in [0, 16777216]");
  if (!finite(zipf) || zipf < 0 || zipf > 10) return bad("--zipf must be in [0, 10]");
  if (!finite(user_tokens) || user_tokens < 1 || user_tokens > 1e7) return bad("--user-tokens must be in [1, 1e7]");
  if (!finite(output_tokens) || output_tokens < 1 || output_tokens > 1e7)
    return bad("--output-tokens must be in [1, 1e7]");
  if (!finite(length_sigma) || length_sigma < 0 || length_sigma > 5) return bad("--length-sigma must be in [0, 5]");
  if (block_size < 1 || block_size > (int64_t{1} << 24)) return bad("--block-size must be in [1, 16777216]");
  if (max_input_tokens < 1 || max_input_tokens > std::numeric_limits<int32_t>::max())
    return bad("--max-input-tokens must be in [1, 2147483647]");
  if ((max_input_tokens + block_size - 1) / block_size > trace::kMaxSynthesizedBlocks)
    return bad("--max-input-tokens " + std::to_string(max_input_tokens) + " needs more than " +
               std::to_string(trace::kMaxSynthesizedBlocks) + " blocks of --block-size " + std::to_string(block_size));
  return Status::ok();
}

Result<GenStats> generate_trace(const GenOptions& o, std::ostream& out) {
  MC_RETURN_IF_ERROR(o.validate());
  trace::PrefixModel model;
  model.system_prompts = o.system_prompts;
  model.system_tokens = o.system_tokens;
  model.zipf = o.zipf;
  model.seed = o.seed;
  const trace::PrefixIds ids(o.seed);
  const trace::ZipfChoice prompts(o.system_prompts, o.zipf);
  const int64_t bs = o.block_size;
  const int64_t cap = o.max_input_tokens;
  Rng starts(stream(o.seed, 0x5354415254ULL, 0));
  const double mean_gap = 1.0 / o.session_rate;
  auto gap = [&] {
    if (o.arrival == "poisson") return starts.exponential(mean_gap);
    const double shape = 1.0 / (o.burst_cv * o.burst_cv);
    return starts.gamma(shape, mean_gap / shape);
  };

  // The open sessions by index: a closed one is erased in O(1), so a run with many sessions open at once (a high
  // --session-rate with long --think-s) stays linear in its rows.
  std::unordered_map<int64_t, std::unique_ptr<Session>> open;
  std::priority_queue<Session*, std::vector<Session*>, Later> due;
  GenStats stats;
  double next_start = 0;
  int64_t started = 0;
  while (started < o.sessions || !due.empty()) {
    if (started < o.sessions && (due.empty() || next_start <= due.top()->time_s)) {
      auto s = std::make_unique<Session>();
      s->index = started++;
      s->time_s = next_start;
      s->rng = Rng(stream(o.seed, 0x53455353ULL, static_cast<uint64_t>(s->index)));
      s->turns_left = s->rng.geometric(o.turns_mean);
      if (!prompts.empty()) {
        const int64_t k = prompts.pick(s->rng.uniform());
        s->shared_tokens = std::min(model.system_prompt_tokens(k), cap);
        s->shared = ids.system_ids(static_cast<uint64_t>(k), s->shared_tokens / bs);
      }
      s->input_length = std::min(cap, s->shared_tokens + tokens(s->rng.lognormal(o.user_tokens, o.length_sigma), cap));
      next_start += gap();
      ++stats.sessions;
      due.push(s.get());
      open.emplace(s->index, std::move(s));
      continue;
    }
    Session* s = due.top();
    due.pop();
    // Arrivals this late (a tiny --session-rate over many sessions) are no workload anyone replays, and past int64
    // milliseconds they are not even a timestamp: refuse rather than write a row the reader rejects.
    constexpr double kMaxSpanMs = 1e12;  // about 31.7 years
    if (!(s->time_s * 1000 < kMaxSpanMs)) {
      return Status(Code::kInvalidArgument,
                    "gen: session " + std::to_string(s->index) + " arrives after " + std::to_string(s->time_s) +
                        " s, past the 1e12 ms (31.7 years) a trace may span; raise --session-rate or lower --sessions");
    }
    trace::Request row;
    row.timestamp_ms = static_cast<int64_t>(std::floor(s->time_s * 1000));
    row.input_length = s->input_length;
    row.output_length = tokens(s->rng.lognormal(o.output_tokens, o.length_sigma), std::numeric_limits<int32_t>::max());
    const auto row_id = (static_cast<uint64_t>(s->index) << 20) | static_cast<uint64_t>(s->turn);
    row.hash_ids = ids.prompt_ids(s->shared, s->shared_tokens, row.input_length, bs, row_id);
    out << trace::to_jsonl(row) << '\n';
    if (!out) return Status(Code::kIo, "gen: writing the trace failed");
    ++stats.rows;
    stats.max_input_tokens = std::max(stats.max_input_tokens, row.input_length);
    stats.last_timestamp_s = static_cast<double>(row.timestamp_ms) / 1000;
    // The next turn starts with this one's prompt and answer.
    const int64_t history = row.input_length + row.output_length;
    const int64_t next_input = history + tokens(s->rng.lognormal(o.user_tokens, o.length_sigma), cap);
    const double think = s->rng.exponential(o.think_s);
    if (--s->turns_left > 0 && next_input <= cap) {
      s->shared = ids.history_ids(row.hash_ids, row.input_length, row.output_length, bs, row_id);
      s->shared_tokens = history;
      s->input_length = next_input;
      s->time_s += think;
      ++s->turn;
      due.push(s);
    } else {
      open.erase(s->index);
    }
  }
  return stats;
}

}  // namespace mc::replay
