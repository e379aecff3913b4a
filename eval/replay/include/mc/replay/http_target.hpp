// The replay through the HTTP front door (mc-trace-replay --target http://HOST:PORT; DESIGN.md §15): each request is
// one streamed POST /v1/completions to mc-gateway, its prompt the synthesized token ids (synth.hpp, so prefixes
// match as in the ZeroMQ replay), max_tokens the row's output length with ignore_eos, the row's SLOs in the body's
// "mc" object, stream_options.include_usage. TTFT and TBT are measured at this client as `vllm bench serve` does:
// each SSE chunk with text is one token event at its arrival time; the usage chunk gives the server's token count
// and cached_tokens (the ledger's avoided prefill; the local/remote/SSD split is not on the HTTP API).
// An HTTP 200 is an acceptance, a 429 (early rejection) or any other status a rejection whose reason is the error
// document's code and message; a connection that fails before the status line fails the submission.
//
// Threading: one thread per request in flight (a blocking HTTP client each), reaped as they end; the sink is called
// from those threads (EventSink is thread-safe). stop() waits for them (each bounded by read_timeout_ms).
#pragma once

#include <memory>
#include <string>

#include "mc/replay/replay.hpp"

namespace mc::replay {

struct HttpTargetOptions {
  std::string url;                // http://HOST:PORT of mc-gateway
  std::string model;              // the model to name; "": the first of GET /v1/models
  std::string api_key;            // sent as "Authorization: Bearer KEY" (mc-gateway --api-keys); "": none
  int connect_timeout_ms = 2000;  // the TCP connection and GET /v1/models
  int submit_timeout_ms = 10000;  // until the response's status line
  int read_timeout_ms = 600'000;  // silence on a stream before it counts as failed
};

// The HTTP target: its links (one per sender thread, all sharing the target) and the event source that delivers the
// streams' events. make() checks the URL (kInvalidArgument) and asks GET /v1/models (kUnavailable naming the URL and
// the remedy when the gateway does not answer).
struct HttpTarget {
  LinkFactory links;
  std::unique_ptr<EventSource> events;
};
Result<HttpTarget> make_http_target(const HttpTargetOptions& options);

}  // namespace mc::replay
