#include "server/http/connection.h"

#include <sys/socket.h>

#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>

#include "server/http/connection_table.h"

namespace moeserve::server::http {
namespace {

using std::chrono::milliseconds;
namespace asio = boost::asio;
using boost::system::error_code;

// One read's worth; reads land in a per-thread scratch buffer, so an idle
// connection holds no read buffer of its own.
constexpr size_t kReadChunk = 16384;

bool would_block(const error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again || ec == asio::error::interrupted;
}

bool is_light(const std::string& method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS";
}

// Rounds up to a multiple of `grid`.
Clock::time_point on_grid(Clock::time_point t, milliseconds grid) {
  const auto g = std::chrono::duration_cast<Clock::duration>(grid);
  const auto since = t.time_since_epoch();
  return Clock::time_point(((since + g - Clock::duration(1)) / g) * g);
}

}  // namespace

Connection::Connection(Socket socket, ConnectionContext& ctx, std::string peer)
    : socket_(std::move(socket)),
      executor_(socket_.get_executor()),
      ctx_(ctx),
      peer_(std::move(peer)),
      deadline_(executor_),
      poll_(executor_) {}

Connection::~Connection() {
  cancel_stream();  // normally done already; a stream must never outlive its client unnoticed
  ctx_.table->release(this, peer_);
}

void Connection::start() {
  error_code ec;
  socket_.non_blocking(true, ec);
  // SSE chunks are small and must go out at once.
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  asio::dispatch(executor_, [self = shared_from_this()] { self->begin_request(); });
}

void Connection::stop() {
  asio::post(executor_, [self = shared_from_this()] { self->on_server_stop(); });
}

// ---- reading a request ----

void Connection::begin_request() {
  if (stopping()) return close();
  phase_ = Phase::kReading;
  parser_.reset();
  in_body_ = false;
  const ConnectionOptions& o = ctx_.options;
  // A new connection has head_timeout for its first request from the start;
  // between keep-alive requests the client has idle_timeout to begin the
  // next one, and then head_timeout for its head (see process_input).
  arm_deadline(first_request_ ? o.head_timeout : std::min(o.idle_timeout, o.head_timeout));
  if (!pending_.empty()) return process_input();
  wait_readable();
}

void Connection::wait_readable() {
  socket_.async_wait(Socket::wait_read,
                     [self = shared_from_this()](const error_code& ec) { self->on_readable(ec); });
}

void Connection::on_readable(const error_code& ec) {
  if (phase_ != Phase::kReading || write_in_flight_) return;
  if (ec) return close();
  thread_local char buf[kReadChunk];
  error_code read_error;
  const size_t n = socket_.read_some(asio::buffer(buf), read_error);
  if (would_block(read_error)) return wait_readable();
  if (read_error) return close();  // EOF or a reset: the client is gone, a partial request with it
  pending_.append(buf, n);
  process_input();
}

void Connection::process_input() {
  if (!parser_) parser_.emplace(ctx_.options.limits);
  const bool was_started = parser_->started();
  pending_.erase(0, parser_->feed(pending_));
  if (!was_started && parser_->started() && !first_request_) arm_deadline(ctx_.options.head_timeout);
  switch (parser_->state()) {
    case ParseState::kComplete:
      return dispatch();
    case ParseState::kError:
      return refuse(parser_->error_status(), parser_->error_message());
    case ParseState::kBody:
      if (!in_body_) {
        in_body_ = true;
        arm_deadline(ctx_.options.body_timeout);
        if (parser_->request().expect_continue) {
          static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          return write(asio::buffer(kContinue), [this] {
            arm_deadline(ctx_.options.body_timeout);
            wait_readable();
          });
        }
      }
      break;
    case ParseState::kHead:
      break;
  }
  // The parser took every byte it was given, so pending_ is empty here: what
  // is buffered per connection stays at one read's worth.
  if (pending_.capacity() > kReadChunk) std::string().swap(pending_);
  wait_readable();
}

void Connection::dispatch() {
  HttpRequest request = std::move(parser_->request());
  request.peer = peer_;
  parser_.reset();
  first_request_ = false;
  keep_alive_ = request.keep_alive;
  head_only_ = request.method == "HEAD";
  version_minor_ = request.version_minor;
  phase_ = Phase::kHandling;
  disarm_deadline();  // the handler has no deadline of ours: the API layer bounds its work
  if (stopping()) return close();
  client_gone_ = false;
  const bool light = is_light(request.method);
  if (light && ctx_.light_inline) return on_reply(call_handler(request));
  start_watch();
  // The task keeps the connection alive, and the event loop running, until
  // the reply is back on the strand.
  auto task = [self = shared_from_this(), request = std::move(request),
               work = asio::make_work_guard(*ctx_.io)]() mutable {
    std::optional<HttpReply> reply;
    if (self->stopping()) {
      reply = self->ctx_.error_reply(503, "the server is shutting down; retry shortly");
    } else if (self->client_alive()) {
      reply = self->call_handler(request);
    }  // else the client left while its request waited for a thread: no engine time spent on it
    asio::post(self->executor_,
               [self, reply = std::move(reply)]() mutable { self->on_reply(std::move(reply)); });
    // The connection may end here, on this thread: while the event loop
    // still runs, which the work guard, let go last, ensures.
    self.reset();
    work.reset();
  };
  if (!ctx_.dispatch(light, std::move(task))) {
    stop_watch();
    refuse(light ? 503 : 429,
           light ? "the server is busy; retry shortly" : "too many requests are waiting; retry shortly");
  }
}

HttpReply Connection::call_handler(const HttpRequest& request) {
  try {
    return ctx_.handler(request, [this] { return client_alive(); });
  } catch (...) {  // a handler bug must not take the server down
    return ctx_.error_reply(500, "internal error while handling the request");
  }
}

// ---- answering ----

void Connection::on_reply(std::optional<HttpReply> reply) {
  if (phase_ == Phase::kClosed || !reply) {
    // Nobody to answer: a stream that was started still has to end.
    if (reply && reply->next && reply->cancel) reply->cancel();
    return close();
  }
  if (reply->next) return start_stream(std::move(*reply));
  stop_watch();
  phase_ = Phase::kWriting;
  const bool keep_alive = keep_alive_ && !stopping() && !client_gone_;
  out_ = response_head(*reply, keep_alive);
  body_ = head_only_ ? std::string() : std::move(reply->body);
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(out_), asio::buffer(body_)};
  write(buffers, [this, keep_alive] { after_response(keep_alive); });
}

