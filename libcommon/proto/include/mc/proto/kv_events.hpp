// KV events: what a store master or an instance publishes when KV blocks appear or go (DESIGN.md §4).
// Wire rules: envelope.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mc/proto/message.hpp"

namespace mc::proto {

// ---------------------------------------------------------------------------------------------
// KV events (DESIGN.md §4, after the open KV-events contract, Mooncake RFC #1527)
// Published on a ZeroMQ PUB socket as three frames:
//   [topic (str, e.g. "kv"), event_id as big-endian u64, msgpack KvEvent]
// event_id increases by exactly 1 per event on one stream; a subscriber that sees a gap resyncs.
// ---------------------------------------------------------------------------------------------

inline constexpr const char* kKvEventStored = "stored";
inline constexpr const char* kKvEventRemoved = "removed";
inline constexpr const char* kKvEventCleared = "cleared";  // every block of backend_id is gone

struct KvEvent {
  std::string type;       // stored | removed | cleared
  uint64_t event_id = 0;  // same as frame 1
  int64_t ts_unix_ms = 0;
  std::vector<uint64_t> seq_hashes;  // prefix-chained block hashes (block_key.hpp)
  std::string backend_id;            // the holder: storage segment or instance name
  std::string medium;                // gpu | cpu | disk
  // Random per publisher start (EventPublisher::incarnation), never 0; 0 from a publisher that does not say.
  // Another value on a stream means its publisher restarted: its event ids begin again at 1.
  uint64_t incarnation = 0;
  MC_MESSAGE(type, event_id, ts_unix_ms, seq_hashes, backend_id, medium, incarnation);
};

}  // namespace mc::proto
