#include "core/serial_worker.h"

#include <utility>

namespace moeserve {

SerialWorker::SerialWorker() : thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return jobs_.empty() && !running_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SerialWorker::run(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void SerialWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return jobs_.empty() && !running_; });
}

bool SerialWorker::busy() {
  std::lock_guard<std::mutex> lock(mu_);
  return running_ || !jobs_.empty();
}

void SerialWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !jobs_.empty() || stop_; });
    if (!jobs_.empty()) {
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
      lock.unlock();
      job();
      lock.lock();
      running_ = false;
      cv_.notify_all();
      continue;
    }
    if (stop_) return;
  }
}

}  // namespace moeserve
