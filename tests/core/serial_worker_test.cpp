#include "core/serial_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace moeserve {
namespace {

// Jobs run one at a time, in order, off the calling thread; wait() sees
// each one's effects; the caller goes on while a job runs.
TEST(SerialWorker, RunsJobsInOrderOffTheCallingThread) {
  SerialWorker w;
  std::vector<int> seen;
  std::atomic<bool> release{false};
  std::thread::id job_thread;
  w.run([&] {
    job_thread = std::this_thread::get_id();
    while (!release.load()) std::this_thread::yield();
    seen.push_back(1);
  });
  EXPECT_TRUE(w.busy());  // the job waits for `release`: the caller is not blocked
  w.run([&] { seen.push_back(2); });  // queued behind the first, which still waits
  w.run([&] { seen.push_back(3); });
  EXPECT_TRUE(seen.empty());
  release = true;
  w.wait();
  EXPECT_FALSE(w.busy());
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
  EXPECT_NE(job_thread, std::this_thread::get_id());
}

// Destroying a worker with jobs queued waits for every one of them.
TEST(SerialWorker, DestructionWaitsForTheJobs) {
  std::atomic<int> done{0};
  {
    SerialWorker w;
    w.run([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done += 1;
    });
    w.run([&] { done += 1; });
  }
  EXPECT_EQ(done.load(), 2);
}

}  // namespace
}  // namespace moeserve
