#include "server/http/listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace moeserve::server::http {
namespace {

// The bound port and address family of a listening socket.
Listener describe(int fd) {
  Listener l{fd, -1, 0};
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return l;
  l.family = addr.ss_family;
  if (addr.ss_family == AF_INET) l.port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) l.port = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return l;
}

// One socket bound and listening on `ai`, or -1 (errno set).
int try_listen(const addrinfo* ai) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return -1;
  // A restarted server can take its port back while old connections linger
  // in TIME_WAIT; a port another process listens on still fails.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

}  // namespace

Result<Listener> open_listener(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return make_error(StatusCode::kIoError, "cannot listen on {}:{}: {}", host, port, ::gai_strerror(rc));
  }
  int fd = -1, err = 0;
  for (const addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = try_listen(ai);
    if (fd < 0) err = errno;
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    if (port == 0)
      return make_error(StatusCode::kIoError, "cannot listen on {}: {}", host, std::strerror(err));
    return make_error(
        StatusCode::kIoError,
        "cannot listen on {}:{} ({}: in use, or not an address of this machine); pick another with --port",
        host, port, std::strerror(err));
  }
  return describe(fd);
}

}  // namespace moeserve::server::http
