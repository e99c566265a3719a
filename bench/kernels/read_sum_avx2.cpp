// The memory-read loop of the bandwidth benchmark: sums floats with four
// independent 256-bit accumulators, so the loop is bound by loads, not by
// add latency. Called only when cpu_features().avx2.
#include <immintrin.h>

#include <cstddef>

namespace moeserve::bench {

float read_sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0.0f;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

}  // namespace moeserve::bench
