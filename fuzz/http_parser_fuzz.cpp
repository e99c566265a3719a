// libFuzzer target for the HTTP/1.1 request parser: arbitrary bytes, fed in
// pieces whose sizes come from the input's first byte, as pipelined requests
// (each complete request's leftover bytes go to a fresh parser). The parser
// must never crash, never take more than it was given, and stay within its
// limits.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/http/request_parser.h"

using moeserve::server::http::HttpLimits;
using moeserve::server::http::ParseState;
using moeserve::server::http::RequestParser;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 64;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const HttpLimits limits{.max_head_bytes = 1024, .max_header_lines = 16, .max_body_bytes = 512};
  while (!in.empty()) {
    RequestParser p(limits);
    size_t used = 0;
    while (used < in.size()) {
      const size_t piece = std::min(step, in.size() - used);
      const size_t took = p.feed(in.substr(used, piece));
      if (took > piece) __builtin_trap();
      used += took;
      if (took < piece) break;  // complete or refused
    }
    if (p.state() == ParseState::kError) {
      if (p.error_status() < 400 || p.error_status() > 499) __builtin_trap();
      return 0;
    }
    if (p.state() != ParseState::kComplete) return 0;
    const auto& r = p.request();
    if (r.body.size() > limits.max_body_bytes || r.headers.size() > limits.max_header_lines) __builtin_trap();
    (void)r.header("content-length");
    if (used == 0) return 0;
    in.remove_prefix(used);
  }
  return 0;
}
