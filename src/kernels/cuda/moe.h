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

// Per token: probabilities p over the n_expert router logits (f32),
// softmax or sigmoid; the n_used largest of p + selection_bias (p without
// a bias; ties: lower index first, as the CPU top_k); their weights the
// unbiased p, divided by their sum when `normalize`, times weight_scale
// (as backend.h's RouteOpArgs). Then every (token, slot) pair grouped by
// expert: expert_offsets (n_expert + 1 entries, exclusive prefix sums of
// the counts) and pairs_by_expert, pairs ascending within an expert.
struct RouteArgs {
  const float* logits = nullptr;  // [n_tokens][n_expert]
  int64_t n_tokens = 0, n_expert = 0, n_used = 0;
  bool sigmoid = false;                   // gating: sigmoid(logits), else softmax
  const float* selection_bias = nullptr;  // [n_expert] device, or null
  bool normalize = true;
  float weight_scale = 1.0f;
  float* probs = nullptr;              // optional [n_tokens][n_expert]: p (may be logits)
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

// A layer whose experts are shared with the host (backend/expert_split.h):
// the groups of its local experts only, for the expert kernels on its
// compact stacks (local expert i = matrix i). local_offsets[i]..[i+1] are
// the pairs of expert local[i], in the order route_and_group gave them;
// pairs of other experts are left out (the host computes them).
struct LocalGroupsArgs {
  const int32_t* offsets = nullptr;  // [n_expert + 1], from route_and_group
  const int32_t* pairs = nullptr;    // pairs_by_expert
  const int32_t* local = nullptr;    // [n_local] ascending expert ids
  int64_t n_expert = 0, n_local = 0;
  int32_t* local_offsets = nullptr;  // [n_local + 1]
  int32_t* local_pairs = nullptr;    // room for all pairs; the first local_offsets[n_local] are written
};
Status local_expert_groups(const LocalGroupsArgs& a, cudaStream_t stream);

// The groups of a mixed forward's experts cut at a pair id: pairs below
// `bound` (the decode rows' pairs: bound = decode rows * n_used) into the
// lo groups, the others into the hi groups with `bound` subtracted (the hi
// part then reads like a forward of the rows after the decode rows alone).
// Each expert's pairs keep their order. The expert kernels choose their
// arithmetic by row count, so the decode rows get the kernels a forward of
// their own would (cuda_expert_ops.cpp). Offsets: [n_expert + 1] each, from 0.
struct SplitGroupsArgs {
  const int32_t* offsets = nullptr;  // [n_expert + 1]
  const int32_t* pairs = nullptr;    // pairs_by_expert
  int64_t n_expert = 0;
  int32_t bound = 0;
  int32_t *lo_offsets = nullptr, *lo_pairs = nullptr;  // pairs: room for every pair below bound
  int32_t *hi_offsets = nullptr, *hi_pairs = nullptr;  // ... and for every other pair
};
Status split_expert_groups(const SplitGroupsArgs& a, cudaStream_t stream);

// dst row rows[i] = src row i, for i < n_rows (rows of n_cols floats): the
// host-computed expert outputs into their pair rows.
struct ScatterRowsArgs {
  float* dst = nullptr;
  const float* src = nullptr;
  const int32_t* rows = nullptr;
  int64_t n_rows = 0, n_cols = 0;
};
Status scatter_rows(const ScatterRowsArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda
