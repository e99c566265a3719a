#include "server/http/worker_pool.h"

#include <unistd.h>

#include <system_error>

namespace moeserve::server::http {

WorkerPool::WorkerPool(size_t threads, size_t queue_limit, std::function<void(int fd)> serve)
    : queue_limit_(queue_limit), serve_(std::move(serve)) {
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

bool WorkerPool::offer(int fd) {
  {
    std::lock_guard lock(mu_);
    if (closing_ || queue_.size() >= queue_limit_) return false;
    queue_.push_back(fd);
  }
  cv_.notify_one();
  return true;
}

void WorkerPool::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (closing_ && threads_.empty()) return;
    closing_ = true;
    for (int fd : queue_) ::close(fd);
    queue_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void WorkerPool::work() {
  for (;;) {
    int fd = -1;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (closing_) return;
      fd = queue_.front();
      queue_.pop_front();
    }
    serve_(fd);
  }
}

}  // namespace moeserve::server::http
