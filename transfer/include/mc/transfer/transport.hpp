// The backend interface of the transfer engine (kept apart from the public engine.hpp, as verbs.h is from
// driver.h): what a transport (tcp/, shm/, rdma/, or a test's mock) implements.
//
// The engine opens a TransportSegment per (transport, remote segment); the segment lists its paths and
// moves slices. post() never blocks on the network: it queues the slice and returns; the transport later
// calls sink->slice_done(cookie, status) exactly once per posted slice, from any thread, after the last
// byte of the slice has landed (READ: in local memory; WRITE: in the remote segment, acknowledged) or
// with the error. A transport never calls slice_done from inside post() with the engine's lock held:
// it may call it synchronously from post(), since the engine posts without holding its lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/transfer/types.hpp"

namespace mc::transfer {

struct EngineOptions;

// One slice as handed to a transport. The slice never straddles a remote region or a local registration.
struct SliceOp {
  Op op = Op::kRead;
  char* local = nullptr;       // local bytes (registered memory)
  uint64_t remote_offset = 0;  // segment offset of the first byte
  uint64_t length = 0;         // > 0
  int path = 0;                // index into TransportSegment::paths()
  uint64_t cookie = 0;         // passed back to slice_done
  // The request's grant token (TransferRequest::grant), owned by the engine's request record and alive until
  // slice_done; nullptr when the request carries none. tcp sends it with every wire op; shm and rdma ignore it.
  const std::string* grant = nullptr;
};

class SliceSink {
 public:
  virtual ~SliceSink() = default;
  virtual void slice_done(uint64_t cookie, const Status& status) = 0;
};

struct PathSpec {
  std::string label;          // "tcp 127.0.0.1->127.0.0.2:4000"
  std::string local_device;   // topology device of the local side ("lo", "eth0", "mlx5_0"), "" = any
  std::string remote_device;  // the peer's device for this path, "" = unknown
  double weight = 1.0;        // topology preference, product of both sides' weights
};

class TransportSegment {
 public:
  virtual ~TransportSegment() = default;
  virtual const std::vector<PathSpec>& paths() const = 0;
  virtual void post(const SliceOp& op) = 0;
  // False when the engine should not cut requests into slices (shm: one memcpy, parallelised inside).
  virtual bool wants_slicing() const { return true; }
  // Bytes the engine keeps in flight per path at most (0 = no limit); more slices wait for completions.
  virtual uint64_t path_window_bytes() const { return 0; }
  // Blocking check that `path` works again (connect + ping), bounded by timeout_ms.
  virtual Status probe(int path, int64_t timeout_ms) = 0;
  // Drop pooled connections idle for longer than idle_ms (called periodically by the engine).
  virtual void evict_idle(int64_t idle_ms) { (void)idle_ms; }
  // Adds this segment's data-path counters (monotonic) into `out` (EngineStats::transport_counters).
  virtual void add_counters(std::map<std::string, uint64_t>& out) const { (void)out; }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;  // "shm" | "rdma" | "tcp" | test names
  // Lower is tried first when several transports can reach a segment (shm 0, rdma 10, tcp 20).
  virtual int rank() const = 0;
  // Opens the segment for this transport, or an error saying why it cannot reach it (kNoPath: different
  // host for shm, no device for rdma). `sink` outlives the returned object.
  virtual Result<std::unique_ptr<TransportSegment>> open(const proto::SegmentDescriptor& descriptor,
                                                         SliceSink* sink) = 0;
};

}  // namespace mc::transfer
