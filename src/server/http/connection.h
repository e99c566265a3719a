// One accepted connection, served on one pool thread: reads requests in
// sequence (keep-alive and pipelining: bytes after one request are the start
// of the next), hands each to the handler and writes the reply, streams
// included. Every wait has a deadline, so a slow or silent client costs one
// thread for a bounded time:
//   - head_timeout: the whole request head (from the first byte, or from the
//     start for a connection's first request) — this closes slowloris;
//   - idle_timeout: between keep-alive requests;
//   - body_timeout: the whole body, once the head is in;
//   - write_timeout: each time a write blocks.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "server/http/request_parser.h"
#include "server/http/response.h"
#include "server/http/socket_io.h"

namespace moeserve::server::http {

struct ConnectionOptions {
  HttpLimits limits;
  std::chrono::milliseconds head_timeout{30000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};
  std::chrono::milliseconds linger{1000};         // draining input after an error reply
  std::chrono::milliseconds ping_interval{1000};  // streams: SSE comment after this long without output
};

// What every connection shares with the server.
struct ConnectionContext {
  ConnectionOptions options;
  Handler handler;
  ErrorReplier error_reply;
  int wake_fd = -1;  // readable once the server stops
  const std::atomic<bool>* stopping = nullptr;
};

class Connection {
 public:
  // Takes ownership of `fd` (non-blocking).
  Connection(int fd, const ConnectionContext& ctx) : fd_(fd), ctx_(ctx) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Serves requests until the client or the server ends the connection.
  void serve();

 private:
  enum class Outcome { kRequest, kClosed, kRefused };
  Outcome read_request(RequestParser& parser, bool first);
  // Writes the reply; returns whether the connection may stay open.
  bool respond(const HttpRequest& request);
  bool write_stream(HttpReply& reply, bool head_only, bool keep_alive, bool chunked);
  HttpReply call_handler(const HttpRequest& request);
  bool client_alive() const;
  // Answers with an error and closes (lingering, see linger_close).
  void refuse(int status, const std::string& message);
  bool write(std::string_view data);
  bool stopping() const { return ctx_.stopping && ctx_.stopping->load(); }

  int fd_;
  const ConnectionContext& ctx_;
  std::string pending_;  // received bytes not yet parsed (at most one read's worth)
};

}  // namespace moeserve::server::http
