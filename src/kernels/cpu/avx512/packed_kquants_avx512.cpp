// AVX-512 VNNI dot products of packed Q4_K / Q6_K row groups (16 rows, one
// per 32-bit lane; packed_layout.h) with 1..kMaxDotColumns activation rows.
//
// Per 4 weights x 16 rows the work is one vpdpbusd against 4 activation
// bytes broadcast from memory. The sub-block scales and the super-block
// scales are per-lane vectors, so each row's result comes out in its lane:
// no horizontal sums. Per (row, column) the operations are the same for any
// number of columns, and the same as the scalar reference (ref/packed_ref.cpp),
// so every result is bit-identical to it.
#include <cstdint>

#include "kernels/cpu/avx512/kquant_common_avx512.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/stream_prefetch.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

constexpr int kLanes = kPackRows;
constexpr size_t kPlane = 64;
constexpr size_t kQ4Group = kLanes * sizeof(BlockQ4_K);
constexpr size_t kQ6Group = kLanes * sizeof(BlockQ6_K);
// Columns per kernel instance: accumulators for more would spill.
constexpr int kPackedColumns = 4;

// Every line of the packed stream is prefetched into L2 a fixed distance
// ahead and into L1 a short distance ahead (stream_prefetch.h says why and
// what each gained), next to the line's own load rather than in a burst per
// block group (a burst stalls once the miss queues are full).
inline void prefetch_line_ahead(const uint8_t* line) {
  prefetch_line_to_l2(line + kStreamPrefetchDistance);
  prefetch_line_to_l1(line + kL1PrefetchDistance);
}

// 4 activation bytes to every lane; written as a plain load so that the
// compiler folds it into vpdpbusd's broadcast memory operand.
using UnalignedI32 = int32_t __attribute__((aligned(1), may_alias));
inline __m512i bcast32(const int8_t* p) {
  return _mm512_set1_epi32(*reinterpret_cast<const UnalignedI32*>(p));
}

// vpshufb controls moving byte k (0..3) of every dword to its byte `to`,
// zeroing the others; built at compile time (the kernels run per 16 rows).
struct ByteSelect {
  alignas(64) uint8_t control[4][64];
};
constexpr ByteSelect make_byte_select(int to) {
  ByteSelect s{};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 64; ++i) s.control[k][i] = 0x80;
    for (int d = 0; d < 16; ++d) s.control[k][4 * d + to] = uint8_t(4 * (d % 4) + k);
  }
  return s;
}
constexpr ByteSelect kToLowByte = make_byte_select(0);
inline __m512i byte_select(const ByteSelect& s, int k) { return _mm512_load_si512(s.control[k]); }

// ---- Q4_K ---------------------------------------------------------------------
// Sub-block j = 2c (low nibbles of qs chunk c) and 2c + 1 (high nibbles).
// High nibbles are used in place (x16, masked with 0xF0): their sums are
// exact multiples of 16, so an arithmetic shift by 4 recovers them exactly.
template <int NC>
void q4_k_packed(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const uint8_t*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m512i low4 = _mm512_set1_epi8(0x0F), high4 = _mm512_set1_epi8(char(0xF0));
  const __m512i m3f = _mm512_set1_epi8(0x3F), m0f = low4, m30 = _mm512_set1_epi8(0x30);
  const __m512i words02 = _mm512_set1_epi32(0x00FF00FF);
  __m512 acc[NC], accm[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps(), accm[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* g = w + size_t(b) * kQ4Group;
    // Lines 0..3 (scales) here, lines 4..35 (codes) next to their loads.
    for (size_t line = 0; line < 4; ++line) prefetch_line_ahead(g + 64 * line);
    const __m512 d = _mm512_cvtph_ps(load256(g));
    const __m512 dmin = _mm512_cvtph_ps(load256(g + 32));
    const __m512i u0 = load512(g + 64), u1 = load512(g + 128), u2 = load512(g + 192);
    // The k_scale_min() bit moves, one dword (4 codes) per row.
    const __m512i sc03 = _mm512_and_si512(u0, m3f);
    const __m512i sc47 =
        _mm512_ternarylogic_epi32(_mm512_srli_epi32(u0, 2), m30, _mm512_and_si512(u2, m0f), 0xEA);
    const __m512i m03 = _mm512_and_si512(u1, m3f);
    const __m512i m47 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(u1, 2), m30,
                                                  _mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f), 0xEA);
    // Mins as int16 word pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7).
    const __m512i mins[4] = {
        _mm512_and_si512(m03, words02), _mm512_and_si512(_mm512_srli_epi32(m03, 8), words02),
        _mm512_and_si512(m47, words02), _mm512_and_si512(_mm512_srli_epi32(m47, 8), words02)};
    __m512i isum[NC], lo[NC], hi[NC];
    for (int c = 0; c < NC; ++c) isum[c] = _mm512_setzero_si512();
    const uint8_t* qs = g + 256;
#pragma GCC unroll 4
    for (int ch = 0; ch < 4; ++ch) {
      for (int c = 0; c < NC; ++c) lo[c] = _mm512_setzero_si512(), hi[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m512i q = load512(qs + kPlane * size_t(8 * ch + i));
        prefetch_line_ahead(qs + kPlane * size_t(8 * ch + i));
        const __m512i ql = _mm512_and_si512(q, low4), qh = _mm512_and_si512(q, high4);
        for (int c = 0; c < NC; ++c) {
          const int8_t* xq = x[c][b].qs + 64 * ch + 4 * i;
          lo[c] = _mm512_dpbusd_epi32(lo[c], ql, bcast32(xq));
          hi[c] = _mm512_dpbusd_epi32(hi[c], qh, bcast32(xq + 32));
        }
      }
      const __m512i scales = ch < 2 ? sc03 : sc47;
      const __m512i s_lo = _mm512_shuffle_epi8(scales, byte_select(kToLowByte, (2 * ch) % 4));
      const __m512i s_hi = _mm512_shuffle_epi8(scales, byte_select(kToLowByte, (2 * ch + 1) % 4));
      for (int c = 0; c < NC; ++c) {
        const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(lo[c], s_lo),
                                           _mm512_mullo_epi32(_mm512_srai_epi32(hi[c], 4), s_hi));
        isum[c] = _mm512_add_epi32(isum[c], t);
      }
    }
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_K& xb = x[c][b];
      // Sums of 32 activations per sub-block, as word pairs matching `mins`.
      int32_t bs[8];
      for (int j = 0; j < 8; ++j) bs[j] = xb.bsums[2 * j] + xb.bsums[2 * j + 1];
      auto pair = [&](int a, int e) {
        return _mm512_set1_epi32(int32_t(uint32_t(uint16_t(bs[a])) | (uint32_t(bs[e]) << 16)));
      };
      __m512i imin = _mm512_madd_epi16(mins[0], pair(0, 2));
      imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[1], pair(1, 3)));
      imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[2], pair(4, 6)));
      imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[3], pair(5, 7)));
      const __m512 xd = _mm512_set1_ps(xb.d);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, xd), acc[c]);
      accm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmin, xd), accm[c]);
    }
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + c * out_stride, _mm512_sub_ps(acc[c], accm[c]));
}

