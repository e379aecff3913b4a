#include "mc/store/master.hpp"

#include <unistd.h>

#include <chrono>
#include <map>
#include <random>

#include "convert.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/endpoint.hpp"
#include "mc/common/limits.hpp"
#include "mc/common/log.hpp"
#include "mc/net/fast_rpc.hpp"
#include "mc/net/grant.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/store.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/store/directory.hpp"
#include "mc/store/master_ha.hpp"

namespace mc::store {

namespace {

Status check_batch(size_t n, const char* what) {
  if (n > proto::kStoreMaxBatch) {
    return Status(Code::kInvalidArgument, std::string(what) + ": " + std::to_string(n) +
                                              " keys exceed the batch limit of " +
                                              std::to_string(proto::kStoreMaxBatch));
  }
  return Status::ok();
}

void add_item(proto::StoreItemsReply& reply, const Status& s) {
  reply.codes.push_back(static_cast<uint16_t>(s.code()));
  reply.messages.push_back(s.is_ok() ? "" : s.message());
}

}  // namespace

struct MasterServer::Impl {
  MasterOptions options;
  const Clock* clock;
  MasterCore core;
  std::unique_ptr<rpc::RpcServer> server;
  std::unique_ptr<rpc::EventPublisher> events;
  metrics::Registry registry;
  SegmentRegistry directory;  // the transfer engine's segment directory
  const uint64_t epoch = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);  // store.info

  Impl(const MasterOptions& o, const Clock* c) : options(o), clock(c), core(o.config, c) {}

  // ---- Quotas (docs/SECURITY.md "Quotas (issue 51)") ----
  // The limits of --quota and store.quota_set, kept here too: a core made afresh (step down, takeover) gets them
  // again (usage it derives from the objects).
  std::map<std::string, QuotaLimits> quotas;
  void apply_quotas() {
    for (const auto& [tenant, limits] : quotas) (void)core.set_quota(tenant, limits);
  }
  // The tenant charged for a caller's puts: a client's tenant; other roles (workers, the Conductor, admin) and
  // callers without keys are not charged.
  static std::string tenant_of(const rpc::CallContext& ctx) { return is_tenant(ctx) ? ctx.caller->tenant : ""; }
  // A put or pin refused over quota: counted per tenant by the core (mc_store_quota_refused_total), logged here
  // rate-limited with the caller's identity.
  uint64_t quota_refusals = 0;
  void log_quota_refusal(const rpc::CallContext& ctx, const Status& st) {
    if (st.code() != Code::kResourceExhausted) return;
    ++quota_refusals;
    if (log::nth_worth_logging(quota_refusals)) {
      MC_LOG_WARN << "quota: refused " << ctx.type << " of "
                  << (ctx.caller != nullptr ? ctx.caller->describe() : std::string("an unkeyed caller")) << ": "
                  << st.message() << " (" << quota_refusals << " refused so far)";
    }
  }

  // ---- Replication on etcd (master_ha.hpp; DESIGN.md §17) ----
  std::unique_ptr<MasterHa> ha;         // null without --etcd: the master runs alone
  std::vector<etcd::Op> directory_ops;  // directory records to write with the next commit
  bool in_call = false;                 // inside a handler: events wait for its commit
  bool leading = false;                 // serving as the leader (core holds the cluster's state)
  // Group commit of the fast path: its calls of one wait_and_handle() are made durable together, before any of their
  // replies is sent (FastServer::set_before_reply); ZeroMQ calls commit one by one.
  bool fast_call = false;      // the call being answered came by the fast path
  bool batch_pending = false;  // fast calls answered since the last batch commit
  bool commit_batch() {
    if (!ha || !batch_pending) return true;
    batch_pending = false;
    if (!commit().is_ok()) return false;
    publish_events();
    return true;
  }
  int64_t next_campaign_ms = 0;
  uint64_t campaign_failures = 0;

  Status not_leader() const {
    std::optional<LeaderInfo> l = ha->leader();
    return Status(Code::kUnavailable, "this mc-store master is a standby of cluster '" + ha->options().cluster_id +
                                          "'; the leader is " +
                                          (l ? l->endpoint + " (" + l->member + ")" : "not elected yet") +
                                          ": resolve the master through etcd (--etcd, --cluster-id)");
  }
  // Makes the changes of the call (or of the periodic work) durable; on failure steps down (the caller answers
  // the error). Without etcd: nothing to do.
  Status commit() {
    if (!ha) return Status::ok();
    DurableChanges changes = core.take_durable_changes();
    std::vector<etcd::Op> extra;
    extra.swap(directory_ops);
    Status s = ha->commit(changes, extra);
    if (!s.is_ok()) step_down(s.message());
    return s;
  }
  void step_down(const std::string& why) {
    leading = false;
    ha->step_down(why);
    core = MasterCore(options.config, clock);
    apply_quotas();
    directory = SegmentRegistry();
    directory_ops.clear();
    (void)core.take_events();
  }
  // A standby's periodic work: take the lead when nobody holds it.
  void campaign() {
    const int64_t now = clock->now_ms();
    if (now < next_campaign_ms) return;
    next_campaign_ms = now + std::max(50, options.tick_ms);
    Result<std::optional<TakeoverState>> won = ha->campaign();
    if (!won.is_ok()) {
      if (log::nth_worth_logging(++campaign_failures)) {
        MC_LOG_WARN << "store master HA: campaign failed (" << campaign_failures
                    << " times in a row; tried again every 500 ms): " << won.status().to_string();
      }
      next_campaign_ms = now + 500;
      return;
    }
    campaign_failures = 0;
    if (!won.value()) return;
    TakeoverState& st = *won.value();
    const int64_t t0 = clock->now_ms();
    core = MasterCore(options.config, clock);
    apply_quotas();
    core.set_put_id_base(static_cast<uint64_t>(st.revision) << 32);
    Result<DurableLoad> loaded = core.load_durable(st.segments, st.objects);
    core.track_durable_changes();
    directory = SegmentRegistry();
    uint64_t refused_directory = 0;
    for (const proto::SegmentDescriptor& d : st.directory) {
      Result<uint64_t> r = directory.publish(d);
      if (!r.is_ok()) {
        ++refused_directory;
        MC_LOG_ERROR << "etcd record " << ha->directory_key(d.name).substr(0, 160)
                     << " refused at takeover: " << r.status().message();
      }
    }
    sync_directory();
    if (!loaded.is_ok()) {
      MC_LOG_ERROR << "store master HA: loading the records failed: " << loaded.status().to_string();
      step_down("load failed");
      return;
    }
    for (const std::string& why : loaded->refusals) MC_LOG_ERROR << "etcd record refused at takeover: " << why;
    ha->count_refused(loaded->refused_records + refused_directory);
    registry.counter("mc_store_ha_takeovers_total", "times this master became the leader").inc();
    MC_LOG_INFO << "store master HA: leader of cluster '" << ha->options().cluster_id << "' at etcd revision "
                << st.revision << ": loaded " << loaded->segments << " segments, " << loaded->objects << " objects ("
                << loaded->replicas << " replicas, " << loaded->held_ranges << " ranges of unfinished puts held, "
                << loaded->refused_records + refused_directory << " records refused, " << st.corrupt_records
                << " corrupt records skipped; every segment offered for new puts once its node heartbeats here) in "
                << (clock->now_ms() - t0) << " ms";
    leading = true;
    Status c = commit();
    if (!c.is_ok()) MC_LOG_WARN << "store master HA: first commit failed: " << c.to_string();
    // Subscribers learn from the new publisher's incarnation that they must rebuild (DESIGN.md §4).
  }

