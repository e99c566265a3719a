// The incremental HTTP/1.1 request parser (Beast's parser underneath, the
// server's policy on top): valid requests in any split, pipelining, every
// limit, malformed input.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/http/request_parser.h"

namespace moeserve::server::http {
namespace {

const std::string kPost =
    "POST /v1/chat%2Fx?a=1 HTTP/1.1\r\nHost: x\r\ncontent-length: 11\r\nAuthorization:  Bearer k "
    "\r\n\r\nhello world";

// Feeds everything; returns the parser (and how much it used).
RequestParser parse(std::string_view in, size_t* used = nullptr, HttpLimits limits = {}) {
  RequestParser p(limits);
  const size_t n = p.feed(in);
  if (used) *used = n;
  return p;
}

TEST(HttpParser, ParsesARequest) {
  size_t used = 0;
  const RequestParser p = parse(kPost, &used);
  ASSERT_EQ(p.state(), ParseState::kComplete);
  EXPECT_EQ(used, kPost.size());
  const HttpRequest& r = p.request();
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v1/chat/x");
  EXPECT_EQ(r.query, "a=1");
  EXPECT_EQ(r.body, "hello world");
  EXPECT_EQ(r.header("AUTHORIZATION"), "Bearer k");
  EXPECT_EQ(r.header("Content-Length"), "11");
  EXPECT_EQ(r.header("missing"), "");
  EXPECT_TRUE(r.keep_alive);
}

TEST(HttpParser, AnySplitGivesTheSameRequest) {
  for (size_t cut = 0; cut <= kPost.size(); ++cut) {
    RequestParser p;
    size_t used = p.feed(std::string_view(kPost).substr(0, cut));
    used += p.feed(std::string_view(kPost).substr(used));
    ASSERT_EQ(p.state(), ParseState::kComplete) << cut;
    EXPECT_EQ(used, kPost.size());
    EXPECT_EQ(p.request().body, "hello world");
  }
  RequestParser bytewise;
  for (char c : kPost) EXPECT_EQ(bytewise.feed(std::string_view(&c, 1)), 1u);
  ASSERT_EQ(bytewise.state(), ParseState::kComplete);
  EXPECT_EQ(bytewise.request().header("authorization"), "Bearer k");
  EXPECT_EQ(bytewise.request().body, "hello world");
}

TEST(HttpParser, PipelinedRequestsAreLeftForTheNextParser) {
  const std::string in = "GET /a HTTP/1.1\r\n\r\n" + kPost +
                         "GET /c HTTP/1.1\r\n\r\nGET /d HTTP/1.1\r\nConnection: close\r\n\r\n";
  std::string_view rest = in;
  std::vector<std::string> paths;
  while (!rest.empty()) {
    RequestParser p;
    rest.remove_prefix(p.feed(rest));
    ASSERT_EQ(p.state(), ParseState::kComplete);
    paths.push_back(p.request().path + (p.request().keep_alive ? "" : "!"));
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"/a", "/v1/chat/x", "/c", "/d!"}));
}

TEST(HttpParser, PartialInputNeedsMore) {
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: x\r\n").state(), ParseState::kHead);
  const RequestParser p = parse("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab");
  EXPECT_EQ(p.state(), ParseState::kBody);
  EXPECT_FALSE(parse("").started());
}

TEST(HttpParser, ConnectionSemantics) {
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").request().keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").request().keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nconnection: foo, CLOSE\r\n\r\n").request().keep_alive);
  EXPECT_TRUE(parse("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
                  .request()
                  .expect_continue);
}

