#include "mc/trace/trace_prefix.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "mc/common/splitmix.hpp"

namespace mc::trace {
namespace {

// Distinct streams of ids: a mix of (seed, kind, a, b) through two SplitMix64 rounds.
constexpr uint64_t kSystem = 0x53595354454D0001ULL;
constexpr uint64_t kFresh = 0x4652455348000002ULL;
constexpr uint64_t kHistory = 0x484953544F520003ULL;

uint64_t mix(uint64_t seed, uint64_t kind, uint64_t a, uint64_t b) {
  uint64_t state = seed ^ kind;
  uint64_t h = splitmix64(state);
  state = h ^ a;
  h = splitmix64(state);
  state = h ^ b;
  return splitmix64(state);
}

Status bad_model(std::string_view spec, const std::string& why) {
  return Status(Code::kInvalidArgument,
                "--synthesize-prefixes '" + std::string(spec) + "': " + why +
                    " (give none, chat, or chat:key=value,... with keys system_prompts, system_tokens, zipf, "
                    "continue, sessions, seed; DESIGN.md §4.6)");
}

template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end;
}

bool parse_double(std::string_view text, double& out) {
  if (text.empty() || text.size() > 64) return false;
  const std::string s(text);
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

}  // namespace

double uniform01(uint64_t& state) { return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53; }

uint64_t PrefixIds::system_id(uint64_t prompt, uint64_t block) const { return mix(seed_, kSystem, prompt, block); }
uint64_t PrefixIds::fresh_id(uint64_t row, uint64_t block) const { return mix(seed_, kFresh, row, block); }
uint64_t PrefixIds::history_id(uint64_t row, uint64_t block) const { return mix(seed_, kHistory, row, block); }

std::vector<uint64_t> PrefixIds::prompt_ids(const std::vector<uint64_t>& shared_ids, int64_t shared_tokens,
                                            int64_t input_length, int64_t block_size, uint64_t row) const {
  const int64_t blocks = (input_length + block_size - 1) / block_size;
  const int64_t shared =
      std::min({std::min(shared_tokens, input_length) / block_size, static_cast<int64_t>(shared_ids.size()), blocks});
  std::vector<uint64_t> ids(shared_ids.begin(), shared_ids.begin() + shared);
  ids.reserve(static_cast<size_t>(blocks));
  for (int64_t j = shared; j < blocks; ++j) ids.push_back(fresh_id(row, static_cast<uint64_t>(j)));
  return ids;
}

std::vector<uint64_t> PrefixIds::history_ids(const std::vector<uint64_t>& prompt_ids, int64_t input_length,
                                             int64_t output_length, int64_t block_size, uint64_t row) const {
  const int64_t kept = std::min(input_length / block_size, static_cast<int64_t>(prompt_ids.size()));
  const int64_t blocks = (input_length + output_length) / block_size;
  std::vector<uint64_t> ids(prompt_ids.begin(), prompt_ids.begin() + kept);
  ids.reserve(static_cast<size_t>(std::max(blocks, kept)));
  for (int64_t j = kept; j < blocks; ++j) ids.push_back(history_id(row, static_cast<uint64_t>(j)));
  return ids;
}

std::vector<uint64_t> PrefixIds::system_ids(uint64_t prompt, int64_t blocks) const {
  std::vector<uint64_t> ids;
  ids.reserve(static_cast<size_t>(std::max<int64_t>(blocks, 0)));
  for (int64_t j = 0; j < blocks; ++j) ids.push_back(system_id(prompt, static_cast<uint64_t>(j)));
  return ids;
}

int64_t PrefixModel::system_prompt_tokens(int64_t k) const {
  uint64_t state = mix(seed, kSystem, static_cast<uint64_t>(k), ~uint64_t{0});
  return static_cast<int64_t>(static_cast<double>(system_tokens) * (0.5 + uniform01(state)));
}

bool is_none_model(std::string_view spec) { return spec.empty() || spec == "none"; }

Result<PrefixModel> parse_prefix_model(std::string_view spec) {
  PrefixModel m;
  std::string_view rest = spec;
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  if (name != "chat") return bad_model(spec, "unknown model '" + std::string(name) + "'");
  rest = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad_model(spec, "'" + std::string(item) + "' is not key=value");
    const std::string key(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    auto out_of = [&](const std::string& range) {
      return bad_model(spec, key + "=" + std::string(value) + " is not " + range);
    };
    if (key == "system_prompts") {
      if (!parse_number(value, m.system_prompts) || m.system_prompts < 0 || m.system_prompts > 100000)
        return out_of("an integer in [0, 100000]");
    } else if (key == "system_tokens") {
      if (!parse_number(value, m.system_tokens) || m.system_tokens < 0 || m.system_tokens > (int64_t{1} << 24))
        return out_of("an integer in [0, 16777216]");
    } else if (key == "zipf") {
      if (!parse_double(value, m.zipf) || m.zipf < 0 || m.zipf > 10) return out_of("a number in [0, 10]");
    } else if (key == "continue") {
      if (!parse_double(value, m.continue_probability) || m.continue_probability < 0 || m.continue_probability > 1)
        return out_of("a probability in [0, 1]");
    } else if (key == "sessions") {
      if (!parse_number(value, m.sessions) || m.sessions < 1 || m.sessions > 4096)
        return out_of("an integer in [1, 4096]");
    } else if (key == "seed") {
      if (!parse_number(value, m.seed)) return out_of("an unsigned 64-bit integer");
    } else {
      return bad_model(spec, "unknown key '" + key + "'");
    }
  }
  return m;
}

std::string to_string(const PrefixModel& m) {
  auto num = [](double v) {
    std::string s = std::to_string(v);
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  return "chat:system_prompts=" + std::to_string(m.system_prompts) +
         ",system_tokens=" + std::to_string(m.system_tokens) + ",zipf=" + num(m.zipf) +
         ",continue=" + num(m.continue_probability) + ",sessions=" + std::to_string(m.sessions) +
         ",seed=" + std::to_string(m.seed);
}

ZipfChoice::ZipfChoice(int64_t n, double s) {
  double sum = 0;
  cumulative_.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t k = 0; k < n; ++k) {
    sum += std::pow(static_cast<double>(k + 1), -s);
    cumulative_.push_back(sum);
  }
}

int64_t ZipfChoice::pick(double u) const {
  if (cumulative_.empty()) return 0;
  const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u * cumulative_.back());
  return std::min<int64_t>(it - cumulative_.begin(), static_cast<int64_t>(cumulative_.size()) - 1);
}

