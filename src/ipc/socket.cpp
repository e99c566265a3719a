#include "ipc/socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/log.h"

namespace moeserve::ipc {
namespace {

std::string errno_text() { return std::strerror(errno); }

Status set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return make_error(StatusCode::kIoError, "socket: cannot make it non-blocking: {}", errno_text());
  }
  return Status::ok();
}

Result<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(a.sun_path)) {
    return make_error(StatusCode::kInvalidArgument, "socket path '{}' must have 1 to {} bytes", path,
                      sizeof(a.sun_path) - 1);
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

int poll_ms(Clock::time_point deadline) {
  if (deadline == kNoDeadline) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left + 1, 0, 1 << 30));
}

// The directory a listening socket goes in: made 0700 when missing, refused
// when others could reach it.
Status check_private_dir(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT || mkdir(dir.c_str(), 0700) != 0) {
      return make_error(StatusCode::kIoError, "socket directory {}: {} (create it with mkdir -m 700)", dir,
                        errno_text());
    }
    return Status::ok();
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return make_error(
        StatusCode::kInvalidArgument,
        "socket directory {} must be a directory of this user that no one else can open (mode {:o}, "
        "owner {}): use a private one, e.g. mkdir -m 700 DIR",
        dir, st.st_mode & 07777, st.st_uid);
  }
  return Status::ok();
}

}  // namespace

Result<std::string> parse_unix_address(std::string_view address) {
  constexpr std::string_view kPrefix = "unix:";
  if (address.substr(0, kPrefix.size()) != kPrefix || address.size() == kPrefix.size()) {
    return make_error(StatusCode::kInvalidArgument, "address '{}': expected unix:PATH (a Unix socket path)",
                      address);
  }
  return std::string(address.substr(kPrefix.size()));
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status Socket::wait(short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd_.get(), events, 0};
    const int r = ::poll(&p, 1, poll_ms(deadline));
    if (r > 0) return Status::ok();  // ready, or an error the next call reports
    if (r == 0 || (deadline != kNoDeadline && Clock::now() >= deadline)) {
      return make_error(StatusCode::kUnavailable, "no answer before the deadline");
    }
    if (errno != EINTR) return make_error(StatusCode::kIoError, "poll: {}", errno_text());
  }
}

Status Socket::write_all(std::span<const uint8_t> bytes, Clock::time_point deadline) {
  const std::span<const uint8_t> parts[1] = {bytes};
  return write_all(parts, deadline);
}

Status Socket::write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline) {
  if (!valid()) return make_error(StatusCode::kIoError, "the connection is closed");
  std::vector<iovec> iov;
  iov.reserve(parts.size());
  for (const auto& p : parts) {
    if (!p.empty()) iov.push_back({const_cast<uint8_t*>(p.data()), p.size()});
  }
  size_t first = 0;
  while (first < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, 512);
    const ssize_t n = ::sendmsg(fd_.get(), &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        MOESERVE_RETURN_IF_ERROR(wait(POLLOUT, deadline));
        continue;
      }
      return make_error(StatusCode::kIoError, "the peer is gone ({})", errno_text());
    }
    size_t left = size_t(n);
    while (left > 0 && first < iov.size()) {
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return Status::ok();
}

Status Socket::write_with_fd(std::span<const uint8_t> bytes, int pass_fd, Clock::time_point deadline) {
  if (!valid() || bytes.empty()) return make_error(StatusCode::kIoError, "the connection is closed");
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<uint8_t*>(bytes.data()), 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  while (true) {
    const ssize_t n = ::sendmsg(fd_.get(), &m, MSG_NOSIGNAL);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      MOESERVE_RETURN_IF_ERROR(wait(POLLOUT, deadline));
      continue;
    }
    return make_error(StatusCode::kIoError, "the peer is gone ({})", errno_text());
  }
  return write_all(bytes.subspan(1), deadline);
}

Status Socket::read_exact(std::span<uint8_t> out, Clock::time_point deadline) {
  const std::span<uint8_t> parts[1] = {out};
  return read_exact(parts, deadline);
}

