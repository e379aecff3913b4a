#include "mc/infer/daemons.hpp"

#include "mc/cli/cli.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/endpoint.hpp"
#include "mc/common/units.hpp"
#include "mc/coord/etcd_flags.hpp"
#include "mc/infer/decode_worker.hpp"
#include "mc/infer/prefill_worker.hpp"
#include "mc/net/auth.hpp"
#include "mc/net/flags.hpp"

namespace mc::infer {

void add_backend_flags(CLI::App& app, BackendFlags& f) {
  app.add_option("--backend", f.backend,
                 "Compute backend: ref (the CPU engine: a checkpoint's weights for a Hugging Face --model DIR, "
                 "else seeded ones) or sim (GPU cost model)")
      ->envname("MC_BACKEND")
      ->capture_default_str()
      ->check(CLI::IsMember({"ref", "sim"}));
  cli::add_model_option(app, f.model, /*env=*/true);
  app.add_option("--seed", f.seed, "ref: seed of the weights (prefill and decode must agree); sim: token stream seed")
      ->envname("MC_SEED")
      ->capture_default_str();
  app.add_option("--threads", f.threads, "ref: compute threads (all cores: $(nproc))")
      ->envname("MC_THREADS")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--kv-dtype", f.kv_dtype,
                 "ref: KV element type: fp32, bf16, fp16, or auto (the checkpoint's weight type; fp32 for seeded "
                 "weights); part of the KV blocks' key namespace")
      ->envname("MC_KV_DTYPE")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}));
  cli::add_gpu_option(app, f.gpu);
  cli::add_time_scale_option(app, f.time_scale,
                             "sim: sleep modelled time divided by this (> 0; 10 = ten times faster)");
  app.add_option("--kv-bytes-per-token", f.kv_bytes_per_token,
                 "sim: KV bytes per token (all layers) actually stored and moved; 0 = the model's")
      ->envname("MC_KV_BYTES_PER_TOKEN")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  cli::add_block_size_option(app, f.block_tokens, "--block-size",
                             "Tokens per KV block (prefill, decode and store must agree)");
  app.add_option("--kv-blocks", f.kv_blocks, "KV blocks in this instance's buffer (0: fill --kv-buffer-size)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cli::add_size_option(app, "--kv-buffer-size", f.kv_buffer_size_bytes,
                       "KV buffer size in bytes (64MiB, 2GiB, ...) when --kv-blocks is 0")
      ->envname("MC_KV_BUFFER_SIZE");
}

