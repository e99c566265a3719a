// Shared by the AVX-512 K-quant kernel files (included only by *_avx512.cpp
// files, which are compiled with AVX-512 enabled; everything here stays in
// an anonymous namespace of each, so no AVX-512 code leaks into other TUs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cols_dispatch.h"
#include "kernels/cpu/simd_common_x86.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// Mask of the 16-bit lanes of the upper 256 bits.
constexpr __mmask32 kHighHalf16 = 0xFFFF0000u;

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }

}  // namespace
}  // namespace moeserve::cpu::detail
