#include "mc/sim/cluster_config.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "mc/common/input_file.hpp"
#include "mc/common/units.hpp"
#include "mc/sched/queue_discipline.hpp"

namespace mc::sim {

namespace {

Status bad(const std::string& source, const std::string& key, const std::string& why) {
  return error(Code::kInvalidArgument, source + ": \"" + key + "\": " + why);
}

// A byte or token quantity: a non-negative number or a units string ("3M", "87GB").
Result<int64_t> quantity(const nlohmann::json& v, const std::string& source, const std::string& key, bool bytes) {
  if (v.is_number_integer() || v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() < 0) return bad(source, key, "must be >= 0");
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!(d >= 0) || d > 9e18) return bad(source, key, "must be a number in [0, 9e18]");
    return static_cast<int64_t>(d);
  }
  if (v.is_string()) {
    auto r = bytes ? units::parse_size_bytes(v.get<std::string>()) : units::parse_count(v.get<std::string>());
    if (!r.is_ok()) return bad(source, key, r.status().message());
    return r.value();
  }
  return bad(source, key, "must be a number or a string like \"3M\" / \"87GB\"");
}

}  // namespace

std::string_view cache_mode_name(CacheMode mode) { return mode == CacheMode::kGlobal ? "global" : "local"; }

Status ClusterConfig::validate() const {
  static const std::set<std::string> kPolicies = {"random", "round_robin", "least_loaded", "cache_aware", "kvcache"};
  const std::string src = "cluster config";
  if (prefill_instances < 1 || prefill_instances > 4096) return bad(src, "prefill_instances", "must be in [1, 4096]");
  if (decode_instances < 1 || decode_instances > 4096) return bad(src, "decode_instances", "must be in [1, 4096]");
  if (cache_capacity_tokens < 0) return bad(src, "cache_capacity_tokens", "must be >= 0");
  if (!(nic_bandwidth_bytes_per_s > 0)) return bad(src, "nic_bandwidth_bytes_per_s", "must be > 0");
  if (!kPolicies.count(policy)) {
    return bad(src, "policy", "unknown policy '" + policy + "' (random|round_robin|least_loaded|cache_aware|kvcache)");
  }
  if (!queue.empty() && !sched::parse_queue_discipline(queue).is_ok()) {
    return bad(src, "queue", "unknown queue discipline '" + queue + "' (fcfs|slo; empty: the policy's default)");
  }
  if (!(queue_aging_weight >= 0 && queue_aging_weight <= 1e6)) {
    return bad(src, "queue_aging_weight", "must be in [0, 1e6]");
  }
  if (!(queue_guard_ms >= 0 && queue_guard_ms <= 86'400'000)) return bad(src, "queue_guard_ms", "must be in [0, 24 h]");
  if (preempt_chunk_tokens < 0 || preempt_chunk_tokens > (int64_t{1} << 24)) {
    return bad(src, "preempt_chunk_tokens", "must be in [0, 2^24] tokens (0: off)");
  }
  if (!pending_prefix.empty() && pending_prefix != "on" && pending_prefix != "off") {
    return bad(src, "pending_prefix",
               "must be \"on\" or \"off\" (or \"\": the policy's default), not \"" + pending_prefix + "\"");
  }
  if (!(placement_load_weight >= 0 && placement_load_weight <= 1000)) {
    return bad(src, "placement_load_weight", "must be in [0, 1000] (0: the smallest TTFT, as in the paper)");
  }
  if (!(slo_headroom >= 0 && slo_headroom <= 0.9)) {
    return bad(src, "slo_headroom", "must be in [0, 0.9] (0: admit up to the SLO itself, as in the paper)");
  }
  if (!(shed_limit >= 0 && shed_limit <= 1000)) return bad(src, "shed_limit", "must be in [0, 1000] (0: off)");
  if (!(balancing_threshold >= 1 && balancing_threshold <= 1000)) {
    return bad(src, "balancing_threshold", "must be in [1, 1000] (1: any longer prefix, priced by TTFT)");
  }
  if (!(slo_ttft_ms > 0)) return bad(src, "slo_ttft_ms", "must be > 0");
  if (!(slo_tbt_ms > 0)) return bad(src, "slo_tbt_ms", "must be > 0");
  if (block_size < 1 || block_size > (1 << 24)) return bad(src, "block_size", "must be in [1, 16777216]");
  if (chunk_tokens < 0) return bad(src, "chunk_tokens", "must be >= 0");
  if (pipeline_group < 1 || pipeline_group > prefill_instances) {
    return bad(src, "pipeline_group",
               "must be in [1, prefill_instances = " + std::to_string(prefill_instances) + "] (1: no pipelining)");
  }
  if (pipeline_chunk_tokens < 256 || pipeline_chunk_tokens > (int64_t{1} << 24)) {
    return bad(src, "pipeline_chunk_tokens",
               "must be in [256, 16777216]: a smaller chunk's pass is bound by reading the weights, which the cost "
               "model (FLOPs only) does not see");
  }
  if (!(pipeline_reserve_factor >= 1 && pipeline_reserve_factor <= 64)) {
    return bad(src, "pipeline_reserve_factor", "must be in [1, 64] (1: the group's members only)");
  }
  if (!(pipeline_min_gain >= 0 && pipeline_min_gain <= 1)) {
    return bad(src, "pipeline_min_gain", "must be in [0, 1] (a fraction of one instance's predicted TTFT)");
  }
  if (decode_kv_capacity_tokens < 0) return bad(src, "decode_kv_capacity_tokens", "must be >= 0");
  if (decode_max_batch < 0) return bad(src, "decode_max_batch", "must be >= 0");
  if (max_context_tokens < 1) return bad(src, "max_context_tokens", "must be >= 1");
  if (!instance_nic_bandwidth_bytes_per_s.empty()) {
    if (static_cast<int64_t>(instance_nic_bandwidth_bytes_per_s.size()) != prefill_instances + decode_instances) {
      return bad(src, "instance_nic_bandwidth_bytes_per_s",
                 "needs one entry per instance (" + std::to_string(prefill_instances + decode_instances) + "), has " +
                     std::to_string(instance_nic_bandwidth_bytes_per_s.size()));
    }
    for (double b : instance_nic_bandwidth_bytes_per_s) {
      if (!(b > 0)) return bad(src, "instance_nic_bandwidth_bytes_per_s", "every entry must be > 0");
    }
  }
  return Status::ok();
}

nlohmann::json ClusterConfig::to_json() const {
  nlohmann::json j = {
      {"model", model},
      {"gpu", gpu},
      {"prefill_instances", prefill_instances},
      {"decode_instances", decode_instances},
      {"cache_capacity_tokens", cache_capacity_tokens},
      {"cache_mode", cache_mode_name(cache_mode)},
      {"nic_bandwidth_bytes_per_s", nic_bandwidth_bytes_per_s},
      {"policy", policy},
      {"slo_ttft_ms", slo_ttft_ms},
      {"slo_tbt_ms", slo_tbt_ms},
      {"early_rejection", early_rejection},
      {"queue",
       queue.empty() ? std::string(sched::queue_discipline_name(sched::default_queue_discipline(policy))) : queue},
      {"queue_aging_weight", queue_aging_weight},
      {"queue_guard_ms", queue_guard_ms},
      {"preempt_chunk_tokens", preempt_chunk_tokens},
      {"pending_prefix", pending_prefix},
      {"placement_load_weight", placement_load_weight},
      {"slo_headroom", slo_headroom},
      {"shed_limit", shed_limit},
      {"balancing_threshold", balancing_threshold},
      {"block_size", block_size},
      {"chunk_tokens", chunk_tokens},
      {"pipeline_group", pipeline_group},
      {"pipeline_chunk_tokens", pipeline_chunk_tokens},
      {"pipeline_reserve_factor", pipeline_reserve_factor},
      {"pipeline_min_gain", pipeline_min_gain},
      {"decode_kv_capacity_tokens", decode_kv_capacity_tokens},
      {"decode_max_batch", decode_max_batch},
      {"max_context_tokens", max_context_tokens},
      {"seed", seed}};
  if (!instance_nic_bandwidth_bytes_per_s.empty())
    j["instance_nic_bandwidth_bytes_per_s"] = instance_nic_bandwidth_bytes_per_s;
  return j;
}

Result<ClusterConfig> parse_cluster_config(const nlohmann::json& doc, const std::string& source) {
  if (!doc.is_object()) return error(Code::kInvalidArgument, source + ": the cluster config must be a JSON object");
  ClusterConfig c;
  for (const auto& item : doc.items()) {
    // Named references, not a structured binding: the lambdas below capture them (clang before 16 cannot
    // capture a structured binding, and clang-tidy parses with clang).
    const std::string& key = item.key();
    const nlohmann::json& v = item.value();
    auto str = [&](std::string& out) -> Status {
      if (!v.is_string()) return bad(source, key, "must be a string");
      out = v.get<std::string>();
      return Status::ok();
    };
    auto num = [&](double& out) -> Status {
      if (!v.is_number()) return bad(source, key, "must be a number");
      out = v.get<double>();
      return Status::ok();
    };
    auto qty = [&](int64_t& out, bool bytes) -> Status {
      MC_ASSIGN_OR_RETURN(out, quantity(v, source, key, bytes));
      return Status::ok();
    };
    if (key == "model") {
      MC_RETURN_IF_ERROR(str(c.model));
    } else if (key == "gpu") {
      MC_RETURN_IF_ERROR(str(c.gpu));
    } else if (key == "policy") {
      MC_RETURN_IF_ERROR(str(c.policy));
    } else if (key == "prefill_instances") {
      MC_RETURN_IF_ERROR(qty(c.prefill_instances, false));
    } else if (key == "decode_instances") {
      MC_RETURN_IF_ERROR(qty(c.decode_instances, false));
    } else if (key == "cache_capacity_tokens") {
      MC_RETURN_IF_ERROR(qty(c.cache_capacity_tokens, false));
    } else if (key == "cache_mode") {
      std::string m;
      MC_RETURN_IF_ERROR(str(m));
      if (m == "global") {
        c.cache_mode = CacheMode::kGlobal;
      } else if (m == "local") {
        c.cache_mode = CacheMode::kLocal;
      } else {
        return bad(source, key, "must be \"global\" or \"local\", not \"" + m + "\"");
      }
    } else if (key == "nic_bandwidth_bytes_per_s") {
      int64_t b = 0;
      MC_RETURN_IF_ERROR(qty(b, true));
      c.nic_bandwidth_bytes_per_s = static_cast<double>(b);
    } else if (key == "slo_ttft_ms") {
      MC_RETURN_IF_ERROR(num(c.slo_ttft_ms));
    } else if (key == "slo_tbt_ms") {
      MC_RETURN_IF_ERROR(num(c.slo_tbt_ms));
    } else if (key == "queue") {
      MC_RETURN_IF_ERROR(str(c.queue));
    } else if (key == "queue_aging_weight") {
      MC_RETURN_IF_ERROR(num(c.queue_aging_weight));
    } else if (key == "queue_guard_ms") {
      MC_RETURN_IF_ERROR(num(c.queue_guard_ms));
    } else if (key == "preempt_chunk_tokens") {
      MC_RETURN_IF_ERROR(qty(c.preempt_chunk_tokens, false));
    } else if (key == "pending_prefix") {
      MC_RETURN_IF_ERROR(str(c.pending_prefix));
    } else if (key == "placement_load_weight") {
      MC_RETURN_IF_ERROR(num(c.placement_load_weight));
    } else if (key == "slo_headroom") {
      MC_RETURN_IF_ERROR(num(c.slo_headroom));
    } else if (key == "shed_limit") {
      MC_RETURN_IF_ERROR(num(c.shed_limit));
    } else if (key == "balancing_threshold") {
      MC_RETURN_IF_ERROR(num(c.balancing_threshold));
    } else if (key == "early_rejection") {
      if (!v.is_boolean()) return bad(source, key, "must be true or false");
      c.early_rejection = v.get<bool>();
    } else if (key == "block_size") {
      MC_RETURN_IF_ERROR(qty(c.block_size, false));
    } else if (key == "chunk_tokens") {
      MC_RETURN_IF_ERROR(qty(c.chunk_tokens, false));
    } else if (key == "pipeline_group") {
      MC_RETURN_IF_ERROR(qty(c.pipeline_group, false));
    } else if (key == "pipeline_chunk_tokens") {
      MC_RETURN_IF_ERROR(qty(c.pipeline_chunk_tokens, false));
    } else if (key == "pipeline_reserve_factor") {
      MC_RETURN_IF_ERROR(num(c.pipeline_reserve_factor));
    } else if (key == "pipeline_min_gain") {
      MC_RETURN_IF_ERROR(num(c.pipeline_min_gain));
    } else if (key == "decode_kv_capacity_tokens") {
      MC_RETURN_IF_ERROR(qty(c.decode_kv_capacity_tokens, false));
    } else if (key == "decode_max_batch") {
      MC_RETURN_IF_ERROR(qty(c.decode_max_batch, false));
    } else if (key == "max_context_tokens") {
      MC_RETURN_IF_ERROR(qty(c.max_context_tokens, false));
    } else if (key == "seed") {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
        return bad(source, key, "must be an integer >= 0");
      }
      c.seed = v.get<uint64_t>();
    } else if (key == "instance_nic_bandwidth_bytes_per_s") {
      if (!v.is_array()) return bad(source, key, "must be an array of bandwidths (bytes/s), one per instance");
      c.instance_nic_bandwidth_bytes_per_s.clear();
      for (const auto& e : v) {
        MC_ASSIGN_OR_RETURN(int64_t b, quantity(e, source, key, true));
        c.instance_nic_bandwidth_bytes_per_s.push_back(static_cast<double>(b));
      }
    } else {
      return bad(source, key, "unknown key (see mc-sim(1), CLUSTER.json)");
    }
  }
  Status s = c.validate();
  if (!s.is_ok()) return error(s.code(), source + ": " + s.message().substr(s.message().find(':') + 2));
  return c;
}

Result<ClusterConfig> load_cluster_config(const std::string& path) {
  MC_ASSIGN_OR_RETURN(std::ifstream in, open_input_file(path, "cluster config"));
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (doc.is_discarded()) return error(Code::kInvalidArgument, path + ": not valid JSON");
  return parse_cluster_config(doc, path);
}

}  // namespace mc::sim
