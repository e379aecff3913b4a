#include "mc/replay/analyze.hpp"

#include "mc/common/report.hpp"
#include "mc/report/format.hpp"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <list>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace mc::replay {

using json = nlohmann::json;

bool Window::contains(const trace::Request& row) const {
  double t_s = static_cast<double>(row.timestamp_ms) / 1000.0;
  if (t_s < start_s) return false;
  if (duration_s > 0 && t_s >= start_s + duration_s) return false;
  return true;
}

Result<std::vector<trace::Request>> read_window(trace::Reader& reader, const Window& window) {
  std::vector<trace::Request> rows;
  while (true) {
    MC_ASSIGN_OR_RETURN(std::optional<trace::Request> row, reader.next());
    if (!row) break;
    if (!window.contains(*row)) {
      // The reader enforces non-decreasing timestamps: past the window's end nothing more can match.
      if (window.duration_s > 0 &&
          static_cast<double>(row->timestamp_ms) / 1000.0 >= window.start_s + window.duration_s)
        break;
      continue;
    }
    if (window.max_requests > 0 && static_cast<int64_t>(rows.size()) >= window.max_requests) break;
    rows.push_back(std::move(*row));
  }
  return rows;
}

Status empty_window_error(std::string_view action, const std::string& source_name) {
  return Status(Code::kInvalidArgument, "no request to " + std::string(action) + ": " + source_name +
                                            " has no valid row in the window (empty file, all rows skipped, or "
                                            "--start-s/--duration-s/--max-requests select none)");
}

namespace {

// A row's block ids as the cache sees them: a request's adapter and salt put its blocks in a namespace of their
// own (DESIGN.md §4.1), so equal hash ids of different scopes are different blocks; the base scope keeps the
// trace's ids.
std::vector<uint64_t> scoped_block_ids(const trace::Request& row) {
  if (row.scope.empty()) return row.hash_ids;
  const uint64_t scope =
      std::hash<std::string>{}(row.scope.lora_name + '\0' + row.scope.lora_version + '\0' + row.scope.salt);
  std::vector<uint64_t> ids;
  ids.reserve(row.hash_ids.size());
  for (uint64_t id : row.hash_ids) {
    uint64_t z = scope ^ (id + 0x9e3779b97f4a7c15ULL + (scope << 6) + (scope >> 2));  // splitmix64 finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    ids.push_back(z ^ (z >> 31));
  }
  return ids;
}

}  // namespace

// An LRU set of block ids (capacity_blocks <= 0: never evicts).
struct PrefixCacheModel::Impl {
  int64_t capacity_blocks;
  int64_t block_size;
  bool earlier_arrivals_only;
  std::list<uint64_t> order;  // front = most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  int64_t blocks = 0, hit_blocks = 0;
  int64_t tokens = 0, hit_tokens = 0, hit_tokens_full = 0;
  // earlier_arrivals_only: rows of the current timestamp, inserted when a later one arrives.
  std::vector<uint64_t> pending;
  int64_t pending_timestamp_ms = 0;

  void touch(uint64_t id) {
    auto it = where.find(id);
    if (it != where.end()) {
      order.splice(order.begin(), order, it->second);
      return;
    }
    order.push_front(id);
    where.emplace(id, order.begin());
    if (capacity_blocks > 0 && static_cast<int64_t>(order.size()) > capacity_blocks) {
      where.erase(order.back());
      order.pop_back();
    }
  }
};

PrefixCacheModel::PrefixCacheModel(int64_t capacity_blocks, int64_t block_size, bool earlier_arrivals_only)
    : impl_(std::make_unique<Impl>(
          Impl{capacity_blocks, block_size, earlier_arrivals_only, {}, {}, 0, 0, 0, 0, 0, {}, 0})) {}
PrefixCacheModel::~PrefixCacheModel() = default;

