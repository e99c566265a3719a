// PLACEHOLDER: to be filled with the reference quant kernels.
#include "kernels/cpu/register.h"
namespace moeserve::cpu::detail {
void register_quant_reference(CpuKernels& k) { (void)k; }
}  // namespace moeserve::cpu::detail
