#include "server/http/socket_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace moeserve::server::http {
namespace {

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

// Polls fd for `events` and the wake fd; kOk when fd is ready.
IoResult wait_for(int fd, int wake_fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, ms_until(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoResult::kError;
    }
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) return IoResult::kStopped;
    if (fds[0].revents != 0) return IoResult::kOk;  // readable, writable, or an error read() will report
    if (n == 0) return IoResult::kTimeout;
  }
}

}  // namespace

IoResult read_some(int fd, int wake_fd, char* buf, size_t cap, Clock::time_point deadline, size_t& got) {
  got = 0;
  for (;;) {
    const ssize_t n = ::recv(fd, buf, cap, 0);
    if (n > 0) {
      got = size_t(n);
      return IoResult::kOk;
    }
    if (n == 0) return IoResult::kEof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::kError;
    if (const IoResult w = wait_for(fd, wake_fd, POLLIN, deadline); w != IoResult::kOk) return w;
  }
}

IoResult write_all(int fd, int wake_fd, std::string_view data, std::chrono::milliseconds timeout) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::kError;
    if (const IoResult w = wait_for(fd, wake_fd, POLLOUT, Clock::now() + timeout); w != IoResult::kOk)
      return w;
  }
  return IoResult::kOk;
}

void linger_close(int fd, int wake_fd, std::chrono::milliseconds max) {
  ::shutdown(fd, SHUT_WR);
  const Clock::time_point deadline = Clock::now() + max;
  char buf[16384];
  size_t got = 0;
  while (read_some(fd, wake_fd, buf, sizeof buf, deadline, got) == IoResult::kOk) {
  }
  ::close(fd);
}

}  // namespace moeserve::server::http
