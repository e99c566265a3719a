// AVX-512 VBMI (+ BITALG) dot products of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS
// and IQ3_S against Q8_K activations: registered over quant_iquants_avx512.cpp's
// kernels of those types when the CPU has both (dispatch.cpp), the dot itself
// shared (iquant_common_avx512.h); IQ1_S / IQ1_M in quant_iq1_vbmi_avx512.cpp.
//
// The kernels are instruction bound, and byte permutes shorten each step of
// the decode:
//  - lookup: an entry's value codes (positions in the magnitude list) fit 16
//    bits, held as two byte planes (the words' low and high bytes). vpermi2b
//    reads 128 bytes of a plane, so each plane takes one permute per 128
//    entries and one blend on index bit 7, for 64 entries at once (IQ3_XXS:
//    a super-block; IQ2_XXS: two), and unpacking the planes' bytes gives the
//    words. The word lookup of the plain kernel needs twice the permutes and
//    three times the blends per entry.
//  - expansion: vpmultishiftqb copies, to each byte of a quadword, the 8 bits
//    at any offset of that quadword, so it spreads the words' codes over
//    bytes in one step (each byte's low bits its code, the next codes above),
//    and vpermb reads the magnitude from a 64-byte table that repeats the
//    list (the bits above the code do not matter). The order of the entries
//    in the looked-up words is chosen by permuting the indices before the
//    lookup, so that the expanded values come out in row order.
//  - signs: vpmultishiftqb extracts the 7-bit sign fields to bytes and
//    vpermi2b looks up their sign bytes (kIqSigns, 128 entries, the field's
//    eighth bit ignored) for 64 fields at once; vpshufbitqmb turns them into
//    the negation masks (a store and mask loads measured the same).
//  - index bits above 8 (IQ2_XS, IQ2_S, IQ3_S) become blend masks, by
//    vpshufbitqmb where they are bits of qh; 4-bit scales are placed by
//    vpmultishiftqb.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/iquant_vbmi_common_avx512.h"
#include "kernels/cpu/register.h"