void PrefixCacheModel::add(const trace::Request& row) {
  Impl& m = *impl_;
  if (m.earlier_arrivals_only && row.timestamp_ms != m.pending_timestamp_ms) {
    for (uint64_t id : m.pending) m.touch(id);
    m.pending.clear();
    m.pending_timestamp_ms = row.timestamp_ms;
  }
  const std::vector<uint64_t> ids = scoped_block_ids(row);
  const auto n = static_cast<int64_t>(ids.size());
  int64_t hit = 0;
  while (hit < n && m.where.count(ids[static_cast<size_t>(hit)])) ++hit;
  const int64_t full_blocks = row.input_length / m.block_size;
  m.blocks += n;
  m.hit_blocks += hit;
  m.tokens += row.input_length;
  m.hit_tokens += std::min(hit * m.block_size, row.input_length);
  m.hit_tokens_full += std::min(hit, full_blocks) * m.block_size;
  if (m.earlier_arrivals_only) {
    m.pending.insert(m.pending.end(), ids.begin(), ids.end());
    return;
  }
  for (uint64_t id : ids) m.touch(id);
}

HitRatios PrefixCacheModel::ratios() const {
  const Impl& m = *impl_;
  HitRatios r;
  if (m.blocks > 0) r.blocks = static_cast<double>(m.hit_blocks) / static_cast<double>(m.blocks);
  if (m.tokens > 0) {
    r.tokens = static_cast<double>(m.hit_tokens) / static_cast<double>(m.tokens);
    r.tokens_full_blocks = static_cast<double>(m.hit_tokens_full) / static_cast<double>(m.tokens);
  }
  return r;
}

Result<TraceAnalysis> analyze(trace::Reader& reader, const AnalyzeOptions& options) {
  for (int64_t c : options.capacity_tokens)
    if (c < options.reader.block_size)
      return Status(Code::kInvalidArgument, "capacity " + std::to_string(c) + " tokens is smaller than one block (" +
                                                std::to_string(options.reader.block_size) + " tokens)");
  TraceAnalysis a;
  PrefixCacheModel infinite(0, options.reader.block_size);
  PrefixCacheModel infinite_earlier(0, options.reader.block_size, true);
  std::vector<std::unique_ptr<PrefixCacheModel>> lru;
  for (int64_t c : options.capacity_tokens)
    lru.push_back(std::make_unique<PrefixCacheModel>(c / options.reader.block_size, options.reader.block_size));
  std::vector<double> in_len, out_len, blocks;
  std::unordered_set<uint64_t> distinct;
  MC_ASSIGN_OR_RETURN(const std::vector<trace::Request> rows, read_window(reader, options.window));
  bool first = true;
  for (const trace::Request& row : rows) {
    double t_s = static_cast<double>(row.timestamp_ms) / 1000.0;
    if (first) a.first_timestamp_s = t_s;
    first = false;
    a.last_timestamp_s = t_s;
    ++a.requests;
    in_len.push_back(static_cast<double>(row.input_length));
    out_len.push_back(static_cast<double>(row.output_length));
    blocks.push_back(static_cast<double>(row.hash_ids.size()));
    a.total_input_tokens += row.input_length;
    a.total_blocks += static_cast<int64_t>(row.hash_ids.size());
    const std::vector<uint64_t> ids = scoped_block_ids(row);
    distinct.insert(ids.begin(), ids.end());
    infinite.add(row);
    infinite_earlier.add(row);
    for (auto& m : lru) m->add(row);
  }
  a.lines = reader.stats().lines;
  a.skipped_rows = reader.stats().skipped;
  a.span_s = a.last_timestamp_s - a.first_timestamp_s;
  a.arrival_rate_rps = a.span_s > 0 ? static_cast<double>(a.requests) / a.span_s : 0.0;
  if (options.keep_samples) {
    a.samples.input_tokens = in_len;
    a.samples.output_tokens = out_len;
    a.samples.arrival_s.reserve(rows.size());
    for (const trace::Request& row : rows) {
      a.samples.arrival_s.push_back(static_cast<double>(row.timestamp_ms) / 1000.0 - a.first_timestamp_s);
    }
  }
  a.input_tokens = distribution(std::move(in_len));
  a.output_tokens = distribution(std::move(out_len));
  a.blocks_per_request = distribution(std::move(blocks));
  a.distinct_blocks = static_cast<int64_t>(distinct.size());
  a.infinite = infinite.ratios();
  a.infinite_earlier = infinite_earlier.ratios();
  for (size_t i = 0; i < lru.size(); ++i) a.lru.push_back({options.capacity_tokens[i], lru[i]->ratios()});
  return a;
}