void add_conductor_flags(CLI::App& app, ConductorHeartbeatOptions& o) {
  app.add_option("--conductor", o.endpoint, "mc-conductor endpoint to register with and heartbeat to (empty: none)")
      ->envname("MC_CONDUCTOR");
  app.add_option("--conductor-wait-ms", o.start_wait_ms,
                 "At start, retry this long (ms) to reach and register with --conductor, then exit 1 naming it")
      ->envname("MC_CONDUCTOR_WAIT_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  app.add_option("--instance-id", o.instance_id, "Unique instance name (default: <role>-<host>-<pid>)");
  app.add_option("--host", o.host,
                 "Host label reported to the conductor and (with --store) to the store master, which place "
                 "KV blocks and schedule by it; only placement uses it, not the choice of transport "
                 "(default: gethostname)");
}

Result<std::unique_ptr<Backend>> backend_from_flags(const BackendFlags& f) {
  BackendOptions o;
  o.kind = f.backend;
  MC_ASSIGN_OR_RETURN(o.model, model::load_model(f.model));
  o.seed = f.seed;
  o.threads = f.threads;
  o.kv_dtype = f.kv_dtype;
  MC_ASSIGN_OR_RETURN(o.gpu, model::gpu_preset(f.gpu));
  o.time_scale = f.time_scale;
  o.kv_bytes_per_token = f.kv_bytes_per_token;
  return make_backend(o);
}

Result<int64_t> kv_blocks_from_flags(const BackendFlags& f, const Backend& backend) {
  if (f.kv_blocks > 0) return f.kv_blocks;
  const int64_t block_bytes = backend.kv_layout(f.block_tokens).block_bytes();
  const int64_t blocks = static_cast<int64_t>(f.kv_buffer_size_bytes / static_cast<uint64_t>(block_bytes));
  if (blocks < 1) {
    return error(Code::kInvalidArgument,
                 "--kv-buffer-size " + units::format_bytes(static_cast<int64_t>(f.kv_buffer_size_bytes)) +
                     " holds no block of " + std::to_string(block_bytes) + " B; raise it or lower --block-size");
  }
  return blocks;
}

Result<std::unique_ptr<KvBlockCache>> open_store_flag(const std::string& store, const std::string& etcd,
                                                      const std::string& cluster_id, const std::string& host) {
  if (store == "none") return std::unique_ptr<KvBlockCache>();
  if (store == "mem") return std::unique_ptr<KvBlockCache>(std::make_unique<MemoryBlockCache>());
  if (store == "etcd" && etcd.empty()) {
    return Status(Code::kInvalidArgument, "--store etcd needs --etcd HOST:PORT[,...] and --cluster-id NAME");
  }
  // The store sees the host label the Conductor sees (--host), so "same host" means one thing to both.
  return connect_store_cache(store == "etcd" ? "" : store, host, store == "etcd" ? etcd : "", cluster_id);
}

namespace {
void add_drain_flag(CLI::App& app, int64_t& drain_timeout_s, const char* what) {
  app.add_option("--drain-timeout-s", drain_timeout_s,
                 std::string("On SIGTERM/SIGINT: how long (s) ") + what +
                     " may still take before they end with an error (a second signal ends them at once)")
      ->envname("MC_DRAIN_TIMEOUT_S")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400}));
}
}  // namespace

void add_decode_flags(CLI::App& app, DecodeDaemonConfig& c) {
  app.add_option("--listen", c.listen, "RPC endpoint to bind (port 0: any free port)")
      ->envname("MC_DECODE_LISTEN")
      ->capture_default_str();
  add_backend_flags(app, c.backend);
  add_conductor_flags(app, c.conductor);
  app.add_option("--max-batch", c.max_batch_size, "Running sequences per decode step at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--reservation-ttl-ms", c.reservation_ttl_ms,
                 "Reservations without a KV commit are aborted after this many milliseconds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--max-reservation-ttl-ms", c.max_reservation_ttl_ms,
                 "The longest ttl_ms a decode.reserve may ask for (ms); longer or negative ones are refused")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--client-timeout-ms", c.client_timeout_ms, "Per-message timeout towards client endpoints (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--kv-listen", c.kv_listen,
                 "Transfer-engine endpoint serving the KV buffer to prefill (tcp://host:port; auto = host of "
                 "--listen, any port; none = kv_write RPC fallback)")
      ->envname("MC_DECODE_KV_LISTEN")
      ->capture_default_str();
  cli::add_xfer_server_flags(app, c.kv_max_connections, c.kv_idle_timeout_ms);
  app.add_option("--store", c.store,
                 "Where to put the new blocks of pipelined prefills (only decode holds all their layers): none, the "
                 "mc-store master endpoint (tcp://host:port), or etcd (--etcd, --cluster-id)")
      ->envname("MC_STORE")
      ->capture_default_str();
  cli::add_etcd_flags(app, c.etcd, c.cluster_id, "--store's endpoint");
  cli::add_size_option(app, "--store-put-queue-bytes", c.store_put_queue_bytes,
                       "Most bytes of block copies waiting for the store; beyond it blocks are not stored", 1 << 20,
                       uint64_t{64} << 30)
      ->envname("MC_STORE_PUT_QUEUE_BYTES");
  cli::add_metrics_flags(app, c.metrics_listen);
  add_drain_flag(app, c.drain_timeout_s, "the running and reserved requests");
}