PrefixSynthesizer::PrefixSynthesizer(const PrefixModel& model)
    : model_(model), ids_(model_.seed), system_prompts_(model_.system_prompts, model_.zipf) {}

std::vector<uint64_t> PrefixSynthesizer::next(int64_t input_length, int64_t output_length, int64_t block_size) {
  const auto row = static_cast<uint64_t>(rows_++);
  uint64_t rng = mix(model_.seed, kFresh ^ kHistory, row, 0);
  std::vector<uint64_t> ids;
  auto session = open_.end();
  if (uniform01(rng) < model_.continue_probability) {
    std::vector<std::list<Session>::iterator> eligible;
    for (auto it = open_.begin(); it != open_.end(); ++it)
      if (it->history_tokens < input_length) eligible.push_back(it);
    if (!eligible.empty()) {
      session = eligible[static_cast<size_t>(uniform01(rng) * static_cast<double>(eligible.size()))];
      ids = ids_.prompt_ids(session->history, session->history_tokens, input_length, block_size, row);
      ++continued_;
    }
  }
  if (session == open_.end()) {
    if (system_prompts_.empty()) {
      ids = ids_.prompt_ids({}, 0, input_length, block_size, row);
    } else {
      const int64_t k = system_prompts_.pick(uniform01(rng));
      const int64_t tokens = std::min(model_.system_prompt_tokens(k), input_length);
      ids = ids_.prompt_ids(ids_.system_ids(static_cast<uint64_t>(k), tokens / block_size), tokens, input_length,
                            block_size, row);
    }
    open_.emplace_front();
    session = open_.begin();
    if (static_cast<int64_t>(open_.size()) > model_.sessions) open_.pop_back();
  } else {
    open_.splice(open_.begin(), open_, session);
  }
  // The answer joins the history; a history past the id bound closes the session (its next turn would be too long).
  const int64_t history_tokens = input_length + output_length;
  if (history_tokens / block_size > (int64_t{1} << 16)) {
    open_.erase(session);
    return ids;
  }
  session->history = ids_.history_ids(ids, input_length, output_length, block_size, row);
  session->history_tokens = history_tokens;
  return ids;
}

}  // namespace mc::trace