TEST(HttpParser, TolerantForms) {
  // Leading empty lines, absolute-form targets, repeated equal
  // Content-Lengths, a POST without a body, obsolete line folding (joined
  // with a space, as RFC 9112 5.2 allows).
  EXPECT_EQ(parse("\r\n\r\nGET /x HTTP/1.1\r\n\r\n").request().path, "/x");
  EXPECT_FALSE(parse("\r\n\r\n").started());
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n").request().header("A"), "b folded");
  EXPECT_EQ(parse("GET http://h:1/p?q HTTP/1.1\r\n\r\n").request().path, "/p");
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab").request().body,
            "ab");
  EXPECT_EQ(parse("POST / HTTP/1.1\r\n\r\n").state(), ParseState::kComplete);
  EXPECT_EQ(parse("GET /%zz%4 HTTP/1.1\r\n\r\n").request().path, "/%zz%4");
}

TEST(HttpParser, Limits) {
  HttpLimits small{.max_head_bytes = 100, .max_header_lines = 3, .max_body_bytes = 10};
  RequestParser big(small);
  const std::string flood = "GET / HTTP/1.1\r\n" + std::string(1000, 'a');
  EXPECT_LE(big.feed(flood), flood.size());
  EXPECT_EQ(big.state(), ParseState::kError);
  EXPECT_EQ(big.error_status(), 431);
  EXPECT_EQ(big.feed("more"), 0u);  // nothing more is taken after an error

  EXPECT_EQ(parse("GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\n\r\n", nullptr, small).error_status(),
            431);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n", nullptr, small).state(),
            ParseState::kComplete);
  // The body limit is checked on the Content-Length, before any body byte.
  const std::string head = "POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n";
  const RequestParser too_big = parse(head + std::string(11, 'b'), nullptr, small);
  EXPECT_EQ(too_big.error_status(), 413);
  EXPECT_TRUE(too_big.request().body.empty());
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").error_status(), 413);
  EXPECT_EQ(
      parse("POST / HTTP/1.1\r\nContent-Length: 000000000000000000000010\r\n\r\n", nullptr, small).state(),
      ParseState::kBody);
}

TEST(HttpParser, MalformedInputIsRefused) {
  const std::pair<const char*, int> cases[] = {
      {"GET\r\n\r\n", 400},
      {"GET / HTTP/1.1 extra\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 400},
      {"BREW /pot HTCPCP/1.0\r\n\r\n", 400},
      {"BREW /pot HTTP/1.1\r\n\r\n", 405},
      {"G@T / HTTP/1.1\r\n\r\n", 400},
      {"GET nopath HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nName : v\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\n: v\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX-\x01: v\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411},
      {"GET / HTTP/1.1\r\nExpect: tea\r\n\r\n", 417},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 411},
      // Bare LF line endings (RFC 9112 2.2 lets a server refuse them).
      {"GET /x HTTP/1.1\nHost: y\n\n", 400},
  };
  for (const auto& [in, status] : cases) {
    const RequestParser p = parse(in);
    EXPECT_EQ(p.state(), ParseState::kError) << in;
    EXPECT_EQ(p.error_status(), status) << in;
    EXPECT_FALSE(p.error_message().empty());
  }
  // NUL bytes in the request line.
  EXPECT_EQ(parse(std::string("GET /\0 HTTP/1.1\r\n\r\n", 19)).error_status(), 400);
}

TEST(HttpParser, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  const std::string alphabet = "GET POST/ HTTP/1.1\r\n:Content-Length: 0123456789\x00\x7f\xff";
  for (int i = 0; i < 5000; ++i) {
    std::string in;
    const size_t n = rng() % 300;
    for (size_t j = 0; j < n; ++j) {
      in.push_back(rng() % 3 ? alphabet[rng() % alphabet.size()] : char(rng()));
    }
    RequestParser p(HttpLimits{.max_head_bytes = 128, .max_header_lines = 4, .max_body_bytes = 64});
    size_t used = 0;
    while (used < in.size()) {
      const size_t step = std::min<size_t>(1 + rng() % 16, in.size() - used);
      const size_t took = p.feed(std::string_view(in).substr(used, step));
      used += took;
      if (took < step) break;
    }
    ASSERT_LE(used, in.size());
    if (p.state() == ParseState::kError) {
      EXPECT_GE(p.error_status(), 400);
    }
  }
}

}  // namespace
}  // namespace moeserve::server::http
