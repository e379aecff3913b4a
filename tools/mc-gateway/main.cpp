// mc-gateway: the OpenAI-compatible HTTP front door of a cluster (gateway.hpp, DESIGN.md §15).
#include "mc/cli/cli.hpp"
#include "mc/common/daemon.hpp"
#include "mc/gateway/gateway.hpp"
#include "mc/net/flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "mc-gateway: OpenAI-compatible HTTP front door (completions, chat completions, SSE streaming) in "
      "front of the Conductor"};
  mc::cli::add_common_flags(app, "mc-gateway");
  mc::gateway::GatewayOptions o;
  app.add_option("--listen", o.listen,
                 "HTTP address HOST:PORT (port 0: a free one; not loopback needs "
                 "--allow-unauthenticated: the HTTP port has no authentication)")
      ->envname("MC_GATEWAY_LISTEN")
      ->capture_default_str();
  app.add_option("--conductor", o.conductor, "The Conductor's endpoint")
      ->envname("MC_CONDUCTOR")
      ->capture_default_str();
  app.add_option("--client-bind", o.client_bind,
                 "ZeroMQ endpoint where decode instances send token events (port 0: a free one)")
      ->envname("MC_CLIENT_BIND")
      ->capture_default_str();
  mc::cli::add_model_option(app, o.model, /*env=*/true);
  app.add_option("--served-model-name", o.served_model_name,
                 "The model name clients send and GET /v1/models lists (default: the --model preset's name)")
      ->envname("MC_SERVED_MODEL_NAME");
  app.add_option("--adapter", o.adapters,
                 "A LoRA adapter served, NAME or NAME@VERSION (repeatable, or comma-separated): a request naming it "
                 "as its model runs with it and is keyed in its namespace")
      ->envname("MC_ADAPTERS")
      ->delimiter(',');
  mc::cli::add_slo_default_flags(app, o.slo_ttft_ms, o.slo_tbt_ms, /*zero_defers=*/true);
  app.get_option("--slo-ttft-ms")
      ->description(
          "Default TTFT SLO (ms) of requests that set no mc.slo_ttft_ms (0: the "
          "Conductor's)");
  app.get_option("--slo-tbt-ms")
      ->description(
          "Default TBT SLO (ms) of requests that set no mc.slo_tbt_ms (0: the "
          "Conductor's)");
  app.add_option("--default-max-tokens", o.limits.default_max_tokens_chat,
                 "max_tokens of a chat completion that sets none (completions: 16, as OpenAI's)")
      ->capture_default_str()
      ->check(mc::cli::kPositiveFinite);
  app.add_option("--max-prompt-tokens", o.limits.max_prompt_tokens,
                 "Longest prompt accepted, tokens (0: the model's context); longer is 413")
      ->envname("MC_MAX_PROMPT_TOKENS")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  app.add_option(
         "--max-connections", o.max_connections,
         "HTTP worker threads: connections served at once; as many more wait, then the listener stops accepting")
      ->envname("MC_GATEWAY_MAX_CONNECTIONS")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  app.add_option("--max-requests", o.max_requests, "Generation requests in flight at most; beyond: 503")
      ->envname("MC_GATEWAY_MAX_REQUESTS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-connections-per-address", o.max_connections_per_address,
                 "Connections served at once from one client address; a further one is answered 429 and closed "
                 "(-1: a quarter of --max-connections with --api-keys, else none, as behind a proxy; 0: none)")
      ->envname("MC_GATEWAY_MAX_CONNECTIONS_PER_ADDRESS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, int64_t{65536}));
  app.add_option("--max-requests-per-tenant", o.max_requests_per_tenant,
                 "Generation requests in flight per user tenant (--api-keys, --tenant-header); beyond: 429 "
                 "(-1: half of --max-requests where tenants are named; 0: none)")
      ->envname("MC_GATEWAY_MAX_REQUESTS_PER_TENANT")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 20));
  mc::cli::add_size_option(app, "--max-body-bytes", o.max_body_bytes,
                           "Largest request body (bytes, or 8MiB); larger is 413", 1024, uint64_t{1} << 30);
  app.add_option("--read-timeout-ms", o.read_timeout_ms, "Time for a request's bytes to arrive (ms)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{600'000}));
  app.add_option("--keep-alive-timeout-s", o.keep_alive_timeout_s, "An idle keep-alive connection is closed after (s)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  app.add_option("--heartbeat-ms", o.heartbeat_ms,
                 "A silent stream gets an SSE keep-alive comment this often (ms): a client that went away is found "
                 "at that write and its request cancelled")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{60'000}));
  app.add_option("--submit-timeout-ms", o.submit_timeout_ms, "Deadline of conductor.submit (ms)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{600'000}));
  app.add_option("--request-timeout-ms", o.request_timeout_ms,
                 "A whole answer's deadline (ms): then 504 (or an error event in a stream) and the request is "
                 "cancelled")
      ->envname("MC_REQUEST_TIMEOUT_MS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86'400'000}));
  app.add_option("--drain-timeout-s", o.drain_timeout_s,
                 "On SIGTERM: requests in flight get this long (s) to finish, then are cancelled")
      ->envname("MC_DRAIN_TIMEOUT_S")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600}));
  app.add_option("--api-keys", o.api_keys_file,
                 "File of 'KEY TENANT' lines (mode 600): requests need 'Authorization: Bearer KEY', and each tenant's "
                 "KV blocks are keyed apart (its prefixes and cached_tokens are its own)")
      ->envname("MC_API_KEYS");
  app.add_option("--tenant-header", o.tenant_header,
                 "HTTP header in which a proxy in front names each request's tenant (instead of --api-keys)")
      ->envname("MC_TENANT_HEADER");
  mc::cli::add_metrics_flags(app, o.metrics_listen);
  mc::cli::add_auth_flags(app, "gateway");
  if (int rc = mc::cli::parse(app, argc, argv); rc >= 0) return rc;
  mc::daemon::install_stop_signals();
  return mc::cli::report("mc-gateway", mc::gateway::run_gateway(o));
}