  // Every store.* handler: only the leader answers, and what the call changed is durable before its reply.
  template <typename Req, typename Fn>
  void on(Fn fn) {
    server->handle<Req>(
        [this, fn = std::move(fn)](const Req& req, const rpc::CallContext& ctx) -> Result<typename Req::Reply> {
          if (!ha) return fn(req, ctx);
          if (!ha->is_leader()) return not_leader();
          in_call = true;
          Result<typename Req::Reply> r = fn(req, ctx);
          in_call = false;
          if (fast_call) {  // durable with the rest of its batch, before any reply of the batch is sent
            batch_pending = true;
            return r;
          }
          MC_RETURN_IF_ERROR(commit());
          publish_events();
          return r;
        });
  }

  void publish_events() {
    if (in_call) return;  // after the call's commit
    for (proto::KvEvent& e : core.take_events()) {
      if (!events) continue;
      Status s = events->publish(std::move(e));
      if (!s.is_ok()) MC_LOG_WARN << "KV event not published: " << s.to_string();
    }
  }

  void update_metrics() {
    MasterStats s = core.stat(false);
    registry.gauge("mc_store_objects", "complete objects").set(static_cast<double>(s.objects));
    registry.gauge("mc_store_processing_objects", "objects being written").set(static_cast<double>(s.processing));
    registry.gauge("mc_store_nodes", "live storage nodes").set(static_cast<double>(s.nodes));
    registry.counter("mc_store_hits_total", "reads that found the object").set(s.hits);
    registry.counter("mc_store_misses_total", "reads of absent objects").set(s.misses);
    registry.counter("mc_store_evictions_total", "replicas evicted").set(s.evictions);
    registry.counter("mc_store_demotions_total", "replicas demoted to SSD").set(s.demotions);
    registry.gauge("mc_store_pinned_objects", "objects pinned (never evicted)")
        .set(static_cast<double>(s.pinned_objects));
    registry.gauge("mc_store_pinned_bytes", "bytes of pinned objects").set(static_cast<double>(s.pinned_bytes));
    registry.counter("mc_store_corrupt_replicas_total", "replicas dropped: bytes failed the checksum")
        .set(s.corrupt_replicas);
    registry.gauge("mc_store_suspect_nodes", "nodes that missed heartbeats, within the grace period")
        .set(static_cast<double>(s.suspect_nodes));
    registry.counter("mc_store_ssd_failures_total", "SSD segments made read-only by ENOSPC/EIO").set(s.ssd_failures);
    registry.counter("mc_store_dead_nodes_total", "storage nodes declared dead (missed heartbeats)").set(s.dead_nodes);
    registry.counter("mc_store_nodes_drained_total", "storage nodes that drained and unmounted").set(s.nodes_drained);
    registry.counter("mc_store_drain_moved_objects_total", "objects copied off draining nodes")
        .set(s.drain_moved_objects);
    registry.counter("mc_store_drain_moved_bytes_total", "bytes copied off draining nodes").set(s.drain_moved_bytes);
    registry.counter("mc_store_drain_dropped_objects_total", "objects lost by drains (no room, corrupt, timeout)")
        .set(s.drain_dropped_objects);
    uint64_t cap = 0, used = 0;
    for (const auto& seg : s.segments) {
      cap += seg.info.capacity_bytes;
      used += seg.used_bytes;
    }
    registry.gauge("mc_store_capacity_bytes", "mounted capacity").set(static_cast<double>(cap));
    registry.gauge("mc_store_used_bytes", "allocated bytes").set(static_cast<double>(used));
    // Per tenant (bounded: tenants come from the roster). Limits: -1 where there is none.
    for (const TenantStats& t : core.tenant_stats()) {
      const std::string l = "{tenant=\"" + t.tenant + "\"}";
      const auto lim = [](uint64_t v) { return v == kQuotaNone ? -1.0 : static_cast<double>(v); };
      registry.gauge("mc_store_tenant_bytes" + l, "a tenant's charged bytes (size x replicas asked)")
          .set(static_cast<double>(t.usage.bytes));
      registry.gauge("mc_store_tenant_pinned_bytes" + l, "a tenant's charged bytes of pinned objects")
          .set(static_cast<double>(t.usage.pinned_bytes));
      registry.gauge("mc_store_tenant_puts" + l, "a tenant's unfinished puts").set(static_cast<double>(t.usage.puts));
      registry.gauge("mc_store_tenant_put_bytes" + l, "a tenant's charged bytes of unfinished puts")
          .set(static_cast<double>(t.usage.put_bytes));
      registry.gauge("mc_store_tenant_objects" + l, "a tenant's objects (complete and unfinished)")
          .set(static_cast<double>(t.usage.objects));
      registry.gauge("mc_store_tenant_limit_bytes" + l, "a tenant's quota of bytes (-1: none)")
          .set(lim(t.limits.bytes));
      registry.gauge("mc_store_tenant_limit_pinned_bytes" + l, "a tenant's quota of pinned bytes (-1: none)")
          .set(lim(t.limits.pinned_bytes));
      registry.gauge("mc_store_tenant_limit_puts" + l, "a tenant's quota of unfinished puts (-1: none)")
          .set(lim(t.limits.puts));
      registry.gauge("mc_store_tenant_limit_put_bytes" + l, "a tenant's quota of unfinished put bytes (-1: none)")
          .set(lim(t.limits.put_bytes));
      registry.gauge("mc_store_tenant_limit_objects" + l, "a tenant's quota of objects (-1: none)")
          .set(lim(t.limits.objects));
      registry.counter("mc_store_quota_refused_total" + l, "puts and pins refused over a tenant's quota")
          .set(t.refused);
    }
    if (fast_server) {
      const rpc::fast::FastServer::Counters& f = fast_server->counters();
      registry.gauge("mc_store_fast_connections", "open fast-path connections")
          .set(static_cast<double>(fast_server->connections()));
      registry.gauge("mc_store_fast_buffered_bytes", "request bytes buffered in partial fast-path frames")
          .set(static_cast<double>(fast_server->buffered_bytes()));
      registry.counter("mc_store_fast_refused_frames_total", "fast-path frames refused (too large, buffer full)")
          .set(f.refused);
      registry.counter("mc_store_fast_rejected_connections_total", "fast connections closed at accept (cap reached)")
          .set(f.rejected);
      registry.counter("mc_store_fast_evicted_connections_total", "idle or stalled fast connections closed")
          .set(f.evicted);
      registry.counter("mc_store_fast_accept_failures_total", "failed accept() calls on the fast port")
          .set(f.accept_failures);
      registry
          .counter("mc_store_fast_cut_connections_total",
                   "fast connections closed at a deadline (handshake, request) or for replies they do not read")
          .set(f.cut);
      registry
          .counter("mc_store_fast_address_rejected_connections_total",
                   "fast connections closed at accept: --fast-max-connections-per-address of their address open")
          .set(f.address_rejected);
    }
    registry.counter("mc_rpc_replies_dropped_total", "ZeroMQ replies dropped: their peer left too many unread")
        .set(server->counters().replies_dropped);
    registry
        .counter("mc_rpc_requests_dropped_total",
                 "ZeroMQ requests dropped unanswered: their peer's replies were being dropped (it does not read)")
        .set(server->counters().requests_dropped);
  }

  // Drops the descriptors of engines whose store segments are all gone (node unmounted or dead).
  void sync_directory() {
    std::set<std::string> referenced;
    for (const SegmentStats& seg : core.stat(false).segments) {
      if (!seg.info.xfer_segment.empty()) referenced.insert(seg.info.xfer_segment);
    }
    for (const std::string& name : directory.retain_bound(referenced)) {
      MC_LOG_INFO << "segment directory: dropped " << name << " (no mounted store segment refers to it)";
      if (ha) directory_ops.push_back(etcd::Op::del(ha->directory_key(name)));
    }
  }

  void register_handlers();

  // ---- Data-plane grants (docs/SECURITY.md "Data-plane grants") ----
  // With the cluster's grant key, each replica served by a transfer-engine segment gets a grant for `op` of exactly
  // its bytes, to the caller, for ttl_ms (+ the clock slack): the node's transfer server refuses any other access.
  static void grant(std::vector<proto::StoreReplica>& replicas, uint8_t op, int64_t ttl_ms,
                    const rpc::CallContext& ctx) {
    const auth::Keyring* ring = auth::keyring();
    if (ring == nullptr || ring->grant_key().empty()) return;
    const int64_t expiry = auth::unix_now_ms() + ttl_ms + auth::kGrantClockSlackMs;
    for (proto::StoreReplica& r : replicas) {
      if (r.size_bytes == 0) continue;
      // A DRAM replica is reached through its node's transfer segment, a disk one through store.node.read/write
      // of its store segment.
      const bool dram = !r.xfer_segment.empty();
      auth::Grant g{dram ? r.xfer_segment : r.segment,
                    dram ? r.xfer_offset_bytes : r.offset_bytes,
                    r.size_bytes,
                    op,
                    expiry,
                    ctx.caller != nullptr ? ctx.caller->name : std::string(),
                    0};
      Result<std::string> token = auth::issue_grant(ring->grant_key(), g);
      if (token.is_ok()) {
        r.grant = std::move(token).value();
      } else {
        MC_LOG_WARN << "store master: no grant for " << g.describe() << ": " << token.status().message();
      }
    }
  }

  // ---- Tenants and claims (docs/SECURITY.md) ----
  // A tenant's client names keys in its own space: key K of tenant T is "tenant/T/K" in the pool, and
  // "shared/NS/..." names a shared namespace NS, open to the tenants that opted into it (roster SHARED). Every other
  // role (workers, the Conductor, admin) names pool keys as they are. Without a key ring: unchanged.
  static bool is_tenant(const rpc::CallContext& ctx) {
    return ctx.caller != nullptr && ctx.caller->role == auth::Role::kClient;
  }
  static Result<std::string> scope_key(const rpc::CallContext& ctx, const std::string& key) {
    if (!is_tenant(ctx)) return key;
    if (key.rfind("shared/", 0) == 0) {
      const std::string ns =
          key.substr(7, key.find('/', 7) == std::string::npos ? std::string::npos : key.find('/', 7) - 7);
      for (const auto& s : ctx.caller->shared) {
        if (s == ns) return key;
      }
      return Status(Code::kPermissionDenied, ctx.type + " of '" + key + "' from " + ctx.caller->describe() +
                                                 ": shared namespace '" + ns + "' is not one this tenant opted into");
    }
    return "tenant/" + ctx.caller->tenant + "/" + key;
  }
  static Result<std::vector<std::string>> scope_keys(const rpc::CallContext& ctx,
                                                     const std::vector<std::string>& keys) {
    if (!is_tenant(ctx)) return keys;
    std::vector<std::string> out;
    // A tenant's "" would name its space's root "tenant/T/": refused as an empty key is without tenants.
    for (const auto& k : keys) {
      if (k.empty()) return Status(Code::kInvalidArgument, ctx.type + ": empty object key");
    }
    out.reserve(keys.size());
    for (const auto& k : keys) {
      MC_ASSIGN_OR_RETURN(std::string scoped, scope_key(ctx, k));
      out.push_back(std::move(scoped));
    }
    return out;
  }
  // The key as the caller named it (a tenant's own prefix removed).
  static std::string unscope_key(const rpc::CallContext& ctx, const std::string& key) {
    if (!is_tenant(ctx)) return key;
    const std::string own = "tenant/" + ctx.caller->tenant + "/";
    return key.rfind(own, 0) == 0 ? key.substr(own.size()) : key;
  }
  // A storage node id and a store segment belong to the storage key that mounted them first; a transfer segment
  // name to the key that published it first.
  auth::Claims node_claims{"storage node id", 65536};
  auth::Claims segment_claims{"store segment", 65536};
  auth::Claims xfer_claims{"transfer segment", 65536};
  // Logs and counts a refusal by a claim or a tenant scope (the RPC layer logs refused roles itself).
  Status refused(const Status& st) {
    if (!st.is_ok()) {
      registry.counter("mc_store_refused_total", "calls refused for their caller's identity").inc();
      const uint64_t n = static_cast<uint64_t>(registry.counter("mc_store_refused_total", "").value());
      if (log::nth_worth_logging(n)) MC_LOG_WARN << "refused: " << st.message() << " (" << n << " refused so far)";
    }
    return st;
  }

