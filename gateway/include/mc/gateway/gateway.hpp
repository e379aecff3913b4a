// mc-gateway: the OpenAI-compatible HTTP front door of a cluster (DESIGN.md §15).
//
// One HTTP/1.1 server (cpp-httplib: keep-alive, server-sent events for streams) in front of the Conductor:
//   POST /v1/completions, POST /v1/chat/completions   (openai.hpp: what is accepted; streamed or whole)
//   GET /v1/models    the served model and its LoRA adapters (an adapter's name becomes the request's key scope)
//   GET /health       200 when the Conductor answers and has a live prefill and decode instance, else 503
//   GET /metrics      the gateway's metrics (Prometheus text, metrics.hpp)
// A request is tokenized (tokenizer.hpp), submitted with conductor.submit (its client endpoint is the
// gateway's own token-event server), and its token_event / request_done / request_error messages become the
// response. Status codes: 400 bad field, 404 unknown model or path, 413 prompt beyond the context or body beyond
// --max-body-bytes, 429 with Retry-After when the Conductor rejects early for the SLO (the message gives the
// predicted TTFT and the SLO), 503 when the Conductor is unreachable or no instance can serve (or the gateway is at
// --max-requests or draining), 504 when the answer is not complete within --request-timeout-ms; all in OpenAI's
// error shape. A client that disconnects from a stream (seen at the next write: a token or a keep-alive comment,
// every --heartbeat-ms), a stop string or an end-of-sequence token ends the request in the cluster with
// conductor.cancel (counted: mc_gateway_cancels_total, mc_gateway_client_disconnects_total).
//
// Bounds: --max-connections HTTP worker threads, and as many accepted connections waiting for one; beyond that the
// listener stops accepting and the kernel's backlog holds connections (mc/net/http_pool.hpp); of those workers at
// most --max-connections-per-address for one client address (429 beyond); --max-requests generation requests in
// flight (503 beyond), --max-requests-per-tenant of them for one user tenant (429 beyond), --max-body-bytes per
// request (413), --read-timeout-ms for a request's bytes, --keep-alive-timeout-s for an idle connection.
//
// Drain (SIGTERM/SIGINT): the listening socket closes at once (new connections are refused), requests in flight
// run to their end for up to --drain-timeout-s, then those left are cancelled in the cluster and ended with an
// error event; then the process exits 0.
//
// Threading: the HTTP worker threads submit and cancel through a pool of RpcClients (one call each at a time);
// one thread serves the token-event endpoint and hands events to the request's stream (a mutex and condition
// variable per request). Nothing here aborts on a network error.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/gateway/openai.hpp"

namespace mc::gateway {

struct GatewayOptions {
  std::string listen = "127.0.0.1:8000";           // HTTP HOST:PORT (port 0: a free one)
  std::string conductor = "tcp://127.0.0.1:7460";  // the Conductor's endpoint
  std::string client_bind = "tcp://127.0.0.1:0";   // where decode instances send token events
  std::string model = "llama3-70b";                // model preset or JSON file the cluster serves: tokenizer, context
  std::string served_model_name;                   // the name clients use ("": the preset's name)
  std::vector<std::string> adapters;               // LoRA adapters served, "NAME" or "NAME@VERSION"
  ParseLimits limits;
  double slo_ttft_ms = 0;  // default SLOs of requests that set none (0: the Conductor's)
  double slo_tbt_ms = 0;
  size_t max_connections = 256;  // HTTP worker threads
  int64_t max_requests = 256;    // generation requests in flight
  // Connections served at once from one client address (a further one: 429 and closed unread). -1: a quarter of
  // max_connections with --api-keys (clients connect directly), else none (behind a proxy every user has the
  // proxy's address); 0: none.
  int64_t max_connections_per_address = -1;
  // Generation requests in flight per user tenant (--api-keys or --tenant-header; beyond: 429 too_many_requests).
  // -1: half of max_requests where tenants are named, so one tenant never takes every slot; 0: none.
  int64_t max_requests_per_tenant = -1;
  uint64_t max_body_bytes = 8 << 20;  // request body
  int64_t read_timeout_ms = 10'000;
  int64_t keep_alive_timeout_s = 5;
  int64_t heartbeat_ms = 250;            // SSE keep-alive comment on a silent stream (disconnect detection)
  int64_t submit_timeout_ms = 10'000;    // conductor.submit answered (accepted or rejected)
  int64_t request_timeout_ms = 600'000;  // whole answer; then 504 (whole) or an error event (stream)
  int64_t drain_timeout_s = 30;
  std::string metrics_listen;  // a second /metrics on its own ADDR:PORT (--metrics-listen, as every daemon); "": none
  // Tenants (docs/SECURITY.md "Cache isolation"). --api-keys FILE: lines "KEY TENANT" ('#' comments); every /v1/*,
  // /tokenize and /detokenize request then needs "Authorization: Bearer KEY" (401 otherwise), and its KV blocks are
  // keyed in its tenant's own namespace, so neither its prefix hits nor `cached_tokens` involve another tenant's
  // prompts (keys of one TENANT share). --tenant-header NAME instead: a proxy in front authenticates the users and
  // names each request's tenant in that header (401 without it). Neither: every client shares one namespace.
  std::string api_keys_file;
  std::string tenant_header;
};

// --api-keys: KEY -> TENANT. KEY: 16 to 256 printable ASCII characters without space; TENANT: [A-Za-z0-9_.-]{1,64}.
// kInvalidArgument naming the file and line; kNotFound when it cannot be read. A file readable by other OS users is
// refused (mode 0600 expected), as an ssh key is.
Result<std::unordered_map<std::string, std::string>> load_api_keys(const std::string& path);

// Checks the options (kInvalidArgument naming the flag); the model's tokenizer is loaded (once) by run_gateway.
Status validate(const GatewayOptions& options);

// Runs until SIGTERM/SIGINT (daemon::stop_requested()), then drains. Prints
// "ready mc-gateway http://HOST:PORT metrics=http://HOST:PORT conductor=ENDPOINT model=NAME" on stdout once serving
// (its /metrics is on the same port).
// kFailedPrecondition when the listen address is not loopback and --allow-unauthenticated is not given (the HTTP
// port has no authentication); kUnavailable naming the address when it cannot be bound.
Status run_gateway(const GatewayOptions& options);

}  // namespace mc::gateway
