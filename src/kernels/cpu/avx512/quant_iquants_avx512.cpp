// AVX-512 (F/BW/VL/VNNI) dot products of the codebook i-quants IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S against Q8_K activations, one weight row
// against 1..8 activation rows (a super-block decoded once for every column).
// IQ1_S / IQ1_M keep their AVX2 kernels (quant_iquants_avx2.cpp). Where the
// CPU has AVX512_VBMI (and BITALG), quant_iquants_vbmi_avx512.cpp and
// quant_iq1_vbmi_avx512.cpp replace all seven with byte-permute decoders;
// these remain for the other AVX-512 CPUs.
//
// The AVX2 kernels build each sub-block from four (IQ3: eight) scalar table
// loads and inserts, and on the decode path that lookup, not DRAM, was the
// limit. Here the codebook sits in registers: an entry's values, as positions
// in the type's short list of magnitudes (IQ2: 3, 2-bit codes; IQ3: 8, 3-bit
// codes), fit one 16-bit word, so 256 entries are 8 registers and vpermi2w
// looks up 32 entries at once (a whole IQ2 super-block): one vpermi2w per 64
// entries, then blends on the index's upper bits. A looked-up word goes to the
// bytes of its values with a word permute, a variable word shift and a vpshufb
// through the magnitude list. Gathers were measured and are slower still.
//
// The signs become one __mmask64 per 64 values (bit e negates value e), which
// is the bit order of the sign bytes. XXS / XS store 7 sign bits per 8 values
// and the eighth makes the count even: the same word lookup reads kIqSigns
// itself (128 entries). Masked vpsubb negates the activations (never -128),
// vpdpbusd multiplies the unsigned magnitudes: 4 products per int32 lane,
// |sum| <= 4 * 62 * 127 = 31,496, so vpackssdw narrows two registers to int16
// without saturating and vpdpwssd applies the odd scales 2s + 1 (<= 31) and
// accumulates. The block's integer sum is exact; d * x.d and the type's
// constant (1/8 for IQ2, 1/4 for IQ3_XXS, 1 for IQ3_S) scale it once a block.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/iquant_common_avx512.h"
#include "kernels/cpu/register.h"

namespace moeserve::cpu::detail {
namespace {

// ---- codebooks as words of value codes ------------------------------------------
// Entry e of a codebook of kValues values per entry, as one word: value 2i
// in slot i of the low byte, value 2i + 1 in slot i of the high byte, a slot
// being 16 / kValues bits (IQ2: 2, its codes 0..2; IQ3: 4, a nibble whose top
// bit stays clear). A word shifted right by one slot width times i holds value
// 2i in its low byte's low bits and 2i + 1 in its high byte's, so one vpsrlvw
// spreads an entry over kValues bytes (expand()).
template <int N, int kValues>
struct CodeWords {
  static constexpr int kSlot = 16 / kValues;
  alignas(64) uint16_t words[N] = {};
  template <typename Entry>
  constexpr CodeWords(const Entry (&grid)[N], const Magnitudes& m) {
    if (m.count > (1 << kSlot) || (kSlot == 4 && m.count > 8)) throw "codes wider than a slot";
    for (int e = 0; e < N; ++e) {
      for (int j = 0; j < kValues; ++j) {
        const int code = code_of(uint8_t(grid[e] >> (8 * j)), m);
        words[e] = uint16_t(words[e] | code << (8 * (j % 2) + kSlot * (j / 2)));
      }
    }
  }
};

constexpr CodeWords<256, 8> kIq2xxsWords(kIq2xxsEntries, kIq2Magnitudes);
constexpr CodeWords<512, 8> kIq2xsWords(kIq2xsEntries, kIq2Magnitudes);
constexpr CodeWords<1024, 8> kIq2sWords(kIq2sEntries, kIq2Magnitudes);
constexpr CodeWords<256, 4> kIq3xxsWords(kIq3xxsEntries, kIq3xxsMagnitudes);
constexpr CodeWords<512, 4> kIq3sWords(kIq3sEntries, kIq3sMagnitudes);

// 32 table lookups: word i of the result is table[idx word i], read from the
// index's low log2(N) bits (the bits above are ignored, so callers need not
// clear them). One vpermi2w per 64 entries (index bits 0-5), then blends on
// index bits 6, 7, ... halve the candidates until one is left.
template <int N>
inline __m512i lookup32(const uint16_t* table, __m512i idx) {
  constexpr int kParts = N / 64;
  static_assert(kParts >= 1 && (kParts & (kParts - 1)) == 0, "N: 64 times a power of two");
  __m512i part[kParts];
  for (int p = 0; p < kParts; ++p) {
    part[p] = _mm512_permutex2var_epi16(load512(table + 64 * p), idx, load512(table + 64 * p + 32));
  }
  int bit = 6;
  for (int n = kParts; n > 1; n /= 2, ++bit) {
    const __mmask32 upper = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(int16_t(1 << bit)));
    for (int i = 0; i < n / 2; ++i) part[i] = _mm512_mask_blend_epi16(upper, part[2 * i], part[2 * i + 1]);
  }
  return part[0];
}

// The word permutes and shifts of expand(): register r of the values of a
// lookup32 takes, in word o, entry r * 64 / kValues + o / (kValues / 2)
// shifted by kSlot * (o % (kValues / 2)).
template <int kValues>
struct ExpandConstants {
  static constexpr int kWordsPerEntry = kValues / 2;
  alignas(64) int16_t place[kValues / 2][32] = {};  // by r: a lookup32 yields kValues / 2 registers
  alignas(64) int16_t shift[32] = {};
  constexpr ExpandConstants() {
    for (int r = 0; r < kValues / 2; ++r) {
      for (int o = 0; o < 32; ++o) place[r][o] = int16_t(r * 64 / kValues + o / kWordsPerEntry);
    }
    for (int o = 0; o < 32; ++o) shift[o] = int16_t(16 / kValues * (o % kWordsPerEntry));
  }
};

// Register r of the magnitudes of 32 looked-up entries (the 64 values of
// entries r * 64 / kValues on) as unsigned bytes: vpshufb reads a byte's low
// nibble, and its bit 7 as "zero": IQ3's nibble slots leave bit 7 clear and
// the code in the nibble, IQ2's 2-bit slots need the mask.
template <int kValues>
inline __m512i expand(__m512i entries, int r, __m512i magnitudes) {
  static constexpr ExpandConstants<kValues> k;
  const __m512i placed = _mm512_permutexvar_epi16(load512(k.place[r]), entries);
  __m512i codes = _mm512_srlv_epi16(placed, load512(k.shift));
  if constexpr (kValues == 8) codes = _mm512_and_si512(codes, _mm512_set1_epi8(3));
  return _mm512_shuffle_epi8(magnitudes, codes);
}

inline __m512i magnitude_table(const Magnitudes& m) {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(m.values)));
}

