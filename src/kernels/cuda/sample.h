// Sampling on the GPU: the greedy choice of each logit row, so a decode step
// reads back one token id a row instead of the whole vocabulary's logits
// (600 KB a row for a 152k vocabulary: a pageable copy plus a host scan,
// about a tenth of a 30B-A3B decode step on an H100).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace moeserve::cuda {

// out[r] = the index of the largest value of row r of x ([n_rows][n_cols],
// row-major): NaN counts as -inf, ties go to the lowest index, and a row
// with nothing above -inf gives 0 (the host sampler's arg-max,
// runtime/sampler.cpp). out is device memory.
struct ArgmaxArgs {
  const float* x = nullptr;
  int64_t n_rows = 0, n_cols = 0;
  int32_t* out = nullptr;
};
Status argmax_rows(const ArgmaxArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda
