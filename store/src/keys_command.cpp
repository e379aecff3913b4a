#include "mc/store/keys_command.hpp"

#include <cctype>
#include <string>
#include <vector>

namespace mc::store {

Status run_keys(std::istream& in, std::ostream& out, const KeysOptions& options) {
  if (options.ns.block_size == 0) {
    return Status(Code::kInvalidArgument, "--block-size must be at least 1 token");
  }
  // The rules a request's scope must meet (trace rows, the Conductor): no keys for a scope no request can carry.
  MC_RETURN_IF_ERROR(validate_key_scope({options.ns.lora_name, options.ns.lora_version, options.ns.salt},
                                        "--lora/--lora-version/--salt"));
  std::vector<uint32_t> tokens;
  std::string word;
  int64_t position = 0;
  while (in >> word) {
    ++position;
    bool digits = !word.empty() && word.size() <= 10;
    for (char c : word) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    unsigned long long v = digits ? std::stoull(word) : 0;
    if (!digits || v > 0xffffffffULL) {
      return Status(Code::kInvalidArgument, "token " + std::to_string(position) + " '" + word +
                                                "' is not a token id (an integer in [0, 4294967295])");
    }
    tokens.push_back(static_cast<uint32_t>(v));
  }
  for (uint64_t h : seq_hashes(tokens, options.ns)) {
    out << (options.store_keys ? block_store_key(options.ns, h) : hash_hex(h)) << '\n';
  }
  return Status::ok();
}

}  // namespace mc::store
