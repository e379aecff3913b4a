// Fuzz harness: the store fast path's record decoder (Seal::open, mc/net/fast_rpc.hpp), which a server runs on
// every byte an authenticated peer sends after the handshake. Input: one control byte (the size of the first piece,
// so records split anywhere are tried), then the bytes as they arrive. Keys: fixed client and server key pairs
// (fuzz_seeds seals its seeds with them). Invariants: no crash or throw; no plaintext comes out after an error; every
// refusal is data_loss.
#include <sodium.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mc/net/fast_rpc.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_seal: invariant broken: %s\n", what);
  std::abort();
}

struct Keys {
  std::string cpk, csk, spk, ssk;
  Keys() {
    if (sodium_init() < 0) broken("sodium_init");
    unsigned char pk[32], sk[32], seed[32];
    for (int who = 0; who < 2; ++who) {
      for (int i = 0; i < 32; ++i) seed[i] = static_cast<unsigned char>(who * 64 + i);
      crypto_kx_seed_keypair(pk, sk, seed);
      (who == 0 ? cpk : spk).assign(reinterpret_cast<char*>(pk), 32);
      (who == 0 ? csk : ssk).assign(reinterpret_cast<char*>(sk), 32);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Keys keys;
  static const std::string cnonce(32, 'c'), snonce(32, 's');
  if (size == 0) return 0;
  mc::rpc::fast::Seal server;
  if (!server.derive(false, keys.spk, keys.ssk, keys.cpk, cnonce, snonce).is_ok()) broken("derive");
  const size_t first = std::min<size_t>(data[0], size - 1);
  const auto* bytes = reinterpret_cast<const char*>(data) + 1;
  std::string plain;
  mc::Status a = server.open(bytes, first, plain, "fuzz");
  const size_t after_first = plain.size();
  mc::Status b = a.is_ok() ? server.open(bytes + first, size - 1 - first, plain, "fuzz") : a;
  if (!a.is_ok() && plain.size() != after_first) broken("plaintext after an error");
  if (!b.is_ok() && b.code() != mc::Code::kDataLoss) broken("a refusal that is not data_loss");
  return 0;
}
