// The handler threads: a fixed number of workers taking tasks from a bounded
// FIFO. The API layer's handler may block (a plain generation waits for its
// answer), so it never runs on the event loop's threads; it runs here. When
// every worker is busy and the queue is full, offer() says no and the caller
// answers the request with a refusal instead of letting the backlog grow.
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
  WorkerPool(size_t threads, size_t queue_limit);
  ~WorkerPool() { shutdown(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // The workers that started (fewer than asked when the system refused
  // more threads; start_error() says why).
  size_t threads() const { return threads_.size(); }
  const std::string& start_error() const { return start_error_; }
  // Queues the task; false (the task dropped) when the queue is full or the
  // pool is shutting down.
  bool offer(std::function<void()> task);
  // Runs what is still queued, then joins the workers.
  void shutdown();

 private:
  void work();

  const size_t queue_limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool closing_ = false;
  std::vector<std::thread> threads_;
  std::string start_error_;
};

}  // namespace moeserve::server::http
