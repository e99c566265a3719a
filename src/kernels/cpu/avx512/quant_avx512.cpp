// AVX-512 (F/BW/VL/VNNI) vec_dot for the float types and the 32-element block
// types, and the activation quantizers. K-quants: quant_kquants_avx512.cpp;
// issue 43's types: quant_lowbit_avx512.cpp; the codebook i-quants:
// quant_iquants_avx512.cpp.
// Entries not set here keep their AVX2 versions (dispatch.cpp registers the
// AVX2 level first).
//
// Q8_0/Q4_0 blocks are 32 codes, exactly one 256-bit register, so these use
// the 256-bit VNNI form _mm256_dpbusd_epi32 (u8 x s8 -> int32 with no int16
// intermediate): Q8_0 moves the weight sign onto the activations (activations
// are never -128, so negation cannot wrap); Q4_0 multiplies the unsigned
// nibbles and subtracts 8*Σx, a second dpbusd against a vector of 8s.
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/simd_common_x86.h"
#include "kernels/cpu/x86_intrinsics.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {

void register_quant_kquants_avx512(CpuKernels& k);  // quant_kquants_avx512.cpp
void register_quant_iquants_avx512(CpuKernels& k);  // quant_iquants_avx512.cpp

namespace {

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// ---- float weights ----------------------------------------------------------

inline __m512 load_f32(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// 64 elements per iteration in 4 accumulators; the tail uses masked loads.
template <typename W, __m512 (*Load)(const W*, __mmask16)>
float float_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const W*>(wv);
  const auto* x = static_cast<const float*>(xv);
  constexpr __mmask16 kAll = 0xffff;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    prefetch_ahead(w + i, 64 * sizeof(W));
    acc0 = _mm512_fmadd_ps(Load(w + i, kAll), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(Load(w + i + 16, kAll), _mm512_loadu_ps(x + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(Load(w + i + 32, kAll), _mm512_loadu_ps(x + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(Load(w + i + 48, kAll), _mm512_loadu_ps(x + i + 48), acc3);
  }
  for (; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? kAll : __mmask16((1u << left) - 1);
    acc0 = _mm512_fmadd_ps(Load(w + i, m), _mm512_maskz_loadu_ps(m, x + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// ---- Q8_0 / Q4_0 weights x Q8_0 activations ------------------------------------

inline __m256i q8_0_block_dot(const BlockQ8_0& w, const BlockQ8_0& x) {
  const __m256i qw = load256(w.qs);
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qw, qw),
                             _mm256_sign_epi8(load256(x.qs), qw));
}

inline __m256i q4_0_block_dot(const BlockQ4_0& w, const BlockQ8_0& x) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  // low nibbles are elements 0..15, high nibbles 16..31
  const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
  const __m256i qx = load256(x.qs);
  const __m256i codes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nib, qx);
  const __m256i offset = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), qx);
  return _mm256_sub_epi32(codes, offset);
}

template <typename WBlock, __m256i (*BlockDot)(const WBlock&, const BlockQ8_0&)>
float q8_0_act_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const WBlock*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  const int64_t nb = n / kQK8_0;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t b = 0;
  auto step = [&](int64_t i, __m256 acc) {
    const float d = half_to_float(w[i].d) * half_to_float(x[i].d);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(BlockDot(w[i], x[i])), acc);
  };
  for (; b + 4 <= nb; b += 4) {
    prefetch_ahead(w + b, 4 * sizeof(WBlock));
    acc0 = step(b, acc0);
    acc1 = step(b + 1, acc1);
    acc2 = step(b + 2, acc2);
    acc3 = step(b + 3, acc3);
  }
  for (; b < nb; ++b) acc0 = step(b, acc0);
  return hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

// ---- activation quantizers ----------------------------------------------------

// The reference's round_clamp on 16 lanes: clamp (NaN -> lo: max_ps returns
// its second operand for NaN), then round to nearest even.
inline __m512i round_clamp16(__m512 v, float lo, float hi) {
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
  return _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline void store_i8x16(int8_t* dst, __m512i q32) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(q32));
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m512 v0 = _mm512_loadu_ps(src + b * kQK8_0);
    const __m512 v1 = _mm512_loadu_ps(src + b * kQK8_0 + 16);
    // Accumulator second: NaN lanes drop out, as in the reference scan.
    const __m512 amax =
        _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
    // Scale exactly as the reference: f16-rounded amax/127, saturated.
    float s = _mm512_reduce_max_ps(amax) / 127.0f;
    s = s > 65504.0f ? 65504.0f : s;
    const uint16_t d16 = fp32_to_fp16(s);
    const float d = fp16_to_fp32(d16);
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    out[b].d = d16;
    store_i8x16(out[b].qs, round_clamp16(_mm512_mul_ps(v0, id), -127.0f, 127.0f));
    store_i8x16(out[b].qs + 16, round_clamp16(_mm512_mul_ps(v1, id), -127.0f, 127.0f));
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ8_K& blk = out[b];
    __m512 hi = _mm512_setzero_ps(), lo = _mm512_setzero_ps();
    for (int i = 0; i < kQK_K; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      hi = _mm512_max_ps(v, hi);
      lo = _mm512_min_ps(v, lo);
    }
    const float h = _mm512_reduce_max_ps(hi), l = _mm512_reduce_min_ps(lo);
    const float m = -l > h ? l : h;
    if (m == 0.0f) {
      std::memset(&blk, 0, sizeof blk);
      continue;
    }
    const float iscale = -127.0f / m;
    blk.d = 1.0f / iscale;
    const __m512 is = _mm512_set1_ps(iscale);
    for (int g = 0; g < kQK_K / 16; ++g) {  // one register = one bsums group
      const __m512i q = round_clamp16(_mm512_mul_ps(is, _mm512_loadu_ps(x + 16 * g)), -127.0f, 127.0f);
      store_i8x16(blk.qs + 16 * g, q);
      blk.bsums[g] = int16_t(_mm512_reduce_add_epi32(q));
    }
  }
}

