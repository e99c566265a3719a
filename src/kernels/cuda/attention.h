// Attention over an f16 KV cache on the GPU, for a batch of rows that may
// belong to several sequences (continuous batching): per row, its sequence
// slot and position. K/V rows of sequence s, layer l live at
// k_cache[s * n_layer + l] (+ pos * kv_dim), likewise V.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace moeserve::cuda {

// Per row of a draft tree (speculative decoding's tree verify), int32s:
// [0] the tree's first cache row (its slice's pos0), or -1 for a row
// outside any tree; [1 + i] the cache row (minus [0]) of the row's ancestor
// at position [0] + i — its path from the tree's root, itself last.
inline constexpr int kTreeRowInfo = 65;

// Where each row of the batch belongs (device arrays, n_rows entries).
struct RowLayout {
  const int32_t* row_seq = nullptr;  // sequence slot of the row (index into the cache tables)
  const int32_t* row_pos = nullptr;  // position of the row within its sequence
  int64_t n_rows = 0;
  // Optional, for draft trees: the cache row each row's K/V goes to (null:
  // row_pos), and [n_rows][kTreeRowInfo] tree rows' keys (null: no trees).
  // A tree row must be a query block of its own.
  const int32_t* row_slot = nullptr;
  const int32_t* row_tree = nullptr;
};

#ifdef __CUDACC__
// The cache row of the key at position j for a row with tree info `tree`
// (null: j itself).
__device__ __forceinline__ int tree_key_row(const int32_t* tree, int j) {
  return tree == nullptr || j < tree[0] ? j : tree[0] + tree[1 + j - tree[0]];
}
// A row's tree info, or null.
__device__ __forceinline__ const int32_t* row_tree_info(const int32_t* row_tree, int64_t row) {
  return row_tree != nullptr && row_tree[row * kTreeRowInfo] >= 0 ? row_tree + row * kTreeRowInfo : nullptr;
}
#endif

// The per-sequence cache tables (device arrays of device pointers).
struct KvTables {
  uint16_t* const* k = nullptr;  // [n_seq * n_layer] f16 rows [capacity][kv_dim]
  uint16_t* const* v = nullptr;
  int64_t n_layer = 0;
  // Paged KV (backend::KvView::block_table): sequence s's position p is row
  // block_ids[block_base[s] + (p >> block_shift)] << block_shift |
  // (p & (2^block_shift - 1)) of its tables' rows (every paged sequence's
  // tables point at the shared block pool). block_base null, or
  // block_base[s] < 0: row p (a contiguous cache). Device arrays.
  const int32_t* block_base = nullptr;  // [n_seq]
  const int32_t* block_ids = nullptr;
  int block_shift = 0;
};

#ifdef __CUDACC__
// Sequence seq's block ids, or null for a contiguous cache.
__device__ __forceinline__ const int32_t* seq_pages(const int32_t* block_base, const int32_t* block_ids,
                                                    int seq) {
  if (block_base == nullptr || seq < 0) return nullptr;
  const int32_t base = block_base[seq];
  return base < 0 ? nullptr : block_ids + base;
}
// The cache row holding position-row `row` of a sequence with block ids
// `pages` (null: row itself).
__device__ __forceinline__ int64_t paged_row(const int32_t* pages, int shift, int64_t row) {
  if (pages == nullptr) return row;
  return (int64_t(pages[row >> shift]) << shift) | (row & ((int64_t(1) << shift) - 1));
}
#endif

// One RoPE configuration (backend::RopeSpec's fields; kernels/cuda does not
// see the backend): NEOX rotation of the first n_rot dims with
// theta_i = pos * inv_freq(i), inv_freq(i) = freq_base^(-2i/n_rot) blended
// by YaRN when yarn_factor > 1 (computed in double on the device exactly as
// RopeSpec::inv_freq), cos and sin both times attn_factor.
struct RopeConfig {
  int64_t n_rot = 0;
  double freq_base = 10000.0;
  double yarn_factor = 1.0, yarn_ramp_low = 0.0, yarn_ramp_high = 0.0;
  float attn_factor = 1.0f;
};

// In place per row: q heads and k heads each RMS-normed with their weight
// (head_dim values), then NEOX RoPE over the first rope.n_rot dims at the
// row's position (angles in double, as kernels/cpu/rope_table.h); then K
// and V rows stored as f16 into the row's cache at its position, layer
// `layer`.
struct QkNormRopeStoreArgs {
  float* q = nullptr;             // [n_rows][n_head * head_dim]
  float* k = nullptr;             // [n_rows][n_head_kv * head_dim]
  const float* v = nullptr;       // [n_rows][n_head_kv * head_dim]
  const float* q_norm = nullptr;  // [head_dim] (null: no q/k norm)
  const float* k_norm = nullptr;  // [head_dim]
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  RopeConfig rope;  // n_rot 0: no rotation
  float rms_eps = 1e-6f;
  RowLayout rows;
  KvTables kv;
  int64_t layer = 0;
  // Optional: the rows' rotation table of `rope` from rope_table() (it
  // depends only on the positions, so a forward computes it once for all
  // its layers). Null: each CTA computes its row's angles itself (same
  // bits, slower).
  const float* cos_sin = nullptr;  // [n_rows][rope.n_rot]
};
Status qk_norm_rope_store(const QkNormRopeStoreArgs& a, cudaStream_t stream);

