// msgpack encoding of protocol structs, with errors as values (never exceptions to the caller).
// pack(): struct -> bytes. unpack<T>(): bytes -> T, or kMalformedMessage naming `what` and the
// decoder's text for truncated, ill-typed or trailing-garbage input, or nesting deeper than 64 levels; what it
// allocates is bounded by a small multiple of the input's size, whatever sizes the input declares. Thread-safety: pure
// functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <msgpack.hpp>

#include "mc/common/status.hpp"

namespace mc::codec {

template <typename T>
std::string pack(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  return std::string(buf.data(), buf.size());
}

namespace detail {

// msgpack-c allocates a container's element storage (24 bytes per element) as soon as it reads the header,
// before the elements arrive, so a 5-byte array header declaring 2^32 - 1 elements made a 100 GB allocation
// (found by tests/fuzz/fuzz_protocol). This walks the headers first and refuses a container whose elements,
// together with those every enclosing container still owes, cannot fit in the bytes that follow (each
// element takes at least one byte), which bounds what decoding allocates to a small multiple of the input.
// It also refuses nesting deeper than kMaxDepth: msgpack-c builds one object per level, so 60 MiB of one-element
// arrays (0x91 0x91 ...), which fit that bound, held 2.5 GB and a daemon's serving loop for 20 s; no message of
// the protocol nests more than a few levels.
// Returns the refusal's text, or empty when the sizes fit: what is truncated or ill-typed otherwise is left
// to msgpack to report.
inline constexpr size_t kMaxDepth = 64;
inline std::string oversized_container(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  auto be = [&](size_t at, size_t width) {
    uint64_t v = 0;
    for (size_t k = 0; k < width; ++k) v = (v << 8) | p[at + k];
    return v;
  };
  uint64_t owed = 1;  // objects still to come, the top-level one first
  // Elements still to come of each open array or map, innermost last (its size is the nesting depth).
  uint64_t open[kMaxDepth] = {};
  size_t depth = 0;
  size_t i = 0;
  while (i < n && owed > 0) {
    const unsigned char b = p[i];
    --owed;
    if (depth > 0) --open[depth - 1];  // this object is one element of the innermost open container
    size_t head = 1;                   // the header's bytes
    size_t len = 0;                    // bytes of a length field after the type byte (str, bin, ext, array, map)
    uint64_t skip = 0;                 // payload bytes after the header
    uint64_t elems = 0;
    bool is_map = false;
    if (b >= 0x80 && b <= 0x8f) {
      elems = 2 * uint64_t{b & 0x0fu};
    } else if (b >= 0x90 && b <= 0x9f) {
      elems = b & 0x0fu;
    } else if (b >= 0xa0 && b <= 0xbf) {
      skip = b & 0x1fu;
    } else if (b >= 0xc4 && b <= 0xdf) {
      // Bytes after the type byte, by type 0xc4..0xdf: the length field's width (str, bin, ext: its
      // payload follows; array, map: its element count) or the fixed payload (numbers, fixext).
      static constexpr uint8_t kLenBytes[28] = {1, 2, 4, 1, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0,
                                                0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 2, 4, 2, 4};
      static constexpr uint8_t kFixedBytes[28] = {0, 0, 0, 1, 1, 1, 4,  8, 1, 2, 4, 8, 1, 2,
                                                  4, 8, 2, 3, 5, 9, 17, 0, 0, 0, 0, 0, 0, 0};
      len = kLenBytes[b - 0xc4];
      skip = kFixedBytes[b - 0xc4];  // ext: its type byte
      if (b >= 0xdc) {
        elems = 1;  // the count follows
        is_map = b >= 0xde;
      }
    }  // else positive or negative fixint, nil, (never used), false, true: one byte
    if (len > 0) {
      if (n - i < head + len) return {};  // truncated
      const uint64_t v = be(i + head, len);
      if (elems > 0) {
        elems = is_map ? 2 * v : v;
      } else {
        skip += v;
      }
      head += len;
    }
    if (n - i < head) return {};
    i += head;
    owed += elems;
    if (elems > 0) {
      if (depth == kMaxDepth) {
        return "at byte " + std::to_string(i) + " arrays and maps nest deeper than " + std::to_string(kMaxDepth) +
               " levels";
      }
      open[depth++] = elems;
    }
    while (depth > 0 && open[depth - 1] == 0) --depth;  // containers whose last element this was
    if (owed > n - i) {
      return "truncated message (" + std::to_string(n) + " bytes): at byte " + std::to_string(i) +
             " its arrays and maps still declare " + std::to_string(owed) + " elements, more than the " +
             std::to_string(n - i) + " bytes left can hold";
    }
    if (skip > n - i) return {};  // truncated
    i += static_cast<size_t>(skip);
  }
  return {};
}

}  // namespace detail

// Decodes exactly one msgpack object from `bytes` into T.
template <typename T>
Result<T> unpack(std::string_view bytes, std::string_view what) {
  if (std::string why = detail::oversized_container(bytes); !why.empty()) {
    return Status(Code::kMalformedMessage, std::string(what) + ": " + why);
  }
  try {
    std::size_t offset = 0;
    // The depth is refused above already; the limit here keeps msgpack's own stack bounded all the same.
    const msgpack::unpack_limit limit(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, detail::kMaxDepth);
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, limit);
    if (offset != bytes.size()) {
      return Status(Code::kMalformedMessage, std::string(what) + ": " + std::to_string(bytes.size() - offset) +
                                                 " trailing bytes after the message");
    }
    T out{};
    oh.get().convert(out);
    return out;
  } catch (const msgpack::insufficient_bytes&) {
    return Status(Code::kMalformedMessage,
                  std::string(what) + ": truncated message (" + std::to_string(bytes.size()) + " bytes)");
  } catch (const std::exception& e) {
    return Status(Code::kMalformedMessage, std::string(what) + ": cannot decode: " + e.what());
  }
}

}  // namespace mc::codec
