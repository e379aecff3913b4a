#include "mc/infer/model_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/infer/backend.hpp"
#include "mc/model/model_config.hpp"

namespace mc::infer {

namespace {

Result<std::vector<uint32_t>> parse_ids(const std::string& text, int64_t vocab) {
  std::vector<uint32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t comma = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, comma - i);
    if (item.empty() || item.size() > 10 || item.find_first_not_of("0123456789") != std::string::npos) {
      return error(Code::kInvalidArgument, "--prompt-ids: '" + item + "' is not a token id (give ids like 1,2,3)");
    }
    const uint64_t v = std::stoull(item);
    if (v >= static_cast<uint64_t>(vocab)) {
      return error(Code::kInvalidArgument,
                   "--prompt-ids: token " + item + " >= the vocabulary's " + std::to_string(vocab));
    }
    ids.push_back(static_cast<uint32_t>(v));
    i = comma + 1;
  }
  return ids;
}

// The top `k` (id, logit) of `logits`, largest first (ties: the lower id).
std::vector<std::pair<uint32_t, float>> top_k(const std::vector<float>& logits, int64_t k) {
  std::vector<uint32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0u);
  const auto n = static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(logits.size())));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(),
                    [&](uint32_t a, uint32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<std::pair<uint32_t, float>> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(idx[i], logits[idx[i]]);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status run_model_command(const RunCommand& c, std::ostream& out) {
  BackendOptions o;
  o.kind = "ref";
  MC_ASSIGN_OR_RETURN(o.model, model::load_model(c.model));
  o.kv_dtype = c.kv_dtype;
  o.threads = c.threads;
  o.seed = c.seed;
  MC_ASSIGN_OR_RETURN(std::vector<uint32_t> prompt, parse_ids(c.prompt_ids, o.model.vocab_size));
  const auto n = static_cast<int64_t>(prompt.size());
  if (c.steps < 0 || c.top < 0) return error(Code::kInvalidArgument, "--steps and --top must be >= 0");
  if (n + c.steps > o.model.max_context_tokens) {
    return error(Code::kInvalidArgument, std::to_string(n) + " prompt tokens + " + std::to_string(c.steps) +
                                             " steps exceed the model's context of " +
                                             std::to_string(o.model.max_context_tokens));
  }
  if (c.cached_tokens < 0 || c.cached_tokens >= n) {
    return error(Code::kInvalidArgument, "--cached-tokens must be in [0, prompt tokens)");
  }
  Result<std::unique_ptr<Backend>> made = make_backend(o);
  // A truncated weights file is data loss to a daemon; to this command it is bad input (exit 2), as in inspect.
  if (!made && made.status().code() == Code::kDataLoss) {
    return error(Code::kInvalidArgument, made.status().message());
  }
  MC_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, std::move(made));
  constexpr int64_t kBlock = 16;
  const KvLayout layout = backend->kv_layout(kBlock);
  const int64_t blocks = layout.blocks_for_tokens(n + std::max<int64_t>(c.steps, 1));
  MC_ASSIGN_OR_RETURN(std::unique_ptr<KvBuffer> kv, KvBuffer::create(layout, blocks));
  MC_ASSIGN_OR_RETURN(std::vector<int32_t> table, kv->allocate(blocks));

  if (c.cached_tokens > 0) {
    // The prefix first, as another request would have computed it; its logits are not used.
    const std::span<const uint32_t> prefix(prompt.data(), static_cast<size_t>(c.cached_tokens + 1));
    MC_RETURN_IF_ERROR(backend->prefill(*kv, PrefillRequest{prefix, 0, table, 0}, nullptr).status());
  }
  const auto t1 = std::chrono::steady_clock::now();
  MC_ASSIGN_OR_RETURN(PrefillResult first,
                      backend->prefill(*kv, PrefillRequest{prompt, c.cached_tokens, table, 0}, nullptr));
  const double prefill_s = seconds_since(t1);

  std::vector<uint32_t> tokens;
  const auto top = top_k(first.last_logits, c.top);
  const auto best2 = top_k(first.last_logits, 2);
  const float gap = best2.size() > 1 ? best2[0].second - best2[1].second : 0.0f;
  const auto t2 = std::chrono::steady_clock::now();
  if (c.steps > 0) tokens.push_back(first.first_token);
  // Decode steps: each feeds the last token at the next position (a batch of one).
  std::vector<uint32_t> next;
  for (int64_t s = 1; s < c.steps; ++s) {
    DecodeSequence seq{tokens.back(), n + s - 1, table};
    MC_RETURN_IF_ERROR(backend->decode_step(*kv, {&seq, 1}, next));
    tokens.push_back(next.at(0));
  }
  const double decode_s = seconds_since(t2);
  const double decode_tps = c.steps > 1 && decode_s > 0 ? static_cast<double>(c.steps - 1) / decode_s : 0.0;

  if (c.json) {
    nlohmann::json j = {{"model", o.model.name},
                        {"revision", backend->weights_revision(c.seed)},
                        {"kv_dtype", backend->kv_encoding()},
                        {"prompt_tokens", n},
                        {"cached_tokens", c.cached_tokens},
                        {"tokens", tokens},
                        {"prefill_s", prefill_s},
                        {"decode_tokens_per_s", decode_tps}};
    nlohmann::json jt = nlohmann::json::array();
    for (const auto& [id, logit] : top) jt.push_back({id, logit});
    j["top"] = jt;
    j["top_gap"] = gap;  // top-1 minus top-2 logit: how far the first greedy choice is from a tie
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return Status::ok();
  }
  out << "model " << o.model.name << " (" << backend->weights_revision(c.seed) << ", KV " << backend->kv_encoding()
      << "): " << n << " prompt tokens";
  if (c.cached_tokens > 0) out << " (" << c.cached_tokens << " from cache)";
  char buf[96];
  std::snprintf(buf, sizeof(buf), ", prefill %.3f s, decode %.1f tokens/s\n", prefill_s, decode_tps);
  out << buf << "tokens";
  for (uint32_t t : tokens) out << " " << t;
  out << "\ntop";
  for (const auto& [id, logit] : top) {
    std::snprintf(buf, sizeof(buf), " %u:%.5f", id, static_cast<double>(logit));
    out << buf;
  }
  out << "\n";
  return Status::ok();
}

}  // namespace mc::infer
