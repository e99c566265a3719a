// Mixture-of-experts routing on the GPU: router probabilities to top-k
// selections, (token, slot) pairs grouped by expert, and the weighted
// combine of the expert outputs. No host round trip: the groups stay on the
// device for matmul.h's expert_gate_up / expert_down.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "kernels/cuda/matmul.h"

namespace moeserve::cuda {

// Per token: softmax over the n_expert router logits (f32), the n_used
// largest (ties: lower index first, as the CPU top_k), their probabilities
// renormalised to sum 1. Then every (token, slot) pair grouped by expert:
// expert_offsets (n_expert + 1 entries, exclusive prefix sums of the
// counts) and pairs_by_expert, pairs ascending within an expert.
struct RouteArgs {
  const float* logits = nullptr;  // [n_tokens][n_expert]
  int64_t n_tokens = 0, n_expert = 0, n_used = 0;
  int32_t* selected = nullptr;         // [n_tokens][n_used] expert ids
  float* weights = nullptr;            // [n_tokens][n_used]
  int32_t* pairs_by_expert = nullptr;  // [n_tokens * n_used]
  int32_t* expert_offsets = nullptr;   // [n_expert + 1]
  void* scratch = nullptr;             // route_scratch_bytes(n_tokens, n_expert) bytes
};
// Limits of route_and_group: n_expert <= kRouteMaxExperts, n_used <=
// min(kRouteMaxUsed, n_expert). NaN probabilities rank below everything
// (a NaN logit makes the whole row NaN, as on the CPU).
inline constexpr int64_t kRouteMaxExperts = 512;
inline constexpr int64_t kRouteMaxUsed = 32;
// Scratch bytes for up to n_tokens tokens: a buffer of this size serves any
// smaller n_tokens too; 0 (scratch may be null) for a few tokens (decode),
// which take a single launch.
size_t route_scratch_bytes(int64_t n_tokens, int64_t n_expert);
Status route_and_group(const RouteArgs& a, cudaStream_t stream);

// x[t] += sum over slots j (in slot order) of weights[t][j] * y[t * n_used + j].
struct CombineArgs {
  float* x = nullptr;              // [n_tokens][n_embd]
  const float* y = nullptr;        // [n_tokens * n_used][n_embd]
  const float* weights = nullptr;  // [n_tokens][n_used]
  int64_t n_tokens = 0, n_used = 0, n_embd = 0;
};
Status combine_experts(const CombineArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda
