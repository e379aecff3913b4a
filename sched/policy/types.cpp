#include "mc/sched/types.hpp"

#include <string>

namespace mc::sched {

std::string_view path_class_name(PathClass c) {
  switch (c) {
    case PathClass::kSameHost:
      return "same_host";
    case PathClass::kRemote:
      return "remote";
    case PathClass::kSsd:
      return "ssd";
    case PathClass::kRecompute:
      return "recompute";
  }
  return "unknown";
}

std::string_view role_name(Role r) { return r == Role::kPrefill ? "prefill" : "decode"; }

Result<Role> parse_role(std::string_view s) {
  if (s == "prefill") return Role::kPrefill;
  if (s == "decode") return Role::kDecode;
  return error(Code::kInvalidArgument, "unknown role '" + std::string(s) + "': expected prefill or decode");
}

std::string_view reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kNoPrefillInstance:
      return "no_prefill_instance";
    case RejectReason::kNoDecodeInstance:
      return "no_decode_instance";
    case RejectReason::kTtftSlo:
      return "ttft_slo";
    case RejectReason::kTbtSlo:
      return "tbt_slo";
    case RejectReason::kKvCapacity:
      return "kv_capacity";
    case RejectReason::kInvalidRequest:
      return "invalid_request";
    case RejectReason::kLoadShed:
      return "load_shed";
  }
  return "unknown";
}

}  // namespace mc::sched
