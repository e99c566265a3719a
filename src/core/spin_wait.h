// Busy-waiting for another thread of the same job, which is normally about
// to finish (microseconds): a pause per round keeps the spinning core from
// flooding the memory system and gives a sibling hyperthread the pipeline,
// and after spin_rounds the waiter yields so that a peer the OS or the
// hypervisor descheduled can run.
#pragma once

#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace moeserve {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

template <typename Ready>
void spin_until(Ready&& ready, int spin_rounds = 1024) {
  for (int i = 0; !ready(); ++i) {
    if (i < spin_rounds) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace moeserve
