// Value types of the transfer engine's public API: operations, requests, per-request status, slices
// and notifications. All lengths and offsets are 64-bit (DESIGN.md §13.10: nothing is truncated to 32 bits).
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::transfer {

enum class Op : uint8_t { kRead = 1, kWrite = 2 };  // READ: remote -> local; WRITE: local -> remote
const char* op_name(Op op);                         // "read" | "write"

// Handle of an opened remote segment (TransferEngine::open_segment). 0 is never valid.
using SegmentHandle = uint64_t;
// Id of a submitted batch (TransferEngine::submit). 0 is never valid.
using BatchId = uint64_t;

// One request of a batch: move `length` bytes between local memory at `local_addr` (inside memory
// registered with this engine) and bytes [remote_offset, remote_offset+length) of `segment`.
// When notify_tag is non-empty, the target process receives a Notification carrying it after every
// byte of this request has landed (WRITE: the decode instance learns a layer is complete), and the
// request completes only once the target has acknowledged that notification.
struct TransferRequest {
  Op op = Op::kRead;
  void* local_addr = nullptr;
  SegmentHandle segment = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  std::string notify_tag;
  // The data-plane grant (mc/net/grant.hpp token) the target's server requires when it enforces grants
  // (EngineOptions::grant_key): issued by the owner of the remote memory's allocation. Carried on every wire op
  // of the request and in its notification; "" when the target does not enforce grants.
  std::string grant{};
};

enum class TransferState : uint8_t {
  kPending = 0,    // slices still moving
  kCompleted = 1,  // every byte landed (and the notification, if any, was acknowledged)
  kFailed = 2,     // status() says why (no path left, out of range, peer gone, ...)
  kTimeout = 3,    // the request's deadline (EngineOptions::request_timeout_ms) passed
};
const char* state_name(TransferState state);  // "pending" | "completed" | "failed" | "timeout"
inline bool is_final(TransferState s) { return s != TransferState::kPending; }

// One slice as carried out (for `mc-xfer read -v` and tests): which path moved it, after how many attempts.
struct SliceTrace {
  uint64_t request_offset = 0;  // offset of the slice inside its request
  uint64_t length = 0;
  std::string path;         // "tcp 127.0.0.1->127.0.0.2:4000", "shm", ...
  uint32_t attempts = 0;    // 1 = first try succeeded
  int64_t duration_ns = 0;  // post of the last attempt -> its completion
  bool ok = false;
};

// Status of one request. A request is final only when none of its slices is in flight any more, so
// its local buffer may be reused or freed as soon as state is final, whatever the state.
struct RequestStatus {
  TransferState state = TransferState::kPending;
  uint64_t transferred_bytes = 0;  // bytes whose slices completed; equals length when kCompleted
  Status status;                   // ok unless kFailed/kTimeout; names the segment, offset and cause
  uint32_t slice_count = 0;
  uint32_t retried_slices = 0;     // slices that needed more than one attempt
  int64_t latency_ns = 0;          // submit -> final (0 while pending)
  std::vector<SliceTrace> slices;  // filled only when EngineOptions::trace_slices
};

// Status of a batch: final when every request is final; kCompleted only if all completed, otherwise
// the first failed/timed-out request's state and status.
struct BatchStatus {
  TransferState state = TransferState::kPending;
  uint64_t transferred_bytes = 0;
  Status status;
  std::vector<RequestStatus> requests;  // in submission order
};

// Delivered to the target process of a request that carried a notify_tag.
struct Notification {
  std::string tag;   // TransferRequest::notify_tag
  std::string from;  // initiator's segment name ("host:port") or "" when it serves none
  Op op = Op::kWrite;
  uint64_t segment_offset = 0;  // the request's remote range in the target's segment
  uint64_t length = 0;
  // With grants enforced (EngineOptions::grant_key): the id of the grant it carried, already checked to cover the
  // range (a decode instance: the reservation the sender may write). 0 otherwise.
  uint64_t grant_id = 0;
};

}  // namespace mc::transfer
