// The real transport of the live replay: a ConductorLink over mc-conductor's RPC endpoint
// (protocol.hpp, Conductor section). Each link is one RpcClient (DEALER) connection: it sends
// "conductor.submit" and receives the request's "conductor.event" pushes (first_token, tokens, done
// with the ledger, failed) on the same connection, so carries_events() is true.
//
// Errors: connect() fails with kUnavailable / kTimeout / kProtocolMismatch naming the endpoint and
// saying to start mc-conductor (or fix --conductor) when the hello handshake does not complete
// within connect_timeout_ms. A submit that times out is that request's failure, not the run's.
// Thread-safety: one link per thread (ZeroMQ sockets are not thread-safe).
#pragma once

#include <memory>
#include <string>

#include "mc/common/protocol.hpp"
#include "mc/replay/replay.hpp"

namespace mc::replay {

struct ConductorLinkOptions {
  std::string endpoint;              // tcp://host:port of mc-conductor
  int connect_timeout_ms = 2000;
  int submit_timeout_ms = 10000;
  int64_t block_size_tokens = 0;     // sent with each submission: the Conductor refuses a mismatch; 0: not checked
};

Result<std::unique_ptr<ConductorLink>> connect_conductor(const ConductorLinkOptions& options);
LinkFactory conductor_link_factory(ConductorLinkOptions options);

// Conversions between the wire and the report (exposed for tests).
proto::ConductorSubmitRequest to_submit_request(const Submission& submission, int64_t block_size_tokens);
Admission to_admission(const proto::ConductorSubmitReply& reply);
// -1 (never measured) becomes absent.
Ledger to_ledger(const proto::RequestLedger& ledger);
// Forwards one pushed event to the sink; kMalformedMessage for an unknown kind.
Status deliver_event(const proto::ConductorEvent& event, EventSink& sink);

}  // namespace mc::replay
