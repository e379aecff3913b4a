#include "mc/common/grant.hpp"

#include <sodium.h>

#include <chrono>
#include <cstring>

namespace mc::auth {
namespace {

constexpr char kMagic[4] = {'M', 'C', 'G', '1'};
constexpr size_t kFixed = 4 + 1 + 8 + 8 + 8 + 8;  // magic, ops, offset, length, expiry, id
constexpr size_t kMacBytes = crypto_auth_hmacsha512256_BYTES;
static_assert(kMacBytes == 32);

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Status denied(const std::string& why) { return Status(Code::kPermissionDenied, "grant refused: " + why); }

std::string mac_of(std::string_view key, std::string_view body) {
  std::string mac(kMacBytes, '\0');
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(body.data()), body.size());
  crypto_auth_hmacsha512256_final(&st, reinterpret_cast<unsigned char*>(mac.data()));
  return mac;
}

const char* op_word(uint8_t op) { return op == kGrantRead ? "read" : op == kGrantWrite ? "write" : "?"; }

std::string ops_words(uint8_t ops) {
  std::string s;
  if ((ops & kGrantRead) != 0) s = "read";
  if ((ops & kGrantWrite) != 0) s += s.empty() ? "write" : "+write";
  return s.empty() ? "none" : s;
}

}  // namespace

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Grant::describe() const {
  return ops_words(ops) + " [" + std::to_string(offset) + ", +" + std::to_string(length) + ") of " + segment +
         " for " + (grantee.empty() ? std::string("-") : grantee) + " until " + std::to_string(expiry_unix_ms) +
         (id != 0 ? " (id " + std::to_string(id) + ")" : std::string());
}

Result<std::string> issue_grant(std::string_view key, const Grant& g) {
  if (key.size() != 32) return Status(Code::kInvalidArgument, "grant key: expected 32 bytes");
  if (g.length == 0 || g.offset + g.length < g.offset) {
    return Status(Code::kInvalidArgument, "grant of " + g.segment + ": empty or overflowing range");
  }
  if ((g.ops & (kGrantRead | kGrantWrite)) == 0 || (g.ops & ~(kGrantRead | kGrantWrite)) != 0) {
    return Status(Code::kInvalidArgument, "grant of " + g.segment + ": ops must be read and/or write");
  }
  if (g.segment.empty() || g.segment.size() > 255 || g.grantee.size() > 255) {
    return Status(Code::kInvalidArgument, "grant: segment must be 1..255 bytes and grantee at most 255");
  }
  std::string body(kMagic, 4);
  body.push_back(static_cast<char>(g.ops));
  put_u64(body, g.offset);
  put_u64(body, g.length);
  put_u64(body, static_cast<uint64_t>(g.expiry_unix_ms));
  put_u64(body, g.id);
  body.push_back(static_cast<char>(g.segment.size()));
  body += g.segment;
  body.push_back(static_cast<char>(g.grantee.size()));
  body += g.grantee;
  body += mac_of(key, body);
  std::string out(sodium_base64_encoded_len(body.size(), sodium_base64_VARIANT_URLSAFE_NO_PADDING), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(body.data()), body.size(),
                    sodium_base64_VARIANT_URLSAFE_NO_PADDING);
  out.resize(std::strlen(out.c_str()));
  return out;
}

Result<Grant> verify_grant(std::string_view key, std::string_view token) {
  if (token.empty()) return denied("the request carries no grant");
  if (token.size() > kMaxGrantTokenBytes) return denied("not a grant token (over " + std::to_string(kMaxGrantTokenBytes) + " bytes)");
  if (key.size() != 32) return denied("this server has no valid grant key");
  // The alphabet first: libsodium's decoder also maps some bytes >= 0x80 to base64 digits (found by fuzz_grant),
  // which would give one grant many spellings.
  for (const char c : token) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return denied("not a grant token (a character outside URL-safe base64)");
  }
  std::string raw(token.size(), '\0');
  size_t raw_len = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(raw.data()), raw.size(), token.data(), token.size(), nullptr,
                        &raw_len, nullptr, sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0) {
    return denied("not a grant token (bad base64)");
  }
  raw.resize(raw_len);
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  if (raw.size() < kFixed + 2 + kMacBytes || std::memcmp(p, kMagic, 4) != 0) return denied("not a grant token");
  size_t pos = kFixed;
  const size_t seg_len = p[pos++];
  if (pos + seg_len + 1 + kMacBytes > raw.size()) return denied("not a grant token (truncated)");
  const size_t seg_at = pos;
  pos += seg_len;
  const size_t grantee_len = p[pos++];
  if (pos + grantee_len + kMacBytes != raw.size()) return denied("not a grant token (bad length)");
  const size_t grantee_at = pos;
  pos += grantee_len;
  const std::string expect = mac_of(key, std::string_view(raw.data(), pos));
  if (sodium_memcmp(expect.data(), raw.data() + pos, kMacBytes) != 0) {
    return denied("grant forged or damaged (its MAC does not verify under this cluster's grant key)");
  }
  Grant g;
  g.ops = p[4];
  g.offset = get_u64(p + 5);
  g.length = get_u64(p + 13);
  g.expiry_unix_ms = static_cast<int64_t>(get_u64(p + 21));
  g.id = get_u64(p + 29);
  g.segment.assign(raw.data() + seg_at, seg_len);
  g.grantee.assign(raw.data() + grantee_at, grantee_len);
  return g;
}

Status check_grant(const Grant& g, std::string_view segment, uint8_t op, uint64_t offset, uint64_t length,
                   int64_t now_unix_ms) {
  if (g.segment != segment) {
    return denied("grant is for segment " + g.segment + ", not " + std::string(segment) + " (" + g.describe() + ")");
  }
  if ((g.ops & op) == 0) return denied(std::string("grant does not allow ") + op_word(op) + " (" + g.describe() + ")");
  if (offset < g.offset || length > g.length || offset - g.offset > g.length - length) {
    return denied(std::string(op_word(op)) + " of [" + std::to_string(offset) + ", +" + std::to_string(length) +
                  ") is outside the grant (" + g.describe() + ")");
  }
  if (now_unix_ms > g.expiry_unix_ms) {
    return denied("grant expired " + std::to_string(now_unix_ms - g.expiry_unix_ms) + " ms ago (" + g.describe() +
                  ")");
  }
  return Status::ok();
}

}  // namespace mc::auth
