// The real transports of the live replay (protocol.hpp, Conductor and worker sections):
//   ConductorLink  one RpcClient (DEALER) connection to mc-conductor sending "conductor.submit"; the
//                  reply is the admission (accepted with the chosen instances, or rejected at once).
//   EventSource    an RpcServer (ROUTER) the replay binds (client_bind, default tcp://127.0.0.1:0) and
//                  names as client_endpoint in every submission; mc-decode connects to it and calls
//                  "client.token_event" per token, then "client.request_done" (with the ledger) or
//                  "client.request_error".
//
// Errors: connect() fails with kUnavailable / kTimeout / kProtocolMismatch naming the endpoint and
// saying to start mc-conductor (or fix --conductor) when the hello handshake does not complete
// within connect_timeout_ms. A submit that times out is that request's failure, not the run's.
// Thread-safety: one link per thread (ZeroMQ sockets are not thread-safe).
#pragma once

#include <memory>
#include <string>

#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"
#include "mc/replay/replay.hpp"

namespace mc::replay {

struct ConductorLinkOptions {
  std::string endpoint;  // tcp://host:port of mc-conductor
  int connect_timeout_ms = 2000;
  int submit_timeout_ms = 10000;
  int64_t block_size_tokens = 0;  // sent with each submission: the Conductor refuses a mismatch; 0: not checked
};

Result<std::unique_ptr<ConductorLink>> connect_conductor(const ConductorLinkOptions& options);
LinkFactory conductor_link_factory(ConductorLinkOptions options);

// Binds `bind_endpoint` and serves the worker -> client messages on its own thread once started.
// Fails (at start()) with kUnavailable naming the endpoint when it cannot bind.
std::unique_ptr<EventSource> make_client_event_source(std::string bind_endpoint);

// Conversions between the wire and the report (exposed for tests).
proto::ConductorSubmitRequest to_submit_request(const Submission& submission, int64_t block_size_tokens);
Admission to_admission(const proto::ConductorSubmitReply& reply);
// The workers' ledger in the report's terms: avoided prefill = hit tokens; transfer bytes = prefix
// fetch + KV sent to decode; transfer time = fetch + KV tail; -1 (never measured) becomes absent;
// the SSD tier is absent (the workers do not split it out).
Ledger to_ledger(const proto::RequestLedger& ledger);
DoneReport to_done_report(const proto::RequestDone& done);

}  // namespace mc::replay