namespace moeserve::cpu::detail {
namespace {

// ---- codebooks ---------------------------------------------------------------------

constexpr CodePlanes<256, 8> kIq2xxsPlanes(kIq2xxsEntries, kIq2Magnitudes);
constexpr CodePlanes<512, 8> kIq2xsPlanes(kIq2xsEntries, kIq2Magnitudes);
constexpr CodePlanes<1024, 8> kIq2sPlanes(kIq2sEntries, kIq2Magnitudes);
constexpr CodePlanes<256, 4> kIq3xxsPlanes(kIq3xxsEntries, kIq3xxsMagnitudes);
constexpr CodePlanes<512, 4> kIq3sPlanes(kIq3sEntries, kIq3sMagnitudes);

// ---- signs and scales -----------------------------------------------------------------

// The XXS types' sub-block words: 4 sign fields of 7 bits, then the scale in
// bits 28..31. Two per quadword, their 8 fields at these offsets.
alignas(64) constexpr struct FieldOffsets {
  int8_t bytes[64] = {};
  constexpr FieldOffsets() {
    for (int j = 0; j < 64; ++j) bytes[j] = int8_t(32 * (j % 8 / 4) + 7 * (j % 4));
  }
} kFieldOffsets;

// Mask r of sign bytes (byte i: the signs of values 8i..8i+7) is bytes
// 8r..8r+7. vpshufbitqmb takes bits 8k..8k+7 of a mask from quadword k of its
// source, so the bytes are transposed first (byte r of quadword k: sign byte
// 8r + k) and mask r picks byte r of each quadword.
alignas(64) constexpr struct MaskBits {
  int8_t transpose[64] = {};
  int8_t of_mask[8][64] = {};
  constexpr MaskBits() {
    for (int k = 0; k < 8; ++k) {
      for (int r = 0; r < 8; ++r) transpose[8 * k + r] = int8_t(8 * r + k);
    }
    for (int r = 0; r < 8; ++r) {
      for (int i = 0; i < 64; ++i) of_mask[r][i] = int8_t(8 * r + i % 8);
    }
  }
} kMaskBits;

// The sign bytes of 7-bit fields (bit 7 ignored), 64 at once.
inline __m512i sign_bytes(__m512i fields) {
  return _mm512_permutex2var_epi8(load512(kIqSignBytes), fields, load512(kIqSignBytes + 64));
}

// kMasks negation masks from sign bytes in kMaskBits.transpose's order.
template <int kMasks>
inline void masks_of_transposed(__m512i transposed_signs, __mmask64* neg) {
  for (int r = 0; r < kMasks; ++r) {
    neg[r] = _mm512_bitshuffle_epi64_mask(transposed_signs, load512(kMaskBits.of_mask[r]));
  }
}

// Negation masks from the sign fields of `sub_block_words` (sub-block k in
// dword k): field i covers values 8i..8i+7.
template <int kMasks>
inline void xxs_sign_masks(__m512i sub_block_words, __mmask64* neg) {
  const __m512i fields = _mm512_multishift_epi64_epi8(load512(kFieldOffsets.bytes), sub_block_words);
  masks_of_transposed<kMasks>(sign_bytes(_mm512_permutexvar_epi8(load512(kMaskBits.transpose), fields)), neg);
}

// IQ2_S / IQ3_S store the sign bytes as such: a mask is 8 of them.
inline void stored_sign_masks(const uint8_t* bytes, __mmask64* neg) {
  for (int r = 0; r < 4; ++r) {
    uint64_t m;
    std::memcpy(&m, bytes + 8 * r, 8);
    neg[r] = _cvtu64_mask64(m);
  }
}

// The odd scales 2s + 1 of the sub-block words in dwords' low words.
inline __m512i xxs_odd_scales(__m512i sub_block_words) {
  return _mm512_or_si512(_mm512_srli_epi32(sub_block_words, 27), _mm512_set1_epi32(1));
}

// Decoded::scales[p] of super-block `block` from xxs_odd_scales (sub-block k
// of the super-block, in dword 8 block + k).
alignas(64) constexpr struct ScaleWords {
  int16_t index[2][2][32] = {};  // by super-block, by pair
  constexpr ScaleWords() {
    for (int block = 0; block < 2; ++block) {
      for (int p = 0; p < 2; ++p) {
        for (int w = 0; w < 32; ++w) {
          const int group16 = 8 * p + 4 * (w % 8 / 4) + w / 8;
          index[block][p][w] = int16_t(2 * (8 * block + group16 / 2));
        }
      }
    }
  }
} kScaleWords;

inline void xxs_scales(__m512i odd_scales, int block, __m512i (&scales)[2]) {
  for (int p = 0; p < 2; ++p)
    scales[p] = _mm512_permutexvar_epi16(load512(kScaleWords.index[block][p]), odd_scales);
}

// 4-bit scales s (IQ2_XS, IQ2_S: one per 16 values, IQ3_S: per 32) as the
// words 2s + 1 of Decoded::scales: vpmultishiftqb puts the nibble of word w
// in bits 1-4 of its low byte (from offset 4 n - 1, wrapping around the
// quadword that holds all of a super-block's scales) and a ternary logic
// keeps those bits and sets bit 0.
template <int kValuesPerScale>
struct NibbleOffsets {
  alignas(64) int8_t of_pair[2][64] = {};
  constexpr NibbleOffsets() {
    for (int p = 0; p < 2; ++p) {
      for (int w = 0; w < 32; ++w) {
        const int group16 = 8 * p + 4 * (w % 8 / 4) + w / 8;
        of_pair[p][2 * w] = int8_t((4 * (16 * group16 / kValuesPerScale) + 63) % 64);
      }
    }
  }
};

template <int kValuesPerScale>
inline void nibble_scales(__m512i scales_in_every_qword, __m512i (&scales)[2]) {
  static constexpr NibbleOffsets<kValuesPerScale> kOffsets;
  for (int p = 0; p < 2; ++p) {
    const __m512i placed = _mm512_multishift_epi64_epi8(load512(kOffsets.of_pair[p]), scales_in_every_qword);
    scales[p] = _mm512_ternarylogic_epi32(placed, _mm512_set1_epi16(0x1E), _mm512_set1_epi16(1), 0xEA);
  }
}

// ---- decoders -------------------------------------------------------------------------

// Two super-blocks a decode: 64 entries. qs as dwords: sub-block ib's 4 index
// bytes (dword 2ib), then its sign fields and scale (2ib + 1).
constexpr MagnitudeBytes<2> kIq2MagnitudeBytes(kIq2Magnitudes);
alignas(64) constexpr struct Iq2xxsGathers {
  int8_t index[64] = {};        // index bytes of the two blocks' qs, in kEightValueOrder
  int32_t sub_blocks[16] = {};  // the 16 sub-block words
  constexpr Iq2xxsGathers() {
    for (int i = 0; i < 64; ++i) {
      const int entry = kEightValueOrder.order[i], group = entry % 32;
      index[i] = int8_t(64 * (entry / 32) + 8 * (group / 4) + group % 4);
    }
    for (int k = 0; k < 16; ++k) sub_blocks[k] = 16 * (k / 8) + 2 * (k % 8) + 1;
  }
} kIq2xxsGathers;

struct Iq2XxsVbmi {
  using Block = BlockIQ2_XXS;
  static constexpr float kFactor = 0.125f;
  static constexpr int kBlocksPerDecode = 2;

