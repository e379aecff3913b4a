// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): advances
// `state` by the golden-ratio increment and returns a bijectively mixed 64-bit word, so distinct seeds give
// distinct streams. Deterministic on every host; not for cryptography. Used by the replay's token synthesis
// and the sim backend's KV contents.
// Thread-safety: pure; the caller owns `state`.
#pragma once

#include <cstdint>

namespace mc {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace mc