// ---- signs ------------------------------------------------------------------------

inline __m512i lanes128(const int8_t (&bytes)[16]) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
}

// kIqSigns as words, so that lookup32 reads it: the sign byte of a 7-bit
// field, its eighth bit the parity that makes the count of ones even.
constexpr struct SignWords {
  alignas(64) uint16_t words[128] = {};
  constexpr SignWords() {
    for (int i = 0; i < 128; ++i) words[i] = kIqSignBytes[i];
  }
} kSignWords;

// IQ2_XXS / IQ3_XXS: the four 7-bit sign fields of a sub-block's word (bits
// 0..27, the scale above) to its bytes 0..3: fields 2-3 move up by 2 bits
// (the upper word from a dword shift), then fields 1 and 3 by 1. Bit 7 of a
// byte is left over from its neighbour; lookup32<128> ignores it.
inline __m512i xxs_sign_fields(__m512i v) {
  const __m512i a = _mm512_mask_blend_epi16(0xAAAAAAAA, v, _mm512_slli_epi32(v, 2));
  return _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAA, a, _mm512_slli_epi16(a, 1));
}

// Negation masks from 32 words whose low bytes are the sign bytes of groups
// 0..31 (bit j: value j of the group): bit 8g + j of mask r is value j of
// group 8r + g, so each 128-bit lane, its 8 low bytes packed, is one mask.
inline void sign_masks(__m512i sign_words, __mmask64 (&neg)[4]) {
  static constexpr int8_t kLowBytes[16] = {0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1};
  alignas(64) uint64_t m[8];
  _mm512_store_si512(m, _mm512_shuffle_epi8(sign_words, lanes128(kLowBytes)));
  for (int r = 0; r < 4; ++r) neg[r] = _cvtu64_mask64(m[2 * r]);
}
// IQ2_S / IQ3_S store the 32 sign bytes as such.
inline void sign_masks(const uint8_t* bytes, __mmask64 (&neg)[4]) {
  for (int r = 0; r < 4; ++r) {
    uint64_t m;
    std::memcpy(&m, bytes + 8 * r, 8);
    neg[r] = _cvtu64_mask64(m);
  }
}

// ---- scales -----------------------------------------------------------------------

