#include "core/thread_pool.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <system_error>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include "core/cpu_features.h"
#include "core/spin_wait.h"

namespace moeserve {
namespace {

// Busy-wait rounds before a waiter goes to sleep. A pause is ~40-140 cycles,
// so this is some tens of microseconds: enough to bridge the gap between
// back-to-back kernels without burning a core when the pool is idle.
constexpr int kSpinRounds = 4096;
// barrier() waits are short (inside a job), so they spin, then yield.
constexpr int kBarrierSpinRounds = 1024;

// The pool whose job this thread is running (workers: always their pool).
thread_local const ThreadPool* tl_current_pool = nullptr;

#if defined(__linux__)
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }
// Sleep while *a == expected (returns at once if it already differs).
void futex_wait(std::atomic<uint32_t>& a, uint32_t expected) {
  syscall(SYS_futex, futex_word(a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>& a) {
  syscall(SYS_futex, futex_word(a), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}
#else
void futex_wait(std::atomic<uint32_t>& a, uint32_t expected) { a.wait(expected); }
void futex_wake_all(std::atomic<uint32_t>& a) { a.notify_all(); }
#endif

// Wait until `word` differs from `old`; `sleepers` counts threads in futex_wait
// so the waking side only makes a syscall when someone sleeps. The sleeper
// increments `sleepers` and then re-reads `word`; the waker changes `word` and
// then reads `sleepers` (both seq_cst), so at least one of them sees the other.
uint32_t wait_for_change(std::atomic<uint32_t>& word, uint32_t old, std::atomic<uint32_t>& sleepers) {
  for (int i = 0; i < kSpinRounds; ++i) {
    const uint32_t now = word.load(std::memory_order_acquire);
    if (now != old) return now;
    cpu_relax();
  }
  for (;;) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t now = word.load(std::memory_order_seq_cst);
    if (now == old) futex_wait(word, old);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    now = word.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "moeserve: ThreadPool: %s\n", what);
  std::abort();
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1, cpu_features().physical_cores);
  n_threads_ = n_threads;
  done_ = std::make_unique<DoneSlot[]>(size_t(n_threads_));
  workers_.reserve(size_t(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_main(i); });
    } catch (const std::system_error& e) {
      // The system refused another thread (a thread or address-space
      // limit): run with the ones that started. Workers never read
      // n_threads_ and nothing was dispatched yet, so shrinking it is safe.
      std::fprintf(stderr, "moeserve: ThreadPool: started %d of %d threads (%s)\n", i, n_threads, e.what());
      n_threads_ = i;
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  if (workers_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(dispatch_mutex_);
    stop_ = true;
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(epoch_);
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_main(int index) {
  tl_current_pool = this;
  // Not epoch_.load(): a job (or the destructor) may already have bumped it
  // before this thread got scheduled. The constructor left it at 0.
  uint32_t seen = 0;
  for (;;) {
    seen = wait_for_change(epoch_, seen, sleeping_workers_);
    if (stop_) return;
    job_.call(job_.ctx, index);
    // seq_cst store then load, against the caller's seq_cst store of
    // caller_sleeping_ then load of the slots: one of the two sees the other.
    done_[index].epoch.store(seen, std::memory_order_seq_cst);
    if (caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
      done_wakeups_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(done_wakeups_);
    }
  }
}

void ThreadPool::wait_for_workers(uint32_t epoch) {
  // Workers [1, next) are known to be done.
  int next = 1;
  auto advance = [&](std::memory_order order) {
    while (next < n_threads_ && done_[next].epoch.load(order) == epoch) ++next;
    return next == n_threads_;
  };
  for (int i = 0; i < kSpinRounds; ++i) {
    if (advance(std::memory_order_acquire)) return;
    cpu_relax();
  }
  for (;;) {
    caller_sleeping_.store(1, std::memory_order_seq_cst);
    const uint32_t wakeups = done_wakeups_.load(std::memory_order_seq_cst);
    if (!advance(std::memory_order_seq_cst)) futex_wait(done_wakeups_, wakeups);
    caller_sleeping_.store(0, std::memory_order_seq_cst);
    if (advance(std::memory_order_acquire)) return;
  }
}

void ThreadPool::dispatch(JobRef job) {
  if (tl_current_pool == this) {
    die("a task dispatched more work to its own pool (nested use is not supported)");
  }
  if (workers_.empty()) {  // one thread: no synchronisation at all
    const ThreadPool* outer = tl_current_pool;
    tl_current_pool = this;
    job.call(job.ctx, 0);
    tl_current_pool = outer;
    return;
  }
  std::lock_guard<std::mutex> lock(dispatch_mutex_);
  job_ = job;
  barrier_arrived_.store(0, std::memory_order_relaxed);
  const uint32_t epoch = epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;  // publishes job_ (release)
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(epoch_);

  const ThreadPool* outer = tl_current_pool;
  tl_current_pool = this;
  job.call(job.ctx, 0);
  tl_current_pool = outer;
  wait_for_workers(epoch);  // also orders the workers' writes before our return
}

void ThreadPool::barrier() {
  if (tl_current_pool != this) die("barrier() called outside a run_on_all job of this pool");
  if (n_threads_ == 1) return;
  const uint32_t generation = barrier_generation_.load(std::memory_order_acquire);
  if (barrier_arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(n_threads_)) {
    barrier_arrived_.store(0, std::memory_order_relaxed);
    barrier_generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  spin_until([&] { return barrier_generation_.load(std::memory_order_acquire) != generation; },
             kBarrierSpinRounds);
}

}  // namespace moeserve
