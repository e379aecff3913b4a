// Prefix-chained block keys (DESIGN.md §4, after the open KV-events contract, Mooncake RFC #1527).
//
// Tokens are cut into blocks of block_size tokens; only complete blocks are keyed. With seed s:
//   local[i] = XXH3_64(tokens of block i as u32 little-endian, s)
//   seq[0]   = local[0]
//   seq[i]   = XXH3_64(seq[i-1] as u64 LE || local[i] as u64 LE, s)
// seq[i] therefore identifies block i *and* everything before it. The hash is XXH3-64 with an
// explicit seed: identical in every process, on every host, on every run (never std::hash).
//
// The namespace: KV bytes differ whenever the model, its revision, the KV dtype, the block size, the
// layer/parallel layout, the LoRA adapter or the tenant salt differ, and such blocks must never hit
// each other. KeyNamespace::chain_seed() folds all of these into the seed used above, so every key
// of a different namespace differs; with an empty namespace (all fields default) the chain seed is
// the plain seed, which keeps the digests identical to the RFC's for tools that only know the seed.
//
// Per request (DESIGN.md §4.1): the model, revision, dtype, layout, seed and block size are the serving
// instance's (its base namespace); the LoRA adapter (name + version) and the tenant salt are the request's.
// A request's namespace is base.with_request(scope): every key of two requests with equal tokens differs
// when their adapter, version or salt differ, and is equal when they agree.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc {

// The part of a block-key namespace a request chooses. All empty: the base model, no salt.
struct RequestKeyScope {
  std::string lora_name;     // LoRA adapter; empty = the base model
  std::string lora_version;  // the adapter's version; needs lora_name
  std::string salt;          // tenant isolation; independent of the adapter

  bool empty() const { return lora_name.empty() && lora_version.empty() && salt.empty(); }
  // "name@version" (or "name" without a version), "base" for no adapter, then " salt=<salt>" when salted.
  std::string describe() const;
  bool operator==(const RequestKeyScope&) const = default;
};
// Longest lora_name, lora_version or salt accepted from a request (bytes).
inline constexpr size_t kMaxKeyScopeFieldBytes = 256;
// kInvalidArgument naming `where` when a field is longer than kMaxKeyScopeFieldBytes or holds a control
// character, or when lora_version is set without lora_name.
Status validate_key_scope(const RequestKeyScope& scope, const std::string& where);

struct KeyNamespace {
  std::string model_id;        // e.g. "llama3-70b"
  std::string model_revision;  // e.g. a commit or "v1"
  std::string kv_dtype;        // e.g. "bf16", "fp8"
  std::string layout;          // layer / tensor / pipeline parallel layout, e.g. "tp8"
  std::string lora_name;
  std::string lora_version;
  std::string salt;           // tenant isolation
  uint64_t seed = 0;          // the explicit XXH3 seed
  uint32_t block_size = 512;  // tokens per block; part of the namespace

  // True when no field but seed and block_size is set (block size already changes every digest,
  // since it changes what a block holds).
  bool is_plain() const;
  // Canonical bytes of the namespace (length-prefixed fields), the input of chain_seed().
  std::string canonical() const;
  // seed when is_plain(); else XXH3_64(canonical(), seed).
  uint64_t chain_seed() const;
  // 16 hex digits of XXH3_64(canonical(), seed): names the namespace in store keys.
  std::string digest_hex() const;
  // This namespace with the request's adapter and salt in place of its own (the base's are replaced).
  KeyNamespace with_request(const RequestKeyScope& scope) const;
  // The adapter and salt of this namespace.
  RequestKeyScope request_scope() const { return {lora_name, lora_version, salt}; }
};

// local[i] of one block of tokens.
uint64_t local_block_hash(std::span<const uint32_t> block_tokens, uint64_t seed);
// seq[i] from seq[i-1] and local[i].
uint64_t chain_hash(uint64_t parent_seq, uint64_t local, uint64_t seed);
// seq hashes of every complete block of `tokens` under `ns` (block_size and chain_seed()).
std::vector<uint64_t> seq_hashes(std::span<const uint32_t> tokens, const KeyNamespace& ns);
// "0x" + 16 lower-case hex digits.
std::string hash_hex(uint64_t h);
// A block's key in the store pool: "kv/<namespace digest>/<seq hash as 16 lower-case hex digits>", the one
// formatter (str) and the one parser (parse) of that grammar, for the workers that write blocks, the master that
// announces them in KV events and the Conductor that resyncs its index from a listing.
struct BlockStoreKey {
  std::string namespace_digest;  // KeyNamespace::digest_hex(): non-empty, no '/'
  uint64_t seq_hash = 0;

  std::string str() const;
  // nullopt for any other key: another prefix, an empty digest or one holding '/', a hash that is not exactly 16
  // hex digits.
  static std::optional<BlockStoreKey> parse(std::string_view key);
  bool operator==(const BlockStoreKey&) const = default;
};

// Store key of one block of `ns`: BlockStoreKey{ns.digest_hex(), seq_hash}.str().
std::string block_store_key(const KeyNamespace& ns, uint64_t seq_hash);

}  // namespace mc