Status Socket::read_exact(std::span<const std::span<uint8_t>> parts, Clock::time_point deadline) {
  if (!valid()) return make_error(StatusCode::kIoError, "the connection is closed");
  std::vector<iovec> iov;
  iov.reserve(parts.size());
  for (const auto& p : parts) {
    if (!p.empty()) iov.push_back({p.data(), p.size()});
  }
  size_t first = 0;
  while (first < iov.size()) {
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, 512);
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_.get(), &m, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        MOESERVE_RETURN_IF_ERROR(wait(POLLIN, deadline));
        continue;
      }
      return make_error(StatusCode::kIoError, "the peer is gone ({})", errno_text());
    }
    if (n == 0) return make_error(StatusCode::kIoError, "the peer closed the connection");
    // Keep the first descriptor that came along; close any other.
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (!received_fd_.valid()) {
          received_fd_.reset(fd);
        } else {
          ::close(fd);
        }
      }
    }
    size_t left = size_t(n);
    while (left > 0 && first < iov.size()) {
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return Status::ok();
}

Result<Listener> Listener::open(const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(sockaddr_un addr, unix_address(path));
  MOESERVE_RETURN_IF_ERROR(check_private_dir(path));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return make_error(StatusCode::kInvalidArgument, "{} exists and is not a socket: choose another path",
                        path);
    }
    if (connect_unix(path, Clock::now()).is_ok()) {
      return make_error(StatusCode::kInvalidArgument, "{}: another worker is listening there", path);
    }
    ::unlink(path.c_str());  // stale, from a worker that died
  }
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return make_error(StatusCode::kIoError, "socket: {}", errno_text());
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return make_error(StatusCode::kIoError, "bind {}: {}", path, errno_text());
  }
  if (::chmod(path.c_str(), 0600) != 0 || ::listen(fd.get(), 8) != 0) {
    const std::string why = errno_text();
    ::unlink(path.c_str());
    return make_error(StatusCode::kIoError, "listen on {}: {}", path, why);
  }
  Listener l;
  l.fd_ = std::move(fd);
  l.path_ = path;
  return l;
}

Listener::~Listener() {
  if (fd_.valid() && !path_.empty()) ::unlink(path_.c_str());
}

Result<Socket> Listener::accept(Clock::time_point deadline) {
  while (true) {
    pollfd p{fd_.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, poll_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return make_error(StatusCode::kIoError, "poll: {}", errno_text());
    if (r == 0) return make_error(StatusCode::kUnavailable, "no connection before the deadline");
    Fd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return make_error(StatusCode::kIoError, "accept: {}", errno_text());
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
      MOESERVE_LOG_WARN("worker: refused a connection from uid {} (pid {}): only uid {} may connect",
                        cred.uid, cred.pid, geteuid());
      continue;
    }
    return Socket(std::move(fd));
  }
}

Result<Socket> connect_unix(const std::string& path, Clock::time_point deadline) {
  MOESERVE_ASSIGN_OR_RETURN(sockaddr_un addr, unix_address(path));
  while (true) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return make_error(StatusCode::kIoError, "socket: {}", errno_text());
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      MOESERVE_RETURN_IF_ERROR(set_nonblocking(fd.get()));
      return Socket(std::move(fd));
    }
    const int err = errno;
    if ((err != ENOENT && err != ECONNREFUSED && err != EAGAIN && err != EINTR) || Clock::now() >= deadline) {
      return make_error(
          err == ENOENT || err == ECONNREFUSED ? StatusCode::kUnavailable : StatusCode::kIoError,
          "connect to {}: {}", path, std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Result<std::string> make_private_dir(std::string_view prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = fmt::format("{}/{}-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", prefix);
  if (::mkdtemp(templ.data()) == nullptr) {
    return make_error(StatusCode::kIoError, "cannot create a private directory {}: {}", templ, errno_text());
  }
  return templ;
}

void remove_private_dir(const std::string& dir) {
  std::error_code ec;
  if (!dir.empty()) std::filesystem::remove_all(dir, ec);
}

}  // namespace moeserve::ipc