  Result<std::string> refused_key(const rpc::CallContext& ctx, const std::string& key) {
    Result<std::string> k = scope_key(ctx, key);
    if (!k.is_ok()) return refused(k.status());
    return k;
  }
  Result<std::vector<std::string>> refused_keys(const rpc::CallContext& ctx, const std::vector<std::string>& keys) {
    Result<std::vector<std::string>> k = scope_keys(ctx, keys);
    if (!k.is_ok()) return refused(k.status());
    return k;
  }

  // The periodic work: liveness, eviction, delayed frees, then events, directory and metrics.
  void tick() {
    if (ha) {
      if (!ha->is_leader()) {
        if (leading) step_down("the leader lease is no longer held: a paused or cut-off leader stops answering");
        ha->maintain();
        campaign();
        update_ha_metrics();
        return;
      }
      ha->maintain();
    }
    core.tick();
    sync_directory();
    if (!commit().is_ok()) return;
    publish_events();
    update_metrics();
    update_ha_metrics();
  }
  void update_ha_metrics() {
    if (!ha) return;
    const HaCounters c = ha->counters();
    registry.gauge("mc_store_ha_leader", "1 while this master leads its cluster").set(ha->is_leader() ? 1 : 0);
    registry.counter("mc_store_ha_commits_total", "etcd transactions of durable changes").set(c.commits);
    registry.counter("mc_store_ha_commit_failures_total", "durable commits that failed (the master stepped down)")
        .set(c.commit_failures);
    registry.gauge("mc_store_ha_commit_us_mean", "mean time of one durable commit (us)")
        .set(c.commits ? static_cast<double>(c.commit_us_total) / static_cast<double>(c.commits) : 0.0);
    registry.counter("mc_store_ha_step_downs_total", "times this master gave up the lead").set(c.step_downs);
    registry
        .counter("mc_store_ha_corrupt_records_total",
                 "etcd records skipped: they do not parse, break a bound, or contradict the others")
        .set(c.corrupt_records);
    registry.gauge("mc_store_ha_applied_revision", "etcd revision of the records followed")
        .set(static_cast<double>(c.applied_revision));
  }

  // The fast path (mc/net/fast_rpc.hpp), answered by the ZeroMQ server's handlers (RpcServer::dispatch).
  std::unique_ptr<rpc::fast::FastServer> fast_server;
  std::vector<zmq::pollitem_t> poll_items;
};

