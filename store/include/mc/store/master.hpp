// The mc-store master daemon: MasterCore (master_core.hpp) behind a ZeroMQ ROUTER (rpc.hpp) answering the
// "store.*" messages of protocol.hpp, plus the KV event publisher (DESIGN.md §4).
//
// KV event stream (PUB socket at `events_endpoint`, topic "kv", frames [topic, BE u64 event_id, KvEvent]):
//   stored   {seq_hashes:[h], backend_id: segment, medium: cpu|disk}  a replica of block h became readable
//   removed  {seq_hashes:[h], backend_id: segment, medium}            that replica is gone (evicted, removed,
//                                                                      demoted away from cpu)
//   cleared  {seq_hashes:[],  backend_id: segment, medium}            every block of the segment is gone
//                                                                      (node dead, unmounted or re-mounted)
// event_id starts at 1 and grows by exactly 1 per event; a subscriber that sees a gap (or restarts) must
// rebuild its index (store.ls, or match_prefix on demand). Only block keys ("kv/<ns>/<16 hex>",
// block_key.hpp) are announced; other keys (admin puts) are stored silently.
//
// Fast path: the same handlers also answer on a plain TCP port (store/src/fast_rpc.hpp), which clients
// learn with store.info; one zmq::poll covers both (the ZeroMQ socket and the fast path's epoll fd), so
// the master stays one thread without locks.
//
// Threading: serve() runs every handler and the periodic tick() on the calling thread; stop() may be
// called from any thread (and SIGTERM via daemon::stop_requested() also ends serve()).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/common/metrics.hpp"
#include "mc/net/fast_rpc.hpp"
#include "mc/net/rpc.hpp"
#include "mc/store/master_core.hpp"
#include "mc/store/master_ha.hpp"

namespace mc::store {

struct MasterOptions {
  std::string listen = "tcp://127.0.0.1:7450";
  std::string events = "tcp://127.0.0.1:7451";  // empty: no KV events; see default_events_endpoint
  // Fast path (plain TCP frames, no ZeroMQ I/O threads; announced by store.info): "tcp://HOST:PORT";
  // empty: the host of `listen` on a free port; "off": none (clients then use `listen` only).
  std::string fast_listen;
  rpc::fast::FastServerLimits fast_limits;  // bounds of the fast path (fast_rpc.hpp)
  MasterConfig config;
  int tick_ms = 100;           // period of liveness / eviction / delayed-free checks
  std::string metrics_listen;  // --metrics-listen: "ADDR:PORT" of GET /metrics (metrics_http.hpp); empty: off
  // Replication on etcd (master_ha.hpp): with ha.etcd set the master is one member of cluster ha.cluster_id: it serves
  // only while it leads (store.info always), and every change is durable in etcd before its reply.
  HaOptions ha;
  // --quota TENANT=LIMITS (parse_tenant_quota), repeatable: the tenants' limits at start (docs/SECURITY.md "Quotas
  // (issue 51)"); store.quota_set changes them at run time. With keys and no limit set, a tenant may hold half of
  // the pool's DRAM capacity in pinned bytes and as much in unfinished puts (MasterConfig::quota_default_share).
  std::vector<std::string> quotas;
};

class MasterServer {
 public:
  // Binds the RPC and event endpoints. kUnavailable naming the endpoint when a bind fails.
  static Result<std::unique_ptr<MasterServer>> bind(const MasterOptions& options, const Clock* clock = nullptr);
  ~MasterServer();

  const std::string& endpoint() const;  // resolved ("tcp://127.0.0.1:41234")
  std::string events_endpoint() const;  // "" when events are off
  uint16_t fast_port() const;           // port of the fast path (same host as endpoint()); 0 when off
  bool is_leader() const;               // without etcd: always true
  // The registry of its `stat` (gauges updated on every tick; safe to render from any thread).
  const metrics::Registry& metrics() const;
  // Serves until stop() or a stop signal (daemon.hpp).
  Status serve();
  void stop();

 private:
  struct Impl;
  explicit MasterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The KV event endpoint of a master started without --events: tcp://127.0.0.1:7451 alone; replicated on etcd
// (ha.etcd set) the host of `listen` on any free port, announced in the leader record where Conductors and watchers
// find it, so that a standby starts beside its leader on one host (a fixed port would be taken). An unparsable
// `listen` keeps the fixed default (run_master then reports the listen endpoint).
std::string default_events_endpoint(const MasterOptions& options);

// `mc-store master`: bind, print the ready line, serve until SIGTERM/SIGINT.
Status run_master(const MasterOptions& options);

}  // namespace mc::store
