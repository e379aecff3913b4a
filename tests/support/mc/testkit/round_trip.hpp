// Protocol tests: encode a message with the wire codec and decode it again (codec.hpp), failing the
// current test when decoding fails.
#pragma once

#include <gtest/gtest.h>

#include "mc/proto/codec.hpp"

namespace mc::testkit {

template <typename T>
T round_trip(const T& in) {
  auto out = codec::unpack<T>(codec::pack(in), "test");
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? out.value() : T{};
}

}  // namespace mc::testkit
