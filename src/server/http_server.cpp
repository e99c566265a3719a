#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/log.h"
#include "server/http/connection.h"
#include "server/http/listener.h"
#include "server/http/worker_pool.h"

namespace moeserve::server {
namespace {

using std::chrono::milliseconds;

http::HttpReply to_http(ApiReply&& r) {
  http::HttpReply h;
  h.status = r.status;
  h.content_type = std::move(r.content_type);
  h.body = std::move(r.body);
  if (r.stream) {
    h.next = [session = r.stream](std::string& out, milliseconds wait) { return session->next(out, wait); };
  }
  h.cancel = std::move(r.cancel);
  return h;
}

// Refusals made by the HTTP layer get an OpenAI-style body too.
http::HttpReply error_reply(int status, const std::string& message) {
  api::ApiError e;
  switch (status) {
    case 413:
      e = {413,
           "invalid_request_error",
           "the request body is larger than the server's limit",
           {},
           "body_too_large"};
      break;
    case 500:
      e = api::server_error(message);
      break;
    case 429:
      e = api::too_many_requests(message);
      break;
    case 503:
      e = api::unavailable(message);
      break;
    default:
      e = {status, "invalid_request_error", message, {}, {}};
      break;
  }
  return to_http(ApiService::error_reply(e));
}

http::ConnectionOptions connection_options(const HttpOptions& o) {
  const milliseconds timeout(1000 * std::max(1, o.timeout_seconds));
  http::ConnectionOptions c;
  c.limits = {o.max_head_bytes, o.max_header_lines, o.max_body_bytes};
  c.head_timeout = o.head_timeout_ms > 0 ? milliseconds(o.head_timeout_ms) : timeout;
  c.idle_timeout =
      o.idle_timeout_ms > 0 ? milliseconds(o.idle_timeout_ms) : std::min(timeout, milliseconds(5000));
  c.body_timeout = timeout;
  c.write_timeout = timeout;
  return c;
}

// Every thread is busy and the queue is full: a short 503 instead of an
// ever-growing backlog (429 when one client holds too many connections).
// Non-blocking; a client that cannot take it loses it.
void refuse_busy(int fd, int status = 503, const char* message = "the server is busy; retry shortly") {
  const http::HttpReply r = error_reply(status, message);
  const std::string out = http::response_head(r, false) + r.body;
  [[maybe_unused]] const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

}  // namespace

struct HttpServer::Impl {
  HttpOptions options;
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: readable once stop() ran
  std::atomic<bool> stopping{false};
  http::Handler test_handler;

  // Open connections by peer address (max_connections_per_client), and
  // the address of each accepted descriptor until a worker takes it.
  std::mutex clients_mu;
  std::unordered_map<std::string, int> per_client;
  std::unordered_map<int, std::string> client_of_fd;

