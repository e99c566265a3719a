// The HTTP/1.1 front end: our own small server on POSIX sockets (http/:
// parser, connection, listener, worker pool), bounded in every dimension —
// request head size and line count, body size, time to send a head or body,
// time between keep-alive requests, time a write may block, connections
// waiting for a thread. It answers "loading" until a service is attached
// and moves ApiService replies onto the wire — streams as Server-Sent Events
// (chunked), with a comment ping every second while the model is busy so a
// client that went away is noticed (its request is then cancelled and its
// slot freed).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/api_service.h"
#include "server/http/response.h"

namespace moeserve::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (see bind())
  int timeout_seconds = 30;          // socket read/write timeout; idle keep-alive connections close sooner
  size_t max_body_bytes = 1 << 20;   // larger bodies get 413
  int threads = 64;                  // connection threads (each open connection holds one)
  size_t max_head_bytes = 64 << 10;  // request line + headers; larger heads get 431
  size_t max_header_lines = 100;     // more get 431
  int queue_per_thread = 4;          // connections waiting for a thread, per thread; more get 503
  int head_timeout_ms = 0;           // a request head must arrive within this (0: timeout_seconds)
  int idle_timeout_ms = 0;  // keep-alive connections idle longer close (0: min(5 s, timeout_seconds))
  // Open connections (served or waiting) one peer address may hold; more
  // get 429 and close. 0: no per-client limit.
  int max_connections_per_client = 0;
};

class HttpServer {
 public:
  explicit HttpServer(HttpOptions options);
  ~HttpServer();

  // Binds the socket; returns the port (the chosen one when port was 0).
  Result<int> bind();
  // Until a service is set, /health answers 503 {"status":"loading"} and
  // every other route 503.
  void set_service(ApiService* service) { service_.store(service); }
  // Tests: answer every request with this handler instead (call before run()).
  void set_handler(http::Handler handler);
  // Serves until stop() (from another thread or a signal handler: it only
  // stores a flag and writes to an eventfd, both async-signal-safe).
  Status run();
  void stop();

 private:
  http::HttpReply handle(const http::HttpRequest& request, const std::function<bool()>& client_alive);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<ApiService*> service_{nullptr};
};

}  // namespace moeserve::server
