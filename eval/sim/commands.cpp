#include "mc/sim/commands.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>

#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/common/units.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/model/pipeline.hpp"
#include "mc/replay/analyze.hpp"
#include "mc/report/page.hpp"
#include "mc/report/run_charts.hpp"
#include "mc/sim/cluster_description.hpp"

namespace mc::sim {

namespace {

// Replaces every row's output_length (the paper's cache experiments use output length 1).
class OutputOverride final : public RequestSource {
 public:
  OutputOverride(RequestSource& inner, int64_t output_length) : inner_(inner), output_length_(output_length) {}
  Result<std::optional<trace::Request>> next() override {
    MC_ASSIGN_OR_RETURN(std::optional<trace::Request> row, inner_.next());
    if (row) row->output_length = output_length_;
    return row;
  }

 private:
  RequestSource& inner_;
  int64_t output_length_;
};

// The simulated run for the charts: its records and the simulator's own GPU-second ledger.
replay::RunRecords run_records(const std::string& label, const SimResult& r) {
  replay::GpuSeconds g;
  g.spent = r.totals.prefill_gpu_s;
  g.saved = r.totals.prefill_gpu_s_saved;
  g.saved_estimated = false;
  return {label, r.records, r.summary, g};
}

// Busy share of every instance over the run, one bar each.
report::Chart utilization_chart(const SimResult& r, const std::string& id) {
  report::Chart c;
  c.id = id;
  c.title = "Instance utilisation";
  c.y_label = "busy (% of the run)";
  c.y_max = 100;
  c.key = "below";
  report::Series prefill, decode;
  prefill.title = "prefill (computing)";
  decode.title = "decode (stepping)";
  prefill.style = decode.style = report::SeriesStyle::kBars;
  prefill.color = "#0072b2";
  decode.color = "#e69f00";
  for (const InstanceReport& i : r.instances) {
    const auto x = static_cast<double>(c.categories.size());
    c.categories.push_back(i.id);
    (i.role == "prefill" ? prefill : decode).points.emplace_back(x, 100 * i.utilization);
  }
  for (report::Series* s : {&prefill, &decode}) {
    if (!s->points.empty()) c.series.push_back(std::move(*s));
  }
  c.caption = "The share of the simulated span each instance spent computing prefills or stepping its decode batch.";
  return c;
}

// What the trace reader found (format, timestamp unit, epoch shift, re-cut or synthesized ids): in the run's header,
// and on stderr when the reader decided it by itself.
void add_trace_read(replay::RunInfo& info, const RequestSource& source, const trace::FormatOptions& formats,
                    const std::string& path) {
  const trace::ReaderStats* st = source.reader_stats();
  if (st == nullptr) return;
  std::string line;
  for (auto& [k, v] : trace::describe(*st, formats)) {
    line += (line.empty() ? "" : ", ") + k + " " + v;
    info.emplace_back(k, v);
  }
  if (trace::read_differently(*st)) MC_LOG_INFO << path << ": " << line;
}

}  // namespace

Status ClusterOverrides::apply(ClusterConfig& c) const {
  if (policy) c.policy = *policy;
  if (model) c.model = *model;
  if (gpu) c.gpu = *gpu;
  if (seed) c.seed = *seed;
  if (cache_mode) {
    if (*cache_mode == "global") {
      c.cache_mode = CacheMode::kGlobal;
    } else if (*cache_mode == "local") {
      c.cache_mode = CacheMode::kLocal;
    } else {
      return error(Code::kInvalidArgument, "--cache-mode must be global or local, not '" + *cache_mode + "'");
    }
  }
  if (prefill_instances) c.prefill_instances = *prefill_instances;
  if (decode_instances) c.decode_instances = *decode_instances;
  // Per-instance NICs belong to the described instances: another count or one bandwidth for all drops them
  // (every NIC then has nic_bandwidth_bytes_per_s).
  if (prefill_instances || decode_instances || nic_bandwidth) c.instance_nic_bandwidth_bytes_per_s.clear();
  if (cache_capacity_tokens) {
    auto r = units::parse_count(*cache_capacity_tokens);
    if (!r.is_ok()) return r.status().with_context("--cache-capacity-tokens");
    c.cache_capacity_tokens = *r;
  }
  if (nic_bandwidth) {
    auto r = units::parse_size_bytes(*nic_bandwidth);
    if (!r.is_ok()) return r.status().with_context("--nic-bandwidth (bytes per second)");
    c.nic_bandwidth_bytes_per_s = static_cast<double>(*r);
  }
  if (early_rejection) c.early_rejection = *early_rejection;
  if (slo_ttft_ms) c.slo_ttft_ms = *slo_ttft_ms;
  if (slo_tbt_ms) c.slo_tbt_ms = *slo_tbt_ms;
  if (pipeline_group) c.pipeline_group = *pipeline_group;
  if (pipeline_chunk_tokens) c.pipeline_chunk_tokens = *pipeline_chunk_tokens;
  if (pipeline_reserve_factor) c.pipeline_reserve_factor = *pipeline_reserve_factor;
  if (pipeline_min_gain) c.pipeline_min_gain = *pipeline_min_gain;
  if (queue) c.queue = *queue;
  if (queue_aging_weight) c.queue_aging_weight = *queue_aging_weight;
  if (preempt_chunk_tokens) c.preempt_chunk_tokens = *preempt_chunk_tokens;
  if (pending_prefix) c.pending_prefix = *pending_prefix;
  if (placement_load_weight) c.placement_load_weight = *placement_load_weight;
  if (slo_headroom) c.slo_headroom = *slo_headroom;
  if (shed_limit) c.shed_limit = *shed_limit;
  if (balancing_threshold) c.balancing_threshold = *balancing_threshold;
  return c.validate();
}

Result<ClusterConfig> resolve_cluster(const std::string& cluster_path, const ClusterOverrides& overrides) {
  ClusterConfig c;
  if (!cluster_path.empty()) {
    MC_ASSIGN_OR_RETURN(c, load_cluster_config(cluster_path));
  }
  MC_RETURN_IF_ERROR(overrides.apply(c));
  return c;
}

Status run_sim_command(const SimCommand& cmd, std::ostream& out) {
  SimOptions opt;
  std::optional<ClusterDescription> described;
  std::optional<DescribedSimCluster> derived;
  if (!cmd.description_path.empty()) {
    if (!cmd.cluster_path.empty()) {
      return error(Code::kInvalidArgument, "--cluster (a cluster description) and the CLUSTER.json positional '" +
                                               cmd.cluster_path + "' exclude each other: give one");
    }
    MC_ASSIGN_OR_RETURN(described, parse_cluster_description(cmd.description_path));
    // --model/--gpu replace the description's before the derivation: the bytes-per-token scale is the model's.
    if (cmd.overrides.model) described->model = *cmd.overrides.model;
    if (cmd.overrides.gpu) described->gpu = *cmd.overrides.gpu;
    MC_ASSIGN_OR_RETURN(derived, sim_config_from_description(*described));
    opt.cluster = derived->config;
    MC_RETURN_IF_ERROR(cmd.overrides.apply(opt.cluster));
    // Another prefill count keeps the described pool: it is spread over the instances the run has.
    if (cmd.overrides.prefill_instances && !cmd.overrides.cache_capacity_tokens) {
      opt.cluster.cache_capacity_tokens = derived->pool_tokens / opt.cluster.prefill_instances;
    }
  } else {
    MC_ASSIGN_OR_RETURN(opt.cluster, resolve_cluster(cmd.cluster_path, cmd.overrides));
  }
  opt.window = cmd.window;
  MC_RETURN_IF_ERROR(opt.window.validate());
  opt.progress = cmd.progress;
  opt.refit_predictors = cmd.refit;
  if (cmd.output_length && *cmd.output_length < 1) {
    return error(Code::kInvalidArgument, "--output-length must be >= 1");
  }

  trace::ReaderOptions ro;
  ro.mode = cmd.lenient ? trace::Mode::kLenient : trace::Mode::kStrict;
  ro.block_size = opt.cluster.block_size;
  ro.source_name = cmd.trace_path;
  ro.formats = cmd.formats;
  MC_ASSIGN_OR_RETURN(std::unique_ptr<RequestSource> source, open_trace(cmd.trace_path, ro));
  std::unique_ptr<RequestSource> overridden;
  RequestSource* src = source.get();
  if (cmd.output_length) {
    overridden = std::make_unique<OutputOverride>(*source, *cmd.output_length);
    src = overridden.get();
  }

  std::ofstream records_file;
  if (cmd.records_path == "-") {
    return error(Code::kInvalidArgument, "--out needs a file name: stdout carries the report");
  }
  if (!cmd.records_path.empty()) {
    records_file.open(cmd.records_path);
    if (!records_file) {
      return error(Code::kIo, "cannot write records to " + cmd.records_path + ": " + std::strerror(errno));
    }
    opt.records_jsonl = &records_file;
  }

  replay::SummaryOptions so;
  so.slo_ttft_ms =
      cmd.report_slo_ttft_ms.empty() ? std::vector<double>{opt.cluster.slo_ttft_ms} : cmd.report_slo_ttft_ms;
  so.slo_tbt_ms = cmd.report_slo_tbt_ms.empty() ? std::vector<double>{opt.cluster.slo_tbt_ms} : cmd.report_slo_tbt_ms;
  MC_ASSIGN_OR_RETURN(SimResult result, simulate(opt, *src, so));
  if (result.records.empty()) return replay::empty_window_error("simulate", cmd.trace_path);
  if (records_file.is_open() && !records_file.flush()) {
    return error(Code::kIo, "writing records to " + cmd.records_path + " failed: " + std::strerror(errno));
  }

  replay::RunInfo info = mc::report::run_info("mc-sim");
  info.insert(info.end(), {{"trace", cmd.trace_path},
                           {"policy", opt.cluster.policy},
                           {"cluster", std::to_string(opt.cluster.prefill_instances) + "P+" +
                                           std::to_string(opt.cluster.decode_instances) + "D " + opt.cluster.model +
                                           " on " + opt.cluster.gpu},
                           {"cache", std::string(cache_mode_name(opt.cluster.cache_mode)) + " " +
                                         std::to_string(opt.cluster.cache_capacity_tokens) + " tokens/instance"},
                           {"rate_scale", std::to_string(opt.window.rate_scale)},
                           {"early_rejection", opt.cluster.early_rejection ? "on" : "off"},
                           {"refit", cmd.refit ? "on" : "off"}});
  add_trace_read(info, *source, cmd.formats, cmd.trace_path);
  if (described) {
    info.push_back({"description", described->summary() + " from " + described->source});
    info.push_back({"description_pool", std::to_string(derived->pool_tokens) +
                                            " tokens = " + std::to_string(described->total(&DescribedHost::store)) +
                                            " storage nodes x " + units::format_bytes(described->dram_bytes) + " / " +
                                            std::to_string(derived->live_kv_bytes_per_token) + " B/token"});
    info.push_back(
        {"description_kv_scale", std::to_string(derived->model_kv_bytes_per_token) + " B/token (" + opt.cluster.model +
                                     ") / " + std::to_string(derived->live_kv_bytes_per_token) + " B/token (live) = " +
                                     mc::report::fixed(derived->scale, 2) + " (NIC bandwidths multiplied by it)"});
  }
  if (!cmd.html_path.empty() || !cmd.svg_dir.empty()) {
    const std::string label = opt.cluster.policy + " " + std::to_string(opt.cluster.prefill_instances) + "P+" +
                              std::to_string(opt.cluster.decode_instances) + "D";
    report::Page page = replay::run_page("mc-sim: simulated run", info, {run_records(label, result)}, {});
    report::Chart u = utilization_chart(result, "utilization");
    report::drop_zero_bars(u);
    if (!u.series.empty()) page.charts.push_back(std::move(u));
    MC_RETURN_IF_ERROR(report::write_page(page, {cmd.html_path, cmd.svg_dir, {}}));
  }
  if (cmd.json) {
    out << to_json(result, info).dump(2) << "\n";
  } else {
    print_report(out, result, info);
  }
  return Status::ok();
}

Status run_threshold_command(const ThresholdCommand& cmd, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(std::vector<int64_t> prefixes, units::parse_count_list(cmd.prefix_tokens));
  MC_ASSIGN_OR_RETURN(ThresholdReport r, fetch_threshold(cmd.model, cmd.gpu, prefixes, cmd.new_tokens));
  if (cmd.json) {
    out << to_json(r).dump(2) << "\n";
  } else {
    print_threshold(out, r);
  }
  return Status::ok();
}

Status run_pipeline_command(const PipelineCommand& cmd, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(model::ModelConfig model, model::model_preset(cmd.model));
  MC_ASSIGN_OR_RETURN(model::GpuSpec gpu, model::gpu_preset(cmd.gpu));
  MC_ASSIGN_OR_RETURN(std::vector<int64_t> prompts, units::parse_count_list(cmd.prompt_tokens));
  MC_ASSIGN_OR_RETURN(std::vector<int64_t> groups, units::parse_count_list(cmd.groups));
  Result<int64_t> link = units::parse_size_bytes(cmd.link_bandwidth);
  if (!link.is_ok()) return link.status().with_context("--link-bandwidth (bytes per second)");
  if (*link < 1'000'000) {
    return error(Code::kInvalidArgument, "--link-bandwidth " + cmd.link_bandwidth +
                                             ": at least 1MB (bytes per second between stages; 25GB: 200 Gbit/s)");
  }
  if (cmd.chunk_tokens < 256 || cmd.chunk_tokens > (int64_t{1} << 24)) {
    return error(Code::kInvalidArgument,
                 "--prefill-chunk " + std::to_string(cmd.chunk_tokens) +
                     ": give 256 to 16777216 tokens (a smaller chunk's pass is bound by reading the weights, which "
                     "the cost model, FLOPs only, does not see)");
  }
  if (!(cmd.link_latency_us >= 0 && cmd.link_latency_us <= 1e6)) {
    return error(Code::kInvalidArgument, "--link-latency-us: give 0 to 1000000 microseconds");
  }
  std::vector<int64_t> seen;
  for (int64_t x : groups) {
    if (std::find(seen.begin(), seen.end(), x) != seen.end()) {
      return error(Code::kInvalidArgument, "--groups: " + std::to_string(x) + " is listed twice");
    }
    seen.push_back(x);
  }
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<std::string>> table = {{"prompt_tokens", "one_node_s"}};
  for (int64_t x : groups) {
    table[0].push_back("X=" + std::to_string(x) + "_ttft_s");
    table[0].push_back("ratio");
    table[0].push_back("bubble_s");
  }
  for (int64_t n : prompts) {
    if (n < 1 || n > model.max_context_tokens) {
      return error(Code::kInvalidArgument, "--prompt-tokens: " + std::to_string(n) + " is outside 1 to " +
                                               std::to_string(model.max_context_tokens) + " tokens (model " +
                                               model.name + "'s context)");
    }
    const double one = model::prefill_time_s(model, gpu, n, 0);
    nlohmann::json row = {{"prompt_tokens", n}, {"one_node_s", one}, {"groups", nlohmann::json::array()}};
    std::vector<std::string> line = {std::to_string(n), report::fixed(one, 2)};
    for (int64_t x : groups) {
      model::PipelineShape shape;
      MC_ASSIGN_OR_RETURN(shape.stage_layers, model::even_stage_layers(model.num_layers, x));
      shape.chunk_tokens = cmd.chunk_tokens;
      shape.link_bytes_per_s = static_cast<double>(*link);
      shape.link_latency_s = cmd.link_latency_us * 1e-6;
      MC_RETURN_IF_ERROR(model::validate_pipeline(shape, model));
      const model::PipelineTiming t = model::pipelined_prefill(model, gpu, shape, n, 0);
      row["groups"].push_back({{"group", x},
                               {"ttft_s", t.ttft_s},
                               {"ratio_to_one_node", t.ttft_s / one},
                               {"ideal_ratio", 1.0 / static_cast<double>(x)},
                               {"bubble_s", t.bubble_s},
                               {"boundary_s", t.boundary_s},
                               {"chunks", t.chunks}});
      line.push_back(report::fixed(t.ttft_s, 2));
      line.push_back(report::fixed(t.ttft_s / one, 3));
      line.push_back(report::fixed(t.bubble_s, 2));
    }
    rows.push_back(std::move(row));
    table.push_back(std::move(line));
  }
  if (cmd.json) {
    out << nlohmann::json{{"model", model.name},
                          {"gpu", gpu.name},
                          {"chunk_tokens", cmd.chunk_tokens},
                          {"link_bytes_per_s", static_cast<double>(*link)},
                          {"link_latency_us", cmd.link_latency_us},
                          {"rows", rows}}
               .dump(2)
        << "\n";
    return Status::ok();
  }
  out << "# chunked pipeline parallelism: " << model.name << " on " << gpu.name << " nodes, nothing cached, chunks of "
      << cmd.chunk_tokens << " tokens, links " << cmd.link_bandwidth << "/s; ratio = TTFT / one node (ideal 1/X)\n";
  report::print_table(out, table);
  return Status::ok();
}

Status run_node_command(const NodeCommand& cmd, std::ostream& out) {
  NodeCapacityOptions o = cmd.options;
  o.spare_dram_bytes = static_cast<int64_t>(cmd.spare_dram_bytes);
  MC_ASSIGN_OR_RETURN(NodeCapacity c, node_capacity(o));
  if (cmd.json) {
    out << to_json(c).dump(2) << "\n";
  } else {
    print_node_capacity(out, c);
  }
  return Status::ok();
}

Status run_capacity_command(const CapacityCommand& cmd, std::ostream& out) {
  CapacityOptions o;
  MC_ASSIGN_OR_RETURN(o.base, resolve_cluster(cmd.cluster_path, cmd.overrides));
  o.window = cmd.window;
  MC_RETURN_IF_ERROR(o.window.validate());
  o.accept = cmd.accept;
  o.max_instances = cmd.max_instances;
  o.cache_fraction = cmd.cache_fraction;
  o.progress = cmd.progress;
  MC_ASSIGN_OR_RETURN(o.cache_total_tokens, units::parse_count_list(cmd.cache_candidates));
  MC_ASSIGN_OR_RETURN(std::vector<int64_t> nics, units::parse_size_list(cmd.nic_candidates));
  o.nic_bytes_per_s.assign(nics.begin(), nics.end());
  for (double n : o.nic_bytes_per_s) {
    if (!(n > 0)) return error(Code::kInvalidArgument, "--nic-candidates: every bandwidth must be > 0");
  }
  trace::ReaderOptions ro;
  ro.mode = cmd.lenient ? trace::Mode::kLenient : trace::Mode::kStrict;
  ro.block_size = o.base.block_size;
  ro.formats = cmd.formats;
  MC_ASSIGN_OR_RETURN(std::unique_ptr<RequestSource> source, open_trace(cmd.trace_path, ro));
  // The window is applied once here; the simulations then replay all loaded rows.
  MC_ASSIGN_OR_RETURN(std::vector<trace::Request> rows, load_window(*source, o.window));
  if (rows.empty()) return replay::empty_window_error("plan for", cmd.trace_path);
  o.window.start_s = rows.empty() ? 0 : static_cast<double>(rows.front().timestamp_ms) * 1e-3;
  o.window.duration_s = 0;
  o.window.max_requests = 0;
  MC_ASSIGN_OR_RETURN(CapacityPlan plan, plan_capacity(rows, o));
  replay::RunInfo info = mc::report::run_info("mc-plan capacity");
  info.insert(info.end(), {{"trace", cmd.trace_path},
                           {"requests", std::to_string(rows.size())},
                           {"slo_ttft_ms", std::to_string(o.base.slo_ttft_ms)},
                           {"slo_tbt_ms", std::to_string(o.base.slo_tbt_ms)},
                           {"accept", std::to_string(o.accept)},
                           {"policy", o.base.policy},
                           {"model", o.base.model + " on " + o.base.gpu}});
  add_trace_read(info, *source, cmd.formats, cmd.trace_path);
  if (!cmd.html_path.empty() || !cmd.svg_dir.empty()) {
    MC_RETURN_IF_ERROR(
        report::write_page(plan_page(plan, o.accept, o.cache_fraction, info), {cmd.html_path, cmd.svg_dir, {}}));
  }
  if (cmd.json) {
    out << to_json(plan, info).dump(2) << "\n";
  } else {
    print_plan(out, plan, info);
  }
  return Status::ok();
}

}  // namespace mc::sim