  static void decode(const Block& first, const Block& second, Decoded (&out)[2]) {
    const __m512i q0 = load512(first.qs), q1 = load512(second.qs);
    __m512i words[2];
    lookup_words(kIq2xxsPlanes, _mm512_permutex2var_epi8(q0, load512(kIq2xxsGathers.index), q1), nullptr,
                 words);
    const __m512i magnitudes = load512(kIq2MagnitudeBytes.bytes);
    for (int r = 0; r < 8; ++r) {
      out[r / 4].mags[r % 4] = expand(words[r / 4], kEightValueOrder.shift[r % 4], magnitudes);
    }
    const __m512i sub_blocks = _mm512_permutex2var_epi32(q0, load512(kIq2xxsGathers.sub_blocks), q1);
    __mmask64 neg[8];
    xxs_sign_masks<8>(sub_blocks, neg);
    for (int r = 0; r < 8; ++r) out[r / 4].neg[r % 4] = neg[r];
    const __m512i odd = xxs_odd_scales(sub_blocks);
    xxs_scales(odd, 0, out[0].scales);
    xxs_scales(odd, 1, out[1].scales);
  }
};

// qs: 64 index bytes, then the 8 sub-block words.
constexpr MagnitudeBytes<4> kIq3xxsMagnitudeBytes(kIq3xxsMagnitudes);
constexpr MagnitudeBytes<4> kIq3sMagnitudeBytes(kIq3sMagnitudes);

struct Iq3XxsVbmi {
  using Block = BlockIQ3_XXS;
  static constexpr float kFactor = 0.25f;
  static constexpr int kBlocksPerDecode = 1;

  static void decode(const Block& b, Decoded& out) {
    __m512i words[2];
    lookup_words(kIq3xxsPlanes, _mm512_permutexvar_epi8(load512(kFourValueOrder.order), load512(b.qs)),
                 nullptr, words);
    const __m512i magnitudes = load512(kIq3xxsMagnitudeBytes.bytes);
    for (int r = 0; r < 4; ++r) out.mags[r] = expand(words[r / 2], kFourValueOrder.shift[r % 2], magnitudes);
    const __m512i sub_blocks = _mm512_castsi256_si512(load256(b.qs + 64));
    xxs_sign_masks<4>(sub_blocks, out.neg);
    xxs_scales(xxs_odd_scales(sub_blocks), 0, out.scales);
  }
};

// Two super-blocks a decode. qs[g]: index (9 bits) | sign field << 9 of group
// g, so the high byte holds index bit 8 and the field above it.
alignas(64) constexpr struct Iq2xsGathers {
  int8_t low[64] = {};          // the index bytes in kEightValueOrder (the same order)
  int8_t high[64] = {};         // their high bytes
  int8_t sign_fields[64] = {};  // the high bytes in kMaskBits.transpose's order
  constexpr Iq2xsGathers() {
    for (int i = 0; i < 64; ++i) {
      const int entry = kEightValueOrder.order[i];
      low[i] = int8_t(64 * (entry / 32) + 2 * (entry % 32));
      high[i] = int8_t(low[i] + 1);
      const int group = kMaskBits.transpose[i];
      sign_fields[i] = int8_t(64 * (group / 32) + 2 * (group % 32) + 1);
    }
  }
} kIq2xsGathers;

struct Iq2XsVbmi {
  using Block = BlockIQ2_XS;
  static constexpr float kFactor = 0.125f;
  static constexpr int kBlocksPerDecode = 2;

