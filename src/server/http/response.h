// What a handler answers and how it goes on the wire: the status line and
// headers of a complete response or of a chunked stream, and the chunk
// framing. Pure string building.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "server/http/request_parser.h"

namespace moeserve::server::http {

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // Set: a stream (sent chunked). Appends what is ready to `out`, waiting up
  // to `wait`; returns false once the stream is complete.
  std::function<bool(std::string& out, std::chrono::milliseconds wait)> next;
  std::function<void()> cancel;  // streams: the client went away
};

// client_alive: false once the client hung up (or the server is stopping),
// for handlers that wait long before answering.
using Handler = std::function<HttpReply(const HttpRequest&, const std::function<bool()>& client_alive)>;
// Builds the reply for a refusal made by the HTTP layer itself (400, 408,
// 413, 431, 503, ...).
using ErrorReplier = std::function<HttpReply(int status, const std::string& message)>;

std::string_view reason_phrase(int status);

// Status line + headers of a response with a Content-Length.
std::string response_head(const HttpReply& reply, bool keep_alive);
// Status line + headers of a stream: chunked, or (HTTP/1.0 clients) plain
// bytes ended by closing the connection.
std::string stream_head(const HttpReply& reply, bool chunked, bool keep_alive);
// One chunk of chunked transfer encoding ("" gives the last chunk).
std::string chunk(std::string_view data);

}  // namespace moeserve::server::http
