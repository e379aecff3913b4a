// mc-conductor's client commands (conductor.hpp): `stat` and `cancel`, over the Conductor's RPC endpoint.
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "mc/common/report.hpp"
#include "mc/conductor/conductor.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"

namespace mc::sched {

using mc::report::fixed;

Status print_conductor_status(const std::string& endpoint, bool json, int timeout_ms, std::ostream& out) {
  rpc::ClientOptions o;
  o.client_name = "mc-conductor stat";
  o.connect_timeout_ms = timeout_ms;
  MC_ASSIGN_OR_RETURN(auto client, rpc::RpcClient::connect(endpoint, o));
  MC_ASSIGN_OR_RETURN(proto::ConductorStatusReply rep, client->call(proto::ConductorStatusRequest{true}, timeout_ms));
  nlohmann::json j = nlohmann::json::parse(rep.status_json, nullptr, false);
  if (j.is_discarded()) return error(Code::kMalformedMessage, "status from " + endpoint + " is not JSON");
  if (json) {
    out << j.dump(2) << '\n';
    return Status::ok();
  }
  out << "mc-conductor " << endpoint << "  policy " << j.value("policy", "?") << "  SLO TTFT "
      << fixed(j["slo"].value("ttft_ms", 0.0), 0) << " ms, TBT " << fixed(j["slo"].value("tbt_ms", 0.0), 0)
      << " ms, early rejection " << (j["slo"].value("early_reject", true) ? "on" : "off") << "\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"instance", "role", "host", "state", "seen_ms", "queue_ms", "requests", "kv_tokens"}};
  for (const auto& i : j.value("instances", nlohmann::json::array())) {
    std::string role = i.value("role", "");
    std::string kv = role == "decode" ? std::to_string(i.value("kv_reserved_tokens", 0)) + "/" +
                                            std::to_string(i.value("kv_capacity_tokens", 0))
                                      : "-";
    std::string queue = role == "prefill" ? fixed(i.value("queue_ms", 0.0), 1) : "-";
    int64_t reqs = role == "prefill" ? i.value("queued_jobs", 0) : i.value("requests", 0);
    rows.push_back({i.value("id", ""), role, i.value("host", ""), i.value("state", ""),
                    fixed(i.value("last_seen_ms_ago", 0.0), 0), queue, std::to_string(reqs), kv});
  }
  mc::report::print_table(out, rows);
  const auto& idx = j["index"];
  out << "\nindex: " << idx.value("blocks", 0) << " blocks, " << idx.value("holder_entries", 0) << " replicas, "
      << idx.value("backends", 0) << " backends; events " << idx.value("events_applied", 0) << ", gaps "
      << idx.value("gaps", 0) << ", resyncs " << idx.value("resyncs", 0) << " (failed "
      << idx.value("resync_failures", 0) << "), publisher restarts " << idx.value("publisher_restarts", 0)
      << ", offline backends " << idx.value("offline_backends", 0)
      << "\nreconciled: " << idx.value("resync_stale_replicas", 0) << " stale replicas dropped, "
      << idx.value("resync_missing_replicas", 0)
      << " missing added; planned hits found missing: " << idx.value("planned_missing_tokens", 0) << " tokens in "
      << idx.value("planned_missing_requests", 0) << " requests\n";
  const auto& d = j["decisions"];
  out << "decisions: " << d.value("total", 0) << " total, " << d.value("accepted", 0) << " accepted (fetch "
      << d.value("fetch", 0) << " of which remote " << d.value("fetch_remote", 0) << ", recompute "
      << d.value("recompute", 0) << " of which with a cached prefix " << d.value("recompute_cached", 0)
      << ", replicate " << d.value("replicate", 0) << "); rejected:";
  for (const auto& [reason, n] : d["rejected"].items()) out << " " << reason << "=" << n.get<uint64_t>();
  out << "\n";
  const auto& p = j["predictors"];
  out << "prefill model: " << fixed(p["prefill"].value("fixed_ms", 0.0), 2) << " ms + "
      << fixed(p["prefill"].value("ms_per_token", 0.0), 5) << " ms/token + "
      << p["prefill"].value("ms_per_token_pair", 0.0) << " ms/pair (" << p["prefill"].value("samples", 0)
      << " samples)\n";
  out << "decode step:   " << fixed(p["decode"].value("fixed_ms", 0.0), 2) << " ms + "
      << fixed(p["decode"].value("ms_per_request", 0.0), 4) << " ms/request + "
      << p["decode"].value("ms_per_context_token", 0.0) << " ms/context token (" << p["decode"].value("samples", 0)
      << " samples)\n";
  const auto& bw = p["bandwidth_bytes_per_s"];
  const auto& bw_samples = p.value("bandwidth_samples", nlohmann::json::object());
  out << "bandwidth (GB/s): same_host " << fixed(bw.value("same_host", 0.0) / 1e9, 2) << " ("
      << bw_samples.value("same_host", 0) << " samples), remote " << fixed(bw.value("remote", 0.0) / 1e9, 2) << " ("
      << bw_samples.value("remote", 0) << " samples), ssd " << fixed(bw.value("ssd", 0.0) / 1e9, 2) << " ("
      << bw_samples.value("ssd", 0) << " samples)\n";
  for (const auto& path : p.value("bandwidth_paths", nlohmann::json::array())) {
    out << "  path " << path.value("from", "?") << " -> " << path.value("to", "?") << ": "
        << fixed(path.value("bytes_per_s", 0.0) / 1e9, 2) << " GB/s now (measured "
        << fixed(path.value("measured_bytes_per_s", 0.0) / 1e9, 2) << ", " << path.value("samples", 0) << " samples, "
        << fixed(path.value("age_ms", 0.0) / 1e3, 1) << " s ago; send backlog " << path.value("send_backlog_bytes", 0)
        << " B)\n";
  }
  for (const auto& [key, name] : {std::pair{"ttft_error", "TTFT prediction error"},
                                  std::pair{"decode_step_error", "decode step prediction error"}}) {
    const nlohmann::json e = j.value(key, nlohmann::json::object());
    out << name << ": " << e.value("samples", 0) << " samples, mean |err| " << fixed(e.value("mean_abs_ms", 0.0), 2)
        << " ms, p90 |err| " << fixed(e.value("p90_abs_ms", 0.0), 2) << " ms, mean signed "
        << fixed(e.value("mean_signed_ms", 0.0), 2) << " ms\n";
  }
  const nlohmann::json f = j.value("faults", nlohmann::json::object());
  out << "worker faults: redispatched " << f.value("redispatched", 0) << ", failed_by_instance_death "
      << f.value("failed_by_instance_death", 0) << ", reservations_released " << f.value("reservations_released", 0)
      << ", connection_lost " << f.value("connection_lost", 0) << "; refused: heartbeat "
      << f.value("refused_heartbeat", 0) << ", job_report " << f.value("refused_job_report", 0) << ", prefill_ledger "
      << f.value("refused_prefill_ledger", 0) << ", decode_step " << f.value("refused_decode_step", 0) << "\n";
  out << "instance drains: notices " << f.value("drain_notices", 0) << ", drained (exited) "
      << f.value("instances_drained", 0) << ", draining now " << f.value("draining", 0) << "\n";
  const nlohmann::json c = j.value("cancels", nlohmann::json::object());
  out << "cancelled by clients: " << c.value("cancelled", 0) << " (dispatching " << c.value("dispatching", 0)
      << ", prefilling " << c.value("prefilling", 0) << ", decoding " << c.value("decoding", 0)
      << "); cancels of unknown requests " << c.value("unknown", 0) << "\n";
  return Status::ok();
}

Status cancel_request(const std::string& endpoint, const std::string& request_id, bool json, int timeout_ms,
                      std::ostream& out) {
  if (request_id.empty()) return error(Code::kInvalidArgument, "mc-conductor cancel: empty REQUEST_ID");
  rpc::ClientOptions o;
  o.client_name = "mc-conductor cancel";
  o.connect_timeout_ms = timeout_ms;
  MC_ASSIGN_OR_RETURN(auto client, rpc::RpcClient::connect(endpoint, o));
  Result<proto::ConductorCancelReply> rep = client->call(proto::ConductorCancelRequest{request_id}, timeout_ms);
  if (!rep.is_ok()) return rep.status().with_context("cancel of request '" + request_id + "' at " + endpoint);
  if (json) {
    out << nlohmann::json{{"request_id", rep->request_id}, {"stage", rep->stage}}.dump(2) << '\n';
  } else if (rep->stage == "unknown") {
    out << "request " << request_id << ": unknown to the Conductor (finished, failed or never submitted); nothing to "
        << "cancel\n";
  } else {
    out << "request " << request_id << ": cancelled while " << rep->stage << "\n";
  }
  return Status::ok();
}

}  // namespace mc::sched
