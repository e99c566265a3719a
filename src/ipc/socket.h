// Unix stream sockets for the expert worker: a private listening socket
// (its directory 0700, the socket 0600, peers of another uid refused with
// SO_PEERCRED), connecting with a deadline, and whole-buffer reads and
// writes with a deadline (a file descriptor may travel with the bytes:
// SCM_RIGHTS, for the shared-memory ring).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace moeserve::ipc {

using Clock = std::chrono::steady_clock;
// No deadline: wait as long as it takes.
inline constexpr Clock::time_point kNoDeadline = Clock::time_point::max();
inline Clock::time_point deadline_in(std::chrono::milliseconds ms) {
  return ms.count() <= 0 ? kNoDeadline : Clock::now() + ms;
}

// "unix:PATH" -> PATH; kInvalidArgument naming the flag's form otherwise.
Result<std::string> parse_unix_address(std::string_view address);

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A connected stream socket.
class Socket {
 public:
  Socket() = default;
  explicit Socket(Fd fd) : fd_(std::move(fd)) {}
  bool valid() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  void close() { fd_.reset(); }

  // Every byte of every part, in order (gathered writes: rows go to the
  // socket straight from where they are). kIoError when the peer is gone,
  // kUnavailable at the deadline.
  Status write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline);
  Status write_all(std::span<const uint8_t> bytes, Clock::time_point deadline);
  // The same with `pass_fd` attached to the first byte (SCM_RIGHTS).
  Status write_with_fd(std::span<const uint8_t> bytes, int pass_fd, Clock::time_point deadline);
  // Exactly out.size() bytes. kIoError when the peer closed or failed,
  // kUnavailable at the deadline. A file descriptor that arrives with the
  // bytes is kept for take_fd(); any more are closed.
  Status read_exact(std::span<uint8_t> out, Clock::time_point deadline);
  // Scattered read of exactly the parts' total (rows straight to where they go).
  Status read_exact(std::span<const std::span<uint8_t>> parts, Clock::time_point deadline);
  Fd take_fd() { return std::move(received_fd_); }

 private:
  Status wait(short events, Clock::time_point deadline);
  Fd fd_;
  Fd received_fd_;
};

// Listens on PATH. The socket's directory is created 0700 when missing and
// must otherwise belong to this user with no access for others; the socket
// is created 0600. A live socket at PATH (another worker answers) is an
// error; a stale one is replaced.
class Listener {
 public:
  static Result<Listener> open(const std::string& path);
  Listener() = default;
  Listener(Listener&&) = default;
  Listener& operator=(Listener&&) = default;
  ~Listener();
  const std::string& path() const { return path_; }
  // The next connection from a process of this uid (others are closed and
  // logged). kUnavailable at the deadline.
  Result<Socket> accept(Clock::time_point deadline);

 private:
  Fd fd_;
  std::string path_;
};

// Connects to PATH, retrying while nobody listens yet until the deadline.
Result<Socket> connect_unix(const std::string& path, Clock::time_point deadline);

// A fresh private directory (0700) under $TMPDIR or /tmp for a spawned
// worker's socket; removed (with what is in it) by remove_private_dir.
Result<std::string> make_private_dir(std::string_view prefix);
void remove_private_dir(const std::string& dir);

}  // namespace moeserve::ipc
