// Internal: each SIMD level fills the entries it implements; dispatch.cpp
// starts every level from the reference table, so a level only overrides
// what it makes faster.
#pragma once

#include "kernels/cpu/cpu_kernels.h"

namespace moeserve::cpu::detail {

void register_quant_reference(CpuKernels& k);  // vec_dot, quantize_row, dequantize_row
void register_ops_reference(CpuKernels& k);    // everything else
void register_quant_avx2(CpuKernels& k);
void register_ops_avx2(CpuKernels& k);
void register_quant_avx512(CpuKernels& k);
void register_ops_avx512(CpuKernels& k);
void register_quant_kquants_cols_avx512(CpuKernels& k);  // after register_quant_avx512
void register_packed_kquants_avx512(CpuKernels& k);

}  // namespace moeserve::cpu::detail
