// Internal to the matrix x vector kernels: the tensor-core path of the
// quantized weight types (matvec_tc.cu). matvec.cu's launch_matvec hands it
// the grouped expert problems whose weights it decodes; matvec_multi (in
// matvec_tc.cu) uses it for the dense ones.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"
#include "kernels/cuda/matmul_detail.h"
#include "tensor/dtype.h"

namespace moeserve::cuda::detail {

// Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
bool matvec_tc_type(DType t);

// Dense (n_tokens <= kMatvecMaxTokens, one matrix) and grouped (any batch)
// problems.
Status launch_matvec_tc(const MmProblem& p, cudaStream_t stream);

}  // namespace moeserve::cuda::detail
