#include "mc/common/block_key.hpp"

#include <xxhash.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <utility>

namespace mc {
namespace {
void put_u64_le(unsigned char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
void append_field(std::string& out, const std::string& field) {
  unsigned char len[8];
  put_u64_le(len, field.size());
  out.append(reinterpret_cast<const char*>(len), 8);
  out.append(field);
}
}  // namespace

bool KeyNamespace::is_plain() const {
  return model_id.empty() && model_revision.empty() && kv_dtype.empty() && layout.empty() && lora_name.empty() &&
         lora_version.empty() && salt.empty();
}

std::string KeyNamespace::canonical() const {
  std::string out = "mc-ns-v1";
  append_field(out, model_id);
  append_field(out, model_revision);
  append_field(out, kv_dtype);
  append_field(out, layout);
  append_field(out, lora_name);
  append_field(out, lora_version);
  append_field(out, salt);
  append_field(out, std::to_string(block_size));
  return out;
}

uint64_t KeyNamespace::chain_seed() const {
  if (is_plain()) return seed;
  std::string c = canonical();
  return XXH3_64bits_withSeed(c.data(), c.size(), seed);
}

std::string KeyNamespace::digest_hex() const {
  std::string c = canonical();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_withSeed(c.data(), c.size(), seed)));
  return buf;
}

KeyNamespace KeyNamespace::with_request(const RequestKeyScope& scope) const {
  KeyNamespace ns = *this;
  ns.lora_name = scope.lora_name;
  ns.lora_version = scope.lora_version;
  ns.salt = scope.salt;
  return ns;
}

std::string RequestKeyScope::describe() const {
  std::string out = lora_name.empty() ? "base" : lora_name + (lora_version.empty() ? "" : "@" + lora_version);
  if (!salt.empty()) out += " salt=" + salt;
  return out;
}

Status validate_key_scope(const RequestKeyScope& scope, const std::string& where) {
  const std::pair<const char*, const std::string*> fields[] = {
      {"lora_name", &scope.lora_name}, {"lora_version", &scope.lora_version}, {"salt", &scope.salt}};
  for (const auto& [name, value] : fields) {
    if (value->size() > kMaxKeyScopeFieldBytes) {
      return error(Code::kInvalidArgument, where + ": " + name + " has " + std::to_string(value->size()) +
                                               " bytes, at most " + std::to_string(kMaxKeyScopeFieldBytes) +
                                               " are accepted");
    }
    for (char c : *value) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return error(Code::kInvalidArgument, where + ": " + name + " holds a control character");
      }
    }
  }
  if (scope.lora_name.empty() && !scope.lora_version.empty()) {
    return error(Code::kInvalidArgument,
                 where + ": lora_version '" + scope.lora_version + "' without lora_name (name the adapter)");
  }
  return Status::ok();
}

uint64_t local_block_hash(std::span<const uint32_t> block_tokens, uint64_t seed) {
  // Tokens as u32 little-endian: serialise explicitly so the digest is the same on any host.
  std::string bytes(block_tokens.size() * 4, '\0');
  for (size_t i = 0; i < block_tokens.size(); ++i) {
    uint32_t t = block_tokens[i];
    bytes[4 * i + 0] = static_cast<char>(t & 0xff);
    bytes[4 * i + 1] = static_cast<char>((t >> 8) & 0xff);
    bytes[4 * i + 2] = static_cast<char>((t >> 16) & 0xff);
    bytes[4 * i + 3] = static_cast<char>((t >> 24) & 0xff);
  }
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

uint64_t chain_hash(uint64_t parent_seq, uint64_t local, uint64_t seed) {
  unsigned char buf[16];
  put_u64_le(buf, parent_seq);
  put_u64_le(buf + 8, local);
  return XXH3_64bits_withSeed(buf, sizeof buf, seed);
}

std::vector<uint64_t> seq_hashes(std::span<const uint32_t> tokens, const KeyNamespace& ns) {
  std::vector<uint64_t> out;
  if (ns.block_size == 0) return out;
  const uint64_t seed = ns.chain_seed();
  const size_t blocks = tokens.size() / ns.block_size;
  out.reserve(blocks);
  for (size_t i = 0; i < blocks; ++i) {
    uint64_t local = local_block_hash(tokens.subspan(i * ns.block_size, ns.block_size), seed);
    out.push_back(i == 0 ? local : chain_hash(out.back(), local, seed));
  }
  return out;
}

std::string hash_hex(uint64_t h) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {
constexpr std::string_view kBlockKeyPrefix = "kv/";
constexpr size_t kSeqHashHexDigits = 16;
}  // namespace

std::string BlockStoreKey::str() const {
  char buf[kSeqHashHexDigits + 1];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(seq_hash));
  std::string key;
  key.reserve(kBlockKeyPrefix.size() + namespace_digest.size() + 1 + kSeqHashHexDigits);
  key.append(kBlockKeyPrefix).append(namespace_digest).append(1, '/').append(buf, kSeqHashHexDigits);
  return key;
}

std::optional<BlockStoreKey> BlockStoreKey::parse(std::string_view key) {
  if (key.substr(0, kBlockKeyPrefix.size()) != kBlockKeyPrefix) return std::nullopt;
  key.remove_prefix(kBlockKeyPrefix.size());
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  const std::string_view hex = key.substr(slash + 1);
  if (hex.size() != kSeqHashHexDigits) return std::nullopt;
  BlockStoreKey parsed;
  auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), parsed.seq_hash, 16);
  if (ec != std::errc() || end != hex.data() + hex.size()) return std::nullopt;
  parsed.namespace_digest = std::string(key.substr(0, slash));
  return parsed;
}

std::string block_store_key(const KeyNamespace& ns, uint64_t seq_hash) {
  return BlockStoreKey{ns.digest_hex(), seq_hash}.str();
}

}  // namespace mc