Result<std::string> resolve_kv_listen(const std::string& kv_listen, const std::string& rpc_listen,
                                      const std::string& flag) {
  if (kv_listen == "none") return std::string();
  if (kv_listen != "auto") {
    Result<Endpoint> ep = parse_endpoint(kv_listen);
    if (!ep.is_ok() || !ep->is_tcp()) {
      return error(Code::kInvalidArgument, flag + " '" + kv_listen + "': expected tcp://host:port, auto or none" +
                                               (ep.is_ok() ? std::string() : " (" + ep.status().message() + ")"));
    }
    return kv_listen;
  }
  Result<Endpoint> rpc_ep = parse_endpoint(rpc_listen);
  if (!rpc_ep.is_ok() || !rpc_ep->is_tcp()) {
    return error(Code::kInvalidArgument, flag + " auto needs a tcp:// --listen (got '" + rpc_listen + "'); give " +
                                             flag + " tcp://host:port or none");
  }
  return Endpoint::tcp(rpc_ep->host == "*" ? "0.0.0.0" : rpc_ep->host, 0).str();
}

Status run_decode_daemon(const DecodeDaemonConfig& c) {
  MC_RETURN_IF_ERROR(validate_heartbeat_options(c.conductor));
  MC_ASSIGN_OR_RETURN(auto backend, backend_from_flags(c.backend));
  DecodeWorkerOptions o;
  o.block_tokens = c.backend.block_tokens;
  MC_ASSIGN_OR_RETURN(o.kv_blocks, kv_blocks_from_flags(c.backend, *backend));
  o.max_batch_size = c.max_batch_size;
  o.reservation_ttl_ms = c.reservation_ttl_ms;
  o.max_reservation_ttl_ms = c.max_reservation_ttl_ms;
  o.weight_seed = c.backend.seed;
  if (c.store == "mem") {
    return Status(Code::kInvalidArgument,
                  "mc-decode --store mem: an in-process store no prefill can read; give the mc-store master "
                  "endpoint, etcd or none");
  }
  MC_ASSIGN_OR_RETURN(
      std::unique_ptr<KvBlockCache> cache,
      open_store_flag(c.store, c.etcd, c.cluster_id, resolve_conductor_options(c.conductor, "decode").host));
  MC_ASSIGN_OR_RETURN(auto worker,
                      DecodeWorker::create(o, std::move(backend), make_rpc_token_sink(c.client_timeout_ms)));
  if (cache) worker->set_block_store(std::move(cache), static_cast<int64_t>(c.store_put_queue_bytes));
  MC_ASSIGN_OR_RETURN(const std::string kv_listen, resolve_kv_listen(c.kv_listen, c.listen));
  if (!kv_listen.empty()) {
    transfer::EngineOptions eo;
    eo.listen = {kv_listen};
    eo.max_connections_served = c.kv_max_connections;
    eo.idle_timeout_served_ms = c.kv_idle_timeout_ms;
    // With the cluster's grant key, only a reservation's grant holder writes into its blocks (docs/SECURITY.md).
    if (const auth::Keyring* ring = auth::keyring(); ring != nullptr) eo.grant_key = ring->grant_key();
    MC_RETURN_IF_ERROR(worker->publish_kv_segment(std::move(eo)).with_context("--kv-listen " + kv_listen));
  }
  daemon::install_stop_signals();
  return serve_decode(*worker, c.listen, c.conductor, c.metrics_listen, c.drain_timeout_s);
}

