// AVX-512 vec_dot of Q5_K with Q8_K activations (Q4_K and Q6_K have
// multi-column kernels in quant_kquants_cols_avx512.cpp).
//
// One 512-bit register holds 64 codes, which lines up with the layouts:
//  - Q4_K/Q5_K: chunk c of 32 qs bytes expands to [low nibbles | high
//    nibbles] = elements 64c..64c+63, i.e. sub-blocks 2c and 2c+1 (one per
//    256-bit half), against 64 consecutive activations.
//  - Q6_K: a half's 64 ql bytes give elements 0..63 (low nibbles) and 64..127
//    (high nibbles), each 128-bit lane one 16-element sub-block.
// The codes are unsigned, so _mm512_maddubs_epi16(codes, activations) needs no
// sign trick and its pair sums stay below 2*63*128 (no saturation); the int16
// pairs are multiplied by their sub-block scale in _mm512_madd_epi16 (a VNNI
// dpbusd would need a separate int32 multiply for the scales: no gain). Each
// super-block is summed in int32 and scaled once; min terms and the Q6_K -32
// offset come from the activations' bsums, as in the reference.
// 512-bit integer ops issue on two ports only, one of them also the only
// shuffle port, so shuffles are avoided where a load can do the job
// (measured: Q5_K in L1 12.5 -> 17 GB/s on a Sapphire Rapids-class Xeon).

#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/avx512/kquant_common_avx512.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// Mask of the 32-bit lanes of the upper 256 bits.
constexpr __mmask16 kHighHalf32 = 0xFF00u;

// The 8 scale and 8 min codes as int32 lanes holding the code in both int16
// halves ((c << 16) | c). Broadcasting one such dword from memory is a plain
// load (no shuffle-port uop) and gives the code in every int16 lane, ready
// for _mm512_madd_epi16; the shuffle port is the bottleneck of this loop.
inline __m512i dup16_codes(__m128i sc_mn) {
  const __m512i c = _mm512_cvtepu8_epi32(sc_mn);
  return _mm512_or_si512(c, _mm512_slli_epi32(c, 16));
}

// Σ_j sc_j * Σ q*x of one Q4_K/Q5_K super-block (int32 lanes); dup holds
// the dup16_codes() of the block.
template <bool kHasHighBit>
inline __m512i affine_scaled_sum(const uint8_t* qs, const uint8_t* qh, const int8_t* xq, const int32_t* dup) {
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512i hbits = _mm512_setzero_si512();
  if (kHasHighBit) hbits = _mm512_broadcast_i64x4(load256(qh));
  __m512i acc = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    // [q | q] from memory (a load, no shuffle), then the high half shifted to
    // its high nibbles.
    const __m512i qq = _mm512_broadcast_i64x4(load256(qs + 32 * c));
    __m512i codes = _mm512_and_si512(_mm512_mask_srli_epi16(qq, kHighHalf16, qq, 4), low4);
    if (kHasHighBit) {
      // Fifth bit of element 32j+l is bit j of qh[l]: j = 2c (low half), 2c+1 (high half).
      const __m512i select = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * c))),
                                                _mm256_set1_epi8(char(1 << (2 * c + 1))), 1);
      const __mmask64 set = _mm512_test_epi8_mask(hbits, select);
      codes = _mm512_mask_add_epi8(codes, set, codes, _mm512_set1_epi8(16));
    }
    const __m512i pairs = _mm512_maddubs_epi16(codes, load512(xq + 64 * c));
    const __m512i scale = _mm512_mask_set1_epi32(_mm512_set1_epi32(dup[2 * c]), kHighHalf32, dup[2 * c + 1]);
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, scale));
  }
  return acc;
}

template <typename Block, bool kHasHighBit>
float affine_kquant_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const Block*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  __m512 acc = _mm512_setzero_ps();
  alignas(64) int32_t dup[16];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(Block));
    const __m512i codes = dup16_codes(unpack_scales_mins(w[b].scales));
    _mm512_store_si512(dup, codes);
    // Compiler barrier: reload dup[] from memory so the broadcasts below stay
    // loads instead of being rebuilt from the register with shuffles.
    asm volatile("" : : "r"(dup) : "memory");
    const uint8_t* qh = nullptr;
    if constexpr (kHasHighBit) qh = w[b].qh;
    const __m512i scaled = affine_scaled_sum<kHasHighBit>(w[b].qs, qh, x[b].qs, dup);
    // Min term in the upper 8 lanes: dword j of bsums is the pair (2j, 2j+1),
    // dword 8+j of codes is (m_j, m_j).
    const __m512i bsums = _mm512_broadcast_i64x4(load256(x[b].bsums));
    const __m512i mins = _mm512_maskz_madd_epi16(kHighHalf32, codes, bsums);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(x[b].d * half_to_float(w[b].d)), _mm512_cvtepi32_ps(scaled), acc);
    acc = _mm512_fnmadd_ps(_mm512_set1_ps(x[b].d * half_to_float(w[b].dmin)), _mm512_cvtepi32_ps(mins), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

void register_quant_kquants_avx512(CpuKernels& k) {
  // Q4_K and Q6_K: quant_kquants_cols_avx512.cpp (multi-column kernels).
  k.vec_dot[dtype_slot(DType::Q5_K)] = affine_kquant_dot<BlockQ5_K, true>;
}

}  // namespace moeserve::cpu::detail
