#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

namespace moeserve {
namespace {

class ThreadPoolSizes : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolSizes, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(GetParam());
  for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 4097}) {
    std::vector<std::atomic<int>> hits(size_t(n) + 1);
    std::vector<int> thread_of(size_t(n), -1);
    pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread) {
      ASSERT_LE(0, begin);
      ASSERT_LE(begin, end);
      ASSERT_LE(end, n);
      ASSERT_LT(thread, pool.size());
      for (int64_t i = begin; i < end; ++i) {
        hits[size_t(i)].fetch_add(1);
        thread_of[size_t(i)] = thread;
      }
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
    // Static split: contiguous chunks in thread order.
    for (int64_t i = 1; i < n; ++i) ASSERT_LE(thread_of[size_t(i - 1)], thread_of[size_t(i)]);
  }
}

TEST_P(ThreadPoolSizes, RunExecutesEveryTaskOnce) {
  ThreadPool pool(GetParam());
  for (int64_t n : {0, 1, 5, 100, 3001}) {
    std::vector<std::atomic<int>> hits(size_t(n) + 1);
    std::atomic<int> bad_thread{0};
    pool.run(n, [&](int64_t task, int thread) {
      if (thread < 0 || thread >= pool.size()) bad_thread.fetch_add(1);
      hits[size_t(task)].fetch_add(1);
    });
    EXPECT_EQ(bad_thread.load(), 0);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST_P(ThreadPoolSizes, ResultsEqualSerialLoop) {
  ThreadPool pool(GetParam());
  const int64_t n = 100003;
  std::vector<double> x(n), parallel(n), serial(n);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = double(i % 97) * 0.25 - 3.0;
  auto f = [](double v) { return v * v * 0.5 + v; };
  for (int64_t i = 0; i < n; ++i) serial[size_t(i)] = f(x[size_t(i)]);
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) parallel[size_t(i)] = f(x[size_t(i)]);
  });
  EXPECT_EQ(parallel, serial);
}

TEST_P(ThreadPoolSizes, TenThousandTinyJobs) {
  ThreadPool pool(GetParam());
  int64_t total = 0;
  std::vector<int64_t> per_thread(size_t(pool.size()));
  for (int job = 0; job < 10000; ++job) {
    std::fill(per_thread.begin(), per_thread.end(), 0);
    pool.parallel_for(pool.size(), [&](int64_t b, int64_t e, int thread) {
      per_thread[size_t(thread)] += e - b;
    });
    total += std::accumulate(per_thread.begin(), per_thread.end(), int64_t{0});
  }
  EXPECT_EQ(total, 10000 * int64_t(pool.size()));
}

TEST_P(ThreadPoolSizes, RunOnAllWithBarrierSeesEveryWrite) {
  ThreadPool pool(GetParam());
  const int n = pool.size();
  std::vector<int> phase1(size_t(n), 0), sums(size_t(n), 0);
  for (int round = 0; round < 200; ++round) {
    pool.run_on_all([&](int thread) {
      phase1[size_t(thread)] = thread + round;
      pool.barrier();
      int s = 0;
      for (int v : phase1) s += v;
      sums[size_t(thread)] = s;
      pool.barrier();  // a second round of the same barrier must work too
    });
    const int expected = n * (n - 1) / 2 + n * round;
    for (int t = 0; t < n; ++t) ASSERT_EQ(sums[size_t(t)], expected) << "round " << round;
  }
}

TEST_P(ThreadPoolSizes, WorkersSleepAndWakeAfterIdle) {
  ThreadPool pool(GetParam());
  std::atomic<int> count{0};
  pool.run_on_all([&](int) { count.fetch_add(1); });
  // Long enough for every worker to stop spinning and block on the futex.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pool.run_on_all([&](int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 2 * pool.size());
}

// The caller finishes its part at once and outlasts its spin, so it sleeps
// until the last slow worker is done; the job's writes are all visible after.
TEST_P(ThreadPoolSizes, CallerSleepsUntilSlowWorkersFinish) {
  ThreadPool pool(GetParam());
  for (int round = 0; round < 3; ++round) {
    std::vector<int> written(size_t(pool.size()), -1);
    pool.run_on_all([&](int t) {
      if (t != 0) std::this_thread::sleep_for(std::chrono::milliseconds(5 * t));
      written[size_t(t)] = round;
    });
    for (int t = 0; t < pool.size(); ++t) ASSERT_EQ(written[size_t(t)], round) << "thread " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadPoolSizes, ::testing::Values(1, 2, 3, 5, 16));

TEST(ThreadPool, DefaultUsesAtLeastOneThread) {
  ThreadPool pool;
  EXPECT_GE(pool.size(), 1);
}

TEST(ThreadPool, SingleThreadRunsInlineOnCaller) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  bool same = false;
  pool.run_on_all([&](int) { same = std::this_thread::get_id() == caller; });
  EXPECT_TRUE(same);
}

TEST(ThreadPool, CallerIsWorkerZero) {
  ThreadPool pool(3);
  const auto caller = std::this_thread::get_id();
  std::vector<std::thread::id> ids(3);
  pool.run_on_all([&](int thread) { ids[size_t(thread)] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], caller);
  EXPECT_NE(ids[1], caller);
  EXPECT_NE(ids[2], ids[1]);
}

TEST(ThreadPool, CreateAndDestroyRepeatedly) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 2 == 0) {
      std::atomic<int> c{0};
      pool.run(10, [&](int64_t, int) { c.fetch_add(1); });
      EXPECT_EQ(c.load(), 10);
    }
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  auto caller = [&] {
    for (int i = 0; i < 500; ++i) pool.run(4, [&](int64_t task, int) { sum.fetch_add(task + 1); });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(sum.load(), 2 * 500 * 10);
}

TEST(ThreadPool, AnotherPoolMayBeUsedInsideATask) {
  ThreadPool outer(2), inner(2);
  std::atomic<int> count{0};
  outer.run(2, [&](int64_t, int) {
    // Both outer threads would share `inner`; its mutex serialises them.
    inner.run(3, [&](int64_t, int) { count.fetch_add(1); });
  });
  EXPECT_EQ(count.load(), 6);
}

TEST(ThreadPoolDeathTest, NestedDispatchOnSamePoolAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ThreadPool pool(2);
        pool.run(1, [&](int64_t, int) { pool.run(1, [](int64_t, int) {}); });
      },
      "nested use is not supported");
  EXPECT_DEATH(
      {
        ThreadPool pool(1);
        pool.parallel_for(1, [&](int64_t, int64_t, int) { pool.parallel_for(1, [](int64_t, int64_t, int) {}); });
      },
      "nested use is not supported");
}

TEST(ThreadPoolDeathTest, BarrierOutsideAJobAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ThreadPool pool(2);
        pool.barrier();
      },
      "barrier");
}

}  // namespace
}  // namespace moeserve