// ---- Q6_K ---------------------------------------------------------------------
// Per half h and quad i three code planes P0..P2 hold, in bits 0..5, the codes
// of elements 128h + 32t + 4i .. +3 for t = 0, 1, 2 (sub-block 8h + 2t + i/4),
// and in bits 6..7 two bits each of the t = 3 code (packed_layout.h): three
// masks give codes 0..2 and three shifts, two selects and a mask code 3
// (9 ops for 4 code vectors; the nibble + 2-bit layout took 13). Each
// sub-block's -32 offset is the partial sum's starting value, and the scales
// are one sign-extending load per sub-block.
template <int NC>
void q6_k_packed(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const uint8_t*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m512i m3f = _mm512_set1_epi8(0x3F), m03 = _mm512_set1_epi8(0x03), m0f = _mm512_set1_epi8(0x0F);
  constexpr int kSelect = 0xCA;  // A ? B : C, bit by bit
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* g = w + size_t(b) * kQ6Group;
    // The 48 code planes next to their loads; the scale planes and d here.
    for (size_t line = 48; line < 53; ++line) prefetch_line_ahead(g + 64 * line);
    const uint8_t* scales = g + 48 * kPlane;
    const __m512 d = _mm512_cvtph_ps(load256(g + 52 * kPlane));
    __m512i isum[NC], part[NC][4];
    for (int c = 0; c < NC; ++c) isum[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        for (int c = 0; c < NC; ++c) {
          for (int t = 0; t < 4; ++t)
            part[c][t] = _mm512_set1_epi32(-32 * int32_t(x[c][b].bsums[8 * h + 2 * t + q]));
        }
#pragma GCC unroll 4
        for (int i = 4 * q; i < 4 * q + 4; ++i) {
          const uint8_t* p = g + 3 * kPlane * size_t(8 * h + i);
          const __m512i p0 = load512(p), p1 = load512(p + kPlane), p2 = load512(p + 2 * kPlane);
          prefetch_line_ahead(p), prefetch_line_ahead(p + kPlane), prefetch_line_ahead(p + 2 * kPlane);
          // Code 3: bits 6..7 of P0, P1, P2 to bits 0..1, 2..3, 4..5.
          const __m512i c3_low =
              _mm512_ternarylogic_epi32(m03, _mm512_srli_epi32(p0, 6), _mm512_srli_epi32(p1, 4), kSelect);
          const __m512i c3 = _mm512_and_si512(
              _mm512_ternarylogic_epi32(m0f, c3_low, _mm512_srli_epi32(p2, 2), kSelect), m3f);
          const __m512i codes[4] = {_mm512_and_si512(p0, m3f), _mm512_and_si512(p1, m3f),
                                    _mm512_and_si512(p2, m3f), c3};
          for (int c = 0; c < NC; ++c) {
            const int8_t* xq = x[c][b].qs + 128 * h + 4 * i;
#pragma GCC unroll 4
            for (int t = 0; t < 4; ++t)
              part[c][t] = _mm512_dpbusd_epi32(part[c][t], codes[t], bcast32(xq + 32 * t));
          }
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const int s = 8 * h + 2 * t + q;
          const __m512i sc =
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * s)));
          for (int c = 0; c < NC; ++c)
            isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(part[c][t], sc));
        }
      }
    }
    for (int c = 0; c < NC; ++c) {
      acc[c] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(x[c][b].d)), acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + c * out_stride, acc[c]);
}

using GroupKernel = void (*)(int64_t, const void*, const void*, size_t, float*, int64_t);

template <GroupKernel K1, GroupKernel K2, GroupKernel K3, GroupKernel K4>
void dispatch_packed(int64_t n, const void* w, const void* x, size_t x_stride, int n_x, float* out,
                     int64_t out_stride) {
  static constexpr GroupKernel kByCount[kPackedColumns] = {K1, K2, K3, K4};
  const auto* xb = static_cast<const uint8_t*>(x);
  for (int i = 0; i < n_x; i += kPackedColumns) {
    const int m = n_x - i < kPackedColumns ? n_x - i : kPackedColumns;
    kByCount[m - 1](n, w, xb + size_t(i) * x_stride, x_stride, out + i * out_stride, out_stride);
  }
}

}  // namespace

void register_packed_kquants_avx512(CpuKernels& k) {
  static_assert(kPackedColumns == 4, "dispatch_packed lists one kernel per column count");
  k.packed_dot[dtype_slot(DType::Q4_K)] =
      dispatch_packed<q4_k_packed<1>, q4_k_packed<2>, q4_k_packed<3>, q4_k_packed<4>>;
  k.packed_dot[dtype_slot(DType::Q6_K)] =
      dispatch_packed<q6_k_packed<1>, q6_k_packed<2>, q6_k_packed<3>, q6_k_packed<4>>;
}

}  // namespace moeserve::cpu::detail
