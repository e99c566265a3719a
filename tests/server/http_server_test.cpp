// The HTTP server over real loopback sockets, with a small fake handler:
// keep-alive and pipelining, streams, every limit and timeout, stop().
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <thread>

namespace moeserve::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A fake service: echoes method, path and body; /stream streams 3 events
// with an idle turn (a ping) between them; /forever streams until cancelled;
// /throw throws.
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
    if (r.path == "/stream" || r.path == "/forever") {
      reply.content_type = "text/event-stream";
      auto step = std::make_shared<int>(0);
      const bool forever = r.path == "/forever";
      reply.next = [step, forever](std::string& out, std::chrono::milliseconds wait) {
        if (forever) {
          std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(100)));
          return true;
        }
        const int i = (*step)++;
        if (i == 1) return true;  // nothing ready: the server pings
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

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// Splits raw bytes into responses (Content-Length or chunked bodies).
std::vector<Response> parse_responses(std::string_view s) {
  std::vector<Response> out;
  while (!s.empty()) {
    const size_t end = s.find("\r\n\r\n");
    if (end == std::string_view::npos || s.substr(0, 9).find("HTTP/1.1 ") != 0) break;
    Response r;
    r.status = std::atoi(std::string(s.substr(9, 3)).c_str());
    std::string_view head = s.substr(0, end);
    s.remove_prefix(end + 4);
    for (size_t p = head.find("\r\n"); p != std::string_view::npos; p = head.find("\r\n")) {
      head.remove_prefix(p + 2);
      const std::string_view line = head.substr(0, head.find("\r\n"));
      const size_t colon = line.find(':');
      std::string name(line.substr(0, colon));
      for (char& c : name) c = char(std::tolower(c));
      r.headers[name] = std::string(line.substr(colon + 2));
    }
    if (r.headers.count("transfer-encoding")) {
      for (;;) {
        const size_t n = std::stoul(std::string(s.substr(0, s.find("\r\n"))), nullptr, 16);
        s.remove_prefix(s.find("\r\n") + 2);
        r.body += s.substr(0, n);
        s.remove_prefix(n + 2);
        if (n == 0) break;
      }
    } else if (r.headers.count("content-length")) {
      const size_t n = std::stoul(r.headers["content-length"]);
      r.body = s.substr(0, n);
      s.remove_prefix(std::min(n, s.size()));
    }
    out.push_back(std::move(r));
  }
  return out;
}

size_t vm_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  }
  return 0;
}

class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{10, 0};  // no test hangs
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~Client() { ::close(fd_); }
  bool send(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(size_t(n));
    }
    return true;
  }
  // Reads until the server closes (true) or the 10 s receive timeout (false).
  bool read_to_close(std::string& out) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        out.append(buf, size_t(n));
        continue;
      }
      return n == 0 || errno == ECONNRESET;
    }
  }
  // Reads until `count` complete responses arrived.
  std::vector<Response> read_responses(size_t count) {
    std::string data;
    char buf[65536];
    while (parse_responses(data).size() < count) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      data.append(buf, size_t(n));
    }
    return parse_responses(data);
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// The single response of a connection the server answers and closes
// without a request (a refusal); its status, or -1 when there is not
// exactly one.
int refusal_status(int port) {
  Client c(port);
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  const auto r = parse_responses(raw);
  EXPECT_EQ(r.size(), 1u) << raw;
  return r.size() == 1 ? r[0].status : -1;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpOptions o = {}, bool with_handler = true) {
    o.port = 0;
    if (o.threads == 64) o.threads = 8;
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
  EXPECT_EQ(r[0].body, "data: 0\n\n: ping\n\ndata: 2\n\ndata: 3\n\n");
  EXPECT_EQ(fake_.cancelled.load(), 0);
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
  {
    Client c(port_);
    ASSERT_TRUE(c.send("GET /wait HTTP/1.1\r\n\r\n"));
    std::this_thread::sleep_for(100ms);
  }
  const auto t0 = Clock::now();
  while (fake_.cancelled.load() == 0 && Clock::now() - t0 < 5s) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fake_.cancelled.load(), 1);
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

TEST_F(HttpServerTest, FullQueueGets503) {
  HttpOptions o;
  o.threads = 4;
  o.queue_per_thread = 1;
  start(o);
  // Four connections hold the four threads, four wait in the queue.
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<Client>(port_));
    if (i < 4) std::this_thread::sleep_for(50ms);  // taken by a thread before the next one comes
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(refusal_status(port_), 503);
}

TEST_F(HttpServerTest, PerClientConnectionCapGets429) {
  HttpOptions o;
  o.threads = 8;
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
