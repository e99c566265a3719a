// The HTTP/1.1 front end, on Boost.Asio's event loop (http/: connections,
// accept loop, request parser on Boost.Beast, handler threads). A fixed
// number of threads serves any number of connections: the event loop's
// threads do all socket work (an idle connection costs memory and a file
// descriptor, no thread), and the API layer's handler — which may block for
// a whole generation — runs on a fixed pool of handler threads. Bounded in
// every dimension: open connections (in all and per client), request head
// size and line count, body size, time to send a head or body, time between
// keep-alive requests, time a write may take, requests waiting for a
// handler thread. It answers "loading" until a service is attached and
// moves ApiService replies onto the wire — streams as Server-Sent Events
// (chunked), with a comment ping every second while the model is busy; a
// client that hangs up is seen at once and its request cancelled.
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
  size_t max_head_bytes = 64 << 10;  // request line + headers; larger heads get 431
  size_t max_header_lines = 100;     // more get 431
  int head_timeout_ms = 0;           // a request head must arrive within this (0: timeout_seconds)
  int idle_timeout_ms = 0;  // keep-alive connections idle longer close (0: min(5 s, timeout_seconds))
  // Open connections, idle ones included (each costs a few KiB and a file
  // descriptor, no thread); more get 503. bind() raises the process's open
  // file limit to fit, or lowers this to what the limit allows.
  int max_connections = 8192;
  // Open connections one peer address may hold; more get 429 and close.
  // 0: no per-client limit.
  int max_connections_per_client = 0;
  // Event-loop threads: sockets, parsing, deadlines, streamed output.
  int io_threads = 1;
  // Threads that run the API layer for requests with a body (POST, ...). A
  // plain (non-streamed) generation holds one until its answer, so give at
  // least as many as the engine has slots.
  int handler_threads = 8;
  // Threads for GET, HEAD and OPTIONS requests (/health, /metrics, models),
  // so that long generations never delay them.
  int light_handler_threads = 2;
  // Run the handler of GET, HEAD and OPTIONS requests on the event loop
  // itself (no thread hop, no light handler threads): only for a handler
  // that answers those from memory, never blocking — ApiService does.
  bool light_requests_inline = false;
  // Requests that may wait for a handler thread; more get 429.
  int max_waiting_requests = 64;
  int ping_interval_ms = 1000;  // streams: an SSE comment after this long without output
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
  // stores a flag and writes to an eventfd, both async-signal-safe). On
  // stop, in-flight requests are cancelled or finished, then it returns.
  Status run();
  void stop();

 private:
  http::HttpReply handle(const http::HttpRequest& request, const std::function<bool()>& client_alive);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<ApiService*> service_{nullptr};
};

}  // namespace moeserve::server
