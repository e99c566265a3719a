// The i-quants' codebooks and sign table (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S, IQ1_M): constants of the GGUF formats as ggml defines them,
// generated from its ggml-common.h by scripts/quant/gen_iquant_grids.py
// (iquant_grids_iq1.cpp, _iq2.cpp, _iq3.cpp).
//  - A grid entry holds one group of values as bytes, little-endian: byte j
//    is element j (IQ2: 8 magnitudes of {8, 25, 43, ...}; IQ3: 4 of {4..62};
//    IQ1: 8 of {-1, 0, 1} as int8).
//  - kIqSigns[i] (i < 128) is i with bit 7 set when i has an odd number of
//    ones: 7 stored sign bits and the eighth that makes their count even;
//    bit j set negates element j.
#pragma once

#include <cstdint>

namespace moeserve {

extern const uint8_t kIqSigns[128];
extern const uint64_t kIq2xxsGrid[256];
extern const uint64_t kIq2xsGrid[512];
extern const uint64_t kIq2sGrid[1024];
extern const uint32_t kIq3xxsGrid[256];
extern const uint32_t kIq3sGrid[512];
extern const uint64_t kIq1sGrid[2048];

// Byte j of a grid entry.
inline uint8_t grid_byte(uint64_t entry, int j) { return uint8_t(entry >> (8 * j)); }

// IQ1_S / IQ1_M: the shift of every value of a group, ±1/8.
inline constexpr float kIq1Delta = 0.125f;

}  // namespace moeserve