void Connection::after_response(bool keep_alive) {
  out_.clear();
  std::string().swap(body_);
  if (!keep_alive || stopping()) return close();
  begin_request();
}

// ---- streams ----

void Connection::start_stream(HttpReply reply) {
  stream_ = std::move(reply);
  phase_ = Phase::kStreaming;
  // HTTP/1.0 has no chunked encoding: the stream ends when the connection does.
  chunked_ = version_minor_ >= 1;
  stream_keep_alive_ = keep_alive_ && chunked_ && !stopping();
  stream_more_ = true;
  if (client_gone_ || stopping()) {
    cancel_stream();
    return close();
  }
  out_ = stream_head(stream_, chunked_, stream_keep_alive_);
  last_output_ = Clock::now();
  output_gap_ = Clock::duration::zero();
  write(asio::buffer(out_), [this] {
    if (!head_only_) return pump();
    cancel_stream();  // HEAD: the head is the whole answer
    after_stream();
  });
}

// Takes what the stream has ready without waiting, writes it, and comes back
// when the write is done; with nothing ready it polls again shortly.
void Connection::pump() {
  if (phase_ != Phase::kStreaming) return;
  if (client_gone_ || stopping()) {
    cancel_stream();
    return close();
  }
  out_.clear();
  try {
    stream_more_ = stream_.next(out_, milliseconds(0));
  } catch (...) {  // a broken stream ends its connection, never the server
    cancel_stream();
    return close();
  }
  const Clock::time_point now = Clock::now();
  if (!out_.empty()) {
    note_output(now);
    if (chunked_) out_ = chunk(out_);
    return write(asio::buffer(out_), [this] { stream_more_ ? pump() : end_stream(); });
  }
  if (!stream_more_) return end_stream();
  if (now - last_write_ >= ctx_.options.ping_interval) {
    // Nothing new for a while: an SSE comment, which clients ignore, so a
    // client that went away shows up as a failed write.
    static const std::string kPing = ": ping\n\n", kPingChunk = chunk(kPing);
    return write(asio::buffer(chunked_ ? kPingChunk : kPing), [this] { pump(); });
  }
  schedule_poll();
}

