// Test helpers for the HTTP server: a blocking loopback client and a parser
// of raw responses (Content-Length or chunked bodies).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::server::http_test {

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// Splits raw bytes into responses (Content-Length or chunked bodies).
inline std::vector<Response> parse_responses(std::string_view s) {
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

inline size_t vm_rss_kib() {
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
inline int refusal_status(int port) {
  Client c(port);
  std::string raw;
  EXPECT_TRUE(c.read_to_close(raw));
  const auto r = parse_responses(raw);
  EXPECT_EQ(r.size(), 1u) << raw;
  return r.size() == 1 ? r[0].status : -1;
}

// Threads of this process.
inline size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

}  // namespace moeserve::server::http_test