  static void decode(const Block& first, const Block& second, Decoded (&out)[2]) {
    const __m512i q0 = load512(first.qs), q1 = load512(second.qs);
    const __m512i high = _mm512_permutex2var_epi8(q0, load512(kIq2xsGathers.high), q1);
    const __mmask64 bit8 = _mm512_test_epi8_mask(high, _mm512_set1_epi8(1));
    __m512i words[2];
    lookup_words(kIq2xsPlanes, _mm512_permutex2var_epi8(q0, load512(kIq2xsGathers.low), q1), &bit8, words);
    const __m512i magnitudes = load512(kIq2MagnitudeBytes.bytes);
    for (int r = 0; r < 8; ++r) {
      out[r / 4].mags[r % 4] = expand(words[r / 4], kEightValueOrder.shift[r % 4], magnitudes);
    }
    // A word shift by one leaves each byte's field in its bits 0-6.
    const __m512i fields =
        _mm512_srli_epi16(_mm512_permutex2var_epi8(q0, load512(kIq2xsGathers.sign_fields), q1), 1);
    __mmask64 neg[8];
    masks_of_transposed<8>(sign_bytes(fields), neg);
    for (int r = 0; r < 8; ++r) out[r / 4].neg[r % 4] = neg[r];
    nibble_scales<16>(every_qword(first.scales), out[0].scales);
    nibble_scales<16>(every_qword(second.scales), out[1].scales);
  }
};

// Two super-blocks a decode. Group g's index: qs[g] | bits 2g, 2g + 1 of qh
// (as one 64-bit word) << 8; qs[32 + g]: its sign byte.
alignas(64) constexpr struct Iq2sGathers {
  int8_t low[64] = {};     // the index bytes of the two blocks' qs, in kEightValueOrder
  int8_t bit[2][64] = {};  // index bits 8, 9 in qh (vpshufbitqmb: block u's in quadwords 2k + u)
  constexpr Iq2sGathers() {
    for (int i = 0; i < 64; ++i) {
      const int entry = kEightValueOrder.order[i], group = entry % 32;
      if (entry / 32 != i / 8 % 2) throw "block u's entries are not in quadwords 2k + u";
      low[i] = int8_t(64 * (entry / 32) + group);
      bit[0][i] = int8_t(2 * group);
      bit[1][i] = int8_t(2 * group + 1);
    }
  }
} kIq2sGathers;

struct Iq2SVbmi {
  using Block = BlockIQ2_S;
  static constexpr float kFactor = 0.125f;
  static constexpr int kBlocksPerDecode = 2;

  static void decode(const Block& first, const Block& second, Decoded (&out)[2]) {
    const __m512i qh = _mm512_mask_blend_epi64(0xAA, every_qword(first.qh), every_qword(second.qh));
    const __mmask64 high_bits[2] = {_mm512_bitshuffle_epi64_mask(qh, load512(kIq2sGathers.bit[0])),
                                    _mm512_bitshuffle_epi64_mask(qh, load512(kIq2sGathers.bit[1]))};
    __m512i words[2];
    lookup_words(kIq2sPlanes,
                 _mm512_permutex2var_epi8(load512(first.qs), load512(kIq2sGathers.low), load512(second.qs)),
                 high_bits, words);
    const __m512i magnitudes = load512(kIq2MagnitudeBytes.bytes);
    for (int r = 0; r < 8; ++r) {
      out[r / 4].mags[r % 4] = expand(words[r / 4], kEightValueOrder.shift[r % 4], magnitudes);
    }
    stored_sign_masks(first.qs + 32, out[0].neg);
    stored_sign_masks(second.qs + 32, out[1].neg);
    nibble_scales<16>(every_qword(first.scales), out[0].scales);
    nibble_scales<16>(every_qword(second.scales), out[1].scales);
  }
};

// Group g's index: qs[g] | bit g of qh (as one 64-bit word) << 8.
struct Iq3SVbmi {
  using Block = BlockIQ3_S;
  static constexpr float kFactor = 1.0f;
  static constexpr int kBlocksPerDecode = 1;

  static void decode(const Block& b, Decoded& out) {
    const __mmask64 bit8 = _mm512_bitshuffle_epi64_mask(every_qword(b.qh), load512(kFourValueOrder.order));
    __m512i words[2];
    lookup_words(kIq3sPlanes, _mm512_permutexvar_epi8(load512(kFourValueOrder.order), load512(b.qs)), &bit8,
                 words);
    const __m512i magnitudes = load512(kIq3sMagnitudeBytes.bytes);
    for (int r = 0; r < 4; ++r) out.mags[r] = expand(words[r / 2], kFourValueOrder.shift[r % 2], magnitudes);
    stored_sign_masks(b.signs, out.neg);
    uint32_t scales;
    std::memcpy(&scales, b.scales, 4);  // (the block's last bytes: no 8-byte read)
    nibble_scales<32>(_mm512_set1_epi32(int(scales)), out.scales);
  }
};

}  // namespace

void register_quant_iq1_vbmi_avx512(CpuKernels& k);  // quant_iq1_vbmi_avx512.cpp

void register_quant_iquants_vbmi_avx512(CpuKernels& k) {
  register_type<Iq2XxsVbmi>(k, DType::IQ2_XXS);
  register_type<Iq3XxsVbmi>(k, DType::IQ3_XXS);
  register_type<Iq2XsVbmi>(k, DType::IQ2_XS);
  register_type<Iq2SVbmi>(k, DType::IQ2_S);
  register_type<Iq3SVbmi>(k, DType::IQ3_S);
  register_quant_iq1_vbmi_avx512(k);
}

}  // namespace moeserve::cpu::detail
