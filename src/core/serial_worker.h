// One background thread running one job at a time, for work that should
// go on while the calling thread does something else (a prefill layer's
// CPU experts while the GPU's next work is enqueued). run() hands it a job,
// first waiting for the one before; wait() returns once it is done.
// Jobs must not throw.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace moeserve {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();  // waits for the job, then stops the thread
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void run(std::function<void()> job);
  void wait();
  bool busy();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve
