// Attention for head sizes the tensor-core kernel (attention.cu: 64 and 128)
// does not take: any multiple of 32 up to 512 (Qwen3.5's gated attention
// uses 256). Same contract as attention() (attention.h), simpler and slower:
// one block of kWarps warps per (row, query head); warp w takes the key
// tiles w, w + kWarps, ... of 32 keys; lane j scores key j of a tile
// against the query (in shared memory), the warp keeps an online softmax
// and its share of the output (dims lane, lane + 32, ...), and the warps'
// partial results are combined through shared memory at the end. With a
// sliding window the tiles start at the window's (keys before it are never
// read).
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4;
constexpr int kMaxDimsPerLane = 16;  // head_dim <= 512

struct GenericParams {
  const float* q;
  float* out;
  const int32_t* row_seq;
  const int32_t* row_pos;
  const int32_t* row_tree;  // draft-tree rows' keys; null: none
  uint16_t* const* k_tab;
  uint16_t* const* v_tab;
  const int32_t* block_base;  // paged KV (KvTables); null: contiguous caches
  const int32_t* block_ids;
  int block_shift;
  int64_t n_layer;
  int layer, n_head, n_head_kv, head_dim;
  int window;  // > 0: sliding window
  float scale_log2;
};

__device__ __forceinline__ float half_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

template <int DPL>
__global__ void __launch_bounds__(kWarps* kWarp) generic_attention_kernel(GenericParams p) {
  __shared__ float q_s[kMaxDimsPerLane * kWarp];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float o_s[kWarps][kMaxDimsPerLane * kWarp];
  const int64_t row = blockIdx.x;
  const int h = int(blockIdx.y), warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int hd = p.head_dim;
  detail::grid_dependency_wait();
  detail::allow_dependents();
  for (int d = int(threadIdx.x); d < hd; d += kWarps * kWarp) q_s[d] = p.q[(row * p.n_head + h) * hd + d];
  __syncthreads();
  const int seq = p.row_seq[row], pos = p.row_pos[row];
  const int32_t* tree = row_tree_info(p.row_tree, row);
  const int32_t* pages = seq_pages(p.block_base, p.block_ids, seq);
  // Keys first..n_keys-1; none (zeros out) for a row without a sequence or position.
  const int n_keys = seq >= 0 && pos >= 0 ? pos + 1 : 0;
  const int first = p.window > 0 ? max(0, n_keys - p.window) : 0;
  const int kvh = h / (p.n_head / p.n_head_kv);
  const int64_t stride = int64_t(p.n_head_kv) * hd;
  const int64_t slot = int64_t(seq) * p.n_layer + p.layer;
  const uint16_t* k = n_keys > 0 ? p.k_tab[slot] + int64_t(kvh) * hd : nullptr;
  const uint16_t* v = n_keys > 0 ? p.v_tab[slot] + int64_t(kvh) * hd : nullptr;
  float o[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;
  for (int tile = first / kWarp + warp; tile * kWarp < n_keys; tile += kWarps) {
    const int key = tile * kWarp + lane;
    const bool seen = key >= first && key < n_keys;
    float s = -FLT_MAX;
    if (seen) {
      const uint16_t* kr = k + paged_row(pages, p.block_shift, tree_key_row(tree, key)) * stride;
      float acc = 0.0f;
      for (int d = 0; d < hd; ++d) acc += q_s[d] * half_to_float(kr[d]);
      s = acc * p.scale_log2;
    }
    float mt = s;
    for (int off = kWarp / 2; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
    const float m_new = fmaxf(m, mt);
    const float pr = seen ? exp2f(s - m_new) : 0.0f;
    const float corr = exp2f(m - m_new);
    float ps = pr;
    for (int off = kWarp / 2; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
    l = l * corr + ps;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[i] *= corr;
    // Only the seen keys' V rows are read (those before the window may be stale).
    const int j0 = max(0, first - tile * kWarp), in_tile = min(kWarp, n_keys - tile * kWarp);
    for (int j = j0; j < in_tile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, pr, j);
      const uint16_t* vr = v + paged_row(pages, p.block_shift, tree_key_row(tree, tile * kWarp + j)) * stride;
#pragma unroll
      for (int i = 0; i < DPL; ++i) o[i] += pj * half_to_float(vr[lane + i * kWarp]);
    }
    m = m_new;
  }
  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
#pragma unroll
  for (int i = 0; i < DPL; ++i) o_s[warp][lane + i * kWarp] = o[i];
  __syncthreads();
  float M = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w) L += l_s[w] * exp2f(m_s[w] - M);
  for (int d = int(threadIdx.x); d < hd; d += kWarps * kWarp) {
    float acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) acc += o_s[w][d] * exp2f(m_s[w] - M);
    p.out[(row * p.n_head + h) * hd + d] = L > 0.0f ? acc / L : 0.0f;  // no key seen: zeros
  }
}

template <int DPL>
void launch(const GenericParams& p, int64_t n_rows, cudaStream_t stream) {
  detail::launch(generic_attention_kernel<DPL>, dim3(unsigned(n_rows), unsigned(p.n_head)), kWarps * kWarp, 0,
                 stream, p);
}

}  // namespace

bool attention_supports_head_dim(int64_t head_dim) {
  switch (head_dim) {
    case 32:
    case 64:
    case 96:
    case 128:
    case 160:
    case 192:
    case 224:
    case 256:
    case 320:
    case 384:
    case 512:
      return true;
    default:
      return false;
  }
}

Status attention_generic(const AttentionArgs& a, cudaStream_t stream) {
  if (a.rows.n_rows == 0) return Status::ok();
  if (a.rows.n_rows > INT32_MAX || a.n_head > 65535) {
    return make_error(StatusCode::kInvalidArgument, "attention: {} rows x {} heads out of range",
                      a.rows.n_rows, a.n_head);
  }
  GenericParams p{a.q,
                  a.out,
                  a.rows.row_seq,
                  a.rows.row_pos,
                  a.rows.row_tree,
                  a.kv.k,
                  a.kv.v,
                  a.kv.block_base,
                  a.kv.block_ids,
                  a.kv.block_shift,
                  a.kv.n_layer,
                  int(a.layer),
                  int(a.n_head),
                  int(a.n_head_kv),
                  int(a.head_dim),
                  a.window > 0 && a.window < a.max_kv ? int(a.window) : 0,
                  a.scale * 1.4426950408889634f};
  switch (a.head_dim / kWarp) {
#define MOESERVE_GENERIC_CASE(n)         \
  case n:                                \
    launch<n>(p, a.rows.n_rows, stream); \
    break;
    MOESERVE_GENERIC_CASE(1)
    MOESERVE_GENERIC_CASE(2)
    MOESERVE_GENERIC_CASE(3)
    MOESERVE_GENERIC_CASE(4)
    MOESERVE_GENERIC_CASE(5)
    MOESERVE_GENERIC_CASE(6)
    MOESERVE_GENERIC_CASE(7)
    MOESERVE_GENERIC_CASE(8)
    MOESERVE_GENERIC_CASE(10)
    MOESERVE_GENERIC_CASE(12)
    MOESERVE_GENERIC_CASE(16)
#undef MOESERVE_GENERIC_CASE
    default:
      return make_error(StatusCode::kInvalidArgument, "attention: head_dim {} unsupported", a.head_dim);
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace moeserve::cuda
