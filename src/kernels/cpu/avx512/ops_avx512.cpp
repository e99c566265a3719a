// PLACEHOLDER: to be filled with the avx512 ops kernels.
#include "kernels/cpu/register.h"
namespace moeserve::cpu::detail {
void register_ops_avx512(CpuKernels& k) { (void)k; }
}  // namespace moeserve::cpu::detail
