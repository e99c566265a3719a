#include "server/http/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

namespace moeserve::server::http {

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

void Connection::serve() {
  bool first = true;
  while (!stopping()) {
    RequestParser parser(ctx_.options.limits);
    if (read_request(parser, first) != Outcome::kRequest) return;
    first = false;
    if (!respond(parser.request())) return;
  }
}

Connection::Outcome Connection::read_request(RequestParser& parser, bool first) {
  const ConnectionOptions& o = ctx_.options;
  // A new connection has head_timeout for its first request from the start;
  // between keep-alive requests the client has idle_timeout to begin the
  // next one, and then head_timeout for its head.
  Clock::time_point deadline =
      Clock::now() + (first ? o.head_timeout : std::min(o.idle_timeout, o.head_timeout));
  bool started = false, in_body = false;
  char buf[16384];
  for (;;) {
    if (!pending_.empty()) {
      if (!started && !first) deadline = Clock::now() + o.head_timeout;
      started = true;
      pending_.erase(0, parser.feed(pending_));
    }
    if (parser.state() == ParseState::kComplete) return Outcome::kRequest;
    if (parser.state() == ParseState::kError) {
      refuse(parser.error_status(), parser.error_message());
      return Outcome::kRefused;
    }
    if (parser.state() == ParseState::kBody && !in_body) {
      in_body = true;
      deadline = Clock::now() + o.body_timeout;
      if (parser.request().expect_continue && !write("HTTP/1.1 100 Continue\r\n\r\n"))
        return Outcome::kClosed;
    }
    // The parser took every byte it was given, so pending_ is empty here:
    // what is buffered per connection stays at one read's worth.
    size_t got = 0;
    const IoResult r = read_some(fd_, ctx_.wake_fd, buf, sizeof buf, deadline, got);
    if (r == IoResult::kOk) {
      pending_.assign(buf, got);
    } else if (r == IoResult::kTimeout && started) {
      refuse(408, "the request was not received in time");
      return Outcome::kRefused;
    } else {
      return Outcome::kClosed;  // EOF, error, stop, or silence on an idle connection
    }
  }
}

bool Connection::respond(const HttpRequest& request) {
  HttpReply reply = call_handler(request);
  const bool head_only = request.method == "HEAD";
  const bool keep_alive = request.keep_alive && !stopping();
  if (reply.next) return write_stream(reply, head_only, keep_alive, request.version_minor >= 1);
  std::string out = response_head(reply, keep_alive);
  if (!head_only) out += reply.body;
  return write(out) && keep_alive;
}

bool Connection::write_stream(HttpReply& reply, bool head_only, bool keep_alive, bool chunked) {
  // HTTP/1.0 has no chunked encoding: the stream ends when the connection does.
  keep_alive = keep_alive && chunked;
  auto gone = [&] {
    if (reply.cancel) reply.cancel();
    return false;
  };
  if (!write(stream_head(reply, chunked, keep_alive))) return gone();
  if (head_only) {
    gone();
    return keep_alive;
  }
  std::string out;
  for (bool more = true; more;) {
    if (stopping()) return gone();
    out.clear();
    more = reply.next(out, ctx_.options.ping_interval);
    // Nothing new for a while: an SSE comment, which clients ignore, so a
    // closed connection shows up as a failed write.
    if (out.empty() && more) out = ": ping\n\n";
    if (!out.empty() && !write(chunked ? chunk(out) : out)) return gone();
  }
  if (chunked && !write(chunk(""))) return false;
  return keep_alive;
}

HttpReply Connection::call_handler(const HttpRequest& request) {
  try {
    return ctx_.handler(request, [this] { return client_alive(); });
  } catch (...) {  // a handler bug must not take the server down
    return ctx_.error_reply(500, "internal error while handling the request");
  }
}

// While a request is handled nothing is read, so readable input is either
// the next pipelined request (alive) or the end of the stream (gone).
bool Connection::client_alive() const {
  if (stopping()) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return true;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return false;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

void Connection::refuse(int status, const std::string& message) {
  const HttpReply reply = ctx_.error_reply(status, message);
  write(response_head(reply, false) + reply.body);
  linger_close(fd_, ctx_.wake_fd, ctx_.options.linger);
  fd_ = -1;
}

bool Connection::write(std::string_view data) {
  return write_all(fd_, ctx_.wake_fd, data, ctx_.options.write_timeout) == IoResult::kOk;
}

}  // namespace moeserve::server::http
