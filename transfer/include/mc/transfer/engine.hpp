// mc::transfer::TransferEngine — moves bytes between registered memory of processes and hosts
// (Mooncake §5, "Transfer Engine"): the data plane of the KV store and of prefill->decode streaming.
//
// Model
//  - A process creates one engine. It registers memory regions (address, length, location); the set of
//    its regions is its *segment*, addressed by peers as (segment, 64-bit offset) and named "host:port"
//    after the engine's first listen endpoint. Memory meant to be reachable over shm must come from
//    allocate_shared_buffer() (shared_buffer.hpp); any memory is reachable over tcp.
//  - A peer opens a segment by name (descriptor fetched from the peer itself, or from a SegmentDirectory
//    such as the store master), then submits batches of READ/WRITE requests and polls or waits.
//  - Each request is cut into slices (slicing.hpp) that are sprayed over all usable paths of the best
//    transport reaching the segment (shm when both ends share a host, else rdma, else tcp), weighted by
//    topology preference and bytes in flight (path_policy.hpp). A failed slice is retried on another path
//    (at most max_attempts attempts per slice); the failed path is quarantined with backoff and probed
//    before reuse. A request completes only when every byte landed.
//  - A request with a notify_tag is announced to the target after its last slice was acknowledged, over one
//    persistent tcp connection per target endpoint (pooled: at most 64, idle ones closed after
//    idle_connection_ms, one found broken replaced once); queued notifications to one peer go out back to back
//    in completion order. When a pooled connection breaks after a run was sent but before its replies came,
//    the unacknowledged notifications are sent again on a fresh connection (at-least-once in that case).
//
// Minimal use (initiator):
//   auto eng = TransferEngine::create({}).value();
//   auto buf = allocate_shared_buffer(1 << 20).value();
//   eng->register_memory(buf.data(), buf.size()).value();
//   SegmentHandle seg = eng->open_segment("127.0.0.1:4000").value();
//   RequestStatus st = eng->transfer_sync({Op::kRead, buf.data(), seg, 0, 1 << 20}, 5000);
// Target (decode instance): create with listen = {"tcp://0.0.0.0:0"}, register an allocate_shared_buffer(),
// give segment_name() and segment_offset(ptr) to the initiator, and take_notifications()/wait_notification().
//
// Thread-safety: every method may be called from any thread concurrently. submit() may copy small shm
// requests inline (then the request is already final when submit returns). The destructor stops the
// engine's threads; requests still pending fail with kCancelled; callers must not destroy the engine
// while other threads call it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mc/common/clock.hpp"
#include "mc/common/status.hpp"
#include "mc/net/grant.hpp"
#include "mc/proto/transfer.hpp"

namespace mc::metrics {
class Registry;
}
#include "mc/transfer/path_policy.hpp"
#include "mc/transfer/slicing.hpp"
#include "mc/transfer/topology.hpp"
#include "mc/transfer/types.hpp"

namespace mc::transfer {

class Transport;

// Where descriptors of remote segments come from.
class SegmentDirectory {
 public:
  virtual ~SegmentDirectory() = default;
  // The descriptor of segment `name`; kNotFound/kUnavailable naming it when it cannot be had.
  virtual Result<proto::SegmentDescriptor> lookup(const std::string& name, int64_t timeout_ms) = 0;
  // Called by the engine when its own descriptor changes (registration); peer-to-peer ignores it.
  virtual Status publish(const proto::SegmentDescriptor& descriptor) = 0;
};

// Peer-to-peer directory: name "host:port" is the peer's endpoint; the descriptor is fetched from it.
std::shared_ptr<SegmentDirectory> make_peer_directory();

struct EngineOptions {
  // Endpoints this engine serves its segment on, one path each ("tcp://127.0.0.1:0" picks a port; the
  // first endpoint names the segment). Empty: initiator only (no segment served, no notifications).
  std::vector<std::string> listen;
  // Source addresses for outgoing tcp paths; each (local address, remote endpoint) pair is one path.
  // Empty: one local side chosen by the kernel.
  std::vector<std::string> local_addresses;
  // Transports allowed, any of "shm", "rdma", "tcp"; the best one reaching a segment is used.
  std::vector<std::string> transports = {"shm", "rdma", "tcp"};
  SlicePolicy slicing{64 << 10, 4 << 10, 0, 1};
  // Topology matrix; empty topology_file = discover from sysfs.
  std::string topology_file;
  // Location of memory registered without one.
  std::string default_location = "cpu:0";

