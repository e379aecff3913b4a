// mc::Status and mc::Result<T>: the one error type of every mc library.
//
// A Status is a code plus a message. Messages name the object (endpoint, key, segment, device, file:line),
// carry the lower layer's text (strerror, zmq_strerror, ibv_wc_status_str) and say what to do about it.
// Codes are grouped by area in blocks of 100 so a code alone tells where an error comes from; the
// wire form of a Status (error replies) is {code, message}, so codes are stable numbers.
//
// Thread-safety: values; copy freely. Neither type ever throws on access of the right alternative;
// accessing value() of an error Result is a programming error and aborts with the message.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace mc {

enum class Code : uint16_t {
  kOk = 0,
  // 1xx general
  kInvalidArgument = 100,  // bad input from a caller or a file: the message names the field and value
  kNotFound = 101,         // a named thing does not exist (key, segment, file, instance)
  kAlreadyExists = 102,
  kOutOfRange = 103,         // offset/length/index past a bound
  kTimeout = 104,            // deadline passed; retrying may succeed
  kUnavailable = 105,        // peer not reachable or not ready; retrying later may succeed
  kResourceExhausted = 106,  // no space / too many; free something or add capacity
  kFailedPrecondition = 107,
  kCancelled = 108,
  kInternal = 109,  // a bug in mc: please report with the message
  kUnimplemented = 110,
  kIo = 111,                // file/socket I/O error (errno text included)
  kDataLoss = 112,          // bytes did not arrive intact
  kPermissionDenied = 113,  // the caller's key (role, tenant, instance) may not do this (docs/SECURITY.md)
  // 2xx protocol / RPC
  kProtocolMismatch = 200,  // peers speak different protocol versions
  kMalformedMessage = 201,  // truncated, ill-typed or unknown message
  kMessageTooLarge = 202,
  // 3xx transfer engine
  kTransferFailed = 300,
  kSegmentNotRegistered = 301,
  kNoPath = 302,
  kLocalDeviceDown = 303,  // a local address or device of a path is gone (down, removed): use another
  // 4xx store
  kObjectNotFound = 400,
  kObjectBusy = 401,  // being written or leased; retryable
  kLeaseExpired = 402,
  kNoSpace = 403,
  // 5xx scheduler
  kRejected = 500,  // request rejected by admission control (reason in message)
  // 6xx inference
  kInferenceFailed = 600,
  kAborted = 601,
};

// Short stable name of a code ("invalid_argument", "timeout", ...), used in logs and JSON.
std::string_view code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "code_name: message"; "ok" for success.
  std::string to_string() const;

  // Prefixes context to the message ("while reading KV block x: ...") keeping the code.
  Status with_context(std::string_view context) const;

  // True for codes where the same call may succeed later (timeout, unavailable, busy).
  bool is_retryable() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status error(Code code, std::string message) { return Status(code, std::move(message)); }

// Result<T>: a T or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).is_ok()) {
      v_ = Status(Code::kInternal, "Result constructed from an ok Status without a value");
    }
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }

  T& value() & {
    check();
    return std::get<T>(v_);
  }
  const T& value() const& {
    check();
    return std::get<T>(v_);
  }
  T&& value() && {
    check();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  T value_or(T fallback) const& { return is_ok() ? std::get<T>(v_) : std::move(fallback); }

 private:
  void check() const {
    if (!is_ok()) fail_access(std::get<Status>(v_));
  }
  [[noreturn]] static void fail_access(const Status& s);

  std::variant<T, Status> v_;
};

[[noreturn]] void abort_on_bad_result_access(const Status& s);

template <typename T>
void Result<T>::fail_access(const Status& s) {
  abort_on_bad_result_access(s);
}

}  // namespace mc

// Propagate a non-ok Status from an expression returning Status.
#define MC_RETURN_IF_ERROR(expr)                \
  do {                                          \
    ::mc::Status mc_status_ = (expr);           \
    if (!mc_status_.is_ok()) return mc_status_; \
  } while (0)

#define MC_CONCAT_INNER(a, b) a##b
#define MC_CONCAT(a, b) MC_CONCAT_INNER(a, b)
// MC_ASSIGN_OR_RETURN(auto x, expr): evaluate a Result<T>, return its Status on error, else bind.
#define MC_ASSIGN_OR_RETURN(lhs, expr) MC_ASSIGN_OR_RETURN_IMPL(MC_CONCAT(mc_result_, __LINE__), lhs, expr)
#define MC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
