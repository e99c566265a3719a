// The connection threads: a fixed number of workers taking accepted sockets
// from a bounded queue. When every worker is busy and the queue is full,
// offer() says no and the accept thread refuses the connection (503) instead
// of letting the backlog grow without bound.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moeserve::server::http {

class WorkerPool {
 public:
  // serve(fd) owns fd (closes it).
  WorkerPool(size_t threads, size_t queue_limit, std::function<void(int fd)> serve);
  ~WorkerPool() { shutdown(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // The workers that started (fewer than asked when the system refused
  // more threads; start_error() says why).
  size_t threads() const { return threads_.size(); }
  const std::string& start_error() const { return start_error_; }
  // Queues fd for a worker; false (fd untouched) when the queue is full.
  bool offer(int fd);
  // Closes what is still queued and joins the workers (they return once the
  // connection they serve ends; the server's stop event ends those).
  void shutdown();

 private:
  void work();

  const size_t queue_limit_;
  std::function<void(int)> serve_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  bool closing_ = false;
  std::vector<std::thread> threads_;
  std::string start_error_;
};

}  // namespace moeserve::server::http