void MasterServer::Impl::register_handlers() {
  using namespace proto;
  on<StoreMountRequest>([this](const StoreMountRequest& req, const rpc::CallContext& ctx) -> Result<StoreAck> {
    MC_RETURN_IF_ERROR(refused(node_claims.check(ctx.caller, req.node_id, true)));
    MC_RETURN_IF_ERROR(refused(segment_claims.check(ctx.caller, req.segment, true)));
    if (!req.xfer_segment.empty()) MC_RETURN_IF_ERROR(refused(xfer_claims.check(ctx.caller, req.xfer_segment, false)));
    MC_ASSIGN_OR_RETURN(Medium medium, parse_segment_medium(req.medium));
    SegmentInfo info{req.segment,  req.node_id,      req.host,
                     req.domain,   medium,           req.capacity_bytes,
                     req.endpoint, req.xfer_segment, req.xfer_base_offset_bytes};
    if (medium == Medium::kCpu && !req.xfer_segment.empty()) {
      MC_RETURN_IF_ERROR(directory.lookup(req.xfer_segment)
                             .status()
                             .with_context("mount of " + req.segment +
                                           ": publish the transfer-engine segment (xfer.publish_segment) first"));
    }
    MC_RETURN_IF_ERROR(core.mount_segment(info, req.restore));
    sync_directory();
    MC_LOG_INFO << "mounted segment " << req.segment << " (" << req.medium << ", " << req.capacity_bytes
                << " bytes) of node " << req.node_id << " at " << req.endpoint
                << (req.restore ? " (restoring: the node re-reports its objects)" : "");
    publish_events();
    return StoreAck{};
  });
  on<StoreUnmountRequest>([this](const StoreUnmountRequest& req, const rpc::CallContext& ctx) -> Result<StoreAck> {
    MC_RETURN_IF_ERROR(refused(node_claims.check(ctx.caller, req.node_id, false)));
    MC_RETURN_IF_ERROR(refused(segment_claims.check(ctx.caller, req.segment, false)));
    MC_RETURN_IF_ERROR(core.unmount_segment(req.node_id, req.segment));
    MC_LOG_INFO << "unmounted segment " << req.segment << " of node " << req.node_id;
    publish_events();
    sync_directory();
    return StoreAck{};
  });
  on<StoreNodeHeartbeatRequest>(
      [this](const StoreNodeHeartbeatRequest& req, const rpc::CallContext& ctx) -> Result<StoreNodeHeartbeatReply> {
        MC_RETURN_IF_ERROR(refused(node_claims.check(ctx.caller, req.node_id, false)));
        MC_RETURN_IF_ERROR(check_batch(req.done.size(), "node_heartbeat done"));
        MC_ASSIGN_OR_RETURN(NodeBeat beat, core.node_heartbeat(req.node_id));
        for (const StoreDemoteResult& d : req.done) {
          (void)core.demote_done(req.node_id, d.task_id, d.ok, static_cast<Code>(d.code), d.message);
        }
        publish_events();
        StoreNodeHeartbeatReply reply;
        for (const DemoteTask& t : beat.tasks) reply.tasks.push_back(to_wire(t));
        reply.changes = std::move(beat.changes);
        reply.more = beat.more;
        reply.report = beat.report;
        for (const SegmentStats& g : core.stat(false).segments) {
          if (g.info.node_id != req.node_id) continue;
          reply.segments.push_back({g.info.name, std::string(medium_name(g.info.medium)), g.info.capacity_bytes,
                                    g.used_bytes, g.objects, g.hits});
        }
        return reply;
      });
  on<StoreClientHeartbeatRequest>(
      [this](const StoreClientHeartbeatRequest& req, const rpc::CallContext&) -> Result<StoreAck> {
        core.client_heartbeat(req.client_id);
        return StoreAck{};
      });
  on<StorePutStartRequest>(
      [this](const StorePutStartRequest& req, const rpc::CallContext& ctx) -> Result<StorePutStartReply> {
        MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "put_start"));
        MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
        if (req.sizes_bytes.size() != req.keys.size()) {
          return Status(Code::kInvalidArgument, "put_start: " + std::to_string(req.keys.size()) + " keys but " +
                                                    std::to_string(req.sizes_bytes.size()) + " sizes");
        }
        PutOptions opt{req.replicas, req.preferred_segment, req.overwrite, req.pin, req.pin_ttl_ms, tenant_of(ctx)};
        StorePutStartReply reply;
        for (size_t i = 0; i < req.keys.size(); ++i) {
          Result<PutGrant> g = core.put_start({req.client_id, req.client_host, ""}, keys[i], req.sizes_bytes[i], opt);
          StorePutStartItem item;
          if (g.is_ok()) {
            item.put_id = g->put_id;
            for (const ReplicaView& v : g->replicas) item.replicas.push_back(to_wire(v));
            grant(item.replicas, auth::kGrantWrite, options.config.put_takeover_ms, ctx);
          } else {
            log_quota_refusal(ctx, g.status());
            item.code = static_cast<uint16_t>(g.status().code());
            item.message = g.status().message();
          }
          reply.items.push_back(std::move(item));
        }
        publish_events();
        return reply;
      });
  on<StorePutEndRequest>([this](const StorePutEndRequest& req, const rpc::CallContext& ctx) -> Result<StoreItemsReply> {
    MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "put_end"));
    MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
    if (req.put_ids.size() != req.keys.size() || req.checksums.size() != req.keys.size()) {
      return Status(Code::kInvalidArgument, "put_end: " + std::to_string(req.keys.size()) + " keys but " +
                                                std::to_string(req.put_ids.size()) + " put_ids and " +
                                                std::to_string(req.checksums.size()) + " checksums");
    }
    const bool parts = !req.part_bytes.empty() || !req.part_checksums.empty();
    if (parts && (req.part_bytes.size() != req.keys.size() || req.part_checksums.size() != req.keys.size())) {
      return Status(Code::kInvalidArgument, "put_end: " + std::to_string(req.keys.size()) + " keys but " +
                                                std::to_string(req.part_bytes.size()) + " part sizes and " +
                                                std::to_string(req.part_checksums.size()) + " part checksum lists");
    }
    StoreItemsReply reply;
    for (size_t i = 0; i < req.keys.size(); ++i) {
      add_item(reply, parts ? core.put_end({req.client_id, "", ""}, keys[i], req.put_ids[i], req.checksums[i],
                                           req.part_bytes[i], req.part_checksums[i])
                            : core.put_end({req.client_id, "", ""}, keys[i], req.put_ids[i], req.checksums[i]));
    }
    publish_events();
    return reply;
  });
  on<StorePutRevokeRequest>(
      [this](const StorePutRevokeRequest& req, const rpc::CallContext& ctx) -> Result<StoreItemsReply> {
        MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "put_revoke"));
        MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
        if (req.put_ids.size() != req.keys.size()) {
          return Status(Code::kInvalidArgument, "put_revoke: keys and put_ids differ in length");
        }
        StoreItemsReply reply;
        for (size_t i = 0; i < req.keys.size(); ++i) {
          add_item(reply, core.put_revoke({req.client_id, "", ""}, keys[i], req.put_ids[i]));
        }
        return reply;
      });
  on<StoreGetReplicasRequest>(
      [this](const StoreGetReplicasRequest& req, const rpc::CallContext& ctx) -> Result<StoreGetReplicasReply> {
        MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "get_replicas"));
        MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
        StoreGetReplicasReply reply;
        Caller caller{req.client_id, req.client_host, req.client_domain};
        for (const std::string& key : keys) {
          Result<ReadGrant> g = core.get_replicas(caller, key, req.with_parts);
          StoreGetItem item;
          if (g.is_ok()) {
            item.size_bytes = g->size_bytes;
            item.checksum = g->checksum;
            item.part_bytes = g->part_bytes;
            item.part_checksums = std::move(g->part_checksums);
            item.lease_ms = g->lease_ms;
            for (const ReplicaView& v : g->replicas) item.replicas.push_back(to_wire(v));
            grant(item.replicas, auth::kGrantRead, g->lease_ms, ctx);
            if (g->replicate_to) {
              item.replicate_to.push_back(to_wire(*g->replicate_to));
              item.replicate_put_id = g->replicate_put_id;
              grant(item.replicate_to, auth::kGrantWrite, options.config.put_takeover_ms, ctx);
            }
          } else {
            item.code = static_cast<uint16_t>(g.status().code());
            item.message = g.status().message();
          }
          reply.items.push_back(std::move(item));
        }
        return reply;
      });
  on<StoreReplicateNearRequest>(
      [this](const StoreReplicateNearRequest& req, const rpc::CallContext&) -> Result<StoreReplicateNearReply> {
        MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "replicate_near"));
        MC_ASSIGN_OR_RETURN(uint32_t marked, core.replicate_near(req.keys, req.host));
        return StoreReplicateNearReply{marked};
      });
  on<StoreReplicaEndRequest>(
      [this](const StoreReplicaEndRequest& req, const rpc::CallContext& ctx) -> Result<StoreAck> {
        MC_ASSIGN_OR_RETURN(const std::string key, refused_key(ctx, req.key));
        MC_RETURN_IF_ERROR(core.replica_end({req.client_id, "", ""}, key, req.put_id, req.ok));
        publish_events();
        return StoreAck{};
      });
  on<StoreExistsRequest>(
      [this](const StoreExistsRequest& req, const rpc::CallContext& ctx) -> Result<StoreExistsReply> {
        MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "exists"));
        MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
        StoreExistsReply reply;
        for (const std::string& k : keys) reply.present.push_back(core.exists(k));
        return reply;
      });
  on<StoreMatchPrefixRequest>(
      [this](const StoreMatchPrefixRequest& req, const rpc::CallContext& ctx) -> Result<StoreMatchPrefixReply> {
        MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "match_prefix"));
        MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
        return StoreMatchPrefixReply{core.match_prefix(keys)};
      });
  on<StoreRemoveRequest>([this](const StoreRemoveRequest& req, const rpc::CallContext& ctx) -> Result<StoreItemsReply> {
    MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "remove"));
    MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
    StoreItemsReply reply;
    for (const std::string& k : keys) add_item(reply, core.remove(k));
    publish_events();
    return reply;
  });
  on<StorePinRequest>([this](const StorePinRequest& req, const rpc::CallContext& ctx) -> Result<StoreItemsReply> {
    MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "pin"));
    MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
    StoreItemsReply reply;
    for (const std::string& k : keys) {
      Status st = core.pin(k, req.ttl_ms, tenant_of(ctx));
      log_quota_refusal(ctx, st);
      add_item(reply, st);
    }
    return reply;
  });
  on<StoreUnpinRequest>([this](const StoreUnpinRequest& req, const rpc::CallContext& ctx) -> Result<StoreItemsReply> {
    MC_RETURN_IF_ERROR(check_batch(req.keys.size(), "unpin"));
    MC_ASSIGN_OR_RETURN(const std::vector<std::string> keys, refused_keys(ctx, req.keys));
    StoreItemsReply reply;
    for (const std::string& k : keys) add_item(reply, core.unpin(k));
    return reply;
  });
  on<StoreLsRequest>([this](const StoreLsRequest& req, const rpc::CallContext& ctx) -> Result<StoreLsReply> {
    const uint32_t limit =
        std::min(req.limit == 0 ? proto::kStoreLsPageObjects : req.limit, proto::kStoreLsPageObjects);
    StoreLsReply reply;
    // A tenant lists its own keys (or a shared namespace it opted into); other roles the whole pool.
    MC_ASSIGN_OR_RETURN(std::string prefix, refused_key(ctx, req.prefix));
    // "shared/NS" names the namespace NS: it lists "shared/NS/..." and not "shared/NSX/...", which scope_key
    // checked no opt-in for.
    if (prefix.size() > 7 && prefix.rfind("shared/", 0) == 0 && prefix.find('/', 7) == std::string::npos) {
      prefix += '/';
    }
    std::string start_after;
    if (!req.start_after.empty()) {
      MC_ASSIGN_OR_RETURN(start_after, refused_key(ctx, req.start_after));
    }
    std::vector<ObjectInfo> objs = core.ls(prefix, limit, start_after, proto::kStoreLsPageBytes, &reply.truncated);
    for (ObjectInfo& o : objs) {
      reply.objects.push_back(
          {unscope_key(ctx, o.key), o.size_bytes, o.complete, o.leased, o.pinned, o.segments, o.media});
    }
    return reply;
  });
  on<StoreQuotaSetRequest>([this](const StoreQuotaSetRequest& req, const rpc::CallContext& ctx) -> Result<StoreAck> {
    if (req.tenant.empty() || req.tenant.size() > 64) {
      return Status(Code::kInvalidArgument, "store.quota_set: tenant name of " + std::to_string(req.tenant.size()) +
                                                " bytes (1..64; the tenant as in the roster)");
    }
    if (quotas.size() >= 65536 && !quotas.count(req.tenant)) {
      return Status(Code::kResourceExhausted, "store.quota_set: 65536 tenants have quotas already");
    }
    MC_ASSIGN_OR_RETURN(QuotaLimits limits, parse_quota_limits(req.limits, core.quota(req.tenant)));
    quotas[req.tenant] = limits;
    MC_RETURN_IF_ERROR(core.set_quota(req.tenant, limits));
    MC_LOG_INFO << "quota of tenant " << req.tenant << " set to '" << req.limits << "' by "
                << (ctx.caller != nullptr ? ctx.caller->describe() : std::string("an unkeyed caller"));
    return StoreAck{};
  });
  on<StoreStatRequest>([this](const StoreStatRequest& req, const rpc::CallContext& ctx) -> Result<StoreStatReply> {
    MasterStats s = core.stat();
    StoreStatReply r;
    if (req.with_segments) {
      for (const SegmentStats& g : s.segments) {
        StoreSegmentStat w;
        w.segment = g.info.name;
        w.node_id = g.info.node_id;
        w.host = g.info.host;
        w.domain = g.info.domain;
        w.medium = std::string(medium_name(g.info.medium));
        w.capacity_bytes = g.info.capacity_bytes;
        w.used_bytes = g.used_bytes;
        w.largest_free_bytes = g.largest_free_bytes;
        w.fragmentation = g.fragmentation;
        w.objects = g.objects;
        w.leased_objects = g.leased_objects;
        w.hits = g.hits;
        w.evictions = g.evictions;
        w.demotions = g.demotions;
        w.suspect = g.suspect;
        w.read_only = g.read_only;
        w.draining = g.draining;
        r.segments.push_back(std::move(w));
      }
    }
    r.objects = s.objects;
    r.processing = s.processing;
    r.nodes = s.nodes;
    r.clients = s.clients;
    r.hits = s.hits;
    r.misses = s.misses;
    r.puts = s.puts;
    r.removes = s.removes;
    r.evictions = s.evictions;
    r.demotions = s.demotions;
    r.reclaimed_puts = s.reclaimed_puts;
    r.refused_put_ends = s.refused_put_ends;
    r.hot_replications = s.hot_replications;
    r.dead_nodes = s.dead_nodes;
    r.pending_free_bytes = s.pending_free_bytes;
    r.pinned_objects = s.pinned_objects;
    r.pinned_bytes = s.pinned_bytes;
    r.expired_pins = s.expired_pins;
    r.corrupt_replicas = s.corrupt_replicas;
    r.suspect_nodes = s.suspect_nodes;
    r.returned_nodes = s.returned_nodes;
    r.reported_replicas = s.reported_replicas;
    r.refused_reports = s.refused_reports;
    r.ssd_failures = s.ssd_failures;
    r.nodes_drained = s.nodes_drained;
    r.drain_moved_objects = s.drain_moved_objects;
    r.drain_moved_bytes = s.drain_moved_bytes;
    r.drain_dropped_objects = s.drain_dropped_objects;
    for (const TenantStats& t : s.tenants) {
      if (is_tenant(ctx) && t.tenant != ctx.caller->tenant) continue;  // a tenant sees its own usage only
      r.tenants.push_back({t.tenant, t.usage.bytes, t.usage.pinned_bytes, t.usage.puts, t.usage.put_bytes,
                           t.usage.objects, t.limits.bytes, t.limits.pinned_bytes, t.limits.puts, t.limits.put_bytes,
                           t.limits.objects, t.refused});
    }
    r.last_event_id = events ? events->last_event_id() : 0;
    r.events_incarnation = events ? events->incarnation() : 0;
    return r;
  });
  on<PublishSegmentRequest>(
      [this](const PublishSegmentRequest& req, const rpc::CallContext& ctx) -> Result<PublishSegmentReply> {
        MC_RETURN_IF_ERROR(refused(xfer_claims.check(ctx.caller, req.descriptor.name, true)));
        MC_ASSIGN_OR_RETURN(uint64_t regions, directory.publish(req.descriptor));
        if (ha)
          directory_ops.push_back(etcd::Op::put(ha->directory_key(req.descriptor.name), codec::pack(req.descriptor)));
        MC_LOG_DEBUG << "segment directory: " << req.descriptor.name << " published with " << regions << " region(s)";
        return PublishSegmentReply{regions};
      });
  on<GetSegmentRequest>([this](const GetSegmentRequest& req, const rpc::CallContext&) -> Result<GetSegmentReply> {
    MC_ASSIGN_OR_RETURN(SegmentDescriptor d, directory.lookup(req.name));
    return GetSegmentReply{std::move(d)};
  });
  server->handle<StoreInfoRequest>([this](const StoreInfoRequest&, const rpc::CallContext&) -> Result<StoreInfoReply> {
    return StoreInfoReply{fast_server ? fast_server->port() : 0u, "mc-store master", epoch};
  });
  on<StoreReportCorruptRequest>(
      [this](const StoreReportCorruptRequest& req, const rpc::CallContext& ctx) -> Result<StoreAck> {
        MC_ASSIGN_OR_RETURN(const std::string key, refused_key(ctx, req.key));
        MC_RETURN_IF_ERROR(core.report_corrupt(key, req.segment, req.offset_bytes));
        publish_events();
        return StoreAck{};
      });
  on<StoreNodeReportRequest>(
      [this](const StoreNodeReportRequest& req, const rpc::CallContext& ctx) -> Result<StoreNodeReportReply> {
        MC_RETURN_IF_ERROR(refused(node_claims.check(ctx.caller, req.node_id, false)));
        MC_RETURN_IF_ERROR(refused(segment_claims.check(ctx.caller, req.segment, false)));
        MC_RETURN_IF_ERROR(check_batch(req.objects.size(), "node_report"));
        MC_ASSIGN_OR_RETURN(StoreNodeReportReply reply,
                            core.node_report(req.node_id, req.segment, req.objects, req.first, req.last));
        publish_events();
        return reply;
      });
  on<StoreNodeDrainRequest>(
      [this](const StoreNodeDrainRequest& req, const rpc::CallContext& ctx) -> Result<StoreNodeDrainReply> {
        MC_RETURN_IF_ERROR(refused(node_claims.check(ctx.caller, req.node_id, false)));
        MC_RETURN_IF_ERROR(check_batch(req.done.size(), "node_drain done"));
        for (const StoreDrainResult& d : req.done) {
          const std::string message = d.message.substr(0, kStoreMaxDrainMessageBytes);
          Status s = core.drain_done(req.node_id, d.key, d.put_id, d.ok, static_cast<Code>(d.code), message);
          if (!s.is_ok()) MC_LOG_DEBUG << "node_drain of " << req.node_id << ": " << s.to_string();
        }
        MC_ASSIGN_OR_RETURN(DrainPage page, core.drain_node(req.node_id, kStoreMaxDrainTasks, req.final));
        publish_events();
        StoreNodeDrainReply reply;
        reply.more = page.more;
        reply.moved_objects = page.moved_objects;
        reply.dropped_objects = page.dropped_objects;
        reply.remaining_objects = page.remaining_objects;
        for (const DrainTask& t : page.tasks) {
          StoreDrainTask w = to_wire(t);
          // The node writes the target's bytes through its transfer engine: a write grant to it, as a hot copy's.
          std::vector<StoreReplica> target{std::move(w.target)};
          grant(target, auth::kGrantWrite, options.config.put_takeover_ms, ctx);
          w.target = std::move(target.front());
          reply.tasks.push_back(std::move(w));
        }
        return reply;
      });
  server->serve_stat(&registry);
}