  void accept_ready(http::WorkerPool& pool);
  bool admit_client(int fd, const std::string& peer);  // false: over the per-client limit
  std::string take_client(int fd);
  void release_client(const std::string& peer);
};

bool HttpServer::Impl::admit_client(int fd, const std::string& peer) {
  if (options.max_connections_per_client <= 0) return true;
  std::lock_guard lock(clients_mu);
  int& n = per_client[peer];
  if (n >= options.max_connections_per_client) return false;
  ++n;
  client_of_fd[fd] = peer;
  return true;
}

// Called by the worker before it serves fd (still open, so not reused yet).
std::string HttpServer::Impl::take_client(int fd) {
  if (options.max_connections_per_client <= 0) return {};
  std::lock_guard lock(clients_mu);
  auto it = client_of_fd.find(fd);
  if (it == client_of_fd.end()) return {};
  std::string peer = std::move(it->second);
  client_of_fd.erase(it);
  return peer;
}

void HttpServer::Impl::release_client(const std::string& peer) {
  if (options.max_connections_per_client <= 0 || peer.empty()) return;
  std::lock_guard lock(clients_mu);
  auto it = per_client.find(peer);
  if (it != per_client.end() && --it->second <= 0) per_client.erase(it);
}

namespace {
std::string peer_address(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  }
  return buf;
}
}  // namespace

HttpServer::HttpServer(HttpOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

HttpServer::~HttpServer() {
  stop();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

void HttpServer::set_handler(http::Handler handler) { impl_->test_handler = std::move(handler); }

Result<int> HttpServer::bind() {
  if (impl_->wake_fd < 0) return make_error(StatusCode::kIoError, "cannot create the server's stop event");
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  MOESERVE_ASSIGN_OR_RETURN(const http::Listener l,
                            http::open_listener(impl_->options.host, impl_->options.port));
  impl_->listen_fd = l.fd;
  return l.port;
}

Status HttpServer::run() {
  Impl& m = *impl_;
  if (m.listen_fd < 0)
    return make_error(StatusCode::kIoError, "HttpServer::run() before a successful bind()");
  http::ConnectionContext ctx;
  ctx.options = connection_options(m.options);
  ctx.handler = [this](const http::HttpRequest& r, const std::function<bool()>& alive) {
    return handle(r, alive);
  };
  ctx.error_reply = error_reply;
  ctx.wake_fd = m.wake_fd;
  ctx.stopping = &m.stopping;
  const size_t threads = size_t(std::max(4, m.options.threads));
  const size_t queue = threads * size_t(std::max(1, m.options.queue_per_thread));
  Status result = Status::ok();
  {
    http::WorkerPool pool(threads, queue, [&ctx, &m](int fd) {
      const std::string peer = m.take_client(fd);
      http::Connection(fd, ctx).serve();
      m.release_client(peer);
    });
    if (pool.threads() == 0) {
      ::close(m.listen_fd);
      m.listen_fd = -1;
      return make_error(StatusCode::kResourceExhausted,
                        "could not start any connection thread ({}); raise the process's thread or memory "
                        "limit, or lower --max-connections",
                        pool.start_error());
    }
    if (pool.threads() < threads) {
      MOESERVE_LOG_WARN("started {} of {} connection threads ({}): at most {} connections are served at once",
                        pool.threads(), threads, pool.start_error(), pool.threads());
    }
    while (!m.stopping.load()) {
      pollfd fds[2] = {{m.listen_fd, POLLIN, 0}, {m.wake_fd, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
        result = make_error(StatusCode::kIoError, "the HTTP server stopped with an error");
        break;
      }
      if (fds[1].revents & POLLIN) break;
      if (fds[0].revents & POLLIN) m.accept_ready(pool);
    }
    pool.shutdown();  // the stop event ends every connection promptly
  }
  ::close(m.listen_fd);
  m.listen_fd = -1;
  return result;
}

void HttpServer::Impl::accept_ready(http::WorkerPool& pool) {
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof addr;
    const int fd =
        ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &addr_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: back off briefly instead of spinning on a
      // listening socket that stays readable.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd wake{wake_fd, POLLIN, 0};
        ::poll(&wake, 1, 50);
      }
      return;
    }
    // SSE chunks are small and must go out at once.
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const std::string peer = options.max_connections_per_client > 0 ? peer_address(addr) : std::string();
    if (!admit_client(fd, peer)) {
      refuse_busy(fd, 429, "too many open connections from this client; close some and retry");
      continue;
    }
    if (!pool.offer(fd)) {
      take_client(fd);
      release_client(peer);
      refuse_busy(fd);
    }
  }
}

void HttpServer::stop() {
  // Async-signal-safe: a lock-free atomic store and a write().
  if (!impl_) return;
  impl_->stopping.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake_fd, &one, sizeof one);
}

http::HttpReply HttpServer::handle(const http::HttpRequest& request,
                                   const std::function<bool()>& client_alive) {
  if (impl_->test_handler) return impl_->test_handler(request, client_alive);
  ApiService* service = service_.load();
  if (service == nullptr) {
    http::HttpReply r =
        to_http(ApiService::error_reply(api::unavailable("the model is still loading; retry shortly")));
    if (request.path == "/health") r.body = R"({"status":"loading"})";
    return r;
  }
  ApiRequest r;
  // HEAD is GET without the body (the connection drops the body).
  r.method = request.method == "HEAD" ? "GET" : request.method;
  r.path = request.path;
  r.body = request.body;
  r.authorization = std::string(request.header("Authorization"));
  // Anthropic's clients send the key as x-api-key.
  if (r.authorization.empty()) {
    if (const std::string_view key = request.header("x-api-key"); !key.empty())
      r.authorization = "Bearer " + std::string(key);
  }
  r.client_alive = client_alive;
  return to_http(service->handle(r));
}

}  // namespace moeserve::server
