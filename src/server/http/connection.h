// One accepted connection on the event loop (Boost.Asio): reads requests in
// sequence (keep-alive and pipelining: bytes after one request are the start
// of the next), hands each to a handler thread, and writes the reply —
// streams included, which it pulls from the reply without blocking. Its
// handlers run on its strand, so one connection's state is never touched by
// two threads at once; a connection costs no thread while it waits. Every
// wait has a deadline, so a slow or silent client costs a few hundred bytes
// for a bounded time:
//   - head_timeout: the whole request head (from the first byte, or from the
//     start for a connection's first request) — this closes slowloris;
//   - idle_timeout: between keep-alive requests;
//   - body_timeout: the whole body, once the head is in;
//   - write_timeout: each write, a stream's included (a client that stops
//     reading a stream is cut, and its engine request cancelled).
// While the handler runs, the socket is watched: a client that hangs up is
// seen at once (client_alive() turns false, a stream is cancelled).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/http/request_parser.h"
#include "server/http/response.h"

namespace moeserve::server::http {

class ConnectionTable;

using Clock = std::chrono::steady_clock;
using Socket = boost::asio::ip::tcp::socket;

struct ConnectionOptions {
  HttpLimits limits;
  std::chrono::milliseconds head_timeout{30000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};
  std::chrono::milliseconds linger{1000};         // draining input after an error reply
  std::chrono::milliseconds ping_interval{1000};  // streams: SSE comment after this long without output
  // Streams are polled for output (see Connection::schedule_poll): at most
  // every poll_min, at least every poll_max.
  std::chrono::milliseconds poll_min{1};
  std::chrono::milliseconds poll_max{16};
};

// What every connection shares with the server; outlives them all.
struct ConnectionContext {
  ConnectionOptions options;
  Handler handler;
  ErrorReplier error_reply;
  // Runs `task` on a handler thread: `light` for requests of a method
  // without a body (GET, HEAD, OPTIONS), which have threads of their own so
  // that long generations never delay them. False when that queue is full.
  std::function<bool(bool light, std::function<void()> task)> dispatch;
  // Light requests' handler runs on the event loop instead (it never blocks).
  bool light_inline = false;
  boost::asio::io_context* io = nullptr;
  ConnectionTable* table = nullptr;
  const std::atomic<bool>* stopping = nullptr;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // The socket's executor must be a strand; the connection was admitted by
  // ctx.table for `peer` and releases it when it ends.
  Connection(Socket socket, ConnectionContext& ctx, std::string peer);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start();
  // The server is stopping: ends the connection as soon as what it is doing
  // allows (a reply being written is finished; a stream is cancelled). Any
  // thread.
  void stop();

 private:
  enum class Phase { kReading, kHandling, kWriting, kStreaming, kRefusing, kClosed };

  // Reading a request.
  void begin_request();
  void wait_readable();
  void on_readable(const boost::system::error_code& ec);
  void process_input();
  void dispatch();
  HttpReply call_handler(const HttpRequest& request);
  // Answering.
  void on_reply(std::optional<HttpReply> reply);
  void after_response(bool keep_alive);
  // Streams.
  void start_stream(HttpReply reply);
  void pump();
  void note_output(Clock::time_point now);
  void schedule_poll();
  void end_stream();
  void after_stream();
  void cancel_stream();
  // Watching the client while its request is handled or streamed.
  bool client_alive() const;
  void start_watch();
  void stop_watch();
  void on_watch(const boost::system::error_code& ec, uint64_t generation);
  void on_client_gone();
  // Refusals, deadlines, the end.
  void refuse(int status, const std::string& message);
  void linger_read();
  void on_server_stop();
  template <typename Buffers, typename Then>
  void write(const Buffers& buffers, Then then);
  void arm_deadline(std::chrono::milliseconds after);
  void disarm_deadline();
  void wait_for_deadline();
  void on_deadline();
  void close();
  bool stopping() const { return ctx_.stopping && ctx_.stopping->load(); }

  Socket socket_;
  const Socket::executor_type executor_;  // the strand
  ConnectionContext& ctx_;
  const std::string peer_;
  boost::asio::steady_timer deadline_;
  Clock::time_point deadline_at_ = Clock::time_point::max();  // max: none
  Clock::time_point timer_at_{};                              // when deadline_'s pending wait expires
  bool timer_waiting_ = false;
  boost::asio::steady_timer poll_;
  Phase phase_ = Phase::kReading;
  bool write_in_flight_ = false;

  // The request being read, and bytes received past it (a pipelined start).
  std::optional<RequestParser> parser_;
  bool first_request_ = true;
  bool in_body_ = false;
  std::string pending_;

  // The request being answered.
  bool keep_alive_ = false;
  bool head_only_ = false;
  int version_minor_ = 1;
  std::atomic<bool> client_gone_{false};
  bool watching_ = false;
  uint64_t watch_generation_ = 0;

  // What is being written, and the stream being pumped.
  std::string out_;
  std::string body_;
  HttpReply stream_;
  bool chunked_ = true;
  bool stream_keep_alive_ = false;
  bool stream_more_ = true;
  Clock::time_point last_output_{}, last_write_{};
  Clock::duration output_gap_{};  // between outputs while they flow (an average)
};

}  // namespace moeserve::server::http