MasterServer::MasterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
const metrics::Registry& MasterServer::metrics() const { return impl_->registry; }
MasterServer::~MasterServer() = default;

Result<std::unique_ptr<MasterServer>> MasterServer::bind(const MasterOptions& options, const Clock* clock) {
  if (options.config.low_watermark <= 0 || options.config.low_watermark > options.config.high_watermark ||
      options.config.high_watermark > 1.0) {
    return Status(Code::kInvalidArgument, "watermarks must satisfy 0 < low <= high <= 1 (got low " +
                                              std::to_string(options.config.low_watermark) + ", high " +
                                              std::to_string(options.config.high_watermark) + ")");
  }
  MasterOptions opts = options;
  if (const auth::Keyring* ring = auth::keyring(); ring != nullptr && !ring->grant_key().empty()) {
    opts.config.grant_hold_ms = std::max(opts.config.grant_hold_ms, 2 * auth::kGrantClockSlackMs);
  }
  // With keys (several tenants), no tenant may hold more than half of the DRAM in pinned bytes or in unfinished
  // puts unless a quota says otherwise; without keys (one trust domain) there is no default quota.
  if (auth::keyring() != nullptr && opts.config.quota_default_share <= 0) opts.config.quota_default_share = 0.5;
  std::map<std::string, QuotaLimits> quotas;
  for (const std::string& q : options.quotas) {
    MC_ASSIGN_OR_RETURN(auto tq, parse_tenant_quota(q));
    if (tq.first.size() > 64) return Status(Code::kInvalidArgument, "--quota '" + q + "': tenant name over 64 bytes");
    quotas[tq.first] = tq.second;
  }
  auto impl = std::make_unique<Impl>(opts, clock ? clock : &RealClock::instance());
  impl->quotas = std::move(quotas);
  impl->apply_quotas();
  rpc::ServerOptions so;
  so.service = "mc-store master";
  so.bind_endpoints = {options.listen};
  MC_ASSIGN_OR_RETURN(impl->server, rpc::RpcServer::bind(so));
  if (!options.events.empty()) {
    MC_ASSIGN_OR_RETURN(impl->events, rpc::EventPublisher::bind(options.events, "kv"));
  }
  if (options.fast_listen != "off") {
    std::string fast_ep = options.fast_listen;
    if (fast_ep.empty()) {
      Result<Endpoint> zmq_ep = parse_endpoint(impl->server->endpoints().at(0));
      if (zmq_ep.is_ok() && zmq_ep->is_tcp()) fast_ep = Endpoint::tcp(zmq_ep->host, 0).str();
    }
    if (!fast_ep.empty()) {
      Impl* raw = impl.get();
      MC_ASSIGN_OR_RETURN(impl->fast_server,
                          rpc::fast::FastServer::listen(
                              fast_ep, "mc-store master",
                              [raw](std::string_view type, std::string_view body, const auth::Identity* caller) {
                                rpc::CallContext ctx;
                                ctx.type = std::string(type);
                                ctx.caller = caller;
                                raw->fast_call = true;
                                Result<std::string> r = raw->server->dispatch(type, body, ctx);
                                raw->fast_call = false;
                                return r;
                              },
                              options.fast_limits));
      impl->fast_server->set_before_reply([raw] { return raw->commit_batch(); });
    }
  }
  impl->register_handlers();
  if (!options.ha.etcd.empty()) {
    LeaderInfo self;
    char host[256] = {0};
    (void)gethostname(host, sizeof host - 1);
    self.member = std::string(host) + "-" + std::to_string(getpid());
    self.endpoint = impl->server->endpoints().at(0);
    self.events = impl->events ? impl->events->endpoint() : "";
    self.fast_port = impl->fast_server ? impl->fast_server->port() : 0;
    MC_ASSIGN_OR_RETURN(impl->ha, MasterHa::start(options.ha, self));
  }
  return std::unique_ptr<MasterServer>(new MasterServer(std::move(impl)));
}

