#include "server/http/accept_loop.h"

#include <sys/socket.h>

#include <boost/asio/strand.hpp>

#include "server/http/connection_table.h"

namespace moeserve::server::http {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

// accept() errors that mean "out of descriptors or memory": waiting a moment
// beats spinning on a listening socket that stays readable.
bool out_of_resources(const error_code& ec) {
  return ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space ||
         ec == asio::error::no_memory || ec.value() == ENFILE;
}

}  // namespace

AcceptLoop::AcceptLoop(asio::io_context& io, ConnectionContext& ctx)
    : io_(io), strand_(asio::make_strand(io)), acceptor_(strand_), ctx_(ctx), backoff_(strand_) {}

error_code AcceptLoop::open(int family, int fd) {
  error_code ec;
  acceptor_.assign(family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), fd, ec);
  return ec;
}

void AcceptLoop::start() {
  asio::post(strand_, [this] { accept_next(); });
}

void AcceptLoop::stop() {
  asio::post(strand_, [this] {
    stopped_ = true;
    error_code ec;
    acceptor_.close(ec);
    backoff_.cancel();
  });
}

void AcceptLoop::accept_next() {
  if (stopped_) return;
  acceptor_.async_accept(asio::make_strand(io_), [this](const error_code& ec, auto socket) {
    on_accept(ec, Socket(std::move(socket)));
  });
}

void AcceptLoop::on_accept(const error_code& ec, Socket socket) {
  if (stopped_ || ec == asio::error::operation_aborted) return;
  if (ec) {
    if (!out_of_resources(ec)) return accept_next();
    backoff_.expires_after(std::chrono::milliseconds(50));
    backoff_.async_wait([this](const error_code& wait_ec) {
      if (!wait_ec) accept_next();
    });
    return;
  }
  try {
    admit(std::move(socket));
  } catch (const std::exception&) {  // out of memory for this one: the next may fit
  }
  accept_next();
}

void AcceptLoop::admit(Socket socket) {
  std::string peer;
  if (ctx_.table->per_client_limited()) {
    error_code ec;
    const auto endpoint = socket.remote_endpoint(ec);
    if (!ec) peer = endpoint.address().to_string();
  }
  switch (ctx_.table->admit(peer)) {
    case ConnectionTable::Admission::kServerFull:
      return refuse_now(socket, 503, "the server has too many open connections; retry shortly");
    case ConnectionTable::Admission::kClientFull:
      return refuse_now(socket, 429, "too many open connections from this client; close some and retry");
    case ConnectionTable::Admission::kAdmitted:
      break;
  }
  std::shared_ptr<Connection> connection;
  try {
    connection = std::make_shared<Connection>(std::move(socket), ctx_, peer);
    ctx_.table->attach(connection);
  } catch (const std::exception&) {  // out of memory: this connection is dropped, the server goes on
    if (!connection) ctx_.table->release(nullptr, peer);
    return;
  }
  connection->start();
}

// Non-blocking: a client that cannot take the few hundred bytes at once loses them.
void AcceptLoop::refuse_now(Socket& socket, int status, const std::string& message) {
  const HttpReply reply = ctx_.error_reply(status, message);
  const std::string out = response_head(reply, false) + reply.body;
  [[maybe_unused]] const ssize_t n =
      ::send(socket.native_handle(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  error_code ec;
  socket.shutdown(Socket::shutdown_send, ec);
  socket.close(ec);
}

}  // namespace moeserve::server::http