// Output comes at the engine's step rate, for all streams at once: learn the
// gap between outputs and poll just before the next is due, then every tick
// until it is there. Silent streams (queued, in a long prefill) back off to a
// sixteenth of their silence so far. Each poll wakes the event loop (and, on
// a machine with few cores, takes time from the engine): this keeps it near
// one wake-up per step, an event at most a tick late.
void Connection::note_output(Clock::time_point now) {
  const Clock::duration since = now - last_output_;
  last_output_ = now;
  // A gap shorter than a tick is a re-poll after a write, not a step.
  if (since < ctx_.options.poll_min || since > std::chrono::milliseconds(250)) return;
  output_gap_ = output_gap_ == Clock::duration::zero() ? since : (3 * output_gap_ + since) / 4;
}

void Connection::schedule_poll() {
  const ConnectionOptions& o = ctx_.options;
  const Clock::time_point now = Clock::now();
  const Clock::duration silence = now - last_output_;
  Clock::time_point at;
  if (output_gap_ > Clock::duration::zero() && silence < 2 * output_gap_) {
    at = std::max(now + o.poll_min, last_output_ + output_gap_ - o.poll_min);
  } else {
    at = now + std::clamp(std::chrono::duration_cast<milliseconds>(silence / 16), o.poll_min, o.poll_max);
  }
  // On a shared grid, so the timers of all streams expire together: one
  // wake-up of the event loop per tick, not one per stream.
  poll_.expires_at(on_grid(at, o.poll_min));
  poll_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (!ec) self->pump();
  });
}

void Connection::end_stream() {
  stream_ = HttpReply();  // complete: nothing to cancel; the session is released
  if (!chunked_) return after_stream();
  static const std::string kLastChunk = chunk("");
  write(asio::buffer(kLastChunk), [this] { after_stream(); });
}

void Connection::after_stream() {
  stop_watch();
  out_.clear();
  if (!stream_keep_alive_ || stopping()) return close();
  begin_request();
}

void Connection::cancel_stream() {
  if (!stream_.next) return;
  std::function<void()> cancel = std::move(stream_.cancel);
  stream_ = HttpReply();
  if (cancel) cancel();
}

// ---- watching the client ----

bool Connection::client_alive() const { return !client_gone_.load() && !stopping(); }

void Connection::start_watch() {
  watching_ = true;
  socket_.async_wait(Socket::wait_read, [self = shared_from_this(), g = ++watch_generation_](
                                            const error_code& ec) { self->on_watch(ec, g); });
}

void Connection::stop_watch() {
  if (!watching_) return;
  watching_ = false;
  ++watch_generation_;
  // Only called while nothing else is pending on the socket.
  error_code ec;
  socket_.cancel(ec);
}

