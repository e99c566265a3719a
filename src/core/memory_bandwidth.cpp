#include "core/memory_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/page_buffer.h"

namespace moeserve {
namespace {

// Eight independent sums so the loads are not serialised by one dependency
// chain. Each cache line is prefetched into L2 4 KiB ahead, as the weight
// kernels do (kernels/cpu/stream_prefetch.h): plain loads alone keep too few
// lines in flight per core and understate what the machine can stream.
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t s[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __builtin_prefetch(p + i + 512, 0, 2);
    for (int k = 0; k < 8; ++k) s[k] += p[i + size_t(k)];
  }
  for (; i < n; ++i) s[0] += p[i];
  uint64_t total = 0;
  for (uint64_t v : s) total += v;
  return total;
}

}  // namespace

Result<double> measure_read_bandwidth(const ReadBandwidthOptions& o) {
  if (o.bytes < 4096 || o.passes < 1) {
    return make_error(StatusCode::kInvalidArgument, "read bandwidth: need at least 4096 bytes and one pass");
  }
  MOESERVE_ASSIGN_OR_RETURN(PageBuffer buffer, PageBuffer::allocate(o.bytes));
  std::memset(buffer.data(), 1, buffer.size());  // fault every page in before timing
  const auto* words = reinterpret_cast<const uint64_t*>(buffer.data());
  const size_t n_words = buffer.size() / sizeof(uint64_t);
  const int n_threads = o.pool != nullptr ? o.pool->size() : 1;
  std::vector<uint64_t> sums(size_t(n_threads) * 8);  // a cache line per thread
  double best = 0.0;
  for (int pass = 0; pass < o.passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    if (o.pool != nullptr) {
      o.pool->parallel_for(int64_t(n_words), [&](int64_t b, int64_t e, int t) {
        sums[size_t(t) * 8] += sum_words(words + b, size_t(e - b));
      });
    } else {
      sums[0] += sum_words(words, n_words);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0.0) best = std::max(best, double(buffer.size()) / s / 1e9);
  }
  // The sums are never used otherwise; keep the reads from being optimised away.
  volatile uint64_t sink = 0;
  for (uint64_t v : sums) sink = sink + v;
  (void)sink;
  return best;
}

}  // namespace moeserve