// cos_sin[row][0..n_rot/2) = cos, [n_rot/2..n_rot) = sin of
// pos(row) * inv_freq(i) (RopeConfig), computed in double and rounded once,
// then times attn_factor (as the CPU's rope_table.cpp). n_rot even, >= 2;
// row_pos on the device.
struct RopeTableArgs {
  const int32_t* row_pos = nullptr;
  int64_t n_rows = 0;
  RopeConfig rope;
  float* cos_sin = nullptr;  // [n_rows][rope.n_rot]
};
Status rope_table(const RopeTableArgs& a, cudaStream_t stream);

// Query blocks: runs of consecutive rows of one sequence (positions
// consecutive too), so a block can share K/V tiles among its queries.
struct QueryBlock {
  int32_t row0 = 0;
  int32_t n_rows = 0;
};

// Query blocks of at most this many rows take the batch-invariant plans:
// each row's keys go in fixed 128-key parts from key 0 (with a sliding
// window, those that hold keys of the window), merged in a fixed order, so
// a row's output does not depend on its block, the batch or the GPU's
// occupancy (decode == verify, bit for bit).
// Larger blocks take plans by occupancy.
inline constexpr int64_t kInvariantBlockRows = 32;

// out[row][h] = softmax(q[row][h] . K[lo..pos(row)]^T * scale) V, causal by
// position within the row's own sequence (lo = 0, or pos - window + 1 with
// a sliding window), GQA (n_head / n_head_kv query heads share a KV head),
// f32 accumulation.
struct AttentionArgs {
  const float* q = nullptr;  // [n_rows][n_head * head_dim]
  float* out = nullptr;      // [n_rows][n_head * head_dim]
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;
  RowLayout rows;
  KvTables kv;
  int64_t layer = 0;
  const QueryBlock* blocks = nullptr;  // device array
  int64_t n_blocks = 0;
  int64_t max_block_rows = 0;  // the largest n_rows among the blocks
  int64_t max_kv = 0;          // upper bound of pos + 1 over the rows (grid sizing)
  // > 0: sliding window, a row at position p sees keys j with p - j <
  // window (keys before the window are never read, whole tiles skipped).
  int64_t window = 0;
  // Scratch for splitting long key ranges over several CTAs when the batch
  // alone does not fill the GPU (decode of few sequences): partial results
  // and a combine pass. Null or too small: fewer splits (none at worst),
  // same results, slower. attention_workspace_bytes() says what it can use.
  float* workspace = nullptr;  // device memory, 16-byte aligned
  size_t workspace_bytes = 0;
};
// The launcher rejects (kInvalidArgument) head sizes attention_supports_head_dim
// refuses, n_head not a multiple of n_head_kv, max_kv < 1, max_block_rows < 1,
// a bad layer, a negative window or null pointers. The caller promises: every
// block's rows are one sequence (its first row's row_seq counts) with
// n_rows <= max_block_rows (longer blocks are clipped), their positions
// consecutive; pos + 1 <= max_kv (keys past max_kv are never read); cache
// rows 16-byte aligned; |q| < 65504 (q goes through the tensor cores as two
// f16 halves). out may equal q. Rows in no block are left untouched; a row
// whose row_pos or row_seq is negative gets zeros.
Status attention(const AttentionArgs& a, cudaStream_t stream);

// Head sizes attention() takes: 64 and 128 on the tensor-core kernel, and
// 32, 96, 160, 192, 224, 256, 320, 384 and 512 on a simpler one
// (attention_generic.cu; Qwen3.5's gated attention has heads of 256).
bool attention_supports_head_dim(int64_t head_dim);
// The simpler kernel's entry (called by attention() after its checks).
Status attention_generic(const AttentionArgs& a, cudaStream_t stream);

// Workspace bytes that let attention() split as much as it wants for any
// batch on the current device: it depends only on head_dim and the GPU's SM
// count (~9 MB for head_dim 128 on 132 SMs), so one allocation made before
// capturing graphs serves every batch. 0 for unsupported head_dim.
size_t attention_workspace_bytes(int64_t head_dim);
// The workspace bytes attention(a) can use (a's workspace fields ignored):
// the above, or more for a decode-class forward whose batch-invariant plan
// keeps a partial per 128 keys of every query row (a verify of 16 rows at a
// long context: tens of MB; capped at 512 MB, past which it takes the plan
// by occupancy). Bigger only when max_kv grows, so a caller that grows its
// buffer to this before a graph is captured keeps its graphs.
size_t attention_workspace_bytes(const AttentionArgs& a);

}  // namespace moeserve::cuda
