// AVX-512 VBMI (+ BITALG) dot products of IQ1_S and IQ1_M against Q8_K
// activations, registered with quant_iquants_vbmi_avx512.cpp's kernels (and
// in the same style: iquant_vbmi_common_avx512.h). Their 2048-entry codebook
// is 16 vpermi2b parts a byte plane; the entries' values g in {-1, 0, 1} go
// through the unsigned dot as 8 (g + 1) plus a constant, and the constant
// (with the shift +-1/8) weighs the activations' 16-value sums instead.
#include <cstdint>

#include "kernels/cpu/avx512/iquant_vbmi_common_avx512.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

constexpr uint64_t kIq1sEntries[2048] = {
#include "tensor/iquant_grid_iq1s.inc"
};
// IQ1 entries are bytes g in {-1, 0, 1}: their codes are g + 1.
constexpr Magnitudes kIq1Values = {{0xFF, 0, 1}, 3};
constexpr CodePlanes<2048, 8> kIq1sPlanes(kIq1sEntries, kIq1Values);

// IQ1_S, two super-blocks a decode. Group g = 4ib + l: index qs[g] | bits
// 3l..3l+2 of qh[ib] << 8; qh[ib] bits 12-14 the scale s, bit 15 set: the
// shift delta is -1 (else +1). A value is (2s + 1) (8g + delta) / 8 with g
// in {-1, 0, 1}; as 8 (g + 1) + (delta - 8) the first term is an unsigned
// magnitude 0, 8 or 16 (no signs) and the second weighs the sub-block's
// activation sum: (2s + 1) (delta - 8) on each of its two bsums.
constexpr Magnitudes kIq1Magnitudes = {{0, 8, 16}, 3};
constexpr MagnitudeBytes<2> kIq1MagnitudeBytes(kIq1Magnitudes);
alignas(64) constexpr struct Iq1sGathers {
  // The qh words (block u's in words 8u..8u+7) for vpshufbitqmb: quadword
  // 2h + u holds block u's sub-blocks 2r + h / 2 (r = 0..3, word r), where
  // the entries of index bytes 16h + 8u.. are.
  int16_t qh_words[32] = {};
  int8_t index_bit[3][64] = {};        // index bits 8, 9, 10 in those quadwords
  int16_t sub_block_words[32] = {};    // word 16u + j: block u's qh word j / 2 (its bsums j)
  int16_t scale_words[2][2][32] = {};  // Decoded::scales of block u from sub_block_words
  constexpr Iq1sGathers() {
    for (int k = 0; k < 8; ++k) {
      for (int r = 0; r < 4; ++r) qh_words[4 * k + r] = int16_t(8 * (k % 2) + 2 * r + k / 4);
    }
    for (int i = 0; i < 64; ++i) {
      const int entry = kEightValueOrder.order[i], group = entry % 32, sub_block = group / 4;
      if (entry / 32 != i / 8 % 2 || sub_block % 2 != i / 32)
        throw "an entry's qh word is not in its quadword";
      for (int b = 0; b < 3; ++b) index_bit[b][i] = int8_t(16 * (sub_block / 2) + 3 * (group % 4) + b);
    }
    for (int w = 0; w < 32; ++w) sub_block_words[w] = int16_t(8 * (w / 16) + w % 16 / 2);
    for (int u = 0; u < 2; ++u) {
      for (int p = 0; p < 2; ++p) {
        for (int w = 0; w < 32; ++w) scale_words[u][p][w] = int16_t(16 * u + 8 * p + 4 * (w % 8 / 4) + w / 8);
      }
    }
  }
} kIq1sGathers;

struct Iq1SVbmi {
  using Block = BlockIQ1_S;
  static constexpr float kFactor = 0.125f;
  static constexpr int kBlocksPerDecode = 2;
  static constexpr bool kWeighsBlockSums = true;

  static void decode(const Block& first, const Block& second, Decoded (&out)[2]) {
    const __m512i qs = _mm512_inserti64x4(_mm512_castsi256_si512(load256(first.qs)), load256(second.qs), 1);
    const __m512i qh = _mm512_zextsi256_si512(
        _mm256_inserti128_si256(_mm256_castsi128_si256(load128(first.qh)), load128(second.qh), 1));
    const __m512i qh_by_entry = _mm512_permutexvar_epi16(load512(kIq1sGathers.qh_words), qh);
    __mmask64 high_bits[3];
    for (int b = 0; b < 3; ++b) {
      high_bits[b] = _mm512_bitshuffle_epi64_mask(qh_by_entry, load512(kIq1sGathers.index_bit[b]));
    }
    __m512i words[2];
    lookup_words(kIq1sPlanes, _mm512_permutexvar_epi8(load512(kEightValueOrder.order), qs), high_bits, words);
    const __m512i magnitudes = load512(kIq1MagnitudeBytes.bytes);
    for (int r = 0; r < 8; ++r) {
      out[r / 4].mags[r % 4] = expand(words[r / 4], kEightValueOrder.shift[r % 4], magnitudes);
      out[r / 4].neg[r % 4] = 0;
    }
    // Per bsums group j of block u (word 16u + j): 2s + 1 and delta - 8 = -7 - 2 (bit 15).
    const __m512i sub_blocks = _mm512_permutexvar_epi16(load512(kIq1sGathers.sub_block_words), qh);
    const __m512i odd = _mm512_ternarylogic_epi32(_mm512_srli_epi16(sub_blocks, 11), _mm512_set1_epi16(0xE),
                                                  _mm512_set1_epi16(1), 0xEA);
    const __m512i negative = _mm512_srli_epi16(sub_blocks, 15);
    const __m512i shift_minus_8 =
        _mm512_sub_epi16(_mm512_set1_epi16(-7), _mm512_add_epi16(negative, negative));
    const __m512i bsum_weights = _mm512_mullo_epi16(odd, shift_minus_8);
    out[0].bsum_weights = _mm512_castsi512_si256(bsum_weights);
    out[1].bsum_weights = _mm512_extracti64x4_epi64(bsum_weights, 1);
    for (int u = 0; u < 2; ++u) {
      for (int p = 0; p < 2; ++p) {
        out[u].scales[p] = _mm512_permutexvar_epi16(load512(kIq1sGathers.scale_words[u][p]), odd);
      }
    }
  }
};

// IQ1_M, two super-blocks a decode. Group g = 4ib + l: nibble g of qh (16
// bytes) holds index bits 8-10 and, in its bit 3, a negative shift; the
// 3-bit scale of 16 values 2ib + half is at bit 16 (ib / 2) + 6 (ib % 2) + 3
// half of the scale words. As 8 (g + 1) + 1 + delta - 9 a value's first part
// is an unsigned magnitude (2, 10 or 18, less 2 for a negative shift) and -9
// weighs the activations' bsums.
constexpr Magnitudes kIq1mMagnitudes = {{2, 10, 18}, 3};
constexpr MagnitudeBytes<2> kIq1mMagnitudeBytes(kIq1mMagnitudes);
constexpr int iq1m_scale_bit(int group16) {
  return 16 * (group16 / 4) + 6 * (group16 / 2 % 2) + 3 * (group16 % 2);
}
alignas(64) constexpr struct Iq1mGathers {
  int8_t index_qh[64] = {};          // qh bytes of the index bits: quadword 2h + u, byte r: block u's 4r + h
  int8_t index_bit[3][64] = {};      // index bits 8, 9, 10 in those quadwords
  int8_t shift_qh[2][64] = {};       // by block: quadword k, byte r: its qh byte 4r + k / 2 (groups 8r + k)
  int8_t shift_bit[4][64] = {};      // by register: the shift sign of value i's group there
  int8_t scale_offsets[3][64] = {};  // vpmultishiftqb offsets: Decoded::scales[0, 1], the bsums' order
  constexpr Iq1mGathers() {
    for (int i = 0; i < 64; ++i) {
      const int k = i / 8, r = i % 8 % 4;
      index_qh[i] = int8_t(16 * (k % 2) + 4 * r + k / 2);
      for (int u = 0; u < 2; ++u) shift_qh[u][i] = int8_t(16 * u + 4 * r + k / 2);
      const int entry = kEightValueOrder.order[i], group = entry % 32;
      if (entry / 32 != k % 2 || group / 2 != 4 * (group / 8) + k / 2)
        throw "an entry's qh byte is not in its quadword";
      for (int b = 0; b < 3; ++b) index_bit[b][i] = int8_t(8 * (group / 8) + 4 * (group % 2) + b);
      for (int reg = 0; reg < 4; ++reg) shift_bit[reg][i] = int8_t(8 * reg + 4 * (k % 2) + 3);
    }
    for (int w = 0; w < 32; ++w) {
      for (int p = 0; p < 2; ++p) {
        scale_offsets[p][2 * w] = int8_t((iq1m_scale_bit(8 * p + 4 * (w % 8 / 4) + w / 8) + 63) % 64);
      }
      scale_offsets[2][2 * w] = int8_t((iq1m_scale_bit(w % 16) + 63) % 64);
    }
  }
} kIq1mGathers;

