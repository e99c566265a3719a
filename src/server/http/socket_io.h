// Reads and writes on a non-blocking socket with deadlines, woken early by
// the server's stop event (an eventfd that stays readable once stop() wrote
// to it). All sends use MSG_NOSIGNAL: a peer that went away is an error, never
// a SIGPIPE.
#pragma once

#include <chrono>
#include <cstddef>
#include <string_view>

namespace moeserve::server::http {

using Clock = std::chrono::steady_clock;

enum class IoResult { kOk, kEof, kTimeout, kStopped, kError };

// Waits until `fd` is readable, the deadline passes or `wake_fd` fires, then
// reads up to `cap` bytes into buf (their count in `got`).
IoResult read_some(int fd, int wake_fd, char* buf, size_t cap, Clock::time_point deadline, size_t& got);

// Sends all of `data`. Each time the socket's buffer is full it waits at
// most `timeout` for room (a reader that stopped reading is dropped).
IoResult write_all(int fd, int wake_fd, std::string_view data, std::chrono::milliseconds timeout);

// Closes after an error reply: shuts down our side, then discards what the
// client still sends for up to `max` (closing with unread input would send
// a reset, which can destroy the reply before the client read it).
void linger_close(int fd, int wake_fd, std::chrono::milliseconds max);

}  // namespace moeserve::server::http