const std::string& MasterServer::endpoint() const { return impl_->server->endpoints().at(0); }
std::string MasterServer::events_endpoint() const { return impl_->events ? impl_->events->endpoint() : ""; }
uint16_t MasterServer::fast_port() const { return impl_->fast_server ? impl_->fast_server->port() : 0; }
bool MasterServer::is_leader() const { return !impl_->ha || impl_->ha->is_leader(); }
void MasterServer::stop() { impl_->server->stop(); }

// A pass of the serving loop busy this long (ms) is a stall whose time is not held against the nodes' heartbeats.
constexpr int64_t kLoopStallMs = 500;

Status MasterServer::serve() {
  int64_t next_tick = impl_->clock->now_ms();
  auto& items = impl_->poll_items;
  const int wait_ms = std::max(1, impl_->options.tick_ms / 2);
  // With a fast path, the ZeroMQ socket's ZMQ_FD joins its epoll set and the loop blocks in one
  // epoll_wait. ZMQ_FD only signals that the socket's state may have changed: after serving ZeroMQ the
  // loop asks ZMQ_EVENTS and, while a message is still waiting, polls again without sleeping.
  int zmq_fd = -1;
  if (impl_->fast_server) {
    size_t len = sizeof(zmq_fd);
    if (zmq_getsockopt(impl_->server->socket().handle(), ZMQ_FD, &zmq_fd, &len) != 0 ||
        !impl_->fast_server->watch(zmq_fd).is_ok()) {
      zmq_fd = -1;
    }
  }
  // The periodic work once tick_ms has passed; true when it ran.
  auto tick_if_due = [&] {
    const int64_t now = impl_->clock->now_ms();
    if (now < next_tick) return false;
    impl_->tick();
    next_tick = now + impl_->options.tick_ms;
    return true;
  };
  // Node liveness must not depend on this loop's latency (issue 51): when one pass was busy past kLoopStallMs
  // (beyond its own wait), heartbeats may have waited unread in the sockets all along: the nodes are credited
  // the time before tick() judges them.
  mc::limits::LogBudget stall_log(10000);
  auto credit_stall = [&](int64_t started_ms, int waited_ms) {
    const int64_t busy_ms = steady_ms() - started_ms - waited_ms;
    if (busy_ms < kLoopStallMs) return;
    impl_->core.credit_loop_stall(busy_ms);
    if (stall_log.allow(steady_ms())) {
      MC_LOG_WARN << "mc-store master: its loop was busy " << busy_ms
                  << " ms at once; heartbeats of that time are not held against the nodes";
    }
  };
  bool zmq_pending = true;
  while (zmq_fd >= 0 && !impl_->server->stopped() && !daemon::stop_requested()) {
    const int64_t pass_ms = steady_ms();
    const int pass_wait_ms = zmq_pending ? 0 : wait_ms;
    const bool zmq_ready = impl_->fast_server->wait_and_handle(pass_wait_ms);
    if (zmq_ready || zmq_pending) {
      MC_RETURN_IF_ERROR(impl_->server->poll_once(0));
      int events = 0;
      size_t len = sizeof(events);
      zmq_pending =
          zmq_getsockopt(impl_->server->socket().handle(), ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN);
    }
    credit_stall(pass_ms, pass_wait_ms);
    // tick() may use the ZeroMQ socket (deferred replies, pushes), which can consume the ZMQ_FD edge of a
    // message that arrived meanwhile: look at the socket once more before sleeping.
    if (tick_if_due()) zmq_pending = true;
  }
  while (zmq_fd < 0 && !impl_->server->stopped() && !daemon::stop_requested()) {
    // One poll over the ZeroMQ socket and the fast path's sockets: every handler runs on this thread.
    items.clear();
    items.push_back({impl_->server->socket().handle(), 0, ZMQ_POLLIN, 0});
    if (impl_->fast_server) items.push_back({nullptr, impl_->fast_server->poll_fd(), ZMQ_POLLIN, 0});
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return Status(Code::kUnavailable, "mc-store master: poll failed: " + std::string(e.what()));
    }
    const int64_t handled_from_ms = steady_ms();
    if (items[0].revents & ZMQ_POLLIN) MC_RETURN_IF_ERROR(impl_->server->poll_once(0));
    if (impl_->fast_server && (items[1].revents & ZMQ_POLLIN)) impl_->fast_server->handle_ready();
    credit_stall(handled_from_ms, 0);
    tick_if_due();
  }
  return Status::ok();
}

std::string default_events_endpoint(const MasterOptions& options) {
  const std::string fixed = MasterOptions{}.events;
  if (options.ha.etcd.empty()) return fixed;
  Result<Endpoint> listen = parse_endpoint(options.listen);
  if (!listen.is_ok() || !listen->is_tcp()) return fixed;
  return Endpoint::tcp(listen->host, 0).str();
}

Status run_master(const MasterOptions& options) {
  daemon::install_stop_signals();
  MC_ASSIGN_OR_RETURN(std::unique_ptr<MasterServer> server, MasterServer::bind(options));
  std::vector<std::pair<std::string, std::string>> extra;
  if (!server->events_endpoint().empty()) extra.emplace_back("events", server->events_endpoint());
  if (server->fast_port() != 0) extra.emplace_back("fast_port", std::to_string(server->fast_port()));
  MC_ASSIGN_OR_RETURN(
      std::unique_ptr<metrics::HttpExporter> exporter,
      metrics::start_daemon_exporter(options.metrics_listen, "mc-store master", &server->metrics(), &extra));
  daemon::announce_ready("mc-store-master", server->endpoint(), extra);
  MC_LOG_INFO << "mc-store master serving on " << server->endpoint();
  return server->serve();
}

}  // namespace mc::store
