// Fuzz harness: every protocol message decoder (codec::unpack<T> for each msgpack struct of protocol.hpp,
// as RpcServer's handlers and the clients decode bodies) and the text decoder of KV layer tags. The first
// input byte picks the message (byte % (kMessageTypes + 1); the last value is KvLayerTag::decode), the rest
// is the encoded message. Invariants: a decoder never throws or crashes; what decodes re-encodes to bytes
// that decode again and re-encode to the same bytes; a decoded layer tag survives encode -> decode.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "mc/proto/codec.hpp"
#include "mc/proto/protocol.hpp"
#include "message_types.hpp"

namespace {

[[noreturn]] void broken(const char* what, std::string_view type) {
  std::fprintf(stderr, "fuzz_protocol: invariant broken: %s (%.*s)\n", what, static_cast<int>(type.size()),
               type.data());
  std::abort();
}

template <typename T>
void round_trip(std::string_view body, std::string_view name) {
  mc::Result<T> first = mc::codec::unpack<T>(body, name);
  if (!first.is_ok()) {
    if (first.status().code() != mc::Code::kMalformedMessage) broken("decode error is not kMalformedMessage", name);
    return;
  }
  const std::string packed = mc::codec::pack(first.value());
  mc::Result<T> second = mc::codec::unpack<T>(packed, name);
  if (!second.is_ok()) broken("re-encoded message does not decode", name);
  if (mc::codec::pack(second.value()) != packed) broken("decode -> encode is not stable", name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t pick = data[0] % (mc::fuzz::kMessageTypes + 1);
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (pick == mc::fuzz::kMessageTypes) {
    std::optional<mc::proto::KvLayerTag> tag = mc::proto::KvLayerTag::decode(body);
    if (tag && mc::proto::KvLayerTag::decode(tag->encode()) != tag) broken("layer tag encode -> decode", "KvLayerTag");
    return 0;
  }
  const std::string name = "message " + std::to_string(pick);
  mc::fuzz::with_message_type(pick, [&]<typename T>() { round_trip<T>(body, name); });
  return 0;
}
