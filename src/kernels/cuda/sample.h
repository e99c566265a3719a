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

// Per row of x: the k largest values of v = scale * x (capped to
// softcap * tanh(v / softcap) when softcap > 0; NaN as -inf), largest first
// with ties to the lower index, and their log-softmax v - logsumexp(row):
// ids[r][j], log_probs[r][j] (device memory, [n_rows][k]). A block-diffusion
// draft's candidates per position for a draft tree (DDTree), without its
// logits crossing to the host. k in 1..kTopKMax and <= n_cols.
inline constexpr int kTopKMax = 64;
struct TopKArgs {
  const float* x = nullptr;
  int64_t n_rows = 0, n_cols = 0;
  int k = 1;
  float scale = 1.0f, softcap = 0.0f;
  int32_t* ids = nullptr;
  float* log_probs = nullptr;
};
Status top_k_rows(const TopKArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda
