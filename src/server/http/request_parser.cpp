#include "server/http/request_parser.h"

#include <algorithm>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstdint>
#include <cstring>
#include <limits>

namespace moeserve::server::http {

namespace beast_http = boost::beast::http;

struct RequestParser::Beast {
  beast_http::request_parser<beast_http::string_body> parser;
};

namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c + 32) : c; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
  return -1;
}

// Percent-decodes a path; a malformed escape is kept as written.
std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(char(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool is_supported_method(std::string_view m) {
  static constexpr std::string_view kMethods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"};
  return std::find(std::begin(kMethods), std::end(kMethods), m) != std::end(kMethods);
}

bool valid_target(std::string_view t) {
  return !t.empty() && std::none_of(t.begin(), t.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c <= 0x20 || c == 0x7f;
  });
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Beast refuses a Content-Length that overflows 64 bits as malformed; a
// number that large is a body over the limit (413), like any other.
bool content_length_over(std::string_view head, size_t max_body) {
  while (!head.empty()) {
    const size_t eol = head.find('\n');
    std::string_view line = head.substr(0, eol);
    head.remove_prefix(eol == std::string_view::npos ? head.size() : eol + 1);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !iequals(line.substr(0, colon), "Content-Length")) continue;
    std::string_view value = trim_ows(line.substr(colon + 1));
    if (!value.empty() && value.back() == '\r') value = trim_ows(value.substr(0, value.size() - 1));
    if (!all_digits(value)) continue;
    value.remove_prefix(std::min(value.find_first_not_of('0'), value.size()));
    if (value.size() > 18) return true;
    size_t n = 0;
    for (char c : value) n = n * 10 + size_t(c - '0');
    if (n > max_body) return true;
  }
  return false;
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

RequestParser::RequestParser(HttpLimits limits) : limits_(limits) {}
RequestParser::~RequestParser() = default;
RequestParser::RequestParser(RequestParser&&) noexcept = default;
RequestParser& RequestParser::operator=(RequestParser&&) noexcept = default;

size_t RequestParser::feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && (state_ == ParseState::kHead || state_ == ParseState::kBody)) {
    const std::string_view rest = data.substr(used);
    used += state_ == ParseState::kHead ? feed_head(rest) : feed_body(rest);
  }
  return used;
}

// Keeps the head's bytes until Beast finds its end; returns how many of
// `data` belong to this request's head (the rest, a body or a pipelined
// request, is fed again).
size_t RequestParser::feed_head(std::string_view data) {
  size_t skipped = 0;
  if (!started_) {
    // RFC 9112 2.2: empty lines before the request line are ignored.
    while (skipped < data.size() && (data[skipped] == '\r' || data[skipped] == '\n')) ++skipped;
    if (skipped == data.size()) return skipped;
    started_ = true;
    data.remove_prefix(skipped);
  }
  if (!beast_) {
    beast_ = std::make_unique<Beast>();
    beast_->parser.header_limit(
        uint32_t(std::min<size_t>(limits_.max_head_bytes, std::numeric_limits<uint32_t>::max())));
    beast_->parser.body_limit(uint64_t(limits_.max_body_bytes));
  }
  // Beast consumes the request line and the header block as each is
  // complete; head_ keeps what it has not consumed yet.
  const size_t before = head_.size();
  const size_t take = std::min(data.size(), limits_.max_head_bytes - head_bytes_);
  head_bytes_ += take;
  head_.append(data.data(), take);
  boost::beast::error_code ec;
  const size_t n = beast_->parser.put(boost::asio::buffer(head_.data(), head_.size()), ec);
  if (ec == beast_http::error::need_more) {
    head_.erase(0, n);
    if (head_bytes_ >= limits_.max_head_bytes) {
      fail(431, "the request line and headers are larger than the server's limit");
    }
    return skipped + take;
  }
  if (ec) {
    if (ec == beast_http::error::header_limit) {
      fail(431, "the request line and headers are larger than the server's limit");
    } else if (ec == beast_http::error::body_limit || (ec == beast_http::error::bad_content_length &&
                                                       content_length_over(head_, limits_.max_body_bytes))) {
      fail(413, "the request body is larger than the server's limit");
    } else if (ec == beast_http::error::bad_content_length) {
      fail(400, "malformed Content-Length");
    } else if (ec == beast_http::error::bad_transfer_encoding) {
      fail(411, "chunked request bodies are not supported; send a Content-Length");
    } else if (ec == beast_http::error::bad_field || ec == beast_http::error::bad_value) {
      fail(400, "malformed header line");
    } else {
      fail(400, "malformed request line");
    }
    return skipped + take;
  }
  // The head ended inside `data`: what follows it is fed again.
  head_.clear();
  head_.shrink_to_fit();
  on_head_end();
  return skipped + (n - before);
}

size_t RequestParser::feed_body(std::string_view data) {
  boost::beast::error_code ec;
  const size_t n = beast_->parser.put(boost::asio::buffer(data.data(), data.size()), ec);
  if (ec && ec != beast_http::error::need_more) {
    fail(ec == beast_http::error::body_limit ? 413 : 400,
         ec == beast_http::error::body_limit ? "the request body is larger than the server's limit"
                                             : "malformed request body");
    return n;
  }
  if (beast_->parser.is_done()) take_message();
  return n;
}

// The server's policy on a complete head; Beast has checked the syntax.
void RequestParser::on_head_end() {
  const auto& msg = beast_->parser.get();
  if (msg.version() != 10 && msg.version() != 11) return fail(400, "unsupported HTTP version");
  const std::string_view method(msg.method_string().data(), msg.method_string().size());
  if (!is_supported_method(method)) return fail(405, "unsupported method");
  std::string_view target(msg.target().data(), msg.target().size());
  if (!valid_target(target)) return fail(400, "malformed request line");
  request_.method = method;
  request_.target = target;
  request_.version_minor = msg.version() % 10;
  // absolute-form ("http://host/path"): keep the path.
  if (target.front() != '/' && target != "*") {
    const size_t scheme = target.find("://");
    if (scheme == std::string_view::npos) return fail(400, "malformed request target");
    const size_t slash = target.find('/', scheme + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  const size_t q = target.find('?');
  request_.path = percent_decode(target.substr(0, q));
  if (q != std::string_view::npos) request_.query = target.substr(q + 1);
  for (const auto& field : msg) {
    if (request_.headers.size() >= limits_.max_header_lines) return fail(431, "too many header lines");
    request_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  // Request bodies must come with a Content-Length (RFC 9112 6.3 lets a
  // server refuse chunked bodies with 411).
  if (!request_.header("Transfer-Encoding").empty() || beast_->parser.chunked()) {
    return fail(411, "chunked request bodies are not supported; send a Content-Length");
  }
  for (const auto& [name, value] : request_.headers) {
    if (!iequals(name, "Expect")) continue;
    if (!iequals(value, "100-continue")) return fail(417, "unsupported Expect header");
    request_.expect_continue = true;
  }
  request_.keep_alive = msg.keep_alive();
  if (beast_->parser.is_done()) {
    take_message();
  } else {
    state_ = ParseState::kBody;
  }
}

void RequestParser::take_message() {
  request_.body = std::move(beast_->parser.get().body());
  beast_.reset();
  state_ = ParseState::kComplete;
}

void RequestParser::fail(int status, std::string message) {
  state_ = ParseState::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  head_.clear();
  head_.shrink_to_fit();
  beast_.reset();
}

}  // namespace moeserve::server::http
