// The mc-prefill and mc-decode daemons as library calls, and the flags they share (one registry: --help, the
// man pages and the MC_* environment names come from here).
//
// Backend flags (both tools): --backend (MC_BACKEND), --model (MC_MODEL), --seed (MC_SEED), --threads
// (MC_THREADS), --gpu (MC_GPU), --time-scale (MC_TIME_SCALE), --kv-bytes-per-token (MC_KV_BYTES_PER_TOKEN),
// --block-size (MC_BLOCK_SIZE), --kv-blocks, --kv-buffer-size (MC_KV_BUFFER_SIZE).
// run_*_daemon: builds the backend and the worker, serves until SIGTERM/SIGINT, returns the first fatal error
// (bad configuration: kInvalidArgument/kNotFound -> exit 2; bind failure -> exit 1).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "mc/common/status.hpp"
#include "mc/infer/backend.hpp"
#include "mc/infer/block_cache.hpp"
#include "mc/infer/conductor_link.hpp"
#include "mc/transfer/engine.hpp"

namespace mc::infer {

struct BackendFlags {
  std::string backend = "ref";
  std::string model = "tiny";
  uint64_t seed = 0;
  int threads = 1;
  std::string kv_dtype = "auto";
  std::string gpu = "a800x8";
  double time_scale = 1.0;
  int64_t kv_bytes_per_token = 0;
  int64_t block_tokens = 16;
  int64_t kv_blocks = 0;                         // 0: as many as fit in kv_buffer_size_bytes
  uint64_t kv_buffer_size_bytes = 256ull << 20;  // size of the KV buffer when kv_blocks is 0
};
// Blocks of the KV buffer: kv_blocks, or kv_buffer_size_bytes / block bytes (kInvalidArgument naming the flag).
Result<int64_t> kv_blocks_from_flags(const BackendFlags& flags, const Backend& backend);
void add_backend_flags(CLI::App& app, BackendFlags& flags);
// --conductor (MC_CONDUCTOR), --instance-id, --host.
void add_conductor_flags(CLI::App& app, ConductorHeartbeatOptions& options);
// Resolves --model and --gpu and builds the backend.
Result<std::unique_ptr<Backend>> backend_from_flags(const BackendFlags& flags);

struct DecodeDaemonConfig {
  BackendFlags backend;
  std::string listen = "tcp://127.0.0.1:0";
  int64_t max_batch_size = 64;
  int64_t reservation_ttl_ms = 30000;
  int64_t max_reservation_ttl_ms = 600000;  // decode_reserve ttl_ms above this is refused
  int client_timeout_ms = 2000;
  // Transfer-engine endpoint serving the KV buffer to prefill instances: "auto" = the host of --listen with any
  // free port; "none" = publish no segment (prefill falls back to kv_write RPCs).
  std::string kv_listen = "auto";
  // Bounds of that transfer port (transfer::EngineOptions, --xfer-max-connections, --xfer-idle-timeout-ms).
  size_t kv_max_connections = transfer::EngineOptions{}.max_connections_served;
  int64_t kv_idle_timeout_ms = transfer::EngineOptions{}.idle_timeout_served_ms;
  ConductorHeartbeatOptions conductor;
  // Where the new blocks of pipelined prefills are put (DESIGN.md §18 "Live groups"): none | <mc-store master
  // endpoint> | etcd; with at most store_put_queue_bytes of copies waiting (BlockPutQueue).
  std::string store = "none";
  std::string etcd;
  std::string cluster_id;
  uint64_t store_put_queue_bytes = uint64_t{256} << 20;
  std::string metrics_listen;    // --metrics-listen (cli::add_metrics_flags); empty: no /metrics
  int64_t drain_timeout_s = 30;  // --drain-timeout-s: how long SIGTERM's drain lets held work finish
};
// The store of a --store flag: none (null), mem (in process), a master endpoint, or etcd (the leader named by
// etcd/cluster_id); `host` is the host label the store client presents. Errors of connect_store_cache.
Result<std::unique_ptr<KvBlockCache>> open_store_flag(const std::string& store, const std::string& etcd,
                                                      const std::string& cluster_id, const std::string& host);
// The engine endpoint for DecodeDaemonConfig::kv_listen or PrefillDaemonConfig::stage_listen ("" for "none");
// kInvalidArgument naming `flag` for a bad value or --listen.
Result<std::string> resolve_kv_listen(const std::string& kv_listen, const std::string& rpc_listen,
                                      const std::string& flag = "--kv-listen");
void add_decode_flags(CLI::App& app, DecodeDaemonConfig& config);
Status run_decode_daemon(const DecodeDaemonConfig& config);

struct PrefillDaemonConfig {
  BackendFlags backend;
  std::string listen = "tcp://127.0.0.1:0";
  std::string store = "none";  // none | mem | <mc-store master endpoint> | etcd (the leader named by etcd below)
  std::string etcd;            // --etcd: a replicated store master's etcd endpoints (with --store etcd)
  std::string cluster_id;      // --cluster-id: its cluster
  int64_t chunk_tokens = 0;
  int decode_timeout_ms = 5000;
  bool kv_engine = true;  // write KV through the transfer engine when the decode instance publishes a segment
  bool allow_fault_injection = false;
  ConductorHeartbeatOptions conductor;
  std::string metrics_listen;                       // --metrics-listen (cli::add_metrics_flags); empty: no /metrics
  int64_t drain_timeout_s = 30;                     // --drain-timeout-s: how long SIGTERM's drain lets held work finish
  int64_t stage_wait_timeout_ms = 30000;            // --stage-wait-timeout-ms (pipelined prefill, DESIGN.md §18)
  uint64_t stage_inbox_bytes = uint64_t{64} << 20;  // --stage-inbox-bytes (also the stage segment's size)
  std::string stage_listen = "auto";  // --stage-listen: the stage segment's endpoint (auto, none, tcp://host:port)
};
void add_prefill_flags(CLI::App& app, PrefillDaemonConfig& config);
Status run_prefill_daemon(const PrefillDaemonConfig& config);

}  // namespace mc::infer
