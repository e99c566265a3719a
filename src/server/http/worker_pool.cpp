#include "server/http/worker_pool.h"

#include <system_error>

namespace moeserve::server::http {

WorkerPool::WorkerPool(size_t threads, size_t queue_limit) : queue_limit_(queue_limit) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    try {
      threads_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      // The system refused another thread (a thread or address-space
      // limit): serve with those that started; the caller reports it.
      start_error_ = e.what();
      break;
    }
  }
}

bool WorkerPool::offer(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (closing_ || queue_.size() >= queue_limit_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkerPool::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (closing_ && threads_.empty()) return;
    closing_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void WorkerPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Tasks catch what their handler throws; this is the last line, so
    // that a worker never takes the process down.
    try {
      task();
    } catch (...) {
    }
  }
}

}  // namespace moeserve::server::http
