// Shared by the AVX-512 VBMI codebook files (quant_iquants_vbmi_avx512.cpp,
// quant_iq1_vbmi_avx512.cpp; included only by *_vbmi_avx512.cpp files,
// everything in an anonymous namespace of each): codebooks as byte planes,
// their 64-entry lookup and the expansion of the looked-up code words to
// magnitude bytes (the technique: quant_iquants_vbmi_avx512.cpp's header).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/iquant_common_avx512.h"

namespace moeserve::cpu::detail {
namespace {

// ---- codebooks as byte planes of code words --------------------------------------

// Entry e's code word: value j's code in bits kBits j.. (kBits = 16 /
// kValues: IQ2's 8 values 2 bits each, IQ3's 4 values a nibble each), split
// into the planes of its low and high byte.
template <int N, int kValues>
struct CodePlanes {
  static constexpr int kBits = 16 / kValues;
  alignas(64) uint8_t low[N] = {};
  alignas(64) uint8_t high[N] = {};
  template <typename Entry>
  constexpr CodePlanes(const Entry (&grid)[N], const Magnitudes& m) {
    if (m.count > (1 << kBits)) throw "codes wider than their bits";
    for (int e = 0; e < N; ++e) {
      unsigned word = 0;
      for (int j = 0; j < kValues; ++j)
        word |= unsigned(code_of(uint8_t(grid[e] >> (8 * j)), m)) << (kBits * j);
      low[e] = uint8_t(word);
      high[e] = uint8_t(word >> 8);
    }
  }
};

// Byte i of a plane for each index byte i: its bits 0-6 pick one of 128
// bytes (vpermi2b reads no more), the index's bits 7.. (upper[0], upper[1],
// ...) the 128-byte part, by blends.
template <int N>
inline __m512i plane_lookup(const uint8_t (&plane)[N], __m512i idx, const __mmask64* upper) {
  constexpr int kParts = N / 128;
  __m512i part[kParts];
  for (int p = 0; p < kParts; ++p) {
    part[p] = _mm512_permutex2var_epi8(load512(plane + 128 * p), idx, load512(plane + 128 * p + 64));
  }
  for (int n = kParts, bit = 0; n > 1; n /= 2, ++bit) {
    for (int i = 0; i < n / 2; ++i)
      part[i] = _mm512_mask_blend_epi8(upper[bit], part[2 * i], part[2 * i + 1]);
  }
  return part[0];
}

// The code words of 64 entries: index byte i's word is word i % 8 of the
// 128-bit lane i / 16 of words[(i / 8) % 2] (vpunpck{l,h}bw's order). idx
// holds the indices' low 8 bits, high_bits[b] their bit 8 + b (N > 256).
template <int N, int kValues>
inline void lookup_words(const CodePlanes<N, kValues>& t, __m512i idx, const __mmask64* high_bits,
                         __m512i (&words)[2]) {
  static_assert(N == 256 || N == 512 || N == 1024 || N == 2048, "128 entries a part, up to 16 parts");
  __mmask64 upper[4] = {_mm512_movepi8_mask(idx)};
  for (int b = 1; (128 << b) < N; ++b) upper[b] = high_bits[b - 1];
  const __m512i low = plane_lookup(t.low, idx, upper);
  const __m512i high = plane_lookup(t.high, idx, upper);
  words[0] = _mm512_unpacklo_epi8(low, high);
  words[1] = _mm512_unpackhi_epi8(low, high);
}

// Where the 64 looked-up entries go. A register of 64 values takes e = 8 /
// kValues entries per quadword (IQ2: 1, IQ3: 2); register r of words[u]
// (register kValues / 2 * u + r of the values) reads words r e .. r e + e - 1
// of each quadword. order[i]: the entry, in row order, whose index goes to
// index byte i; shift[r]: the vpmultishiftqb offsets of register r.
template <int kValues>
struct EntryOrder {
  static constexpr int kBits = 16 / kValues;
  static constexpr int kPerQword = 8 / kValues;
  static constexpr int kRegsPerWords = kValues / 2;
  alignas(64) int8_t order[64] = {};
  alignas(64) int8_t shift[kRegsPerWords][64] = {};
  constexpr EntryOrder() {
    for (int u = 0; u < 2; ++u) {
      for (int r = 0; r < kRegsPerWords; ++r) {
        for (int q = 0; q < 8; ++q) {
          for (int s = 0; s < kPerQword; ++s) {
            const int word = r * kPerQword + s;  // of the quadword
            const int byte = 16 * (q / 2) + 8 * u + 4 * (q % 2) + word;
            const int first_value = 64 * (kRegsPerWords * u + r) + 8 * q + kValues * s;
            order[byte] = int8_t(first_value / kValues);
          }
        }
      }
    }
    for (int r = 0; r < kRegsPerWords; ++r) {
      for (int j = 0; j < 64; ++j) {
        const int v = j % 8;  // the value of its quadword
        shift[r][j] = int8_t(16 * (r * kPerQword + v / kValues) + kBits * (v % kValues));
      }
    }
  }
};

// The magnitudes of the codes in the low bits of each byte: vpermb reads a
// byte's 6 low bits, so the table repeats the list every 2^kBits bytes.
template <int kBits>
struct MagnitudeBytes {
  alignas(64) uint8_t bytes[64] = {};
  explicit constexpr MagnitudeBytes(const Magnitudes& m) {
    for (int i = 0; i < 64; ++i) bytes[i] = m.values[i % (1 << kBits)];
  }
};

// Register r of the magnitudes (unsigned bytes) of words' entries.
inline __m512i expand(__m512i words, const int8_t (&shift)[64], __m512i magnitudes) {
  return _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(load512(shift), words), magnitudes);
}

// The orders of the entries with 8 values (IQ2, IQ1) and 4 (IQ3).
constexpr EntryOrder<8> kEightValueOrder;
constexpr EntryOrder<4> kFourValueOrder;

inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline __m512i every_qword(const uint8_t* bytes) {
  uint64_t v;
  std::memcpy(&v, bytes, 8);
  return _mm512_set1_epi64(int64_t(v));
}

}  // namespace
}  // namespace moeserve::cpu::detail