Result<TraceAnalysis> analyze_file(const std::string& path, const AnalyzeOptions& options) {
  trace::ReaderOptions ro = options.reader;
  ro.source_name = path;
  MC_ASSIGN_OR_RETURN(auto reader, trace::Reader::open(path, ro));
  return analyze(*reader, options);
}

using mc::report::fixed;

namespace {

json ratios_json(const HitRatios& r) {
  return {{"hit_ratio_blocks", r.blocks},
          {"hit_ratio_tokens", r.tokens},
          {"hit_ratio_tokens_full_blocks", r.tokens_full_blocks}};
}

}  // namespace

json to_json(const TraceAnalysis& a, const RunInfo& info) {
  json lru = json::array();
  for (const LruPoint& p : a.lru) {
    json e = ratios_json(p.hit);
    e["capacity_tokens"] = p.capacity_tokens;
    lru.push_back(std::move(e));
  }
  return {{"config", mc::report::run_info_json(info)},
          {"requests", a.requests},
          {"lines", a.lines},
          {"skipped_rows", a.skipped_rows},
          {"first_timestamp_s", a.first_timestamp_s},
          {"last_timestamp_s", a.last_timestamp_s},
          {"span_s", a.span_s},
          {"arrival_rate_rps", a.arrival_rate_rps},
          {"input_tokens", format::distribution_json(a.input_tokens)},
          {"output_tokens", format::distribution_json(a.output_tokens)},
          {"blocks_per_request", format::distribution_json(a.blocks_per_request)},
          {"total_input_tokens", a.total_input_tokens},
          {"total_blocks", a.total_blocks},
          {"distinct_blocks", a.distinct_blocks},
          {"infinite_cache", ratios_json(a.infinite)},
          {"infinite_cache_earlier_arrivals", ratios_json(a.infinite_earlier)},
          {"lru", std::move(lru)}};
}

void print_table(std::ostream& out, const TraceAnalysis& a, const RunInfo& info) {
  mc::report::print_run_header(out, info);
  mc::report::print_table(
      out, {{"trace", "requests", "skipped_rows", "span_s", "arrival_rate_req/s", "blocks_total", "blocks_distinct"},
            {"", std::to_string(a.requests), std::to_string(a.skipped_rows), fixed(a.span_s, 1),
             fixed(a.arrival_rate_rps, 2), std::to_string(a.total_blocks), std::to_string(a.distinct_blocks)}});
  out << "\n";
  std::vector<std::vector<std::string>> len = {{"lengths", "mean", "p50", "p90", "p99", "max"}};
  auto row = [&](const char* name, const std::optional<Distribution>& d) {
    if (!d) return len.push_back({name, "-", "-", "-", "-", "-"});
    len.push_back({name, fixed(d->mean, 1), fixed(d->p50, 0), fixed(d->p90, 0), fixed(d->p99, 0), fixed(d->max, 0)});
  };
  row("input_tokens", a.input_tokens);
  row("output_tokens", a.output_tokens);
  row("blocks_per_request", a.blocks_per_request);
  mc::report::print_table(out, len);
  out << "\n";
  std::vector<std::vector<std::string>> hits = {
      {"prefix cache", "capacity_tokens", "hit_blocks_%", "hit_tokens_%", "hit_tokens_full_blocks_%"}};
  auto hit_row = [&](const std::string& name, const std::string& cap, const HitRatios& r) {
    hits.push_back(
        {name, cap, fixed(100 * r.blocks, 1), fixed(100 * r.tokens, 1), fixed(100 * r.tokens_full_blocks, 1)});
  };
  hit_row("infinite", "-", a.infinite);
  hit_row("infinite, earlier arrivals", "-", a.infinite_earlier);
  for (const LruPoint& p : a.lru) hit_row("LRU", std::to_string(p.capacity_tokens), p.hit);
  mc::report::print_table(out, hits);
}

}  // namespace mc::replay
