#include "server/http/request_parser.h"

#include <algorithm>
#include <cstring>

namespace moeserve::server::http {
namespace {

// RFC 9110 token characters (method and header names).
bool is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool is_token(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

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

// Control characters other than HTAB are not allowed in header values
// (obs-text, bytes >= 0x80, is).
bool valid_field_value(std::string_view v) {
  return std::none_of(v.begin(), v.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c < 0x20 && c != '\t') || c == 0x7f;
  });
}

bool valid_target(std::string_view t) {
  return !t.empty() && std::none_of(t.begin(), t.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c <= 0x20 || c == 0x7f;
  });
}

// Calls f on each comma-separated element of a header value, trimmed.
template <typename F>
void for_each_element(std::string_view v, F&& f) {
  while (!v.empty()) {
    const size_t comma = v.find(',');
    f(trim_ows(v.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

size_t RequestParser::feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && (state_ == ParseState::kHead || state_ == ParseState::kBody)) {
    const std::string_view rest = data.substr(used);
    used += state_ == ParseState::kHead ? feed_head(rest) : feed_body(rest);
  }
  return used;
}

// Takes bytes up to and including the next LF (or all of them), keeping only
// the unfinished line; complete lines are parsed at once, so a bad request
// line is refused without waiting for the rest of the head.
size_t RequestParser::feed_head(std::string_view data) {
  const void* lf = std::memchr(data.data(), '\n', data.size());
  const size_t take = lf ? size_t(static_cast<const char*>(lf) - data.data()) + 1 : data.size();
  if (head_bytes_ + take > limits_.max_head_bytes) {
    fail(431, "the request line and headers are larger than the server's limit");
    return take;
  }
  head_bytes_ += take;
  head_.append(data.data(), take);
  if (lf == nullptr) return take;
  std::string line = std::move(head_);
  head_.clear();
  line.pop_back();  // LF
  if (!line.empty() && line.back() == '\r') line.pop_back();
  on_line(line);
  return take;
}

size_t RequestParser::feed_body(std::string_view data) {
  const size_t take = std::min(data.size(), content_length_ - request_.body.size());
  request_.body.append(data.data(), take);
  if (request_.body.size() == content_length_) state_ = ParseState::kComplete;
  return take;
}

void RequestParser::on_line(std::string_view line) {
  if (!seen_request_line_) {
    // RFC 9112 2.2: empty lines before the request line are ignored.
    if (!line.empty()) on_request_line(line);
    return;
  }
  if (line.empty()) {
    on_head_end();
  } else {
    on_header_line(line);
  }
}

void RequestParser::on_request_line(std::string_view line) {
  seen_request_line_ = true;
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return fail(400, "malformed request line");
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method) || !valid_target(target)) return fail(400, "malformed request line");
  if (version == "HTTP/1.1") {
    request_.version_minor = 1;
  } else if (version == "HTTP/1.0") {
    request_.version_minor = 0;
  } else {
    return fail(400, "unsupported HTTP version");
  }
  if (!is_supported_method(method)) return fail(405, "unsupported method");
  request_.method = method;
  request_.target = target;
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
  request_.keep_alive = request_.version_minor == 1;
}

void RequestParser::on_header_line(std::string_view line) {
  if (request_.headers.size() >= limits_.max_header_lines) {
    return fail(431, "too many header lines");
  }
  // Obsolete line folding (a line starting with whitespace) is refused
  // (RFC 9112 5.2), as is whitespace before the colon.
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return fail(400, "malformed header line");
  const std::string_view name = line.substr(0, colon);
  const std::string_view value = trim_ows(line.substr(colon + 1));
  if (!is_token(name) || !valid_field_value(value)) return fail(400, "malformed header line");
  request_.headers.emplace_back(std::string(name), std::string(value));
}

void RequestParser::on_head_end() {
  bool saw_close = false, saw_keep_alive = false;
  for (const auto& [name, value] : request_.headers) {
    if (iequals(name, "Transfer-Encoding")) {
      // Request bodies must come with a Content-Length (RFC 9112 6.3 lets a
      // server refuse chunked bodies with 411).
      return fail(411, "chunked request bodies are not supported; send a Content-Length");
    }
    if (iequals(name, "Connection")) {
      for_each_element(value, [&](std::string_view e) {
        saw_close |= iequals(e, "close");
        saw_keep_alive |= iequals(e, "keep-alive");
      });
    }
    if (iequals(name, "Expect")) {
      if (!iequals(value, "100-continue")) return fail(417, "unsupported Expect header");
      request_.expect_continue = true;
    }
    if (iequals(name, "Content-Length")) {
      // Digits only; repeated Content-Length headers must agree. A value
      // past the limit is refused without parsing it further (no overflow).
      if (value.empty() ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return fail(400, "malformed Content-Length");
      }
      const std::string_view digits =
          std::string_view(value).substr(std::min(value.find_first_not_of('0'), value.size()));
      size_t n = 0;
      bool too_large = digits.size() > 18;
      for (char c : digits.substr(0, too_large ? 0 : digits.size())) n = n * 10 + size_t(c - '0');
      too_large |= n > limits_.max_body_bytes;
      if (too_large) return fail(413, "the request body is larger than the server's limit");
      if (has_content_length_ && n != content_length_) return fail(400, "conflicting Content-Length headers");
      has_content_length_ = true;
      content_length_ = n;
    }
  }
  request_.keep_alive = request_.version_minor == 1 ? !saw_close : (saw_keep_alive && !saw_close);
  state_ = content_length_ == 0 ? ParseState::kComplete : ParseState::kBody;
  if (state_ == ParseState::kBody) request_.body.reserve(content_length_);
}

void RequestParser::fail(int status, std::string message) {
  state_ = ParseState::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  head_.clear();
  head_.shrink_to_fit();
}

}  // namespace moeserve::server::http