void add_prefill_flags(CLI::App& app, PrefillDaemonConfig& c) {
  app.add_option("--listen", c.listen, "RPC endpoint to bind (port 0: any free port)")
      ->envname("MC_PREFILL_LISTEN")
      ->capture_default_str();
  add_backend_flags(app, c.backend);
  add_conductor_flags(app, c.conductor);
  app.add_option("--store", c.store,
                 "Prefix cache: none, mem (in this process), the mc-store master endpoint (tcp://host:port), or etcd "
                 "(the leader of a replicated master: --etcd, --cluster-id)")
      ->envname("MC_STORE")
      ->capture_default_str();
  cli::add_etcd_flags(app, c.etcd, c.cluster_id, "--store's endpoint");
  app.add_option("--chunk-tokens", c.chunk_tokens, "Chunked prefill: tokens per chunk (0 = whole prompt at once)")
      ->envname("MC_CHUNK_TOKENS")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  app.add_option("--decode-timeout-ms", c.decode_timeout_ms, "Per-call timeout towards decode instances (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--kv-engine", c.kv_engine,
                 "Stream KV to decode instances through the transfer engine when they publish a segment "
                 "(false: always kv_write RPCs)")
      ->envname("MC_KV_ENGINE")
      ->capture_default_str();
  app.add_flag("--allow-fault-injection", c.allow_fault_injection,
               "Honour the fail_after_layers field of prefill jobs (tests only)");
  app.add_option("--stage-wait-timeout-ms", c.stage_wait_timeout_ms,
                 "Pipelined prefill: how long a stage job waits for its previous stage's next chunk before it fails "
                 "(ms)")
      ->envname("MC_STAGE_WAIT_TIMEOUT_MS")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  cli::add_size_option(app, "--stage-inbox-bytes", c.stage_inbox_bytes,
                       "Pipelined prefill: most hidden-state bytes held for stage jobs that have not asked yet "
                       "(and the size of the stage segment they land in)",
                       1 << 20, uint64_t{64} << 30)
      ->envname("MC_STAGE_INBOX_BYTES");
  app.add_option("--stage-listen", c.stage_listen,
                 "Pipelined prefill: transfer-engine endpoint where previous stages WRITE their chunks' hidden states "
                 "(tcp://host:port; auto = host of --listen, any port; none = they come as RPCs)")
      ->envname("MC_STAGE_LISTEN")
      ->capture_default_str();
  cli::add_metrics_flags(app, c.metrics_listen);
  add_drain_flag(app, c.drain_timeout_s, "the queued and running prefill jobs");
}

Status run_prefill_daemon(const PrefillDaemonConfig& c) {
  MC_RETURN_IF_ERROR(validate_heartbeat_options(c.conductor));
  MC_ASSIGN_OR_RETURN(auto backend, backend_from_flags(c.backend));
  MC_ASSIGN_OR_RETURN(
      std::unique_ptr<KvBlockCache> cache,
      open_store_flag(c.store, c.etcd, c.cluster_id, resolve_conductor_options(c.conductor, "prefill").host));
  PrefillWorkerOptions o;
  o.block_tokens = c.backend.block_tokens;
  MC_ASSIGN_OR_RETURN(o.kv_blocks, kv_blocks_from_flags(c.backend, *backend));
  o.chunk_tokens = c.chunk_tokens;
  o.weight_seed = c.backend.seed;
  o.allow_fault_injection = c.allow_fault_injection;
  o.kv_engine = c.kv_engine;
  o.kv_transfer_timeout_ms = c.decode_timeout_ms;
  o.stage_wait_timeout_ms = c.stage_wait_timeout_ms;
  o.stage_inbox_bytes = static_cast<int64_t>(c.stage_inbox_bytes);
  MC_ASSIGN_OR_RETURN(auto worker, PrefillWorker::create(o, std::move(backend), std::move(cache),
                                                         make_rpc_decode_link(c.decode_timeout_ms)));
  MC_ASSIGN_OR_RETURN(const std::string stage_listen, resolve_kv_listen(c.stage_listen, c.listen, "--stage-listen"));
  if (!stage_listen.empty()) {
    transfer::EngineOptions eo;
    eo.listen = {stage_listen};
    // With the cluster's grant key, only the holder of a slot's grant writes into it (docs/SECURITY.md).
    if (const auth::Keyring* ring = auth::keyring(); ring != nullptr) eo.grant_key = ring->grant_key();
    MC_RETURN_IF_ERROR(worker->publish_stage_segment(std::move(eo)).with_context("--stage-listen " + stage_listen));
  }
  daemon::install_stop_signals();
  PrefillServeOptions so;
  so.endpoint = c.listen;
  so.gpu = c.backend.gpu;
  so.conductor = c.conductor;
  so.metrics_listen = c.metrics_listen;
  so.drain_timeout_s = c.drain_timeout_s;
  return serve_prefill(*worker, so);
}

}  // namespace mc::infer
