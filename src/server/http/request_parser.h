// An incremental HTTP/1.1 request parser: bytes go in as they arrive (in any
// split), one request comes out. Boost.Beast's parser reads the syntax; this
// class adds the server's policy on top of it — which methods, versions and
// request targets are served, the limits and the status each refusal gets —
// and turns the message into an HttpRequest. Pure (no sockets, no clocks),
// so it can be unit-tested byte by byte and fuzzed. Every buffer is bounded
// by HttpLimits: the request head (request line + headers) by max_head_bytes
// and max_header_lines, the body by max_body_bytes — refused as soon as the
// Content-Length is known, before a byte of the body is read.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::server::http {

struct HttpLimits {
  size_t max_head_bytes = 64 << 10;  // request line + header lines, CRLFs included
  size_t max_header_lines = 100;
  size_t max_body_bytes = 1 << 20;
};

struct HttpRequest {
  std::string method;     // as sent (methods are case-sensitive)
  std::string target;     // the request target as sent
  std::string path;       // target without query, percent-decoded
  std::string query;      // after '?', raw
  int version_minor = 1;  // HTTP/1.<minor>
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool keep_alive = true;        // from the version and the Connection header
  bool expect_continue = false;  // "Expect: 100-continue"
  std::string peer;              // the client's address (set by the connection, not parsed)

  // The first header of that name (case-insensitive), or empty.
  std::string_view header(std::string_view name) const;
};

enum class ParseState { kHead, kBody, kComplete, kError };

class RequestParser {
 public:
  explicit RequestParser(HttpLimits limits = {});
  ~RequestParser();
  RequestParser(RequestParser&&) noexcept;
  RequestParser& operator=(RequestParser&&) noexcept;

  // Consumes what it needs of `data` and returns how many bytes it used; the
  // rest (a pipelined request's start) is left for the next parser. Uses
  // nothing once the request is complete or an error was found.
  size_t feed(std::string_view data);

  ParseState state() const { return state_; }
  // Whether any byte of a request arrived (empty lines before the request
  // line do not count).
  bool started() const { return started_; }
  const HttpRequest& request() const { return request_; }
  HttpRequest& request() { return request_; }
  // Set in kError: the status to answer (400, 405, 411, 413, 417, 431) and why.
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  size_t feed_head(std::string_view data);
  size_t feed_body(std::string_view data);
  void on_head_end();
  void take_message();
  void fail(int status, std::string message);

  struct Beast;  // Beast's parser, kept out of this header
  HttpLimits limits_;
  std::unique_ptr<Beast> beast_;
  ParseState state_ = ParseState::kHead;
  bool started_ = false;
  // Head bytes Beast has not consumed yet (it takes the request line and
  // the header block each once complete); at most max_head_bytes in all.
  std::string head_;
  size_t head_bytes_ = 0;
  HttpRequest request_;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace moeserve::server::http
