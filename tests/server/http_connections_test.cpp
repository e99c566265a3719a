// The event-loop front end under many connections: open connections cost
// no thread (5,000 idle ones leave the thread count where it was), the
// server's cap answers 503 at once instead of stalling, and the server's
// threads are fixed at start whatever the options.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "server/http_server.h"
#include "server/http_test_client.h"

namespace moeserve::server {
namespace {

using namespace std::chrono_literals;
using namespace http_test;

http::HttpReply echo(const http::HttpRequest& r, const std::function<bool()>&) {
  http::HttpReply reply;
  reply.content_type = "text/plain";
  reply.body = r.method + " " + r.path;
  return reply;
}

// Raises this process's open file limit as far as allowed; returns it.
size_t raise_open_files() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return rl.rlim_cur == RLIM_INFINITY ? size_t(1) << 20 : size_t(rl.rlim_cur);
}

class Served {
 public:
  explicit Served(HttpOptions o) {
    o.port = 0;
    server_ = std::make_unique<HttpServer>(o);
    server_->set_handler(echo);
    auto port = server_->bind();
    EXPECT_TRUE(port.is_ok());
    port_ = port.is_ok() ? *port : 0;
    thread_ = std::thread([this] { EXPECT_TRUE(server_->run().is_ok()); });
  }
  ~Served() {
    server_->stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

int health_status(Client& c) {
  if (!c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) return -1;
  const auto r = c.read_responses(1);
  return r.size() == 1 ? r[0].status : -1;
}

TEST(HttpConnections, ThousandsOfIdleConnectionsAddNoThread) {
  // Each connection is two descriptors here (client and server side).
  const size_t limit = raise_open_files();
  const size_t n = std::min<size_t>(5000, (limit - 256) / 2);
  if (n < 1000) GTEST_SKIP() << "the open file limit (" << limit << ") allows only " << n << " connections";
  HttpOptions o;
  o.max_connections = int(n) + 100;
  o.timeout_seconds = 120;  // nothing closes them while the test runs
  o.idle_timeout_ms = 120000;
  Served s(o);
  {
    Client warm(s.port());
    ASSERT_EQ(health_status(warm), 200);
  }
  std::this_thread::sleep_for(100ms);
  const size_t threads0 = thread_count();
  const size_t rss0 = vm_rss_kib();
  std::vector<std::unique_ptr<Client>> open;
  open.reserve(n);
  size_t answered = 0;
  for (size_t i = 0; i < n; ++i) {
    open.push_back(std::make_unique<Client>(s.port()));
    // A request on each proves the server took the connection; it then
    // stays open, idle, on keep-alive.
    if (health_status(*open.back()) == 200) ++answered;
  }
  std::this_thread::sleep_for(200ms);
  const size_t threads1 = thread_count();
  // The test's own client sockets count too (their memory is the kernel's,
  // not the process's), so this is an upper bound for the server's share.
  const size_t rss1 = vm_rss_kib();
  const double kib_each = double(rss1 > rss0 ? rss1 - rss0 : 0) / double(n);
  std::printf("%zu idle connections: threads %zu -> %zu, RSS +%.1f KiB a connection\n", n, threads0, threads1,
              kib_each);
  RecordProperty("idle_connections", int(n));
  RecordProperty("rss_kib_per_connection_x10", int(kib_each * 10));
  EXPECT_EQ(answered, n);
  EXPECT_LE(threads1, threads0);
  // All of them still served: a request on the oldest and the newest.
  EXPECT_EQ(health_status(*open.front()), 200);
  EXPECT_EQ(health_status(*open.back()), 200);
}

TEST(HttpConnections, PastTheServerCapA503AtOnce) {
  HttpOptions o;
  o.max_connections = 4;
  Served s(o);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Client>(s.port()));
    ASSERT_EQ(health_status(*held.back()), 200);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(refusal_status(s.port()), 503);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  // One closes: there is room again.
  held.pop_back();
  std::this_thread::sleep_for(200ms);
  Client again(s.port());
  EXPECT_EQ(health_status(again), 200);
}

TEST(HttpConnections, ThreadsAreFixedAtStart) {
  const size_t threads0 = thread_count();
  HttpOptions o;
  o.io_threads = 2;
  o.handler_threads = 3;
  o.light_handler_threads = 2;
  o.max_waiting_requests = 100000;  // a huge queue starts no extra thread
  Served s(o);
  std::this_thread::sleep_for(100ms);
  // run()'s own thread, one more event-loop thread and the handler threads.
  EXPECT_EQ(thread_count() - threads0, size_t(1 + 1 + 3 + 2));
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 50; ++i) {
    clients.push_back(std::make_unique<Client>(s.port()));
    ASSERT_EQ(health_status(*clients.back()), 200);
  }
  EXPECT_EQ(thread_count() - threads0, size_t(1 + 1 + 3 + 2));
}

TEST(HttpConnections, LightRequestsInlineNeedNoThreadOfTheirOwn) {
  const size_t threads0 = thread_count();
  HttpOptions o;
  o.handler_threads = 2;
  o.light_requests_inline = true;
  Served s(o);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(thread_count() - threads0, size_t(1 + 2));  // run()'s thread and the handler threads
  Client c(s.port());
  EXPECT_EQ(health_status(c), 200);
  ASSERT_TRUE(c.send("POST /p HTTP/1.1\r\nContent-Length: 1\r\n\r\nx"));
  const auto r = c.read_responses(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].body, "POST /p");
}

}  // namespace
}  // namespace moeserve::server