// The word scales of vpdpwssd on vpackssdw(register 2p, register 2p + 1): in
// 128-bit lane L, words 0-3 hold 16 values of register 2p (its lane L), words
// 4-7 those of register 2p + 1, so word w of the vector is 16-value group
// 8p + 4 ((w % 8) / 4) + w / 8. D::scale_word(q) says where the scale 2s + 1
// of group q is: a word of `a`, or (32 and up) of `b`.
template <typename D>
inline void pair_scales(__m512i a, __m512i b, __m512i (&scales)[2]) {
  alignas(64) static constexpr struct Index {
    int16_t i[2][32] = {};
    constexpr Index() {
      for (int p = 0; p < 2; ++p) {
        for (int w = 0; w < 32; ++w) i[p][w] = int16_t(D::scale_word(8 * p + 4 * (w % 8 / 4) + w / 8));
      }
    }
  } kIndex;
  for (int p = 0; p < 2; ++p) scales[p] = _mm512_permutex2var_epi16(a, load512(kIndex.i[p]), b);
}

// IQ2_XXS / IQ3_XXS: the scale s in bits 28..31 of a dword as 2s + 1 in its low word.
inline __m512i xxs_odd_scales(__m512i v) {
  return _mm512_or_si512(_mm512_srli_epi32(v, 27), _mm512_set1_epi32(1));
}

// 4-bit scales, two to a byte (IQ2_XS, IQ2_S, IQ3_S): word i of `low` is
// 2s + 1 of byte i's low nibble, of `high` its high nibble's.
struct NibbleScales {
  __m512i low, high;
};
inline NibbleScales nibble_scales(__m128i bytes) {
  const __m128i w = _mm_cvtepu8_epi16(bytes);
  const __m128i bits = _mm_set1_epi16(0x1E), one = _mm_set1_epi16(1);
  return {_mm512_castsi128_si512(_mm_ternarylogic_epi32(_mm_slli_epi16(w, 1), bits, one, 0xEA)),
          _mm512_castsi128_si512(_mm_ternarylogic_epi32(_mm_srli_epi16(w, 3), bits, one, 0xEA))};
}

// ---- decoders -----------------------------------------------------------------------

struct Iq2Xxs {
  static constexpr int kBlocksPerDecode = 1;
  using Block = BlockIQ2_XXS;
  static constexpr float kFactor = 0.125f;
  // qs as dwords: sub-block ib's 4 index bytes (dword 2ib), then its word of
  // sign fields and scale (2ib + 1); a 128-bit lane holds sub-blocks 2L, 2L+1.
  static constexpr int scale_word(int q) { return 4 * (q / 2) + 2; }
  static void decode(const Block& b, Decoded& out) {
    static constexpr int8_t kIndexBytes[16] = {0, -1, 1, -1, 2, -1, 3, -1, 8, -1, 9, -1, 10, -1, 11, -1};
    static constexpr int8_t kFieldBytes[16] = {4, -1, 5, -1, 6, -1, 7, -1, 12, -1, 13, -1, 14, -1, 15, -1};
    const __m512i q = load512(b.qs);
    const __m512i entries = lookup32<256>(kIq2xxsWords.words, _mm512_shuffle_epi8(q, lanes128(kIndexBytes)));
    const __m512i mags = magnitude_table(kIq2Magnitudes);
    for (int r = 0; r < 4; ++r) out.mags[r] = expand<8>(entries, r, mags);
    const __m512i fields = _mm512_shuffle_epi8(xxs_sign_fields(q), lanes128(kFieldBytes));
    sign_masks(lookup32<128>(kSignWords.words, fields), out.neg);
    const __m512i scales = xxs_odd_scales(q);
    pair_scales<Iq2Xxs>(scales, scales, out.scales);
  }
};

struct Iq3Xxs {
  static constexpr int kBlocksPerDecode = 1;
  using Block = BlockIQ3_XXS;
  static constexpr float kFactor = 0.25f;
  static constexpr int scale_word(int q) { return 2 * (q / 2); }  // dword ib of aux
  static void decode(const Block& b, Decoded& out) {
    // qs: 64 index bytes, then per sub-block a word of 4 sign fields and the scale.
    const __m512i mags = magnitude_table(kIq3xxsMagnitudes);
    for (int h = 0; h < 2; ++h) {
      const __m512i entries = lookup32<256>(kIq3xxsWords.words, _mm512_cvtepu8_epi16(load256(b.qs + 32 * h)));
      out.mags[2 * h] = expand<4>(entries, 0, mags);
      out.mags[2 * h + 1] = expand<4>(entries, 1, mags);
    }
    const __m512i aux = _mm512_castsi256_si512(load256(b.qs + 64));
    const __m512i fields = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(xxs_sign_fields(aux)));
    sign_masks(lookup32<128>(kSignWords.words, fields), out.neg);
    const __m512i scales = xxs_odd_scales(aux);
    pair_scales<Iq3Xxs>(scales, scales, out.scales);
  }
};

