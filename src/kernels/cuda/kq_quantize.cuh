// The activations of gemm_kq.cu's and kq_vec.cu's integer kernels: one
// row's 256-column block quantized to Q8_K by a warp (kq_blocks.cuh's
// layout), as the CPU quantizes it, so that every kernel that reads these
// rows gets the same codes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kq_blocks.cuh"
#include "kernels/cuda/matmul_common.cuh"

namespace moeserve::cuda::detail::kq {

// One row's 256-column block, 8 columns a lane, as the CPU's Q8_K
// (tensor/quantize.cpp: m = the value of largest |x|, ties to the positive;
// iscale = -127/m; codes rounded to nearest even and clamped; d = 1/iscale).
__device__ __forceinline__ void quantize_block(const float (&v)[8], int lane, uint8_t* out) {
  float hi = 0.0f, lo = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) hi = fmaxf(hi, v[i]), lo = fminf(lo, v[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    hi = fmaxf(hi, __shfl_xor_sync(kFull, hi, o));
    lo = fminf(lo, __shfl_xor_sync(kFull, lo, o));
  }
  const float m = -lo > hi ? lo : hi;
  int c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float d = 0.0f;
  if (m != 0.0f) {
    const float iscale = __fdiv_rn(-127.0f, m);
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = __float2int_rn(fminf(fmaxf(__fmul_rn(iscale, v[i]), -127.0f), 127.0f));
    d = __fdiv_rn(1.0f, iscale);
  }
  uint32_t w0 = 0, w1 = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w0 |= uint32_t(c[i] & 0xFF) << (8 * i);
    w1 |= uint32_t(c[4 + i] & 0xFF) << (8 * i);
  }
  *reinterpret_cast<uint2*>(out + 8 * lane) = make_uint2(w0, w1);
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += c[i];
  sum += __shfl_xor_sync(kFull, sum, 1);
  sum += __shfl_xor_sync(kFull, sum, 2);  // |sum| <= 32 * 127
  if ((lane & 3) == 0) {
    out[kQ8SumHi + (lane >> 2)] = uint8_t(int8_t(sum >> 6));
    out[kQ8SumLo + (lane >> 2)] = uint8_t(sum & 63);
  }
  if (lane == 0) *reinterpret_cast<float*>(out + kQ8D) = d;
}

}  // namespace moeserve::cuda::detail::kq
