// Reference vec_dot of the i-quants with codebooks (IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against Q8_K activations: each weight
// block dequantized by the tensor layer's reference (the ground truth),
// then Σ w * (x.d * q) in float, block by block. Plain on purpose; the
// SIMD levels inherit it until they have their own.
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"

namespace moeserve::cpu::detail {
namespace {

template <DType kType>
float vec_dot_dequantized(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const uint8_t*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  const size_t block_bytes = dtype_traits(kType).block_bytes;
  const DequantizeRowFn dequantize = dequantize_row_fn(kType);  // once, not per block
  float deq[kQK_K];
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    dequantize(w + size_t(b) * block_bytes, deq, kQK_K);
    float block = 0.0f;
    for (int i = 0; i < kQK_K; ++i) block += deq[i] * float(x[b].qs[i]);
    sum += x[b].d * block;
  }
  return sum;
}

}  // namespace

void register_quant_reference_iquants(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::IQ2_XXS)] = vec_dot_dequantized<DType::IQ2_XXS>;
  k.vec_dot[dtype_slot(DType::IQ2_XS)] = vec_dot_dequantized<DType::IQ2_XS>;
  k.vec_dot[dtype_slot(DType::IQ2_S)] = vec_dot_dequantized<DType::IQ2_S>;
  k.vec_dot[dtype_slot(DType::IQ3_XXS)] = vec_dot_dequantized<DType::IQ3_XXS>;
  k.vec_dot[dtype_slot(DType::IQ3_S)] = vec_dot_dequantized<DType::IQ3_S>;
  k.vec_dot[dtype_slot(DType::IQ1_S)] = vec_dot_dequantized<DType::IQ1_S>;
  k.vec_dot[dtype_slot(DType::IQ1_M)] = vec_dot_dequantized<DType::IQ1_M>;
}

}  // namespace moeserve::cpu::detail