struct Iq1MVbmi {
  using Block = BlockIQ1_M;
  static constexpr float kFactor = 0.125f;
  static constexpr int kBlocksPerDecode = 2;
  static constexpr bool kWeighsBlockSums = true;
  static float d(const Block& b) { return _cvtsh_ss(iq1_m_scale_bits(b)); }

  static void decode(const Block& first, const Block& second, Decoded (&out)[2]) {
    const __m512i qs = _mm512_inserti64x4(_mm512_castsi256_si512(load256(first.qs)), load256(second.qs), 1);
    const __m512i qh = _mm512_zextsi256_si512(
        _mm256_inserti128_si256(_mm256_castsi128_si256(load128(first.qh)), load128(second.qh), 1));
    const __m512i qh_by_entry = _mm512_permutexvar_epi8(load512(kIq1mGathers.index_qh), qh);
    __mmask64 high_bits[3];
    for (int b = 0; b < 3; ++b) {
      high_bits[b] = _mm512_bitshuffle_epi64_mask(qh_by_entry, load512(kIq1mGathers.index_bit[b]));
    }
    __m512i words[2];
    lookup_words(kIq1sPlanes, _mm512_permutexvar_epi8(load512(kEightValueOrder.order), qs), high_bits, words);
    const __m512i magnitudes = load512(kIq1mMagnitudeBytes.bytes);
    for (int u = 0; u < 2; ++u) {
      const __m512i shift_signs = _mm512_permutexvar_epi8(load512(kIq1mGathers.shift_qh[u]), qh);
      for (int r = 0; r < 4; ++r) {
        const __mmask64 negative =
            _mm512_bitshuffle_epi64_mask(shift_signs, load512(kIq1mGathers.shift_bit[r]));
        const __m512i m = expand(words[u], kEightValueOrder.shift[r], magnitudes);
        out[u].mags[r] = _mm512_mask_sub_epi8(m, negative, m, _mm512_set1_epi8(2));
        out[u].neg[r] = 0;
      }
    }
    const uint8_t* scales[2] = {first.scales, second.scales};
    for (int u = 0; u < 2; ++u) {
      const __m512i all = every_qword(scales[u]);
      __m512i odd[3];
      for (int j = 0; j < 3; ++j) {
        const __m512i placed = _mm512_multishift_epi64_epi8(load512(kIq1mGathers.scale_offsets[j]), all);
        odd[j] = _mm512_ternarylogic_epi32(placed, _mm512_set1_epi16(0xE), _mm512_set1_epi16(1), 0xEA);
      }
      out[u].scales[0] = odd[0];
      out[u].scales[1] = odd[1];
      out[u].bsum_weights = _mm512_castsi512_si256(_mm512_mullo_epi16(odd[2], _mm512_set1_epi16(-9)));
    }
  }
};

}  // namespace

void register_quant_iq1_vbmi_avx512(CpuKernels& k) {
  register_type<Iq1SVbmi>(k, DType::IQ1_S);
  register_type<Iq1MVbmi>(k, DType::IQ1_M);
}

}  // namespace moeserve::cpu::detail
