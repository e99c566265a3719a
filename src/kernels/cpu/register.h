// Internal: each SIMD level fills the entries it implements; dispatch.cpp
// starts every level from the reference table, so a level only overrides
// what it makes faster.
#pragma once

#include "kernels/cpu/cpu_kernels.h"

namespace moeserve::cpu::detail {

void register_quant_reference(CpuKernels& k);          // vec_dot, quantize_row, dequantize_row
void register_quant_reference_lowbit(CpuKernels& k);   // issue 43's types (quant_ref_lowbit.cpp)
void register_quant_reference_iquants(CpuKernels& k);  // the codebook i-quants (quant_ref_iquants.cpp)
void register_ops_reference(CpuKernels& k);            // everything else
void register_quant_avx2(CpuKernels& k);
void register_ops_avx2(CpuKernels& k);
void register_quant_avx512(CpuKernels& k);
void register_ops_avx512(CpuKernels& k);
void register_quant_kquants_cols_avx512(CpuKernels& k);  // after register_quant_avx512
void register_quant_lowbit_avx512(CpuKernels& k);        // issue 43's types (quant_lowbit_avx512.cpp)
void register_packed_kquants_avx512(CpuKernels& k);
// The codebook i-quants with AVX512_VBMI (and BITALG), over
// register_quant_avx512's (only where cpu_features() has both).
void register_quant_iquants_vbmi_avx512(CpuKernels& k);

// The table of a level as dispatch.cpp builds it (the level must be one the
// CPU runs); `vbmi` adds the VBMI kernels to the AVX-512 level (tests build
// the level both ways).
CpuKernels build_kernels(SimdLevel level, bool vbmi);

// After a level's registration (`before`: the table it started from): a
// type whose vec_dot the level replaced but whose vec_dot_cols it did not
// loses the inherited column kernel, whose float steps would differ from the
// new dot (a token's result would then depend on its batch).
void drop_inherited_columns(CpuKernels& k, const CpuKernels& before);

}  // namespace moeserve::cpu::detail