// ---- dequantizers -------------------------------------------------------------

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    _mm512_mask_storeu_ps(dst + i, m, load_f16(h + i, m));
  }
}

// f32 -> f16 rounding to nearest even, as fp32_to_fp16.
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m256i v =
        _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(h + i, m, v);
  }
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    _mm512_mask_storeu_ps(dst + i, m, load_bf16(h + i, m));
  }
}

}  // namespace

void register_quant_avx512(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::F32)] = float_dot<float, load_f32>;
  k.vec_dot[dtype_slot(DType::F16)] = float_dot<uint16_t, load_f16>;
  k.vec_dot[dtype_slot(DType::BF16)] = float_dot<uint16_t, load_bf16>;
  k.vec_dot[dtype_slot(DType::Q8_0)] = q8_0_act_dot<BlockQ8_0, q8_0_block_dot>;
  k.vec_dot[dtype_slot(DType::Q4_0)] = q8_0_act_dot<BlockQ4_0, q4_0_block_dot>;
  k.quantize_row[dtype_slot(DType::Q8_0)] = quantize_q8_0;
  k.quantize_row[dtype_slot(DType::Q8_K)] = quantize_q8_k;
  k.quantize_row[dtype_slot(DType::F16)] = quantize_f16;
  k.dequantize_row[dtype_slot(DType::F16)] = dequantize_f16;
  k.dequantize_row[dtype_slot(DType::BF16)] = dequantize_bf16;
  register_quant_kquants_avx512(k);
  register_quant_lowbit_avx512(k);
  register_quant_iquants_avx512(k);
  register_quant_kquants_cols_avx512(k);
  register_packed_kquants_avx512(k);
}

}  // namespace moeserve::cpu::detail
