// Status and Result<T>: how errors cross module boundaries.
//
// Parsers and loaders never throw and never abort on bad input: they return a
// Status whose message names the file/object and the reason, so the CLI can
// print it and exit 1 (and the server can answer 400) with nothing changed.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace moeserve {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // caller passed something malformed
  kInvalidFormat,    // a file or payload is broken, truncated or hostile
  kNotFound,         // a key, tensor, file or token does not exist
  kUnsupported,      // well-formed but outside what we implement
  kIoError,          // the OS said no (open, mmap, read)
  kOutOfRange,       // a size or index past a limit
  kInternal,         // a bug: an invariant did not hold
  kResourceExhausted,  // a queue or budget is full; retry later
  kCancelled,        // stopped before it finished (caller or shutdown)
  kUnavailable,      // a peer (an expert worker process) is not there now; another way may work
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid format: model.gguf: tensor 'blk.0.attn_q.weight': data runs past end of file"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

// Result<T>: a value or a non-ok Status (std::expected is C++23).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}  // NOLINT: implicit by design

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace moeserve

// Propagate a non-ok Status from an expression returning Status.
#define MOESERVE_RETURN_IF_ERROR(expr)          \
  do {                                          \
    ::moeserve::Status _st = (expr);            \
    if (!_st.is_ok()) return _st;               \
  } while (0)

#define MOESERVE_CONCAT_INNER(a, b) a##b
#define MOESERVE_CONCAT(a, b) MOESERVE_CONCAT_INNER(a, b)
// MOESERVE_ASSIGN_OR_RETURN(auto x, make_x()); — unwrap a Result or return its Status.
#define MOESERVE_ASSIGN_OR_RETURN(lhs, expr)                                        \
  auto MOESERVE_CONCAT(_res_, __LINE__) = (expr);                                   \
  if (!MOESERVE_CONCAT(_res_, __LINE__).is_ok()) return MOESERVE_CONCAT(_res_, __LINE__).status(); \
  lhs = std::move(MOESERVE_CONCAT(_res_, __LINE__)).value()
