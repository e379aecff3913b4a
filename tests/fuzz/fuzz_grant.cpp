// Fuzz harness: the data-plane grant a transfer server checks on every read, write and notification
// (auth::verify_grant, then auth::check_grant; mc/net/grant.hpp). Input: the token bytes as a peer sends them in
// a wire op's aux. Invariants: no crash or throw; a token that verifies is refused under another key, re-issues to
// the very same token (the base64 and the body are canonical), and check_grant of its own range at its expiry is ok.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "mc/net/grant.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_grant: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string key(32, 'g');  // fuzz_seeds issues its seed under this key
  const std::string_view token(reinterpret_cast<const char*>(data), size);
  mc::Result<mc::auth::Grant> g = mc::auth::verify_grant(key, token);
  if (!g.is_ok()) {
    if (g.status().code() != mc::Code::kPermissionDenied) broken("a refusal that is not permission_denied");
    return 0;
  }
  if (mc::auth::verify_grant(std::string(32, 'h'), token).is_ok()) broken("verified under another key");
  mc::Result<std::string> again = mc::auth::issue_grant(key, g.value());
  if (!again.is_ok() || again.value() != token) broken("a verified token does not re-issue to itself");
  const mc::auth::Grant& v = g.value();
  const uint8_t op = (v.ops & mc::auth::kGrantRead) != 0 ? mc::auth::kGrantRead : mc::auth::kGrantWrite;
  if (!mc::auth::check_grant(v, v.segment, op, v.offset, v.length, v.expiry_unix_ms).is_ok()) {
    broken("a grant does not cover its own range");
  }
  return 0;
}
