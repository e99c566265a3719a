// Accepts connections on the event loop and admits them under the caps of
// ConnectionTable: past the server's cap a connection gets a 503 and past a
// client's a 429, written at once and closed — an answer, never a stall.
// Each admitted connection gets a strand of its own.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "server/http/connection.h"

namespace moeserve::server::http {

class AcceptLoop {
 public:
  AcceptLoop(boost::asio::io_context& io, ConnectionContext& ctx);

  // Adopts a listening socket (its family: AF_INET or AF_INET6).
  boost::system::error_code open(int family, int fd);
  void start();
  // Stops accepting and closes the listening socket. Any thread.
  void stop();

 private:
  void accept_next();
  void on_accept(const boost::system::error_code& ec, Socket socket);
  void admit(Socket socket);
  // Writes a short error reply without waiting and closes.
  void refuse_now(Socket& socket, int status, const std::string& message);

  boost::asio::io_context& io_;
  boost::asio::strand<boost::asio::io_context::executor_type> strand_;  // the acceptor's handlers
  boost::asio::ip::tcp::acceptor acceptor_;
  ConnectionContext& ctx_;
  boost::asio::steady_timer backoff_;
  bool stopped_ = false;
};

}  // namespace moeserve::server::http
