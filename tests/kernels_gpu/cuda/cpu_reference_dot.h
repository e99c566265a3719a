// The reference CPU kernels' product of a quantized weight row with f32
// activations (the activations first converted to the type's vec_dot
// partner, Q8_K for the K-quants), for the GPU kernels that reproduce the
// CPU's arithmetic (gemm_kq.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/matmul_detail.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace moeserve::testing {

// Whether gemm() (and the prefill expert products) of this weight type take
// the CPU's Q8_K arithmetic on the GPU.
inline bool gemm_uses_q8k(DType t) { return cuda::detail::gemm_kq_type(t); }

inline float cpu_reference_dot(DType type, const uint8_t* row, const float* x, int64_t n) {
  std::vector<uint8_t> q(dtype_row_bytes(DType::Q8_K, n));
  quantize_row(DType::Q8_K, x, q.data(), n);
  const cpu::CpuKernels* ref = cpu::cpu_kernels_for(cpu::SimdLevel::kReference);
  return ref->vec_dot[dtype_slot(type)](n, row, q.data());
}

}  // namespace moeserve::testing
