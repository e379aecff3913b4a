// Fuzz harness: the fast-path frame decoder (rpc::fast::FrameReader, what FastServer and FastClient run on
// every received byte) and, for each frame, the body decoder its header's type names (codec::unpack of the
// request type with that kType, as RpcServer::dispatch decodes it). Input: one control byte (the size of
// the chunks the stream is fed in, 1..64 bytes; its high bits pick the body limit), then the byte stream.
// Invariants: no crash or throw; a frame waiting for bytes declares more than is buffered; a decoded frame
// re-encoded with append_frame decodes to the same id, type and body.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "mc/net/fast_rpc.hpp"
#include "mc/proto/codec.hpp"
#include "message_types.hpp"

namespace {

namespace fast = mc::rpc::fast;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_fast_frame: invariant broken: %s\n", what);
  std::abort();
}

template <typename T>
constexpr bool kIsRequest = requires {
  T::kType;
};

// Decodes the body as the request type named by the frame's header, when there is one.
void decode_body(const fast::Frame& f) {
  mc::fuzz::for_each_message_type([&]<typename T>(size_t) {
    if constexpr (kIsRequest<T>) {
      if (f.header.type == T::kType) (void)mc::codec::unpack<T>(f.body, f.header.type);
    }
  });
}

void check_reencoded(const fast::Frame& f) {
  std::string wire;
  fast::append_frame(wire, f.header.type, f.header.id, f.body);
  fast::FrameReader r;
  r.feed(wire.data(), wire.size());
  mc::Result<std::optional<fast::Frame>> again = r.next("re-encoded", fast::kMaxHeaderBytes + f.body.size());
  if (!again.is_ok() || !again->has_value()) broken("a re-encoded frame does not decode");
  const fast::Frame& g = **again;
  if (g.header.id != f.header.id || g.header.type != f.header.type || g.body != f.body) {
    broken("re-encoded frame differs");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  static constexpr uint64_t kBodyLimits[] = {16ull << 20, 0, 64, 4096};
  const uint64_t max_body = kBodyLimits[(data[0] >> 6) % 4];
  const char* p = reinterpret_cast<const char*>(data) + 1;
  size_t left = size - 1;
  fast::FrameReader reader;
  while (left > 0) {
    const size_t n = std::min(chunk, left);
    reader.feed(p, n);
    p += n;
    left -= n;
    while (true) {
      mc::Result<std::optional<fast::Frame>> f = reader.next("fuzz", max_body);
      if (!f.is_ok()) return 0;  // the stream is unusable after an error, as for a server connection
      if (!f->has_value()) {
        const uint64_t want = reader.partial_frame_bytes();
        if (want != 0 && want <= reader.buffered()) broken("an incomplete frame declares no more than is buffered");
        break;
      }
      decode_body(**f);
      check_reencoded(**f);
    }
  }
  return 0;
}