// While a request is handled nothing is read, so readable input is either
// the next pipelined request (alive: its bytes wait in the socket) or the
// end of the stream (gone).
void Connection::on_watch(const error_code& ec, uint64_t generation) {
  if (generation != watch_generation_ || !watching_) return;
  watching_ = false;
  if (ec == asio::error::operation_aborted) return;
  if (!ec) {
    char c;
    const ssize_t n = ::recv(socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return start_watch();
  }
  on_client_gone();
}

void Connection::on_client_gone() {
  client_gone_ = true;
  // A plain request's handler sees client_alive() turn false and ends; a
  // stream is cancelled here, unless a write is pending (it fails, or the
  // next pump sees the flag).
  if (phase_ == Phase::kStreaming && !write_in_flight_) {
    cancel_stream();
    close();
  }
}

// ---- refusals, deadlines, the end ----

// Answers with an error and closes: shuts our side down, then discards what
// the client still sends for up to `linger` (closing with unread input would
// send a reset, which can destroy the reply before the client read it).
void Connection::refuse(int status, const std::string& message) {
  if (write_in_flight_) return close();
  // (`message` may be the parser's: the reply is built before the parser goes.)
  const HttpReply reply = ctx_.error_reply(status, message);
  out_ = response_head(reply, false) + reply.body;
  phase_ = Phase::kRefusing;
  parser_.reset();
  std::string().swap(pending_);
  write(asio::buffer(out_), [this] {
    error_code ec;
    socket_.shutdown(Socket::shutdown_send, ec);
    arm_deadline(ctx_.options.linger);
    linger_read();
  });
}

void Connection::linger_read() {
  socket_.async_wait(Socket::wait_read, [self = shared_from_this()](const error_code& ec) {
    if (ec || self->phase_ != Phase::kRefusing) return self->close();
    thread_local char buf[kReadChunk];
    error_code read_error;
    self->socket_.read_some(asio::buffer(buf), read_error);
    if (read_error && !would_block(read_error)) return self->close();
    self->linger_read();
  });
}

void Connection::on_server_stop() {
  switch (phase_) {
    case Phase::kHandling:  // the handler sees client_alive() false; its reply is written, then we close
      return;
    case Phase::kWriting:  // finishing the reply, but not for long
      return arm_deadline(std::min(ctx_.options.write_timeout, ctx_.options.linger));
    case Phase::kStreaming:
      cancel_stream();
      return close();
    default:
      return close();
  }
}

template <typename Buffers, typename Then>
void Connection::write(const Buffers& buffers, Then then) {
  write_in_flight_ = true;
  arm_deadline(stopping() ? std::min(ctx_.options.write_timeout, ctx_.options.linger)
                          : ctx_.options.write_timeout);
  asio::async_write(
      socket_, buffers,
      [self = shared_from_this(), then = std::move(then)](const error_code& ec, size_t) mutable {
        self->write_in_flight_ = false;
        self->disarm_deadline();
        if (ec || self->phase_ == Phase::kClosed) return self->close();
        self->last_write_ = Clock::now();
        then();
      });
}

// Deadlines move with every phase (a few times a request), mostly later:
// the timer is only re-armed when one comes nearer than its expiry; when it
// expires before the deadline, it waits again for the rest.
void Connection::arm_deadline(milliseconds after) {
  deadline_at_ = Clock::now() + after;
  if (timer_waiting_ && timer_at_ <= deadline_at_) return;
  wait_for_deadline();
}

void Connection::disarm_deadline() { deadline_at_ = Clock::time_point::max(); }

void Connection::wait_for_deadline() {
  timer_waiting_ = true;
  timer_at_ = deadline_at_;
  deadline_.expires_at(timer_at_);
  deadline_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec == asio::error::operation_aborted) return;  // replaced by a nearer deadline, or closed
    self->timer_waiting_ = false;
    if (self->phase_ == Phase::kClosed || self->deadline_at_ == Clock::time_point::max()) return;
    if (Clock::now() < self->deadline_at_) return self->wait_for_deadline();
    self->on_deadline();
  });
}

void Connection::on_deadline() {
  // A request that started but did not arrive in time gets a 408; a silent
  // idle connection, a write that did not finish and a lingering close just end.
  if (phase_ == Phase::kReading && !write_in_flight_ && parser_ && parser_->started()) {
    return refuse(408, "the request was not received in time");
  }
  if (phase_ == Phase::kStreaming) cancel_stream();
  close();
}

void Connection::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  cancel_stream();
  disarm_deadline();
  ++watch_generation_;
  error_code ec;
  deadline_.cancel();
  poll_.cancel();
  socket_.shutdown(Socket::shutdown_both, ec);
  socket_.close(ec);
  std::string().swap(pending_);
  parser_.reset();
}

}  // namespace moeserve::server::http
