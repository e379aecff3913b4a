#include "mc/store/admin.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include <nlohmann/json.hpp>

#include "mc/common/daemon.hpp"
#include "mc/common/input_file.hpp"
#include "mc/common/report.hpp"
#include "mc/coord/leader.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/kv_events.hpp"

namespace mc::store {

namespace {

Result<std::string> read_all(const std::string& file) {
  if (file == "-") {
    std::string data((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    return data;
  }
  MC_ASSIGN_OR_RETURN(std::ifstream in, open_input_file(file, "input file", "give a readable file, or - for stdin"));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return data;
}

std::string mib(uint64_t bytes) { return report::fixed(static_cast<double>(bytes) / (1 << 20), 1); }

}  // namespace

Status admin_put(const AdminOptions& options, const std::string& key, const std::string& file,
                 const WriteOptions& write) {
  MC_ASSIGN_OR_RETURN(std::string data, read_all(file));
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  return client->put(key, std::as_bytes(std::span<const char>(data.data(), data.size())), write);
}

Status admin_pin(const AdminOptions& options, const std::vector<std::string>& keys, bool pin, int64_t ttl_ms,
                 std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_ASSIGN_OR_RETURN(std::vector<Status> results, pin ? client->pin(keys, ttl_ms) : client->unpin(keys));
  for (const Status& r : results) MC_RETURN_IF_ERROR(r);
  if (options.json) {
    nlohmann::json j{{pin ? "pinned" : "unpinned", keys}};
    if (pin) j["ttl_ms"] = ttl_ms;
    out << j.dump() << '\n';
  }
  return Status::ok();
}

Status admin_get(const AdminOptions& options, const std::string& key, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_ASSIGN_OR_RETURN(std::vector<std::byte> buf, client->get(key));  // one lookup: one hit in `stat`
  const uint64_t n = buf.size();
  out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(n));
  out.flush();
  if (!out) return Status(Code::kIo, "cannot write " + std::to_string(n) + " bytes to stdout");
  return Status::ok();
}

Status admin_rm(const AdminOptions& options, const std::string& key, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_RETURN_IF_ERROR(client->remove(key));
  if (options.json) out << nlohmann::json{{"removed", key}}.dump() << '\n';
  return Status::ok();
}

Status admin_ls(const AdminOptions& options, const std::string& prefix, uint32_t limit, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_ASSIGN_OR_RETURN(auto reply, client->ls(prefix, limit));
  if (options.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& o : reply.objects) {
      arr.push_back({{"key", o.key},
                     {"size_bytes", o.size_bytes},
                     {"complete", o.complete},
                     {"leased", o.leased},
                     {"pinned", o.pinned},
                     {"segments", o.segments},
                     {"media", o.media}});
    }
    out << nlohmann::json{{"objects", arr}, {"truncated", reply.truncated}}.dump() << '\n';
    return Status::ok();
  }
  std::vector<std::vector<std::string>> rows = {{"key", "size(bytes)", "state", "replicas"}};
  for (const auto& o : reply.objects) {
    std::string reps;
    for (size_t i = 0; i < o.segments.size(); ++i) reps += (i ? "," : "") + o.segments[i] + "(" + o.media[i] + ")";
    rows.push_back(
        {o.key, std::to_string(o.size_bytes), o.complete ? (o.leased ? "leased" : "complete") : "writing", reps});
  }
  report::print_table(out, rows);
  if (reply.truncated) out << "(truncated at " << limit << " objects; use --limit)\n";
  return Status::ok();
}

namespace {

nlohmann::json tenants_json(const std::vector<proto::StoreTenantStat>& tenants) {
  nlohmann::json arr = nlohmann::json::array();
  const auto lim = [](uint64_t v) { return v == UINT64_MAX ? nlohmann::json(nullptr) : nlohmann::json(v); };
  for (const auto& t : tenants) {
    arr.push_back({{"tenant", t.tenant},
                   {"bytes", t.bytes},
                   {"pinned_bytes", t.pinned_bytes},
                   {"puts", t.puts},
                   {"put_bytes", t.put_bytes},
                   {"objects", t.objects},
                   {"limit_bytes", lim(t.limit_bytes)},
                   {"limit_pinned_bytes", lim(t.limit_pinned_bytes)},
                   {"limit_puts", lim(t.limit_puts)},
                   {"limit_put_bytes", lim(t.limit_put_bytes)},
                   {"limit_objects", lim(t.limit_objects)},
                   {"refused", t.refused}});
  }
  return arr;
}

// One row per tenant: each dimension as "usage/limit" ("-" where there is no limit); bytes in MiB.
void print_tenants(std::ostream& out, const std::vector<proto::StoreTenantStat>& tenants) {
  const auto pair = [](uint64_t used, uint64_t limit, bool bytes) {
    const auto f = [bytes](uint64_t v) { return bytes ? mib(v) : std::to_string(v); };
    return f(used) + "/" + (limit == UINT64_MAX ? std::string("-") : f(limit));
  };
  std::vector<std::vector<std::string>> rows = {
      {"tenant", "bytes(MiB)", "pinned(MiB)", "puts", "put-bytes(MiB)", "objects", "refused"}};
  for (const auto& t : tenants) {
    rows.push_back({t.tenant, pair(t.bytes, t.limit_bytes, true), pair(t.pinned_bytes, t.limit_pinned_bytes, true),
                    pair(t.puts, t.limit_puts, false), pair(t.put_bytes, t.limit_put_bytes, true),
                    pair(t.objects, t.limit_objects, false), std::to_string(t.refused)});
  }
  report::print_table(out, rows);
}

}  // namespace

Status admin_quota_set(const AdminOptions& options, const std::string& tenant, const std::string& limits,
                       std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_RETURN_IF_ERROR(client->quota_set(tenant, limits).with_context("quota of tenant '" + tenant + "'"));
  if (options.json) out << nlohmann::json{{"tenant", tenant}, {"limits", limits}}.dump() << '\n';
  return Status::ok();
}

Status admin_quota_ls(const AdminOptions& options, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_ASSIGN_OR_RETURN(auto s, client->stat());
  if (options.json) {
    out << tenants_json(s.tenants).dump() << '\n';
    return Status::ok();
  }
  print_tenants(out, s.tenants);
  return Status::ok();
}

Status admin_stat(const AdminOptions& options, std::ostream& out) {
  MC_ASSIGN_OR_RETURN(auto client, Client::connect(options.client));
  MC_ASSIGN_OR_RETURN(auto s, client->stat());
  if (options.json) {
    nlohmann::json segs = nlohmann::json::array();
    for (const auto& g : s.segments) {
      segs.push_back({{"segment", g.segment},
                      {"node_id", g.node_id},
                      {"host", g.host},
                      {"domain", g.domain},
                      {"medium", g.medium},
                      {"capacity_bytes", g.capacity_bytes},
                      {"used_bytes", g.used_bytes},
                      {"largest_free_bytes", g.largest_free_bytes},
                      {"fragmentation", g.fragmentation},
                      {"objects", g.objects},
                      {"leased_objects", g.leased_objects},
                      {"hits", g.hits},
                      {"evictions", g.evictions},
                      {"demotions", g.demotions},
                      {"suspect", g.suspect},
                      {"read_only", g.read_only},
                      {"draining", g.draining}});
    }
    nlohmann::json j{{"segments", segs},
                     {"tenants", tenants_json(s.tenants)},
                     {"objects", s.objects},
                     {"processing", s.processing},
                     {"nodes", s.nodes},
                     {"clients", s.clients},
                     {"hits", s.hits},
                     {"misses", s.misses},
                     {"puts", s.puts},
                     {"removes", s.removes},
                     {"evictions", s.evictions},
                     {"demotions", s.demotions},
                     {"reclaimed_puts", s.reclaimed_puts},
                     {"refused_put_ends", s.refused_put_ends},
                     {"hot_replications", s.hot_replications},
                     {"dead_nodes", s.dead_nodes},
                     {"pending_free_bytes", s.pending_free_bytes},
                     {"last_event_id", s.last_event_id},
                     {"pinned_objects", s.pinned_objects},
                     {"pinned_bytes", s.pinned_bytes},
                     {"expired_pins", s.expired_pins},
                     {"corrupt_replicas", s.corrupt_replicas},
                     {"suspect_nodes", s.suspect_nodes},
                     {"returned_nodes", s.returned_nodes},
                     {"reported_replicas", s.reported_replicas},
                     {"refused_reports", s.refused_reports},
                     {"ssd_failures", s.ssd_failures},
                     {"nodes_drained", s.nodes_drained},
                     {"drain_moved_objects", s.drain_moved_objects},
                     {"drain_moved_bytes", s.drain_moved_bytes},
                     {"drain_dropped_objects", s.drain_dropped_objects}};
    out << j.dump() << '\n';
    return Status::ok();
  }
  std::vector<std::vector<std::string>> rows = {{"segment", "medium", "domain", "capacity(MiB)", "used(MiB)", "objects",
                                                 "leased", "hits", "evictions", "demotions", "frag", "state"}};
  for (const auto& g : s.segments) {
    const std::string state = g.suspect ? "suspect" : g.draining ? "draining" : g.read_only ? "read-only" : "ok";
    rows.push_back({g.segment, g.medium, g.domain, mib(g.capacity_bytes), mib(g.used_bytes), std::to_string(g.objects),
                    std::to_string(g.leased_objects), std::to_string(g.hits), std::to_string(g.evictions),
                    std::to_string(g.demotions), report::fixed(g.fragmentation, 2), state});
  }
  report::print_table(out, rows);
  out << "objects " << s.objects << " (writing " << s.processing << "), nodes " << s.nodes << ", hits " << s.hits
      << ", misses " << s.misses << ", evictions " << s.evictions << ", demotions " << s.demotions
      << ", reclaimed puts " << s.reclaimed_puts << ", hot copies " << s.hot_replications << ", dead nodes "
      << s.dead_nodes << ", pinned " << s.pinned_objects << " (" << s.pinned_bytes << " bytes, expired soft pins "
      << s.expired_pins << ")\n";
  out << "faults: corrupt replicas " << s.corrupt_replicas << ", suspect nodes " << s.suspect_nodes
      << ", returned nodes " << s.returned_nodes << ", reported replicas " << s.reported_replicas
      << ", refused reports " << s.refused_reports << ", SSD failures " << s.ssd_failures << "\n";
  if (!s.tenants.empty()) print_tenants(out, s.tenants);
  out << "drains: nodes drained " << s.nodes_drained << ", moved objects " << s.drain_moved_objects << " ("
      << s.drain_moved_bytes << " bytes), dropped objects " << s.drain_dropped_objects << "\n";
  return Status::ok();
}

Status admin_watch(const WatchOptions& options, std::ostream& out, std::ostream& err) {
  daemon::install_stop_signals();
  std::shared_ptr<LeaderLocator> locator;
  std::string events = options.events;
  uint64_t generation = 0;
  if (!options.etcd.empty()) {
    MC_ASSIGN_OR_RETURN(locator, LeaderLocator::create(LeaderAddress{"", options.etcd, options.cluster_id}));
    generation = locator->generation();
    MC_ASSIGN_OR_RETURN(LeaderInfo leader, locator->leader(options.leader_wait_ms));
    if (leader.events.empty()) {
      return Status(Code::kFailedPrecondition, "mc-store watch: the leader of " + locator->describe() + ", " +
                                                   leader.endpoint +
                                                   ", publishes no KV events (started with "
                                                   "--events \"\"): give its masters --events");
    }
    events = leader.events;
    err << "mc-store watch: following the KV events of the leader of " << locator->describe() << ", " << leader.endpoint
        << " (" << leader.member << "), at " << events << '\n';
  }
  MC_ASSIGN_OR_RETURN(auto sub, rpc::EventSubscriber::connect(events, "kv"));
  uint64_t seen = 0;
  int64_t idle_ms = 0;
  bool said_none = false;
  while (!daemon::stop_requested() && (options.count == 0 || seen < options.count)) {
    // A takeover: the new leader's stream (the old one's socket is gone with it).
    if (locator && locator->generation() != generation) {
      generation = locator->generation();
      Result<LeaderInfo> leader = locator->leader(0);
      if (!leader.is_ok()) {
        if (!said_none)
          err << "mc-store watch: the leader of " << locator->describe() << " is gone; waiting for the next\n";
        said_none = true;
      } else if (leader->events.empty()) {
        err << "mc-store watch: the new leader " << leader->endpoint
            << " publishes no KV events; waiting for another\n";
      } else if (leader->events != events) {
        Result<std::unique_ptr<rpc::EventSubscriber>> next = rpc::EventSubscriber::connect(leader->events, "kv");
        if (!next.is_ok()) {
          err << "mc-store watch: cannot subscribe to the new leader's events at " << leader->events << ": "
              << next.status().message() << '\n';
        } else {
          sub = std::move(next).value();
          events = leader->events;
          said_none = false;
          err << "mc-store watch: the leader of " << locator->describe() << " changed: reconnected to "
              << leader->endpoint << " (" << leader->member << "), following its KV events at " << events
              << " (events published during the takeover are not replayed; a new incarnation starts)\n";
        }
      }
      err.flush();
    }
    auto ev = sub->next(100);
    if (!ev.is_ok()) {
      err << "mc-store watch: " << ev.status().to_string() << '\n';
      continue;
    }
    if (!ev->has_value()) {
      idle_ms += 100;
      if (options.timeout_ms > 0 && idle_ms >= options.timeout_ms) break;
      continue;
    }
    idle_ms = 0;
    const proto::KvEvent& e = **ev;
    nlohmann::json j{{"type", e.type},
                     {"event_id", e.event_id},
                     {"ts_unix_ms", e.ts_unix_ms},
                     {"seq_hashes", e.seq_hashes},
                     {"backend_id", e.backend_id},
                     {"medium", e.medium},
                     {"incarnation", e.incarnation}};
    out << j.dump() << '\n';
    out.flush();
    ++seen;
  }
  return Status::ok();
}

}  // namespace mc::store
