// The HTTP server over real loopback sockets, with a small fake handler:
// keep-alive and pipelining, streams, every limit and timeout, stop().
// (The connection caps and the thread count under many idle connections:
// http_connections_test.cpp.)
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server/http_test_client.h"

namespace moeserve::server {
namespace {

using namespace std::chrono_literals;
using namespace http_test;
using Clock = std::chrono::steady_clock;

// A fake service: echoes method, path and body; /stream streams 3 events
// with an idle turn between them; /quiet stays silent for 600 ms, then ends;
// /forever streams until cancelled; /firehose streams 64 KiB a turn until
// cancelled; /wait answers once the client is gone; /throw throws.
struct Fake {
  std::atomic<int> cancelled{0};

  http::HttpReply operator()(const http::HttpRequest& r, const std::function<bool()>& client_alive) {
    http::HttpReply reply;
    reply.content_type = "text/plain";
    if (r.path == "/throw") throw std::runtime_error("boom");
    if (r.path == "/wait") {  // a plain reply that takes long: ends when the client goes
      while (client_alive()) std::this_thread::sleep_for(20ms);
      ++cancelled;
      return reply;
    }
    if (r.path == "/stream" || r.path == "/forever" || r.path == "/quiet" || r.path == "/firehose") {
      reply.content_type = "text/event-stream";
      auto step = std::make_shared<int>(0);
      const std::string path = r.path;
      const auto t0 = Clock::now();
      reply.next = [step, path, t0](std::string& out, std::chrono::milliseconds wait) {
        std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(100)));
        if (path == "/forever") return true;
        if (path == "/firehose") {
          out += "data: " + std::string(65536, 'x') + "\n\n";
          return true;
        }
        if (path == "/quiet") {
          if (Clock::now() - t0 < 600ms) return true;
          out += "data: end\n\n";
          return false;
        }
        const int i = (*step)++;
        if (i == 1) return true;  // nothing ready this turn
        out += "data: " + std::to_string(i) + "\n\n";
        return i < 3;
      };
      reply.cancel = [this] { ++cancelled; };
      return reply;
    }
    reply.body = r.method + " " + r.path + " " + r.body;
    return reply;
  }
};

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpOptions o = {}, bool with_handler = true) {
    o.port = 0;
    server_ = std::make_unique<HttpServer>(o);
    if (with_handler)
      server_->set_handler(
          [this](const http::HttpRequest& r, const std::function<bool()>& alive) { return fake_(r, alive); });
    auto port = server_->bind();
    ASSERT_TRUE(port.is_ok());
    port_ = *port;
    thread_ = std::thread([this] { EXPECT_TRUE(server_->run().is_ok()); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }

  Fake fake_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(HttpServerTest, KeepAliveAndPipelining) {
  start();
  Client c(port_);
  ASSERT_TRUE(c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto first = c.read_responses(1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].body, "GET /a ");
  EXPECT_EQ(first[0].headers.at("connection"), "keep-alive");
  // Four requests in one write: four responses, in order.
  ASSERT_TRUE(
      c.send("GET /1 HTTP/1.1\r\n\r\nPOST /2 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcPUT /3 "
             "HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
             "DELETE /4 HTTP/1.1\r\nConnection: close\r\n\r\n"));
  std::string rest;
  EXPECT_TRUE(c.read_to_close(rest));
  const auto r = parse_responses(rest);
  ASSERT_EQ(r.size(), 4u) << rest;
  EXPECT_EQ(r[0].body, "GET /1 ");
  EXPECT_EQ(r[1].body, "POST /2 abc");
  EXPECT_EQ(r[2].body, "PUT /3 ");
  EXPECT_EQ(r[3].body, "DELETE /4 ");
  EXPECT_EQ(r[3].headers.at("connection"), "close");
}

TEST_F(HttpServerTest, HeadAndHttp10) {
  start();
  Client c(port_);
  ASSERT_TRUE(c.send("HEAD /h HTTP/1.1\r\n\r\nGET /g HTTP/1.0\r\n\r\n"));
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));  // HTTP/1.0 without keep-alive: closed
  EXPECT_EQ(raw.find("HEAD /h"), std::string::npos);
  EXPECT_NE(raw.find("Content-Length: 8\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("GET /g "), std::string::npos) << raw;
}

TEST_F(HttpServerTest, StreamsChunkedSse) {
  start();
  Client c(port_);
  ASSERT_TRUE(c.send("GET /stream HTTP/1.1\r\nConnection: close\r\n\r\n"));
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw;
  EXPECT_EQ(r[0].status, 200);
  EXPECT_EQ(r[0].headers.at("transfer-encoding"), "chunked");
  EXPECT_EQ(r[0].headers.at("cache-control"), "no-cache");
  EXPECT_EQ(r[0].headers.at("content-type"), "text/event-stream");
  EXPECT_EQ(r[0].body, "data: 0\n\ndata: 2\n\ndata: 3\n\n");
  EXPECT_EQ(fake_.cancelled.load(), 0);
}

TEST_F(HttpServerTest, SilentStreamsArePinged) {
  HttpOptions o;
  o.ping_interval_ms = 200;
  start(o);
  Client c(port_);
  ASSERT_TRUE(c.send("GET /quiet HTTP/1.1\r\nConnection: close\r\n\r\n"));
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw;
  EXPECT_EQ(r[0].body.rfind(": ping\n\n", 0), 0u) << r[0].body;
  EXPECT_NE(r[0].body.find("data: end\n\n"), std::string::npos);
}

TEST_F(HttpServerTest, Http10StreamEndsWithTheConnection) {
  start();
  Client c(port_);
  ASSERT_TRUE(c.send("GET /stream HTTP/1.0\r\n\r\n"));
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  EXPECT_EQ(raw.find("Transfer-Encoding"), std::string::npos) << raw;
  EXPECT_NE(raw.find("Connection: close\r\n\r\ndata: 0\n\ndata: 2\n\ndata: 3\n\n"), std::string::npos) << raw;
}

TEST_F(HttpServerTest, SlowStreamReaderIsCutAndCancelled) {
  HttpOptions o;
  o.timeout_seconds = 1;  // each write must finish within a second
  start(o);
  Client c(port_);
  int small = 4096;  // a small receive window fills quickly
  ::setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ASSERT_TRUE(c.send("GET /firehose HTTP/1.1\r\n\r\n"));
  // The client reads nothing: once the socket buffers are full, a write
  // stalls, the write deadline cuts the connection, the stream is cancelled.
  const auto t0 = Clock::now();
  while (fake_.cancelled.load() == 0 && Clock::now() - t0 < 8s) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fake_.cancelled.load(), 1);
  EXPECT_LT(Clock::now() - t0, 5s);
}

TEST_F(HttpServerTest, ExpectContinue) {
  start();
  Client c(port_);
  ASSERT_TRUE(c.send("POST /e HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"));
  char buf[256];
  const ssize_t n = ::recv(c.fd(), buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, size_t(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(c.send("abc"));
  const auto r = c.read_responses(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].body, "POST /e abc");
}

TEST_F(HttpServerTest, ClosedStreamClientIsCancelled) {
  start();
  {
    Client c(port_);
    ASSERT_TRUE(c.send("GET /forever HTTP/1.1\r\n\r\n"));
    char buf[256];
    ASSERT_GT(::recv(c.fd(), buf, sizeof buf, 0), 0);
  }
  const auto t0 = Clock::now();
  while (fake_.cancelled.load() == 0 && Clock::now() - t0 < 8s) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fake_.cancelled.load(), 1);
}

TEST_F(HttpServerTest, PlainRequestSeesTheClientGo) {
  start();
  for (const char* method : {"GET", "POST"}) {
    fake_.cancelled = 0;
    {
      Client c(port_);
      ASSERT_TRUE(c.send(std::string(method) + " /wait HTTP/1.1\r\n\r\n"));
      std::this_thread::sleep_for(100ms);
    }
    const auto t0 = Clock::now();
    while (fake_.cancelled.load() == 0 && Clock::now() - t0 < 5s) std::this_thread::sleep_for(20ms);
    EXPECT_EQ(fake_.cancelled.load(), 1) << method;
  }
}

TEST_F(HttpServerTest, BodyOverTheLimitGets413AndClose) {
  HttpOptions o;
  o.max_body_bytes = 1 << 20;
  start(o);
  Client c(port_);
  const std::string body(2 << 20, 'x');
  c.send("POST /big HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw.substr(0, 300);
  EXPECT_EQ(r[0].status, 413);
  EXPECT_NE(r[0].body.find("\"body_too_large\""), std::string::npos) << r[0].body;
  EXPECT_EQ(r[0].headers.at("connection"), "close");
}

TEST_F(HttpServerTest, HeaderFloodStopsAtTheLimit) {
  start();
  Client c(port_);
  const size_t rss0 = vm_rss_kib();
  std::atomic<size_t> sent{0};
  std::thread writer([&] {
    if (!c.send("GET / HTTP/1.1\r\nHost: x\r\n")) return;
    std::string block;
    for (int i = 0; i < 1000; ++i) block += "X-Padding: " + std::string(100, 'v') + "\r\n";
    while (sent < (200u << 20) && c.send(block)) sent += block.size();
  });
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  ::shutdown(c.fd(), SHUT_RDWR);  // ends the writer if it is still going
  writer.join();
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw.substr(0, 300);
  EXPECT_EQ(r[0].status, 431);
  const double growth_mib = (double(vm_rss_kib()) - double(rss0)) / 1024;
  EXPECT_LT(growth_mib, 16) << "sent " << sent / 1048576 << " MiB";
}

TEST_F(HttpServerTest, SlowlorisIsClosedAtTheHeadDeadline) {
  HttpOptions o;
  o.head_timeout_ms = 1000;
  start(o);
  Client c(port_);
  std::atomic<bool> done{false};
  std::thread drip([&] {
    c.send("GET / HTTP/1.1\r\nX-Slow: ");
    while (!done && c.send("a")) std::this_thread::sleep_for(200ms);
  });
  const auto t0 = Clock::now();
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  drip.join();
  EXPECT_LT(took, 2.5);
  for (const auto& r : parse_responses(raw)) EXPECT_EQ(r.status, 408);
}

TEST_F(HttpServerTest, SlowBodyGets408) {
  HttpOptions o;
  o.timeout_seconds = 1;
  start(o);
  Client c(port_);
  ASSERT_TRUE(c.send("POST /b HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"));
  const auto t0 = Clock::now();
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  EXPECT_LT(Clock::now() - t0, 3s);
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw;
  EXPECT_EQ(r[0].status, 408);
}

TEST_F(HttpServerTest, IdleKeepAliveCloses) {
  HttpOptions o;
  o.idle_timeout_ms = 300;
  start(o);
  Client c(port_);
  ASSERT_TRUE(c.send("GET /a HTTP/1.1\r\n\r\n"));
  const auto t0 = Clock::now();
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  EXPECT_LT(Clock::now() - t0, 2s);
  ASSERT_EQ(parse_responses(raw).size(), 1u);  // answered, then closed quietly
}

TEST_F(HttpServerTest, RefusalsCloseTheConnection) {
  start();
  const std::pair<const char*, int> cases[] = {
      {"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 411},
      {"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400},
      {"\x16\x03\x01\x02\x01\xfc\x03\x03 random\r\n\r\n", 400},
      {"GET /throw HTTP/1.1\r\nConnection: close\r\n\r\n", 500},
  };
  for (const auto& [raw_request, status] : cases) {
    Client c(port_);
    c.send(raw_request);
    std::string raw;
    EXPECT_TRUE(c.read_to_close(raw));
    const auto r = parse_responses(raw);
    ASSERT_EQ(r.size(), 1u) << raw;
    EXPECT_EQ(r[0].status, status);
    EXPECT_NE(r[0].body.find("\"error\""), std::string::npos);
  }
}

TEST_F(HttpServerTest, LoadingBeforeAServiceIsSet) {
  start({}, /*with_handler=*/false);
  Client c(port_);
  ASSERT_TRUE(c.send("GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n"));
  const auto r = c.read_responses(2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].status, 503);
  EXPECT_EQ(r[0].body, R"({"status":"loading"})");
  EXPECT_EQ(r[1].status, 503);
  EXPECT_NE(r[1].body.find("\"error\""), std::string::npos);
}

TEST_F(HttpServerTest, TooManyWaitingRequestsGet429) {
  HttpOptions o;
  o.handler_threads = 1;
  o.max_waiting_requests = 1;
  start(o);
  // One request holds the handler thread, one waits for it: the third is refused.
  Client busy(port_), waiting(port_);
  ASSERT_TRUE(busy.send("POST /wait HTTP/1.1\r\n\r\n"));
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(waiting.send("POST /wait HTTP/1.1\r\n\r\n"));
  std::this_thread::sleep_for(100ms);
  Client third(port_);
  ASSERT_TRUE(third.send("POST /x HTTP/1.1\r\n\r\n"));
  std::string raw;
  EXPECT_TRUE(third.read_to_close(raw));
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw;
  EXPECT_EQ(r[0].status, 429);
  EXPECT_NE(r[0].body.find("\"error\""), std::string::npos);
  // Requests without a body have threads of their own: still answered.
  Client health(port_);
  ASSERT_TRUE(health.send("GET /health HTTP/1.1\r\n\r\n"));
  const auto h = health.read_responses(1);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].status, 200);
}

TEST_F(HttpServerTest, PerClientConnectionCapGets429) {
  HttpOptions o;
  o.max_connections_per_client = 2;
  start(o);
  auto a = std::make_unique<Client>(port_);
  auto b = std::make_unique<Client>(port_);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(refusal_status(port_), 429);
  // One closes: the client may open another, which is served.
  a.reset();
  std::this_thread::sleep_for(200ms);
  Client again(port_);
  ASSERT_TRUE(again.send("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"));
  std::string raw;
  EXPECT_TRUE(again.read_to_close(raw));
  const auto r = parse_responses(raw);
  ASSERT_EQ(r.size(), 1u) << raw;
  EXPECT_EQ(r[0].status, 200);
}

TEST_F(HttpServerTest, StopReturnsPromptlyWithConnectionsOpen) {
  start();
  Client idle(port_), half(port_), streaming(port_);
  half.send("GET / HTTP/1.1\r\nHost");
  streaming.send("GET /forever HTTP/1.1\r\n\r\n");
  char buf[256];
  ASSERT_GT(::recv(streaming.fd(), buf, sizeof buf, 0), 0);
  const auto t0 = Clock::now();
  server_->stop();
  thread_.join();
  EXPECT_LT(Clock::now() - t0, 1500ms);
  EXPECT_EQ(fake_.cancelled.load(), 1);
}

TEST_F(HttpServerTest, PortInUseIsAClearError) {
  start();
  HttpOptions o;
  o.port = port_;
  HttpServer second(o);
  const auto r = second.bind();
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("--port"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::server