// IQ2_XS / IQ2_S: scales[ib] holds the halves' scales of sub-block ib.
inline constexpr int half_scale_word(int q) { return (q % 2 ? 32 : 0) + q / 2; }

struct Iq2Xs {
  static constexpr int kBlocksPerDecode = 1;
  using Block = BlockIQ2_XS;
  static constexpr float kFactor = 0.125f;
  static constexpr int scale_word(int q) { return half_scale_word(q); }
  static void decode(const Block& b, Decoded& out) {
    // 32 words: index (9 bits; lookup32 ignores the bits above) | sign field << 9.
    const __m512i q = load512(b.qs);
    const __m512i entries = lookup32<512>(kIq2xsWords.words, q);
    const __m512i mags = magnitude_table(kIq2Magnitudes);
    for (int r = 0; r < 4; ++r) out.mags[r] = expand<8>(entries, r, mags);
    sign_masks(lookup32<128>(kSignWords.words, _mm512_srli_epi16(q, 9)), out.neg);
    const NibbleScales s = nibble_scales(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
    pair_scales<Iq2Xs>(s.low, s.high, out.scales);
  }
};

struct Iq2S {
  static constexpr int kBlocksPerDecode = 1;
  using Block = BlockIQ2_S;
  static constexpr float kFactor = 0.125f;
  static constexpr int scale_word(int q) { return half_scale_word(q); }
  static void decode(const Block& b, Decoded& out) {
    // Index of group 4ib + l: qs[4ib + l] | bits 2l..2l+1 of qh[ib] << 8.
    alignas(64) static constexpr struct {
      int16_t sub_block[32], shift[32];
    } kGroup = {
        {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
        {0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6}};
    const __m512i qh =
        _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qh))));
    const __m512i per_group = _mm512_permutexvar_epi16(load512(kGroup.sub_block), qh);
    const __m512i high = _mm512_srlv_epi16(_mm512_slli_epi16(per_group, 8), load512(kGroup.shift));
    const __m512i low = _mm512_cvtepu8_epi16(load256(b.qs));
    const __m512i idx =
        _mm512_ternarylogic_epi32(low, high, _mm512_set1_epi16(0x300), 0xF8);  // low | (high & 0x300)
    const __m512i entries = lookup32<1024>(kIq2sWords.words, idx);
    const __m512i mags = magnitude_table(kIq2Magnitudes);
    for (int r = 0; r < 4; ++r) out.mags[r] = expand<8>(entries, r, mags);
    sign_masks(b.qs + 32, out.neg);
    const NibbleScales s = nibble_scales(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
    pair_scales<Iq2S>(s.low, s.high, out.scales);
  }
};

struct Iq3S {
  static constexpr int kBlocksPerDecode = 1;
  using Block = BlockIQ3_S;
  static constexpr float kFactor = 1.0f;
  // scales[ib / 2], nibble ib % 2: sub-block ib's scale.
  static constexpr int scale_word(int q) { return (q / 2 % 2 ? 32 : 0) + q / 4; }
  static void decode(const Block& b, Decoded& out) {
    // Index of group g = 8ib + k: qs[g] | bit k of qh[ib] << 8, and bit k of
    // qh[ib] is bit g of qh read as one 64-bit word.
    uint64_t qh;
    std::memcpy(&qh, b.qh, 8);
    const __m512i mags = magnitude_table(kIq3sMagnitudes);
    for (int h = 0; h < 2; ++h) {
      const __m512i low = _mm512_cvtepu8_epi16(load256(b.qs + 32 * h));
      const __mmask32 ninth = _cvtu32_mask32(uint32_t(qh >> (32 * h)));
      const __m512i entries =
          lookup32<512>(kIq3sWords.words, _mm512_mask_add_epi16(low, ninth, low, _mm512_set1_epi16(256)));
      out.mags[2 * h] = expand<4>(entries, 0, mags);
      out.mags[2 * h + 1] = expand<4>(entries, 1, mags);
    }
    sign_masks(b.signs, out.neg);
    uint32_t sc;
    std::memcpy(&sc, b.scales, 4);
    const NibbleScales s = nibble_scales(_mm_cvtsi32_si128(int(sc)));
    pair_scales<Iq3S>(s.low, s.high, out.scales);
  }
};

}  // namespace

void register_quant_iquants_avx512(CpuKernels& k) {
  register_type<Iq2Xxs>(k, DType::IQ2_XXS);
  register_type<Iq2Xs>(k, DType::IQ2_XS);
  register_type<Iq2S>(k, DType::IQ2_S);
  register_type<Iq3Xxs>(k, DType::IQ3_XXS);
  register_type<Iq3S>(k, DType::IQ3_S);
}

}  // namespace moeserve::cpu::detail
