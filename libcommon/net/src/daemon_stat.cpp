#include "mc/net/daemon_stat.hpp"

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/report.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/envelope.hpp"

namespace mc::daemon {

namespace {

std::string number_text(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  const double d = v.get<double>();
  // Gauges hold counts and byte totals as doubles: print whole values without a fraction.
  if (std::fabs(d) < 9e15 && d == std::floor(d)) return std::to_string(static_cast<int64_t>(d));
  return report::fixed(d, 3);
}

}  // namespace

Status print_stat(const std::string& endpoint, bool json, int timeout_ms, std::ostream& out) {
  rpc::ClientOptions co;
  co.client_name = "mc stat";
  co.connect_timeout_ms = timeout_ms;
  co.default_timeout_ms = timeout_ms;
  MC_ASSIGN_OR_RETURN(auto client, rpc::RpcClient::connect(endpoint, co));
  MC_ASSIGN_OR_RETURN(proto::StatReply reply, client->call(proto::StatRequest{}, timeout_ms));
  nlohmann::json metrics = nlohmann::json::parse(reply.metrics_json, nullptr, false);
  if (metrics.is_discarded() || !metrics.is_object()) {
    return Status(Code::kMalformedMessage,
                  "stat reply of " + endpoint + " (" + reply.service + ") carries metrics that are not a JSON object");
  }
  if (json) {
    out << nlohmann::json{{"service", reply.service}, {"endpoint", endpoint}, {"metrics", metrics}}.dump() << '\n';
    return Status::ok();
  }
  std::vector<std::vector<std::string>> rows = {{"metric", "value"}};
  for (const char* kind : {"counters", "gauges"}) {
    if (!metrics.contains(kind) || !metrics[kind].is_object()) continue;
    for (const auto& [name, v] : metrics[kind].items()) {
      if (v.is_number()) rows.push_back({name, number_text(v)});
    }
  }
  if (metrics.contains("histograms") && metrics["histograms"].is_object()) {
    for (const auto& [name, h] : metrics["histograms"].items()) {
      if (h.contains("count") && h["count"].is_number()) rows.push_back({name + "_count", number_text(h["count"])});
      if (h.contains("sum") && h["sum"].is_number()) rows.push_back({name + "_sum", number_text(h["sum"])});
    }
  }
  report::print_table(out, rows);
  out << "service " << reply.service << " at " << endpoint << '\n';
  return Status::ok();
}

}  // namespace mc::daemon
