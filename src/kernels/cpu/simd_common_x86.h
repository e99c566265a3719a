// Helpers shared by the AVX2 and AVX-512 kernel files (AVX2-level
// instructions only): weight prefetching, loads, the K-quant scale unpacking. Include only from *_avx2.cpp /
// *_avx512.cpp files: everything sits in an anonymous namespace, so each SIMD translation unit gets its own
// copy and no AVX instruction leaks into shared inline code.
#pragma once

#include <cstdint>

#include "kernels/cpu/x86_intrinsics.h"

namespace moeserve::cpu::detail {
namespace {

// Decode streams every weight once from DRAM, and the hardware prefetcher
// alone overlaps that traffic poorly with the integer work (measured, Q4_K
// single thread from DRAM: 7.3 -> 11.4 GB/s with this). The prefetch runs
// ahead of the weight pointer, past the end of the row into the next one when
// a caller walks consecutive rows; prefetches never fault.
constexpr uintptr_t kPrefetchAhead = 2048;
inline void prefetch_ahead(const void* p, uintptr_t bytes) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(p) + kPrefetchAhead;
  for (uintptr_t off = 0; off < bytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(base + off), _MM_HINT_T0);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 8 6-bit scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K
// block: the bit moves of k_scale_min() on 32-bit words (4 codes each), with
// the scale bytes as words u0, u1, u2:
//   sc0..3 = u0 & 0x3f..            sc4..7 = (u2 & 0x0f..) | ((u0 >> 2) & 0x30..)
//   m0..3  = u1 & 0x3f..            m4..7  = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..)
// Reads 16 bytes: the 12 scale bytes and 4 code bytes that follow in the block.
inline __m128i unpack_scales_mins(const uint8_t* scales) {
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i a = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0));  // u0, u2, u1, u2
  const __m128i b = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0));  // u0, u0, u1, u1
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, top);
}

}  // namespace
}  // namespace moeserve::cpu::detail
