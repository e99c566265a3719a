// PLACEHOLDER: to be filled with the avx2 quant kernels.
#include "kernels/cpu/register.h"
namespace moeserve::cpu::detail {
void register_quant_avx2(CpuKernels& k) { (void)k; }
}  // namespace moeserve::cpu::detail