  uint32_t connections_per_path = 4;  // tcp connections opened per path on first use (pool cap)
  // tcp I/O threads per opened segment, each with its own epoll set and share of the connections of every
  // path (0: one per connection, i.e. connections_per_path; at most connections_per_path).
  uint32_t tcp_io_threads = 0;
  uint32_t max_attempts = 4;  // attempts per slice (1 + retries) before the request fails
  int64_t connect_timeout_ms = 1000;
  int64_t slice_timeout_ms = 2000;     // a connection making no progress this long is declared broken
  int64_t request_timeout_ms = 30000;  // deadline of a request from submit (TransferState::kTimeout)
  int64_t idle_connection_ms = 60000;  // pooled connections idle this long are closed
  QuarantinePolicy quarantine;
  int socket_buffer_bytes = 4 << 20;               // SO_SNDBUF/SO_RCVBUF of tcp data connections
  uint32_t shm_threads = 2;                        // memcpy threads for large shm requests (the submitter helps)
  uint64_t shm_parallel_min_bytes = 2 << 20;       // shm requests at least this long are split over threads
  uint64_t max_region_bytes = 0;                   // split registrations into regions of at most this (0: no limit)
  uint64_t max_slice_bytes_served = 256ull << 20;  // server rejects larger single ops
  // The served tcp port's bounds (DESIGN.md §2 "Bounds"): at most this many open connections (lowered to
  // fit RLIMIT_NOFILE, mc/common/limits.hpp); a connection that sends nothing for idle_timeout_served_ms
  // is closed (clients close theirs after idle_connection_ms, below it by default), except one that set
  // up an rdma queue pair, which lives as long as it.
  size_t max_connections_served = 1024;
  int64_t idle_timeout_served_ms = 120000;
  // Data-plane grants (mc/net/grant.hpp, docs/SECURITY.md "Data-plane grants"). With a 32-byte grant_key, the
  // served segment answers a tcp READ, WRITE or completion notification only when it carries a grant for this
  // segment, the op and a range covering it, unexpired, whose MAC verifies under the key; refusals are counted
  // (EngineStats::served_refused) and logged naming the peer and the reason. With a key, rdma is not offered
  // (no rkey is published: per-grant memory windows are not implemented), so a peer reaches the segment over tcp,
  // or over shm when it runs on this host as the same OS user (the shm file's 0600 mode is that boundary).
  // grant_scope, when set, is asked after the MAC and range checks (a decode instance: are these blocks still
  // the live reservation grant.id's?): its error refuses the op. Called from server threads; must not block.
  std::string grant_key;
  std::function<Status(const auth::Grant& grant, Op op, uint64_t offset, uint64_t length)> grant_scope;
  bool trace_slices = false;                    // fill RequestStatus::slices
  std::shared_ptr<SegmentDirectory> directory;  // null: peer-to-peer
  const Clock* clock = nullptr;                 // null: RealClock (quarantine timing)
};

// A registered range as published: where it sits in this engine's segment.
struct RegisteredRegion {
  void* addr = nullptr;
  uint64_t length = 0;
  uint64_t segment_offset = 0;  // offset of addr in this engine's segment
  std::string location;
  bool shm_shareable = false;  // backed by a SharedBuffer
  uint32_t region_count = 0;   // descriptor regions it was split into (max_region_bytes)
};

struct PathStats {
  std::string transport;
  PathState state;
};

// Counters of one engine since create(), monotonic (tests, `mc-xfer bench -v`, metrics). Thread-safe copy.
struct EngineStats {
  // Initiator side of completion notifications (TransferRequest::notify_tag).
  uint64_t notifications_sent = 0;         // acknowledged by their target
  uint64_t notifications_failed = 0;       // no endpoint of the target took them
  uint64_t notify_connections_opened = 0;  // persistent notification connections opened (one per target
                                           // endpoint while it works; reopened when broken or idle-evicted)
  uint64_t notify_connections_broken = 0;  // pooled notification connections found closed/reset and dropped
  // Target side.
  uint64_t notifications_received = 0;
  uint64_t connections_accepted = 0;  // tcp connections accepted by this engine's server (any purpose)
  // Reads and writes of this engine's segment served over tcp, with their bytes, and the ops refused or
  // broken off (bad range, oversized, peer gone). shm and rdma peers copy by themselves: not seen here.
  uint64_t served_reads = 0, served_writes = 0, served_read_bytes = 0, served_written_bytes = 0, served_errors = 0;
  // Of served_errors: reads, writes and notifications refused for want of a valid grant (EngineOptions::grant_key).
  uint64_t served_refused = 0;
  // tcp connections closed at accept (the server's cap, or its cap per peer address), and connections closed at a
  // deadline (idle, or a request or its reply not complete within the idle timeout from its start).
  uint64_t connections_refused = 0, connections_cut = 0;
  // Data-path counters of the transports, summed over open segments (tcp: "tcp_wire_ops", "tcp_send_calls",
  // "tcp_recv_calls", "tcp_wakeups", "tcp_bytes", "tcp_connections_opened"; shm and rdma report none yet).
  std::map<std::string, uint64_t> transport_counters;
};

// Sets the target-side counters of `stats` as gauges of `registry` (mc_xfer_served_reads_total,
// mc_xfer_served_writes_total, mc_xfer_served_read_bytes_total, mc_xfer_served_written_bytes_total,
// mc_xfer_served_errors_total, mc_xfer_served_refused_total, mc_xfer_connections_accepted_total,
// mc_xfer_notifications_received_total, mc_xfer_conn_refused_total, mc_xfer_conn_cut_total): what a daemon serving a
// segment answers in `stat`.
void export_served_metrics(const EngineStats& stats, metrics::Registry& registry);

class TransferEngine {
 public:
  // Starts the listeners and threads. Errors: kInvalidArgument (bad option, named), kIo (bind failed,
  // with strerror and the endpoint).
  static Result<std::unique_ptr<TransferEngine>> create(EngineOptions options);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // "host:port" of the first listen endpoint ("" when not serving) and all bound endpoints ("tcp://a:p").
  const std::string& segment_name() const;
  const std::vector<std::string>& endpoints() const;
  const Topology& topology() const;
  const EngineOptions& options() const;

