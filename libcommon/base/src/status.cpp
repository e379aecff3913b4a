#include "mc/common/status.hpp"

#include <cstdio>

namespace mc {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kNotFound:
      return "not_found";
    case Code::kAlreadyExists:
      return "already_exists";
    case Code::kOutOfRange:
      return "out_of_range";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kResourceExhausted:
      return "resource_exhausted";
    case Code::kFailedPrecondition:
      return "failed_precondition";
    case Code::kCancelled:
      return "cancelled";
    case Code::kInternal:
      return "internal";
    case Code::kUnimplemented:
      return "unimplemented";
    case Code::kIo:
      return "io";
    case Code::kPermissionDenied:
      return "permission_denied";
    case Code::kDataLoss:
      return "data_loss";
    case Code::kProtocolMismatch:
      return "protocol_mismatch";
    case Code::kMalformedMessage:
      return "malformed_message";
    case Code::kMessageTooLarge:
      return "message_too_large";
    case Code::kTransferFailed:
      return "transfer_failed";
    case Code::kSegmentNotRegistered:
      return "segment_not_registered";
    case Code::kNoPath:
      return "no_path";
    case Code::kLocalDeviceDown:
      return "local_device_down";
    case Code::kObjectNotFound:
      return "object_not_found";
    case Code::kObjectBusy:
      return "object_busy";
    case Code::kLeaseExpired:
      return "lease_expired";
    case Code::kNoSpace:
      return "no_space";
    case Code::kRejected:
      return "rejected";
    case Code::kInferenceFailed:
      return "inference_failed";
    case Code::kAborted:
      return "aborted";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(code_name(code_)) + ": " + message_;
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

bool Status::is_retryable() const {
  return code_ == Code::kTimeout || code_ == Code::kUnavailable || code_ == Code::kObjectBusy;
}

void abort_on_bad_result_access(const Status& s) {
  std::fprintf(stderr, "mc: fatal: value() of an error Result: %s\n", s.to_string().c_str());
  std::abort();
}

}  // namespace mc
