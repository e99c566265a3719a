// The reference CPU kernels' product of a quantized weight row with f32
// activations (the activations first converted to the type's vec_dot
// partner, Q8_K for the K-quants), for the GPU kernels that reproduce the
// CPU's arithmetic (gemm_kq.cu); for the codebook i-quants, the integer
// formula that kernel computes (their CPU reference dequantizes first).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/kq_iquant_codes.cuh"
#include "kernels/cuda/matmul_detail.h"
#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"

namespace moeserve::testing {

// Whether gemm() (and the prefill expert products) of this weight type take
// the CPU's Q8_K arithmetic on the GPU.
inline bool gemm_uses_q8k(DType t) { return cuda::detail::gemm_kq_type(t); }

// gemm_kq.cu's integer formula for a codebook i-quant, on the host, in the
// kernel's order: per block, the 16 runs' int32 code sums times their odd
// scales, then (x.d * dfac) * total added to the row's f32 sum (volatile:
// no contraction into an FMA).
template <DType T>
float iq_integer_dot(int64_t n, const uint8_t* row, const void* xv) {
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  const size_t block_bytes = dtype_traits(T).block_bytes;
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = row + size_t(b) * block_bytes;
    int32_t total = 0;
    for (int r = 0; r < 16; ++r) {
      int32_t isum = 0;
      for (int c = 0; c < 16; ++c) {
        const uint32_t codes = cuda::qdec::iq_codes4<T>(blk, 2 * r + (c >> 3), (c >> 2) & 1);
        isum += int32_t(int8_t(uint8_t(codes >> (8 * (c & 3))))) * x[b].qs[16 * r + c];
      }
      total += cuda::qdec::IqInt<T>::iscale(blk, r) * isum;
    }
    volatile float scale = x[b].d * cuda::qdec::IqInt<T>::dfac(blk);
    volatile float part = scale * float(total);
    sum += part;
  }
  return sum;
}

// The product the GPU's integer kernel reproduces bit for bit: the
// reference CPU kernel's (K-quants, IQ4_XS), or iq_integer_dot (the
// codebook i-quants, whose CPU reference dequantizes to floats).
inline float gpu_reference_dot_q8k(DType type, const uint8_t* row, const void* q8k, int64_t n) {
  switch (type) {
    case DType::IQ2_XXS:
      return iq_integer_dot<DType::IQ2_XXS>(n, row, q8k);
    case DType::IQ2_XS:
      return iq_integer_dot<DType::IQ2_XS>(n, row, q8k);
    case DType::IQ2_S:
      return iq_integer_dot<DType::IQ2_S>(n, row, q8k);
    case DType::IQ3_XXS:
      return iq_integer_dot<DType::IQ3_XXS>(n, row, q8k);
    case DType::IQ3_S:
      return iq_integer_dot<DType::IQ3_S>(n, row, q8k);
    case DType::IQ1_S:
      return iq_integer_dot<DType::IQ1_S>(n, row, q8k);
    case DType::IQ1_M:
      return iq_integer_dot<DType::IQ1_M>(n, row, q8k);
    default:
      return cpu::cpu_kernels_for(cpu::SimdLevel::kReference)->vec_dot[dtype_slot(type)](n, row, q8k);
  }
}

inline float cpu_reference_dot(DType type, const uint8_t* row, const float* x, int64_t n) {
  std::vector<uint8_t> q(dtype_row_bytes(DType::Q8_K, n));
  quantize_row(DType::Q8_K, x, q.data(), n);
  return gpu_reference_dot_q8k(type, row, q.data(), n);
}

}  // namespace moeserve::testing
