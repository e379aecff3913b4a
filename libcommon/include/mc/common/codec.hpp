// msgpack encoding of protocol structs, with errors as values (never exceptions to the caller).
// pack(): struct -> bytes. unpack<T>(): bytes -> T, or kMalformedMessage naming `what` and the
// decoder's text for truncated, ill-typed or trailing-garbage input. Thread-safety: pure functions.
#pragma once

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

// Decodes exactly one msgpack object from `bytes` into T.
template <typename T>
Result<T> unpack(std::string_view bytes, std::string_view what) {
  try {
    std::size_t offset = 0;
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), offset);
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
