#include "mc/sim/commands.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>

#include "mc/common/cli.hpp"
#include "mc/common/units.hpp"

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
  MC_ASSIGN_OR_RETURN(opt.cluster, resolve_cluster(cmd.cluster_path, cmd.overrides));
  opt.window = cmd.window;
  MC_RETURN_IF_ERROR(opt.window.validate());
  opt.progress = cmd.progress;
  if (cmd.output_length && *cmd.output_length < 1) {
    return error(Code::kInvalidArgument, "--output-length must be >= 1");
  }

  trace::ReaderOptions ro;
  ro.mode = cmd.lenient ? trace::Mode::kLenient : trace::Mode::kStrict;
  ro.block_size = opt.cluster.block_size;
  ro.source_name = cmd.trace_path;
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
  so.slo_ttft_ms = cmd.report_slo_ttft_ms.empty() ? std::vector<double>{opt.cluster.slo_ttft_ms} : cmd.report_slo_ttft_ms;
  so.slo_tbt_ms = cmd.report_slo_tbt_ms.empty() ? std::vector<double>{opt.cluster.slo_tbt_ms} : cmd.report_slo_tbt_ms;
  MC_ASSIGN_OR_RETURN(SimResult result, simulate(opt, *src, so));
  if (records_file.is_open() && !records_file.flush()) {
    return error(Code::kIo, "writing records to " + cmd.records_path + " failed: " + std::strerror(errno));
  }

  replay::RunInfo info = {{"tool", "mc-sim"},
                          {"build", cli::build_id()},
                          {"trace", cmd.trace_path},
                          {"policy", opt.cluster.policy},
                          {"cluster", std::to_string(opt.cluster.prefill_instances) + "P+" +
                                          std::to_string(opt.cluster.decode_instances) + "D " + opt.cluster.model +
                                          " on " + opt.cluster.gpu},
                          {"cache", std::string(cache_mode_name(opt.cluster.cache_mode)) + " " +
                                        std::to_string(opt.cluster.cache_capacity_tokens) + " tokens/instance"},
                          {"rate_scale", std::to_string(opt.window.rate_scale)},
                          {"early_rejection", opt.cluster.early_rejection ? "on" : "off"}};
  if (cmd.json) {
    out << to_json(result, info).dump(2) << "\n";
  } else {
    print_report(out, result, info);
  }
  return Status::ok();
}

}  // namespace mc::sim
