// PLACEHOLDER: to be filled with the avx512 quant kernels.
#include "kernels/cpu/register.h"
namespace moeserve::cpu::detail {
void register_quant_avx512(CpuKernels& k) { (void)k; }
}  // namespace moeserve::cpu::detail
