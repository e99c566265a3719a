// A persistent pool of worker threads for data-parallel kernels.
//
// The calling thread takes part as worker 0, so ThreadPool(1) creates no
// threads at all and every call runs inline. Dispatch does not allocate: a job
// is a pointer to a callable on the caller's stack plus a trampoline. Workers
// spin briefly on an epoch counter (kernels are dispatched back to back during
// inference, microseconds apart) and then sleep on a futex, so an idle pool
// costs no CPU.
//
// Three ways to dispatch, all of which return only when every part is done:
//   parallel_for(n, fn(begin, end, thread))  static split of [0, n) into one
//       contiguous chunk per thread; the mapping depends only on (n, size()).
//   run(n_tasks, fn(task, thread))  tasks handed out one at a time from an
//       atomic counter (load balancing when a core is busy with something else).
//   run_on_all(fn(thread))  every thread once; these may call barrier().
//
// Nesting: calling any dispatch function of a pool from inside one of its own
// tasks is a bug (it would deadlock) and aborts with a message. Using a
// *different* pool from inside a task is allowed. Calls from several outside
// threads at once are serialised by a mutex. Tasks must not throw.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  // n_threads <= 0: one per physical core (cpu_features().physical_cores).
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads taking part in each job, the caller included.
  int size() const { return n_threads_; }

  template <typename F>
  void parallel_for(int64_t n, F&& fn) {
    if (n <= 0) return;
    const int64_t parts = std::min<int64_t>(n, n_threads_);
    auto body = [&](int thread) {
      if (thread >= parts) return;
      const int64_t chunk = n / parts, rem = n % parts;
      const int64_t begin = thread * chunk + std::min<int64_t>(thread, rem);
      const int64_t end = begin + chunk + (thread < rem ? 1 : 0);
      fn(begin, end, thread);
    };
    dispatch(JobRef::to(body));
  }

  template <typename F>
  void run(int64_t n_tasks, F&& fn) {
    if (n_tasks <= 0) return;
    std::atomic<int64_t> next{0};
    auto body = [&](int thread) {
      for (int64_t task = next.fetch_add(1, std::memory_order_relaxed); task < n_tasks;
           task = next.fetch_add(1, std::memory_order_relaxed)) {
        fn(task, thread);
      }
    };
    dispatch(JobRef::to(body));
  }

  template <typename F>
  void run_on_all(F&& fn) {
    auto body = [&](int thread) { fn(thread); };
    dispatch(JobRef::to(body));
  }

  // Inside run_on_all only: returns once all size() threads have called it.
  void barrier();

 private:
  // A non-owning, non-allocating reference to `void(int thread)`.
  struct JobRef {
    void* ctx = nullptr;
    void (*call)(void* ctx, int thread) = nullptr;
    template <typename F>
    static JobRef to(F& fn) {
      return {const_cast<void*>(static_cast<const void*>(&fn)),
              [](void* c, int thread) { (*static_cast<F*>(c))(thread); }};
    }
  };

  void dispatch(JobRef job);
  void worker_main(int index);
  void wait_for_workers(uint32_t epoch);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex dispatch_mutex_;

  JobRef job_;
  bool stop_ = false;
  // Bumped once per job; workers wait for it to change. 32 bits: futex word.
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> sleeping_workers_{0};
  // Worker i stores the epoch of each job it finishes in its own cache line,
  // and the caller reads them all: with 16 threads a shared counter's 15
  // serialised increments cost microseconds per dispatch. Slot 0 is unused.
  struct alignas(64) DoneSlot {
    std::atomic<uint32_t> epoch{0};
  };
  std::unique_ptr<DoneSlot[]> done_;
  // Futex word for a caller that went to sleep waiting for the slots.
  std::atomic<uint32_t> done_wakeups_{0};
  std::atomic<uint32_t> caller_sleeping_{0};
  // barrier(): arrivals in this round and a generation counter to wait on.
  std::atomic<uint32_t> barrier_arrived_{0};
  std::atomic<uint32_t> barrier_generation_{0};
};

}  // namespace moeserve
