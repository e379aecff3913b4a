// JSON and table forms of a simulation's result. The request summary is replay's own (same keys,
// same table); the simulator adds the instance and cache/compute ledgers.
#include <ostream>

#include "mc/common/report.hpp"
#include "mc/report/format.hpp"
#include "mc/sim/simulator.hpp"

namespace mc::sim {

using mc::report::fixed;
using mc::report::pct;

nlohmann::json to_json(const SimResult& r, const replay::RunInfo& info) {
  nlohmann::json j;
  j["cluster"] = r.cluster;
  j["summary"] = replay::to_json(r.summary, info);
  nlohmann::json inst = nlohmann::json::array();
  for (const InstanceReport& i : r.instances) {
    nlohmann::json o = {{"id", i.id},
                        {"role", i.role},
                        {"busy_s", i.busy_s},
                        {"utilization", i.utilization},
                        {"jobs", i.jobs},
                        {"tokens", i.tokens},
                        {"nic_tx_bytes", i.nic_tx_bytes},
                        {"nic_rx_bytes", i.nic_rx_bytes},
                        {"nic_busy_s", i.nic_busy_s}};
    if (i.role == "prefill") {
      o["prompt_tokens"] = i.prompt_tokens;
      o["hit_tokens_local"] = i.hit_tokens_local;
      o["hit_tokens_remote"] = i.hit_tokens_remote;
      o["hit_ratio_local"] =
          i.prompt_tokens > 0 ? static_cast<double>(i.hit_tokens_local) / static_cast<double>(i.prompt_tokens) : 0.0;
      o["hit_ratio_remote"] =
          i.prompt_tokens > 0 ? static_cast<double>(i.hit_tokens_remote) / static_cast<double>(i.prompt_tokens) : 0.0;
      o["cache_blocks"] = i.cache_blocks;
      o["cache_evictions"] = i.cache_evictions;
    }
    inst.push_back(std::move(o));
  }
  j["instances"] = std::move(inst);
  const SimTotals& t = r.totals;
  j["totals"] = {{"prompt_tokens", t.prompt_tokens},
                 {"hit_tokens_local", t.hit_tokens_local},
                 {"hit_tokens_remote", t.hit_tokens_remote},
                 {"hit_tokens_planned", t.hit_tokens_planned},
                 {"hit_tokens_lost", t.hit_tokens_lost},
                 {"hit_ratio", t.hit_ratio()},
                 {"prefill_gpu_s", t.prefill_gpu_s},
                 {"prefill_gpu_s_saved", t.prefill_gpu_s_saved},
                 {"prefill_gpu_s_without_cache", t.prefill_gpu_s_without_cache},
                 {"transfer_bytes_prefix", t.transfer_bytes_prefix},
                 {"transfer_bytes_kv", t.transfer_bytes_kv},
                 {"replicated_prefixes", t.replicated_prefixes},
                 {"pipelined_prefills", t.pipelined_prefills},
                 {"pipeline_bubble_s", t.pipeline_bubble_s},
                 {"prefill_preemptions", t.prefill_preemptions},
                 {"events", t.events},
                 {"span_s", t.span_s},
                 {"wall_s", t.wall_s}};
  return j;
}

void print_report(std::ostream& out, const SimResult& r, const replay::RunInfo& info) {
  replay::print_table(out, r.summary, info);
  out << "\n";
  std::vector<std::vector<std::string>> rows = {{"instance", "busy_s", "util_%", "jobs", "tokens", "hit_local_%",
                                                 "hit_remote_%", "cache_blocks", "evictions", "nic_tx_GB",
                                                 "nic_rx_GB"}};
  for (const InstanceReport& i : r.instances) {
    const bool p = i.role == "prefill";
    auto ratio = [&](int64_t v) {
      return p && i.prompt_tokens > 0 ? pct(static_cast<double>(v) / static_cast<double>(i.prompt_tokens))
                                      : std::string("-");
    };
    rows.push_back({i.id, fixed(i.busy_s, 1), pct(i.utilization), std::to_string(i.jobs), std::to_string(i.tokens),
                    ratio(i.hit_tokens_local), ratio(i.hit_tokens_remote), p ? std::to_string(i.cache_blocks) : "-",
                    p ? std::to_string(i.cache_evictions) : "-", fixed(static_cast<double>(i.nic_tx_bytes) * 1e-9, 1),
                    fixed(static_cast<double>(i.nic_rx_bytes) * 1e-9, 1)});
  }
  mc::report::print_table(out, rows);
  out << "\n";
  const SimTotals& t = r.totals;
  const double saved = t.prefill_gpu_s_without_cache > 0 ? t.prefill_gpu_s_saved / t.prefill_gpu_s_without_cache : 0.0;
  mc::report::print_table(
      out,
      {{"prefill ledger", "hit_%", "local_%", "remote_%", "lost_to_eviction_tokens", "gpu_s_spent", "gpu_s_saved",
        "saved_%", "prefix_GB", "kv_to_decode_GB", "replicas"},
       {"", pct(t.hit_ratio()),
        pct(t.prompt_tokens > 0 ? static_cast<double>(t.hit_tokens_local) / static_cast<double>(t.prompt_tokens) : 0),
        pct(t.prompt_tokens > 0 ? static_cast<double>(t.hit_tokens_remote) / static_cast<double>(t.prompt_tokens) : 0),
        std::to_string(t.hit_tokens_lost), fixed(t.prefill_gpu_s, 1), fixed(t.prefill_gpu_s_saved, 1), pct(saved),
        fixed(static_cast<double>(t.transfer_bytes_prefix) * 1e-9, 1),
        fixed(static_cast<double>(t.transfer_bytes_kv) * 1e-9, 1), std::to_string(t.replicated_prefixes)}});
  if (t.pipelined_prefills > 0) {
    out << "\npipelined prefills: " << t.pipelined_prefills << " (stage bubbles " << fixed(t.pipeline_bubble_s, 1)
        << " s in all)\n";
  }
  out << "\nsimulated " << fixed(t.span_s, 1) << " s in " << fixed(t.wall_s, 2) << " s wall (" << t.events
      << " events)\n";
}

}  // namespace mc::sim
