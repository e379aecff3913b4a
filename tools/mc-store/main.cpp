// mc-store: the KV store's tool. Subcommands: master (metadata service), serve (storage node), put, get,
// rm, pin, unpin, ls, stat, quota, watch (admin and debugging), keys (block keys of token ids).
#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/common/units.hpp"
#include "mc/coord/etcd_flags.hpp"
#include "mc/net/daemon_stat.hpp"
#include "mc/net/flags.hpp"
#include "mc/store/admin.hpp"
#include "mc/store/bench.hpp"
#include "mc/store/keys_command.hpp"
#include "mc/store/master.hpp"
#include "mc/store/node.hpp"

namespace {

void add_master_flag(CLI::App* cmd, mc::store::ClientOptions& c) {
  cmd->add_option("--master", c.master, "Endpoint of mc-store master")
      ->envname("MC_STORE_MASTER")
      ->capture_default_str();
  mc::cli::add_etcd_flags(*cmd, c.etcd, c.cluster_id, "--master");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mc-store: the KV-cache store (master, storage nodes, admin and debugging commands)"};
  app.require_subcommand(1);
  mc::cli::add_common_flags(app, "mc-store");

  // ---- master ----
  mc::store::MasterOptions master;
  auto* master_cmd =
      app.add_subcommand("master", "Run the metadata service (segments, objects, leases, eviction, KV events)");
  master_cmd->add_option("--listen", master.listen, "RPC endpoint to bind")
      ->envname("MC_STORE_LISTEN")
      ->capture_default_str();
  CLI::Option* master_events =
      master_cmd
          ->add_option(
              "--events", master.events,
              "KV event PUB endpoint (empty: no events; default tcp://127.0.0.1:7451, with --etcd the --listen "
              "host on any free port, announced in etcd)")
          ->envname("MC_STORE_EVENTS");
  master_cmd
      ->add_option("--fast-listen", master.fast_listen,
                   "Plain-TCP fast path for clients (tcp://HOST:PORT; empty: host of --listen, free port; off: none)")
      ->envname("MC_STORE_FAST_LISTEN")
      ->capture_default_str();
  auto& mc_cfg = master.config;
  master_cmd->add_option("--high-watermark", mc_cfg.high_watermark, "Segment usage fraction that starts eviction")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  master_cmd->add_option("--low-watermark", mc_cfg.low_watermark, "Segment usage fraction eviction stops at")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  master_cmd
      ->add_option("--node-ttl-ms", mc_cfg.node_ttl_ms,
                   "A storage node silent this long (ms) is suspect: its replicas are kept but not offered")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  master_cmd
      ->add_option("--node-grace-ms", mc_cfg.node_grace_ms,
                   "A suspect node silent this much longer (ms) is dead and its replicas dropped; one back sooner "
                   "re-reports its objects (0: dead at --node-ttl-ms)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  master_cmd
      ->add_option("--client-ttl-ms", mc_cfg.client_ttl_ms,
                   "A client silent this long (ms) is dead; its puts are reclaimed")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  master_cmd->add_option("--lease-ms", mc_cfg.lease_ms, "Read lease granted by get (ms)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  master_cmd
      ->add_option("--put-takeover-ms", mc_cfg.put_takeover_ms,
                   "Another writer may take over a put older than this (ms)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  master_cmd
      ->add_option("--put-reclaim-ms", mc_cfg.put_reclaim_ms, "Unfinished puts older than this (ms) are reclaimed")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  master_cmd
      ->add_option("--free-delay-ms", mc_cfg.free_delay_ms, "Space of discarded puts is freed this long (ms) later")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  mc::cli::add_size_option(*master_cmd, "--alignment", mc_cfg.alignment_bytes,
                           "Allocation granularity inside a segment (bytes, power of two)");
  mc::cli::add_size_option(*master_cmd, "--max-object-bytes", mc_cfg.max_object_bytes,
                           "Largest object accepted (bytes)");
  master_cmd->add_option("--max-replicas", mc_cfg.max_replicas, "Most replicas of one object, hot copies included")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  master_cmd
      ->add_option("--hot-reads", mc_cfg.hot_read_threshold, "Reads within --hot-window-ms that add a replica (0: off)")
      ->capture_default_str();
  master_cmd->add_option("--hot-window-ms", mc_cfg.hot_window_ms, "Window of the hot-object read count (ms)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  master_cmd
      ->add_option("--quota", master.quotas,
                   "A tenant's quota, TENANT=bytes:SIZE,pinned:SIZE,puts:N,put-bytes:SIZE,objects:N (any subset; "
                   "repeatable); with keys a tenant without one may hold half of the DRAM in pinned bytes and in "
                   "unfinished puts")
      ->envname("MC_STORE_QUOTA")
      ->delimiter(';');
  mc::cli::add_etcd_flags(*master_cmd, master.ha.etcd, master.ha.cluster_id, "");
  master_cmd
      ->add_option("--leader-lease-s", master.ha.lease_ttl_s,
                   "With --etcd: TTL of the leader's etcd lease (s); a dead leader is replaced about this long after")
      ->envname("MC_STORE_LEADER_LEASE_S")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{600}));
  master_cmd->add_option("--etcd-timeout-ms", master.ha.etcd_timeout_ms, "With --etcd: timeout of one etcd call (ms)")
      ->envname("MC_STORE_ETCD_TIMEOUT_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{50}, int64_t{60000}));
  master_cmd->add_option("--tick-ms", master.tick_ms, "Period of liveness/eviction checks (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  auto& fast = master.fast_limits;
  mc::cli::add_size_option(*master_cmd, "--fast-max-frame-bytes", fast.max_frame_bytes,
                           "Largest request body on the fast path; a frame declaring more is refused and its "
                           "connection closed before it is buffered",
                           1, 64ull << 20)
      ->envname("MC_STORE_FAST_MAX_FRAME_BYTES");
  mc::cli::add_size_option(*master_cmd, "--fast-conn-buffer-bytes", fast.max_conn_buffer_bytes,
                           "Unsent replies of one fast connection above which it is not read until they drain", 1)
      ->envname("MC_STORE_FAST_CONN_BUFFER_BYTES");
  mc::cli::add_size_option(*master_cmd, "--fast-buffer-bytes", fast.max_buffer_bytes,
                           "Request bytes in partial frames over all fast connections; a frame that would exceed "
                           "it is refused and its connection closed",
                           1)
      ->envname("MC_STORE_FAST_BUFFER_BYTES");
  master_cmd
      ->add_option("--fast-max-connections", fast.max_connections,
                   "Open fast connections; at the cap a new one takes the slot of one idle for "
                   "--fast-idle-timeout-ms, else it is closed (lowered to fit ulimit -n)")
      ->envname("MC_STORE_FAST_MAX_CONNECTIONS")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  master_cmd
      ->add_option("--fast-max-connections-per-address", fast.max_connections_per_address,
                   "Open fast connections from one peer address; more from it are closed at accept (its clients "
                   "fall back to ZeroMQ), so one address cannot take every slot")
      ->envname("MC_STORE_FAST_MAX_CONNECTIONS_PER_ADDRESS")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  master_cmd
      ->add_option("--fast-idle-timeout-ms", fast.idle_timeout_ms,
                   "A fast connection silent this long (ms) may lose its slot to a new one; one stalled inside a "
                   "frame that long is closed")
      ->envname("MC_STORE_FAST_IDLE_TIMEOUT_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));

  // ---- serve ----
  mc::store::NodeOptions node;
  auto* serve_cmd =
      app.add_subcommand("serve", "Run a storage node contributing DRAM (and optionally SSD) to the pool");
  serve_cmd->add_option("--master", node.master, "Endpoint of mc-store master")
      ->envname("MC_STORE_MASTER")
      ->capture_default_str();
  mc::cli::add_etcd_flags(*serve_cmd, node.etcd, node.cluster_id, "--master");
  serve_cmd->add_option("--listen", node.listen, "RPC endpoint to bind (SSD-tier data RPCs)")->capture_default_str();
  serve_cmd
      ->add_option("--xfer-listen", node.xfer_listen,
                   "Transfer-engine endpoints serving the DRAM segment, comma-separated (one tcp path each)")
      ->delimiter(',')
      ->envname("MC_STORE_XFER_LISTEN")
      ->capture_default_str();
  serve_cmd->add_option("--node-id", node.node_id, "Node name, unique in the cluster (default: <hostname>-<pid>)")
      ->envname("MC_STORE_NODE_ID");
  serve_cmd->add_option("--host", node.host, "Host name used for nearest-replica ordering (default: hostname)");
  serve_cmd->add_option("--domain", node.domain, "Failure domain label (rack, zone)")->capture_default_str();
  mc::cli::add_size_option(*serve_cmd, "--dram-bytes", node.dram_bytes, "DRAM contributed (bytes; 64KiB, 1GiB, ...)");
  auto* ssd_dir =
      serve_cmd->add_option("--ssd-dir", node.ssd_dir, "Directory of the SSD tier file (empty: no SSD tier)");
  mc::cli::add_size_option(*serve_cmd, "--ssd-bytes", node.ssd_bytes, "SSD contributed (bytes; needs --ssd-dir)")
      ->needs(ssd_dir);
  serve_cmd->add_option("--heartbeat-ms", node.heartbeat_ms, "Heartbeat period (ms)")
      ->capture_default_str()
      ->check(CLI::Range(10, 60000));
  serve_cmd
      ->add_option("--master-wait-ms", node.master_wait_ms,
                   "At start, how long to keep asking an unreachable master (ms) before exiting 1")
      ->envname("MC_STORE_MASTER_WAIT_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  bool no_shm = false, no_prefault = false;
  serve_cmd->add_flag("--no-prefault", no_prefault,
                      "Commit DRAM pages on first write instead of at start (faster start, slower first puts)");
  serve_cmd->add_flag("--no-shm", no_shm, "Back DRAM with private memory: same-host clients use tcp instead of shm");
  mc::cli::add_xfer_server_flags(*serve_cmd, node.xfer_max_connections, node.xfer_idle_timeout_ms);
  serve_cmd
      ->add_option("--drain-timeout-s", node.drain_timeout_s,
                   "On SIGTERM, how long the master may move this node's objects to other nodes before it unmounts "
                   "(s; 0: unmount at once)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600}));

  // ---- admin ----
  mc::store::AdminOptions admin;
  std::string key, file = "-", prefix;
  bool overwrite = false;
  uint32_t limit = 1000;
  auto* put_cmd = app.add_subcommand("put", "Store the bytes of FILE (or stdin: -) under KEY");
  add_master_flag(put_cmd, admin.client);
  put_cmd->add_option("KEY", key, "Object key")->required();
  put_cmd->add_option("FILE", file, "File to store, - for stdin")->capture_default_str();
  put_cmd->add_option("--replicas", admin.client.replicas, "Copies to write on distinct nodes")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  put_cmd->add_flag("--overwrite", overwrite, "Replace an existing object");
  mc::store::WriteOptions put_write;
  auto* put_pin = put_cmd->add_flag("--pin", put_write.pin, "Pin the object: never evicted nor demoted to SSD");
  put_cmd
      ->add_option("--pin-ttl-ms", put_write.pin_ttl_ms,
                   "With --pin: soft pin ending this long after the put (ms; 0: until mc-store unpin)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, mc::store::kMaxPinTtlMs))
      ->needs(put_pin);
  auto* get_cmd = app.add_subcommand("get", "Write the bytes of KEY to stdout (exit 1 on a miss)");
  add_master_flag(get_cmd, admin.client);
  get_cmd->add_option("KEY", key, "Object key")->required();
  auto* rm_cmd = app.add_subcommand("rm", "Remove KEY (refused while it is leased or being written)");
  add_master_flag(rm_cmd, admin.client);
  rm_cmd->add_option("KEY", key, "Object key")->required();
  mc::cli::add_json_flag(*rm_cmd, admin.json, "Print the result as JSON");
  std::vector<std::string> pin_keys;
  int64_t pin_ttl_ms = 0;
  auto* pin_cmd =
      app.add_subcommand("pin", "Pin objects: never evicted nor demoted to SSD (exit 1 naming a missing key)");
  add_master_flag(pin_cmd, admin.client);
  pin_cmd->add_option("KEY", pin_keys, "Object keys")->required();
  pin_cmd->add_option("--ttl-ms", pin_ttl_ms, "Soft pin ending this long from now (ms; 0: until mc-store unpin)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, mc::store::kMaxPinTtlMs));
  mc::cli::add_json_flag(*pin_cmd, admin.json, "Print the result as JSON");
  auto* unpin_cmd = app.add_subcommand("unpin", "End the pins of objects (exit 1 naming a missing key)");
  add_master_flag(unpin_cmd, admin.client);
  unpin_cmd->add_option("KEY", pin_keys, "Object keys")->required();
  mc::cli::add_json_flag(*unpin_cmd, admin.json, "Print the result as JSON");
  auto* ls_cmd = app.add_subcommand("ls", "List objects");
  add_master_flag(ls_cmd, admin.client);
  ls_cmd->add_option("--prefix", prefix, "Only keys starting with this");
  ls_cmd->add_option("--limit", limit, "Most objects listed")->capture_default_str();
  mc::cli::add_json_flag(*ls_cmd, admin.json, "Print JSON");
  auto* stat_cmd =
      app.add_subcommand("stat", "Per-segment capacity, usage, objects, hits, evictions, demotions, leases");
  add_master_flag(stat_cmd, admin.client);
  std::string stat_node;
  stat_cmd
      ->add_option("--node", stat_node,
                   "Ask this storage node (its RPC endpoint, in its ready line) for its own counters instead")
      ->envname("MC_STORE_NODE");
  mc::cli::add_json_flag(*stat_cmd, admin.json, "Print JSON");
  // One subcommand whose first word is the action (so its flags are the subcommand's, as every other one's).
  auto* quota_cmd = app.add_subcommand(
      "quota",
      "Quotas per tenant: 'quota ls' (each tenant's usage/limit and refusals) or 'quota set TENANT LIMITS' "
      "(the dimensions not named keep theirs; admin key)");
  std::string quota_action, quota_tenant, quota_limits;
  quota_cmd->add_option("ACTION", quota_action, "ls or set")->required()->check(CLI::IsMember({"ls", "set"}));
  quota_cmd->add_option("TENANT", quota_tenant, "With set: the tenant, as in the roster");
  quota_cmd->add_option("LIMITS", quota_limits,
                        "With set: bytes:SIZE,pinned:SIZE,puts:N,put-bytes:SIZE,objects:N (any subset; VALUE "
                        "'default' resets)");
  add_master_flag(quota_cmd, admin.client);
  mc::cli::add_json_flag(*quota_cmd, admin.json, "Print JSON");
  mc::store::WatchOptions watch;
  auto* watch_cmd = app.add_subcommand("watch", "Print KV events (stored/removed/cleared) as JSONL");
  watch_cmd->add_option("--events", watch.events, "KV event endpoint of the master")
      ->envname("MC_STORE_EVENTS")
      ->capture_default_str();
  mc::cli::add_etcd_flags(*watch_cmd, watch.etcd, watch.cluster_id, "--events");
  watch_cmd->add_option("--count", watch.count, "Stop after this many events (0: never)")->capture_default_str();
  watch_cmd->add_option("--timeout-ms", watch.timeout_ms, "Stop after this long without an event (ms, 0: never)")
      ->capture_default_str();

  // ---- bench ----
  mc::store::BenchOptions bench;
  std::string bench_clients = "1,8,32";
  auto* bench_cmd = app.add_subcommand(
      "bench", "Metadata ops/s (put, put_sync, get, match over 24 keys) or data GB/s (batch_put/batch_get)");
  add_master_flag(bench_cmd, bench.client);
  bench_cmd->add_option("--mode", bench.mode, "metadata or data")->capture_default_str();
  bench_cmd->add_option("--clients", bench_clients, "Concurrent clients, comma-separated (metadata)")
      ->capture_default_str();
  bench_cmd
      ->add_option("--ops", bench.ops,
                   "Operations: put (write-behind commit), put_sync (commit waited for), get, match (metadata)")
      ->delimiter(',');
  bench_cmd->add_option("--transport", bench.transport, "Metadata path: fast (plain TCP) or zmq (ZeroMQ RpcClient)")
      ->capture_default_str();
  bench_cmd
      ->add_option("--pipeline", bench.pipeline, "Requests in flight per client, fast transport (redis-benchmark -P)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  bench_cmd->add_option("--duration", bench.duration_s, "Seconds per point")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  bench_cmd->add_option("--kv-bytes-per-token", bench.kv_bytes_per_token, "KV bytes per token (data)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 22));
  bench_cmd->add_option("--block-tokens", bench.block_tokens, "Tokens per block (data)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  bench_cmd->add_option("--blocks", bench.blocks, "Blocks per round (data)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  bench_cmd->add_option("--batch", bench.batch, "Blocks per batch call (data)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  bench_cmd->add_option("--client-host", bench.client.host,
                        "Host name the client claims (another name forces the tcp path)");
  mc::cli::add_json_flag(*bench_cmd, bench.json, "Print JSON");

  // ---- keys ----
  mc::store::KeysOptions keys;
  auto* keys_cmd = app.add_subcommand(
      "keys", "Read token ids (whitespace-separated) on stdin; print the prefix-chained key of each complete block");
  mc::cli::add_key_namespace_flags(*keys_cmd, keys.ns);
  keys_cmd->add_flag("--store-keys", keys.store_keys, "Print full store keys (kv/<namespace>/<hash>)");

  mc::cli::add_metrics_flags(*master_cmd, master.metrics_listen);
  mc::cli::add_metrics_flags(*serve_cmd, node.metrics_listen);
  mc::cli::add_auth_flags(*master_cmd, "master");
  mc::cli::add_auth_flags(*serve_cmd, "node");
  for (auto* cmd : {put_cmd, get_cmd, rm_cmd, pin_cmd, unpin_cmd, ls_cmd, stat_cmd, watch_cmd, bench_cmd, quota_cmd}) {
    mc::cli::add_auth_flags(*cmd, "admin");
  }
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (master_cmd->parsed()) {
    if (master_events->count() == 0) master.events = mc::store::default_events_endpoint(master);
    return mc::cli::report("mc-store master", mc::store::run_master(master));
  }
  if (serve_cmd->parsed()) {
    node.shm = !no_shm;
    node.prefault = !no_prefault;
    return mc::cli::report("mc-store serve", mc::store::run_node(node));
  }
  if (put_cmd->parsed()) {
    put_write.overwrite = overwrite;
    return mc::cli::report("mc-store put", mc::store::admin_put(admin, key, file, put_write));
  }
  if (pin_cmd->parsed() || unpin_cmd->parsed()) {
    const bool pin = pin_cmd->parsed();
    return mc::cli::report(pin ? "mc-store pin" : "mc-store unpin",
                           mc::store::admin_pin(admin, pin_keys, pin, pin_ttl_ms, std::cout), admin.json);
  }
  if (get_cmd->parsed()) return mc::cli::report("mc-store get", mc::store::admin_get(admin, key, std::cout));
  if (rm_cmd->parsed()) return mc::cli::report("mc-store rm", mc::store::admin_rm(admin, key, std::cout), admin.json);
  if (ls_cmd->parsed())
    return mc::cli::report("mc-store ls", mc::store::admin_ls(admin, prefix, limit, std::cout), admin.json);
  if (stat_cmd->parsed() && !stat_node.empty()) {
    return mc::cli::report("mc-store stat",
                           mc::daemon::print_stat(stat_node, admin.json, admin.client.rpc_timeout_ms, std::cout),
                           admin.json);
  }
  if (stat_cmd->parsed()) return mc::cli::report("mc-store stat", mc::store::admin_stat(admin, std::cout), admin.json);
  if (quota_cmd->parsed() && quota_action == "set") {
    if (quota_tenant.empty() || quota_limits.empty()) {
      return mc::cli::report("mc-store quota set",
                             mc::Status(mc::Code::kInvalidArgument,
                                        "give TENANT and LIMITS (e.g. mc-store quota set bob pinned:1GiB,puts:64)"),
                             admin.json);
    }
    return mc::cli::report("mc-store quota set",
                           mc::store::admin_quota_set(admin, quota_tenant, quota_limits, std::cout), admin.json);
  }
  if (quota_cmd->parsed()) {
    if (!quota_tenant.empty()) {
      return mc::cli::report("mc-store quota ls",
                             mc::Status(mc::Code::kInvalidArgument, "quota ls takes no TENANT (it lists every one)"),
                             admin.json);
    }
    return mc::cli::report("mc-store quota ls", mc::store::admin_quota_ls(admin, std::cout), admin.json);
  }
  if (watch_cmd->parsed())
    return mc::cli::report("mc-store watch", mc::store::admin_watch(watch, std::cout, std::cerr));
  if (bench_cmd->parsed()) {
    auto counts = mc::units::parse_count_list(bench_clients);
    if (!counts.is_ok()) return mc::cli::report("mc-store bench", counts.status(), bench.json);
    bench.clients = counts.value();
    return mc::cli::report("mc-store bench", mc::store::run_bench(bench, std::cout), bench.json);
  }
  if (keys_cmd->parsed()) return mc::cli::report("mc-store keys", mc::store::run_keys(std::cin, std::cout, keys));
  return mc::cli::kExitUsage;
}
