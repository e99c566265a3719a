// Shared by the AVX-512 codebook i-quant files (quant_iquants_avx512.cpp and
// its VBMI variant quant_iquants_vbmi_avx512.cpp; included only by
// *_avx512.cpp files, everything in an anonymous namespace of each): the
// grids as constant expressions, a decoded super-block and its dot against
// Q8_K activation rows. The decoders themselves are per file.
#pragma once

#include <cstdint>

#include "kernels/cpu/avx512/kquant_common_avx512.h"
#include "kernels/cpu/cols_dispatch.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// ---- codebooks ---------------------------------------------------------------------
// The grids' entries, from the files that define kIq*Grid (iquant_grids.h),
// as constant expressions so that each file's lookup tables are built and
// checked by the compiler.
constexpr uint64_t kIq2xxsEntries[256] = {
#include "tensor/iquant_grid_iq2xxs.inc"
};
constexpr uint64_t kIq2xsEntries[512] = {
#include "tensor/iquant_grid_iq2xs.inc"
};
constexpr uint64_t kIq2sEntries[1024] = {
#include "tensor/iquant_grid_iq2s.inc"
};
constexpr uint32_t kIq3xxsEntries[256] = {
#include "tensor/iquant_grid_iq3xxs.inc"
};
constexpr uint32_t kIq3sEntries[512] = {
#include "tensor/iquant_grid_iq3s.inc"
};
constexpr uint8_t kIqSignBytes[128] = {
#include "tensor/iquant_grid_signs.inc"
};

// The magnitudes a codebook's entries are made of, ascending; a value's code
// is its position here. 16 bytes: a vpshufb table.
struct Magnitudes {
  alignas(16) uint8_t values[16];
  int count;
};
constexpr Magnitudes kIq2Magnitudes = {{8, 25, 43}, 3};
constexpr Magnitudes kIq3xxsMagnitudes = {{4, 12, 20, 28, 36, 44, 52, 62}, 8};
constexpr Magnitudes kIq3sMagnitudes = {{1, 3, 5, 7, 9, 11, 13, 15}, 8};

constexpr int code_of(uint8_t value, const Magnitudes& m) {
  for (int i = 0; i < m.count; ++i) {
    if (m.values[i] == value) return i;
  }
  throw "a grid value outside the magnitude list";  // (fails the constant evaluation)
}

// ---- the dot ------------------------------------------------------------------------

// A super-block decoded: values 64r..64r+63 as unsigned magnitudes and
// negation masks (bit e negates value e), and the vpdpwssd word scales
// 2s + 1 of register pairs (0, 1), (2, 3): in 128-bit lane L of
// vpackssdw(register 2p, register 2p + 1), words 0-3 hold 16 values of
// register 2p (its lane L), words 4-7 those of register 2p + 1, so word w of
// scales[p] is the scale of 16-value group 8p + 4 ((w % 8) / 4) + w / 8.
// Decoders with D::kWeighsBlockSums (IQ1) also give the weights of the
// activations' 16-value sums (BlockQ8_K::bsums), added to the block's sum.
struct Decoded {
  __m512i mags[4];
  __mmask64 neg[4];
  __m512i scales[2];
  __m256i bsum_weights;
};

// Σ (2s + 1) |w| (±x) over a super-block against one activation row, in 16
// int32 lanes. Masked vpsubb negates the activations (never -128), vpdpbusd
// multiplies the unsigned magnitudes: 4 products per int32 lane, |sum| <= 4
// * 62 * 127 = 31,496, so vpackssdw narrows two registers to int16 without
// saturating and vpdpwssd applies the odd scales (<= 31) and accumulates.
inline __m512i block_dot(const Decoded& d, const int8_t* xq) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i a[4];
  for (int r = 0; r < 4; ++r) {
    const __m512i x = load512(xq + 64 * r);
    a[r] = _mm512_dpbusd_epi32(zero, d.mags[r], _mm512_mask_sub_epi8(x, d.neg[r], zero, x));
  }
  const __m512i s = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(a[0], a[1]), d.scales[0]);
  return _mm512_dpwssd_epi32(s, _mm512_packs_epi32(a[2], a[3]), d.scales[1]);
}

// A block's f16 scale d, or D::d(block) (IQ1_M keeps it in its scales).
template <typename D>
float block_d(const typename D::Block& b) {
  if constexpr (requires { D::d(b); }) {
    return D::d(b);
  } else {
    return _cvtsh_ss(b.d);
  }
}

// D decodes D::kBlocksPerDecode (1 or 2) super-blocks at a time: decode(b,
// out) or decode(b, next, out); a row's odd last block is decoded paired with
// itself. Blocks are summed one by one in row order whatever the decoder, so
// the result does not depend on the pairing.
template <typename D, int NC>
void iquant_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  using Block = typename D::Block;
  constexpr int kStep = D::kBlocksPerDecode;
  static_assert(kStep == 1 || kStep == 2, "one or two blocks a decode");
  const auto* w = static_cast<const Block*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; b += kStep) {
    prefetch_ahead(w + b, kStep * sizeof(Block));
    Decoded d[kStep];
    if constexpr (kStep == 1) {
      D::decode(w[b], d[0]);
    } else {
      D::decode(w[b], w[b + 1 < nb ? b + 1 : b], d);
    }
    const int blocks = int(nb - b < kStep ? nb - b : kStep);
    for (int i = 0; i < blocks; ++i) {
      const float wd = block_d<D>(w[b + i]) * D::kFactor;
      for (int c = 0; c < NC; ++c) {
        __m512i isum = block_dot(d[i], x[c][b + i].qs);
        if constexpr (requires { D::kWeighsBlockSums; }) {
          const __m256i weighted = _mm256_madd_epi16(load256(x[c][b + i].bsums), d[i].bsum_weights);
          isum = _mm512_add_epi32(isum, _mm512_zextsi256_si512(weighted));
        }
        const __m512 sum = _mm512_cvtepi32_ps(isum);
        acc[c] = _mm512_fmadd_ps(sum, _mm512_set1_ps(x[c][b + i].d * wd), acc[c]);
      }
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = _mm512_reduce_add_ps(acc[c]);
}

template <typename D>
struct Cols {
  template <int NC>
  struct Table {
    static constexpr ColsKernel fn = iquant_cols<D, NC>;
  };
};

template <typename D>
void register_type(CpuKernels& k, DType t) {
  k.vec_dot[dtype_slot(t)] = one_column_dot<Cols<D>::template Table>;
  k.vec_dot_cols[dtype_slot(t)] = dispatch_cols<Cols<D>::template Table>;
}

}  // namespace
}  // namespace moeserve::cpu::detail
