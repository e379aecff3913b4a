// Data-plane grants (docs/SECURITY.md "Data-plane grants"): the capability a transfer READ or WRITE of another
// process's memory must carry when that process serves its segment with a grant key.
//
// A grant names one range of one transfer-engine segment, the operations it allows, its expiry and its grantee,
// and carries a MAC over all of them: keyed BLAKE2b-256 (libsodium crypto_generichash), the keyed-hash MAC that
// needs no HMAC nesting (BLAKE2 is a PRF under a secret key; 0.4 us here against HMAC-SHA-512's 1.5 us), keyed with
// the cluster's grant key (DIR/grant.key,
// auth.hpp) over all of them. The party that owns the memory's allocation issues it — the store master for a pool
// object's replica (put: write, get: read), a decode instance for a reservation's KV blocks (write) — and the
// transfer server of the segment checks it before any byte moves (transfer/engine.hpp EngineOptions::grant_key).
// Only daemons hold the grant key; a tenant's client never does (Keyring::load leaves it empty for a client).
//
// Token: URL-safe base64 (no padding) of
//   "MCG1" | ops u8 | offset u64 | length u64 | expiry_unix_ms i64 | id u64 | segment (u8 length, bytes) |
//   grantee (u8 length, bytes) | keyed BLAKE2b-256 (32 bytes) of everything before it
// integers little-endian; at most kMaxGrantTokenBytes characters.
//
// Expiry is wall-clock (Unix ms) because issuer and server are different hosts: their clocks must agree within
// the slack the issuer adds (kGrantClockSlackMs; hosts run NTP).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mc/common/status.hpp"

namespace mc::auth {

inline constexpr uint8_t kGrantRead = 1;   // the grant allows transfer READs (remote -> initiator)
inline constexpr uint8_t kGrantWrite = 2;  // ... WRITEs and their completion notifications
inline constexpr size_t kMaxGrantTokenBytes = 1024;
inline constexpr int64_t kGrantClockSlackMs = 5000;  // added by issuers to a lease's deadline

struct Grant {
  std::string segment{};         // transfer-engine segment name ("host:port"), <= 255 bytes
  uint64_t offset = 0;           // first byte of the range in the segment
  uint64_t length = 0;           // bytes of the range (> 0); offset + length does not overflow
  uint8_t ops = 0;               // kGrantRead | kGrantWrite
  int64_t expiry_unix_ms = 0;    // refused after this wall-clock time
  std::string grantee{};         // roster name of the identity it was issued to (<= 255 bytes; "" = unnamed)
  uint64_t id = 0;               // the issuer's handle (decode: the reservation id; master: 0)
  std::string describe() const;  // "write [4096, +65536) of 127.0.0.1:4000 for alice until 1700000000000"
};

// The token of `grant` under `key` (32 bytes). kInvalidArgument for a bad key, an empty range, an offset+length
// overflow, no op, or an over-long segment/grantee.
Result<std::string> issue_grant(std::string_view key, const Grant& grant);
// The grant a token carries when its MAC verifies under `key`; kPermissionDenied ("grant forged or damaged",
// "not a grant token") otherwise. Checks format and MAC only; check_grant checks its use.
Result<Grant> verify_grant(std::string_view key, std::string_view token);
// Whether `grant` covers op (kGrantRead or kGrantWrite) of [offset, offset+length) in `segment` at now_unix_ms:
// kPermissionDenied naming what does not match (segment, op, range, expiry) otherwise.
Status check_grant(const Grant& grant, std::string_view segment, uint8_t op, uint64_t offset, uint64_t length,
                   int64_t now_unix_ms);
// Wall-clock Unix time in ms (system_clock).
int64_t unix_now_ms();

}  // namespace mc::auth
