// AVX2 + FMA + F16C ops: the generic kernels of ops_simd.h / attention_simd.h
// instantiated for 8-wide vectors. Only reached after a CPUID check.
#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/simd_f32.h"

namespace moeserve::cpu::detail {

void register_ops_avx2(CpuKernels& k) {
  k.rms_norm = rms_norm_simd<VecAvx2>;
  k.rope_neox = rope_neox_simd<VecAvx2>;
  k.softmax = softmax_simd<VecAvx2>;
  k.silu = silu_simd<VecAvx2>;
  k.swiglu = swiglu_simd<VecAvx2>;
  k.axpy = axpy_simd<VecAvx2>;
  k.top_k = top_k_simd<VecAvx2>;
  k.attention = attention_simd<VecAvx2>;
}

}  // namespace moeserve::cpu::detail
