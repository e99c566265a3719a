// Quantized weight bytes for kernel tests: random bytes (every code, scale
// code and high bit) with each block's float scales made finite, and rows
// of any weight type — quantized from floats where the type has a
// quantizer, random bytes where it is read only (the codebook i-quants).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace moeserve::testing {

// Overwrites the float scales of quantized bytes with finite values.
inline void set_finite_scales(DType t, std::vector<uint8_t>& w, std::mt19937& rng) {
  const DTypeTraits& tr = dtype_traits(t);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  auto put_half = [&](size_t off) {
    const uint16_t h = fp32_to_fp16(scale(rng));
    std::memcpy(w.data() + off, &h, 2);
  };
  for (size_t blk = 0; blk < w.size() / tr.block_bytes; ++blk) {
    const size_t base = blk * tr.block_bytes;
    switch (t) {
      case DType::Q8_0:
      case DType::Q4_0:
      case DType::Q5_0:
      case DType::IQ4_NL:
      case DType::IQ4_XS:
      case DType::IQ2_XXS:
      case DType::IQ2_XS:
      case DType::IQ2_S:
      case DType::IQ3_XXS:
      case DType::IQ3_S:
      case DType::IQ1_S:
        put_half(base);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q4_1:
      case DType::Q5_1:
        put_half(base);
        put_half(base + 2);
        break;
      case DType::Q6_K:
      case DType::Q3_K:  // d last
        put_half(base + tr.block_bytes - 2);
        break;
      case DType::Q2_K:  // d, dmin after the scales and codes
        put_half(base + 80);
        put_half(base + 82);
        break;
      case DType::MXFP4:  // an E8M0 exponent near 2^-7
        w[base] = uint8_t(118 + int(rng() % 4));
        break;
      case DType::IQ1_M: {  // the f16 scale in the top nibbles of the 4 scale words
        const uint16_t h = fp32_to_fp16(scale(rng));
        for (int k = 0; k < 4; ++k) {
          uint16_t word;
          std::memcpy(&word, w.data() + base + 48 + 2 * k, 2);
          word = uint16_t((word & 0x0fff) | (((h >> (4 * k)) & 15) << 12));
          std::memcpy(w.data() + base + 48 + 2 * k, &word, 2);
        }
        break;
      }
      default:
        break;
    }
  }
}

inline void randomize_weight_bytes(DType t, std::vector<uint8_t>& w, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = uint8_t(byte(rng));
  set_finite_scales(t, w, rng);
}

// n_rows rows of n_cols elements of type t: `values` quantized, or random
// bytes for a type without a quantizer.
inline std::vector<uint8_t> weight_rows(DType t, const std::vector<float>& values, int64_t n_rows, int64_t n_cols,
                                        uint32_t seed) {
  std::vector<uint8_t> w(dtype_row_bytes(t, n_cols) * size_t(n_rows));
  if (dtype_has_quantizer(t)) {
    quantize_rows(t, values.data(), w.data(), n_rows, n_cols);
  } else {
    std::mt19937 rng(seed);
    randomize_weight_bytes(t, w, rng);
  }
  return w;
}

}  // namespace moeserve::testing
