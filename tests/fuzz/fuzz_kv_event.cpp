// Fuzz harness: the KV-event decoder a subscriber runs on each published event (rpc::decode_kv_event: the
// big-endian id frame and the msgpack KvEvent). Input: one control byte (high bit clear: an 8-byte id
// frame follows; set: an id frame of (byte % 12) bytes, so wrong lengths are tried too), the id frame, then
// the payload. Invariants: no crash or throw; a decoded event carries the id frame's id, and publishing it
// again (id frame + packed event, as EventPublisher::publish writes them) decodes to the same event.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "mc/net/rpc.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/kv_events.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_kv_event: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t id_bytes = (data[0] & 0x80) ? data[0] % 12 : 8;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (rest.size() < id_bytes) return 0;
  const std::string_view id_frame = rest.substr(0, id_bytes);
  mc::Result<mc::proto::KvEvent> ev = mc::rpc::decode_kv_event(id_frame, rest.substr(id_bytes), "fuzz");
  if (!ev.is_ok()) {
    if (ev.status().code() != mc::Code::kMalformedMessage) broken("decode error is not kMalformedMessage");
    return 0;
  }
  uint64_t id = 0;
  for (const char c : id_frame) id = (id << 8) | static_cast<unsigned char>(c);
  if (ev->event_id != id) broken("event_id is not the id frame's");
  const std::string packed = mc::codec::pack(ev.value());
  mc::Result<mc::proto::KvEvent> again = mc::rpc::decode_kv_event(id_frame, packed, "fuzz");
  if (!again.is_ok()) broken("a re-published event does not decode");
  if (mc::codec::pack(again.value()) != packed) broken("decode -> publish -> decode is not stable");
  return 0;
}