  // Registers [addr, addr+length) whole, or fails: kInvalidArgument (null, zero length, address-space
  // overflow), kAlreadyExists (overlaps a registered range). Never truncates (DESIGN.md §13.10).
  Result<RegisteredRegion> register_memory(void* addr, uint64_t length, const std::string& location = "");
  // Removes the registration starting at addr; kNotFound when none.
  Status unregister_memory(void* addr);
  // Segment offset of a local address inside registered memory; kSegmentNotRegistered otherwise.
  Result<uint64_t> segment_offset(const void* addr) const;
  // This engine's descriptor (what peers fetch).
  proto::SegmentDescriptor local_descriptor() const;

  // Opens a remote segment by name (directory lookup + transport choice). Opening the same name again
  // returns the same handle. Errors: kNotFound/kUnavailable naming the segment; kProtocolMismatch for a
  // descriptor format version we do not know.
  Result<SegmentHandle> open_segment(const std::string& name);
  // Same, with a descriptor obtained elsewhere.
  Result<SegmentHandle> open_segment(const proto::SegmentDescriptor& descriptor);
  Status close_segment(SegmentHandle segment);
  Result<proto::SegmentDescriptor> segment_descriptor(SegmentHandle segment) const;
  // Name of the transport chosen for the segment ("shm", "tcp", ...).
  Result<std::string> segment_transport(SegmentHandle segment) const;
  Result<std::vector<PathStats>> path_stats(SegmentHandle segment) const;

  // Submits a batch. Fails as a whole (nothing started) for an empty batch or an unknown segment handle.
  // Per-request errors — local memory not registered, remote range outside the segment, length overflow —
  // make that request kFailed at once with a message naming the address/offset; the others proceed.
  Result<BatchId> submit(std::span<const TransferRequest> requests);
  Result<BatchStatus> poll(BatchId batch) const;
  // Waits until the batch is final or timeout_ms passed (then the returned state is kPending).
  Result<BatchStatus> wait(BatchId batch, int64_t timeout_ms);
  Result<RequestStatus> poll_request(BatchId batch, size_t index) const;
  Result<RequestStatus> wait_request(BatchId batch, size_t index, int64_t timeout_ms);
  // Forgets a final batch; kFailedPrecondition while it is pending.
  Status free_batch(BatchId batch);
  // submit + wait + free for one request; waits at most timeout_ms, then up to slice_timeout_ms more for
  // in-flight slices to drain, so the buffer is free when it returns.
  RequestStatus transfer_sync(const TransferRequest& request, int64_t timeout_ms);

  // Target side: notifications of requests carrying a notify_tag. With a handler set, it is called
  // (from a server thread, must not block long) instead of queueing.
  void set_notification_handler(std::function<void(const Notification&)> handler);
  std::vector<Notification> take_notifications(size_t max_count = SIZE_MAX);
  Result<Notification> wait_notification(int64_t timeout_ms);

  EngineStats stats() const;

  // Adds a transport (tests: a mock; or a custom backend). Used for segments opened afterwards.
  Status add_transport(std::unique_ptr<Transport> transport);

  class Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc::transfer
