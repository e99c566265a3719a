// AVX-512 version of the bandwidth benchmark's read loop (see
// read_sum_avx2.cpp): one 64-byte load per cache line reaches a higher
// single-thread bandwidth than two 32-byte loads on the CPUs we measured.
// Called only when cpu_features().avx512.
#include <cstddef>

#include "kernels/cpu/x86_intrinsics.h"

namespace moeserve::bench {

float read_sum_avx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}

}  // namespace moeserve::bench
