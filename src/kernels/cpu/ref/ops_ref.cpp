// PLACEHOLDER: to be filled with the reference ops kernels.
#include "kernels/cpu/register.h"
namespace moeserve::cpu::detail {
void register_ops_reference(CpuKernels& k) { (void)k; }
}  // namespace moeserve::cpu::detail
