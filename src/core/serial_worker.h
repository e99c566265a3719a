// One background thread running queued jobs one at a time, in order, for
// work that should go on while the calling thread does something else (a
// prefill layer's CPU experts, or copies of cold experts staged from an
// unpinned file, while the GPU's next work is enqueued). run() queues a
// job and returns; wait() returns once every queued job is done.
// Jobs must not throw.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace moeserve {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();  // waits for the queued jobs, then stops the thread
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void run(std::function<void()> job);
  void wait();
  bool busy();  // a job is queued or running

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve
