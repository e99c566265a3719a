// AVX2 vec_dot for the float types and the 32-element block types (Q8_0,
// Q4_0), the activation quantizers (Q8_0, Q8_K) and some dequantizers.
// K-quant dot products: quant_kquants_avx2.cpp.
//
// Int8 products use _mm256_maddubs_epi16(unsigned, signed): for signed
// weights the sign is moved onto the activations (|w| * sign(x, w)); the
// activation quantizers never produce -128, so negating x cannot wrap, and a
// pair sum is at most 2*128*127 = 32512 < 32767 (no int16 saturation).
//
// The activation quantizers repeat the reference's arithmetic operation by
// operation (same clamps, same round-to-nearest-even, same scalar scale
// computation), so they produce the same bytes.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/avx2/quant_common_avx2.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/simd_common_x86.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {

void register_quant_kquants_avx2(CpuKernels& k);  // quant_kquants_avx2.cpp
void register_quant_lowbit_avx2(CpuKernels& k);   // quant_lowbit_avx2.cpp
void register_quant_iquants_avx2(CpuKernels& k);  // quant_iquants_avx2.cpp

namespace {

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmin(__m256 v) {
  __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_min_ps(s, _mm_movehl_ps(s, s));
  s = _mm_min_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- float weights ----------------------------------------------------------

inline __m256 load_f32(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// 4 independent accumulators (32 elements per iteration) hide the FMA latency.
template <typename W, __m256 (*Load)(const W*), float (*Scalar)(W)>
float float_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const W*>(wv);
  const auto* x = static_cast<const float*>(xv);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(w + i, 32 * sizeof(W));
    acc0 = _mm256_fmadd_ps(Load(w + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(Load(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(Load(w + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(Load(w + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(Load(w + i), _mm256_loadu_ps(x + i), acc0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += Scalar(w[i]) * x[i];
  return sum;
}

inline float scalar_f32(float v) { return v; }
inline float scalar_f16(uint16_t v) { return half_to_float(v); }
inline float scalar_bf16(uint16_t v) { return bf16_to_fp32(v); }

// ---- Q8_0 / Q4_0 weights x Q8_0 activations ------------------------------------

inline __m256i load_q8_0(const BlockQ8_0& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}

// Q4_0 codes as signed -8..7: low nibbles are elements 0..15, high 16..31.
inline __m256i load_q4_0(const BlockQ4_0& b) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
}

// Two blocks per iteration into two accumulators; each block's integer sums
// are scaled once by d_w*d_x.
template <typename WBlock, __m256i (*LoadW)(const WBlock&)>
float q8_0_act_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const WBlock*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  const int64_t nb = n / kQK8_0;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    prefetch_ahead(w + b, 2 * sizeof(WBlock));
    const __m256i p0 = dot_i8_32(LoadW(w[b]), load_q8_0(x[b]));
    const __m256i p1 = dot_i8_32(LoadW(w[b + 1]), load_q8_0(x[b + 1]));
    const float d0 = half_to_float(w[b].d) * half_to_float(x[b].d);
    const float d1 = half_to_float(w[b + 1].d) * half_to_float(x[b + 1].d);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
  }
  if (b < nb) {
    const __m256i p = dot_i8_32(LoadW(w[b]), load_q8_0(x[b]));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[b].d) * half_to_float(x[b].d)),
                           _mm256_cvtepi32_ps(p), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// ---- activation quantizers ----------------------------------------------------

// round_clamp() of the reference on 8 lanes: clamp first (NaN -> lo, as
// max_ps returns its second operand for NaN), then round to nearest even.
inline __m256i round_clamp8(__m256 v, float lo, float hi) {
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
  return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 32 int32 (4 vectors, in element order) -> 32 int8 in element order.
inline __m256i pack_32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i abcd = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_0*>(dst);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* x = src + b * kQK8_0;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), amax);
    }
    // Scale exactly as the reference: f16-rounded amax/127, saturated.
    float s = hmax(amax) / 127.0f;
    s = s > 65504.0f ? 65504.0f : s;
    const uint16_t d16 = fp32_to_fp16(s);
    const float d = fp16_to_fp32(d16);
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = round_clamp8(_mm256_mul_ps(v[k], id), -127.0f, 127.0f);
    out[b].d = d16;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), pack_32(q[0], q[1], q[2], q[3]));
  }
}

// Sums of the two 16-byte halves of 32 int8.
inline void half_sums(__m256i q, int16_t* out) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
  __m256i s = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  s = _mm256_hadd_epi32(s, s);
  s = _mm256_hadd_epi32(s, s);
  out[0] = int16_t(_mm256_extract_epi32(s, 0));
  out[1] = int16_t(_mm256_extract_epi32(s, 4));
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ8_K& blk = out[b];
    // max/min with the accumulator second: NaN lanes are skipped, as in the
    // reference's std::max/std::min scan.
    __m256 hi = _mm256_setzero_ps(), lo = _mm256_setzero_ps();
    for (int i = 0; i < kQK_K; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      hi = _mm256_max_ps(v, hi);
      lo = _mm256_min_ps(v, lo);
    }
    const float h = hmax(hi), l = hmin(lo);
    const float m = -l > h ? l : h;
    if (m == 0.0f) {
      std::memset(&blk, 0, sizeof blk);
      continue;
    }
    const float iscale = -127.0f / m;
    blk.d = 1.0f / iscale;
    const __m256 is = _mm256_set1_ps(iscale);
    for (int i = 0; i < kQK_K; i += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = round_clamp8(_mm256_mul_ps(is, _mm256_loadu_ps(x + i + 8 * k)), -127.0f, 127.0f);
      const __m256i packed = pack_32(q[0], q[1], q[2], q[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk.qs + i), packed);
      half_sums(packed, blk.bsums + i / 16);
    }
  }
}

// ---- dequantizers -------------------------------------------------------------

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16(h + i));
  for (; i < n; ++i) dst[i] = half_to_float(h[i]);
}

// f32 -> f16 rounding to nearest even (F16C), as fp32_to_fp16.
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), v);
  }
  for (; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(h + i));
  for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m256 d = _mm256_set1_ps(half_to_float(in[b].d));
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in[b].qs + 8 * k));
      _mm256_storeu_ps(dst + b * kQK8_0 + 8 * k,
                       _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
    }
  }
}

}  // namespace

void register_quant_avx2(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::F32)] = float_dot<float, load_f32, scalar_f32>;
  k.vec_dot[dtype_slot(DType::F16)] = float_dot<uint16_t, load_f16, scalar_f16>;
  k.vec_dot[dtype_slot(DType::BF16)] = float_dot<uint16_t, load_bf16, scalar_bf16>;
  k.vec_dot[dtype_slot(DType::Q8_0)] = q8_0_act_dot<BlockQ8_0, load_q8_0>;
  k.vec_dot[dtype_slot(DType::Q4_0)] = q8_0_act_dot<BlockQ4_0, load_q4_0>;
  k.quantize_row[dtype_slot(DType::Q8_0)] = quantize_q8_0;
  k.quantize_row[dtype_slot(DType::Q8_K)] = quantize_q8_k;
  k.quantize_row[dtype_slot(DType::F16)] = quantize_f16;
  k.dequantize_row[dtype_slot(DType::F16)] = dequantize_f16;
  k.dequantize_row[dtype_slot(DType::BF16)] = dequantize_bf16;
  k.dequantize_row[dtype_slot(DType::Q8_0)] = dequantize_q8_0;
  register_quant_kquants_avx2(k);
  register_quant_lowbit_avx2(k);
  register_quant_iquants_avx2(k);
}

}  // namespace moeserve::cpu::detail
