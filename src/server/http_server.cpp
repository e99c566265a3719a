#include "server/http_server.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/log.h"
#include "server/http/accept_loop.h"
#include "server/http/connection.h"
#include "server/http/connection_table.h"
#include "server/http/listener.h"
#include "server/http/worker_pool.h"

namespace moeserve::server {
namespace {

namespace asio = boost::asio;
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
  c.ping_interval = milliseconds(std::max(1, o.ping_interval_ms));
  return c;
}

// Each open connection holds a file descriptor (the model, logs and engine
// need a few more): raises the soft limit as far as the hard one allows and
// returns how many connections fit.
int fit_open_file_limit(int wanted) {
  constexpr rlim_t kReserve = 128;
  rlimit rl{};
  if (wanted <= 0 || ::getrlimit(RLIMIT_NOFILE, &rl) != 0) return wanted;
  const rlim_t need = rlim_t(wanted) + kReserve;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return wanted;
  return int(std::max<rlim_t>(rl.rlim_cur, 2 * kReserve) - kReserve);
}

// The event loop's threads: an exception a handler lets through is logged
// and the loop goes on (the server never aborts on one).
void run_event_loop(asio::io_context& io) {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      MOESERVE_LOG_ERROR("HTTP event loop: {}", e.what());
    } catch (...) {
      MOESERVE_LOG_ERROR("HTTP event loop: unknown exception");
    }
  }
}

}  // namespace

struct HttpServer::Impl {
  HttpOptions options;
  int max_connections = 0;  // options.max_connections, as the open file limit allows
  http::Listener listener;
  int wake_fd = -1;  // eventfd: readable once stop() ran
  std::atomic<bool> stopping{false};
  http::Handler test_handler;

  Status serve(http::ConnectionContext& ctx);
};

HttpServer::HttpServer(HttpOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->max_connections = impl_->options.max_connections;
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

HttpServer::~HttpServer() {
  stop();
  if (impl_->listener.fd >= 0) ::close(impl_->listener.fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

void HttpServer::set_handler(http::Handler handler) { impl_->test_handler = std::move(handler); }

Result<int> HttpServer::bind() {
  Impl& m = *impl_;
  if (m.wake_fd < 0) return make_error(StatusCode::kIoError, "cannot create the server's stop event");
  if (m.listener.fd >= 0) ::close(m.listener.fd);
  m.listener = {};
  MOESERVE_ASSIGN_OR_RETURN(m.listener, http::open_listener(m.options.host, m.options.port));
  m.max_connections = fit_open_file_limit(m.options.max_connections);
  if (m.max_connections < m.options.max_connections) {
    MOESERVE_LOG_WARN(
        "the open file limit allows {} connections, not --max-connections {}: more get 503 (raise it with "
        "ulimit -n)",
        m.max_connections, m.options.max_connections);
  }
  return m.listener.port;
}

Status HttpServer::run() {
  Impl& m = *impl_;
  if (m.listener.fd < 0)
    return make_error(StatusCode::kIoError, "HttpServer::run() before a successful bind()");
  const HttpOptions& o = m.options;
  const size_t open_cap = size_t(std::max(0, m.max_connections));
  http::ConnectionTable table(open_cap, size_t(std::max(0, o.max_connections_per_client)));
  http::WorkerPool handlers(size_t(std::max(1, o.handler_threads)),
                            size_t(std::max(1, o.max_waiting_requests)));
  // One request at a time per connection: the open cap bounds this queue.
  http::WorkerPool light(o.light_requests_inline ? 0 : size_t(std::max(1, o.light_handler_threads)),
                         std::max<size_t>(open_cap, 1));
  if (handlers.threads() == 0 || (light.threads() == 0 && !o.light_requests_inline)) {
    ::close(m.listener.fd);
    m.listener.fd = -1;
    return make_error(
        StatusCode::kResourceExhausted,
        "could not start the HTTP handler threads ({}); raise the process's thread or memory limit",
        handlers.start_error() + light.start_error());
  }
  http::ConnectionContext ctx;
  ctx.options = connection_options(o);
  ctx.handler = [this](const http::HttpRequest& r, const std::function<bool()>& alive) {
    return handle(r, alive);
  };
  ctx.error_reply = error_reply;
  ctx.light_inline = o.light_requests_inline;
  ctx.dispatch = [&handlers, &light](bool is_light, std::function<void()> task) {
    return (is_light ? light : handlers).offer(std::move(task));
  };
  ctx.table = &table;
  ctx.stopping = &m.stopping;
  const Status served = m.serve(ctx);
  light.shutdown();
  handlers.shutdown();
  return served;
}

// The event loop: accepts until the stop event, then stops every connection
// and returns once the last one ended.
Status HttpServer::Impl::serve(http::ConnectionContext& ctx) {
  asio::io_context io(std::max(1, options.io_threads));
  ctx.io = &io;
  http::AcceptLoop accept(io, ctx);
  boost::system::error_code ec = accept.open(listener.family, listener.fd);
  if (ec) return make_error(StatusCode::kIoError, "cannot adopt the listening socket: {}", ec.message());
  listener.fd = -1;  // the acceptor owns it now
  asio::posix::stream_descriptor stop_event(io);
  stop_event.assign(::fcntl(wake_fd, F_DUPFD_CLOEXEC, 0), ec);
  if (ec) return make_error(StatusCode::kIoError, "cannot watch the server's stop event: {}", ec.message());
  stop_event.async_wait(asio::posix::stream_descriptor::wait_read, [&](const boost::system::error_code&) {
    accept.stop();
    for (const auto& connection : ctx.table->live()) connection->stop();
    boost::system::error_code close_ec;
    stop_event.close(close_ec);
  });
  accept.start();
  std::vector<std::thread> threads;
  for (int i = 1; i < options.io_threads; ++i) {
    try {
      threads.emplace_back([&io] { run_event_loop(io); });
    } catch (const std::system_error& e) {
      MOESERVE_LOG_WARN("started {} of {} HTTP event-loop threads: {}", i, options.io_threads, e.what());
      break;
    }
  }
  run_event_loop(io);
  for (std::thread& t : threads) t.join();
  return Status::ok();
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
  r.peer = request.peer;
  r.client_alive = client_alive;
  return to_http(service->handle(r));
}

}  // namespace moeserve::server
