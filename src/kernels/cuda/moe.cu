// MoE routing and combine on the GPU.
//
// route_and_group: the tokens are cut into chunks of consecutive tokens.
// Kernel 1 (one block per chunk, one warp per token) does the probabilities
// (softmax or sigmoid) + top-k (of p, or p + bias) + weights, then counts
// the chunk's pairs per expert. With a single chunk (decode) the same block
// also scans the counts and places the pairs: one launch. Otherwise kernel
// 2 (one block) turns the per-chunk counts into per-chunk bases and the
// expert offsets, and kernel 3 (one warp per chunk) places the chunk's
// pairs. Placement walks the chunk's pairs in ascending order, 32 at a
// time, a pair's rank among the equal experts of its round coming from
// __match_any_sync: a stable counting sort, so pairs ascend within each
// expert and nothing depends on the order of atomics (the only atomics are
// integer counts, whose sums are order-free).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kRouteWarps = 8;
constexpr int kRouteThreads = kRouteWarps * kWarp;
constexpr int64_t kMinChunkTokens = 8;               // also the most tokens of the one-launch path
constexpr int64_t kMaxChunks = 256;                  // bounds the scratch and kernel 2's serial loop
constexpr int kScanThreads = int(kRouteMaxExperts);  // one per expert
static_assert(kRouteMaxExperts <= 16 * kWarp, "route_token holds at most 16 logits per lane");
static_assert(kRouteMaxUsed <= kWarp, "slot j of a token lives in lane j");

struct ChunkPlan {
  int64_t chunk_tokens = 0, n_chunks = 0;
};
ChunkPlan plan_chunks(int64_t n_tokens) {
  ChunkPlan c;
  c.chunk_tokens = std::max(kMinChunkTokens, (n_tokens + kMaxChunks - 1) / kMaxChunks);
  c.n_chunks = (n_tokens + c.chunk_tokens - 1) / c.chunk_tokens;
  return c;
}

Status launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "{}: kernel launch failed: {}", what, cudaGetErrorString(err));
  }
  return Status::ok();
}

// ---- routing ---------------------------------------------------------------

// How a token's experts are chosen and weighted (RouteArgs).
struct Gating {
  bool sigmoid = false;
  const float* bias = nullptr;  // [n_expert] or null
  bool normalize = true;
  float scale = 1.0f;
};

// The router probabilities of lane's experts lane, lane + 32, ...: sigmoid
// per expert, or softmax as the CPU reference (max-subtracted, times
// 1/sum; the sum a fixed xor tree). Experts past n_expert get -inf. All
// kPerLane loads are issued before any arithmetic (clamped indices, no
// branch between them): one memory round trip for the token instead of
// one per expert, which is most of a decode step's routing time.
template <int kPerLane>
__device__ void router_probs(const float* logits, int n_expert, bool sigmoid, int lane,
                             float (&p)[kPerLane]) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) p[k] = logits[min(lane + kWarp * k, n_expert - 1)];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int e = lane + kWarp * k;
    if (e >= n_expert)
      p[k] = -INFINITY;
    else if (sigmoid)
      p[k] = 1.0f / (1.0f + expf(-p[k]));
    mx = fmaxf(mx, p[k]);
  }
  if (sigmoid) return;  // (uniform over the warp)
  for (int o = kWarp / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (lane + kWarp * k < n_expert) {
      p[k] = expf(p[k] - mx);
      sum += p[k];
    }
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) p[k] *= inv;
}

// A candidate's rank as one integer, larger first: the high word orders the
// ranking key as the CPU's top_k does (larger first, -0 equal to +0, NaN
// below every number), the low word breaks ties toward the lower expert;
// 0 is "none" (taken, or past n_expert).
__device__ __forceinline__ uint32_t rank_of_value(float v) {
  if (isnan(v)) return 1u;
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // >= 0x007fffff (-inf) for numbers
}
__device__ __forceinline__ uint64_t rank_of(float v, int expert) {
  return (uint64_t(rank_of_value(v)) << 32) | uint64_t(0xffffffffu - uint32_t(expert));
}

// One token, one warp: lane l holds experts l, l + 32, ... (kPerLane of
// them, in registers), and the best rank among them. Each of the n_used
// rounds takes the warp's best rank in two warp reductions (the value's
// word, then the lowest expert among the lanes that hold it), and only the
// winner's lane looks at its candidates again: a short chain per round
// (decode routes one token a layer, so its latency is the layer's). Slot j
// stays in lane j; the normalising sum of the unbiased probabilities is
// accumulated in slot order (as the CPU does) by every lane alike. probs
// (may be null, may be logits) gets the probabilities. Returns lane j's
// slot expert (lanes past n_used: -1).
template <int kPerLane>
__device__ int route_token(const float* logits, float* probs, int n_expert, int n_used, const Gating& g,
                           int32_t* sel, float* weights, int lane) {
  float p[kPerLane], bias[kPerLane];
  uint64_t rank[kPerLane];
  // The bias loads go out first, so they are in flight with the logits'.
#pragma unroll
  for (int k = 0; k < kPerLane; ++k)
    bias[k] = g.bias != nullptr ? g.bias[min(lane + kWarp * k, n_expert - 1)] : 0.0f;
  router_probs<kPerLane>(logits, n_expert, g.sigmoid, lane, p);
  uint64_t mine = 0;  // this lane's best remaining rank
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int e = lane + kWarp * k;
    const float key = g.bias != nullptr ? p[k] + bias[k] : p[k];
    rank[k] = e < n_expert ? rank_of(key, e) : 0;
    mine = max(mine, rank[k]);
    if (probs != nullptr && e < n_expert) probs[e] = p[k];  // each lane rewrites only what it read
  }
  int slot_expert = -1;
  float slot_weight = 0.0f, sel_sum = 0.0f;
  for (int j = 0; j < n_used; ++j) {
    const uint32_t top = __reduce_max_sync(kFull, uint32_t(mine >> 32));
    const uint32_t low = __reduce_max_sync(kFull, uint32_t(mine >> 32) == top ? uint32_t(mine) : 0u);
    const int e = int(0xffffffffu - low);
    const int owner = e % kWarp, at = e / kWarp;
    float w = 0.0f;
    if (lane == owner) {
      mine = 0;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        if (k == at) w = p[k], rank[k] = 0;
        mine = max(mine, rank[k]);
      }
    }
    w = __shfl_sync(kFull, w, owner);
    if (lane == j) slot_expert = e, slot_weight = w;
    sel_sum += w;
  }
  if (lane < n_used) {
    // backend.h's order: scale / sum, then times each weight.
    const float scale = g.scale / (g.normalize && sel_sum > 0.0f ? sel_sum : 1.0f);
    sel[lane] = slot_expert;
    weights[lane] = slot_weight * scale;
  }
  return lane < n_used ? slot_expert : -1;
}

// ---- grouping ----------------------------------------------------------------

// Exclusive prefix sums of v[0..n) in place by one warp (lane l sums a
// contiguous segment, then a shuffle scan of the segment totals); also
// written to out[0..n] with out[n] = the total when out is not null.
__device__ void warp_exclusive_scan(int32_t* v, int n, int lane, int32_t* out) {
  const int per = (n + kWarp - 1) / kWarp;
  const int begin = min(n, lane * per), end = min(n, begin + per);
  int32_t local = 0;
  for (int i = begin; i < end; ++i) local += v[i];
  int32_t incl = local;
  for (int o = 1; o < kWarp; o <<= 1) {
    const int32_t y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  int32_t run = incl - local;
  for (int i = begin; i < end; ++i) {
    const int32_t c = v[i];
    v[i] = run;
    if (out != nullptr) out[i] = run;
    run += c;
  }
  if (out != nullptr && lane == kWarp - 1) out[n] = incl;
  __syncwarp();
}

// Places pairs [begin, end) (ids into the flat selection array) in
// ascending order: pair i goes to running[e] + (earlier pairs of expert e in
// its round of 32), then the round's leader of each expert advances
// running[e]. One warp; running is shared memory owned by this warp.
__device__ void scatter_warp(const int32_t* sel, int begin, int end, int32_t* running, int32_t* pairs,
                             int lane) {
  const unsigned before = (1u << lane) - 1u;
  for (int base = begin; base < end; base += kWarp) {
    const int i = base + lane;
    const int e = i < end ? sel[i] : -1;
    const unsigned same = __match_any_sync(kFull, e);
    if (e >= 0) pairs[running[e] + __popc(same & before)] = i;
    __syncwarp();
    if (e >= 0 && (same & before) == 0) running[e] += __popc(same);
    __syncwarp();
  }
}

struct RouteParams {
  const float* logits = nullptr;
  float* probs = nullptr;
  Gating gating;
  int n_expert = 0, n_used = 0;
  int64_t n_tokens = 0, chunk_tokens = 0;
  int32_t* selected = nullptr;
  float* weights = nullptr;
  int32_t* pairs = nullptr;
  int32_t* offsets = nullptr;
  int32_t* chunk_counts = nullptr;  // [n_chunks][n_expert]; unused with one chunk
};

// One token (a decode step of one sequence), one warp, no barrier: its
// n_used experts are distinct, so its pairs in expert order are the slots
// ranked by expert id, and offsets[e] counts the chosen experts below e.
// The same result as the counting sort below, without its round trips
// through memory (the whole routing of a token was 8 us a layer, measured).
template <int kPerLane>
__device__ void route_one_token(const RouteParams& p, int lane) {
  const int E = p.n_expert, K = p.n_used;
  const int mine = route_token<kPerLane>(p.logits, p.probs, E, K, p.gating, p.selected, p.weights, lane);
  int below_mine = 0;
  int below[(kRouteMaxExperts + 1 + kWarp - 1) / kWarp] = {};  // [k]: chosen experts below lane + 32k
  for (int i = 0; i < K; ++i) {
    const int e = __shfl_sync(kFull, mine, i);
    below_mine += e < mine ? 1 : 0;
#pragma unroll
    for (int k = 0; k < kPerLane + 1; ++k) below[k] += e < lane + kWarp * k ? 1 : 0;
  }
  if (lane < K) p.pairs[below_mine] = lane;
#pragma unroll
  for (int k = 0; k < kPerLane + 1; ++k) {
    if (lane + kWarp * k <= E) p.offsets[lane + kWarp * k] = below[k];
  }
}

// Kernel 1: route the chunk's tokens, count its pairs per expert; with one
// chunk, also scan and place (the whole job in one launch).
template <int kPerLane>
__global__ void __launch_bounds__(kRouteThreads) route_chunk_kernel(RouteParams p) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  extern __shared__ int32_t hist[];  // [n_expert]
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  if (p.n_tokens == 1) {
    if (warp == 0) route_one_token<kPerLane>(p, lane);
    return;
  }
  const int64_t t0 = int64_t(blockIdx.x) * p.chunk_tokens;
  const int64_t t1 = min(p.n_tokens, t0 + p.chunk_tokens);
  const int E = p.n_expert, K = p.n_used;
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  for (int64_t t = t0 + warp; t < t1; t += kRouteWarps) {
    route_token<kPerLane>(p.logits + t * E, p.probs != nullptr ? p.probs + t * E : nullptr, E, K, p.gating,
                          p.selected + t * K, p.weights + t * K, lane);
  }
  __syncthreads();  // the block's selections (global memory) are visible to all its threads
  const int begin = int(t0 * K), end = int(t1 * K);
  for (int i = begin + int(threadIdx.x); i < end; i += blockDim.x) atomicAdd(&hist[p.selected[i]], 1);
  __syncthreads();
  if (gridDim.x > 1) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) p.chunk_counts[int64_t(blockIdx.x) * E + e] = hist[e];
    return;
  }
  if (warp != 0) return;
  warp_exclusive_scan(hist, E, lane, p.offsets);
  scatter_warp(p.selected, begin, end, hist, p.pairs, lane);
}

// Kernel 2 (one block): per expert, the chunk counts become exclusive bases
// within the expert (chunk order); the expert totals are scanned into the
// offsets.
__global__ void __launch_bounds__(kScanThreads)
    chunk_scan_kernel(int32_t* chunk_counts, int n_chunks, int E, int32_t* offsets) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  __shared__ int32_t totals[kRouteMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int c = 0; c < n_chunks; ++c) {
      int32_t* q = chunk_counts + int64_t(c) * E + e;
      const int32_t v = *q;
      *q = run;
      run += v;
    }
    totals[e] = run;
  }
  __syncthreads();
  if (threadIdx.x < kWarp) warp_exclusive_scan(totals, E, int(threadIdx.x), offsets);
}

// Kernel 3 (one warp per chunk): place the chunk's pairs.
__global__ void __launch_bounds__(kWarp) chunk_scatter_kernel(RouteParams p) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  extern __shared__ int32_t running[];  // [n_expert]
  const int lane = int(threadIdx.x);
  const int E = p.n_expert, K = p.n_used;
  const int64_t c = blockIdx.x;
  for (int e = lane; e < E; e += kWarp) running[e] = p.offsets[e] + p.chunk_counts[c * E + e];
  __syncwarp();
  const int64_t t0 = c * p.chunk_tokens, t1 = min(p.n_tokens, t0 + p.chunk_tokens);
  scatter_warp(p.selected, int(t0 * K), int(t1 * K), running, p.pairs, lane);
}

template <int kPerLane>
void launch_route(const RouteParams& p, int64_t n_chunks, cudaStream_t stream) {
  detail::launch(route_chunk_kernel<kPerLane>, unsigned(n_chunks), kRouteThreads,
                 size_t(p.n_expert) * sizeof(int32_t), stream, p);
}

Status check_route_args(const RouteArgs& a) {
  if (a.n_expert < 1 || a.n_expert > kRouteMaxExperts) {
    return make_error(StatusCode::kInvalidArgument, "route_and_group: n_expert {} outside 1..{}", a.n_expert,
                      kRouteMaxExperts);
  }
  if (a.n_used < 1 || a.n_used > std::min(kRouteMaxUsed, a.n_expert)) {
    return make_error(StatusCode::kInvalidArgument, "route_and_group: n_used {} outside 1..{}", a.n_used,
                      std::min(kRouteMaxUsed, a.n_expert));
  }
  if (a.n_tokens < 0 || a.n_tokens > INT32_MAX / a.n_used) {
    return make_error(StatusCode::kInvalidArgument, "route_and_group: bad n_tokens {} (x n_used {})",
                      a.n_tokens, a.n_used);
  }
  if (a.expert_offsets == nullptr)
    return make_error(StatusCode::kInvalidArgument, "route_and_group: null expert_offsets");
  if (a.n_tokens > 0 && (a.logits == nullptr || a.selected == nullptr || a.weights == nullptr ||
                         a.pairs_by_expert == nullptr)) {
    return make_error(StatusCode::kInvalidArgument,
                      "route_and_group: null logits, selected, weights or pairs");
  }
  if (plan_chunks(a.n_tokens).n_chunks > 1 && a.scratch == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "route_and_group: {} tokens need {} bytes of scratch, got null", a.n_tokens,
                      route_scratch_bytes(a.n_tokens, a.n_expert));
  }
  return Status::ok();
}

// ---- combine -------------------------------------------------------------------

// x[t][i] += w[t][0] y[tK][i] + w[t][1] y[tK+1][i] + ... in slot order, one
// fma per slot. Block (blockIdx.y) covers 4 * blockDim.x columns of token
// blockIdx.x; float4 accesses when every row is 16-byte aligned.
template <bool kVec>
__global__ void combine_kernel(float* x, const float* y, const float* w, int K, int64_t n) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  const int64_t t = blockIdx.x;
  const int64_t col = 4 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (col >= n) return;
  float* xr = x + t * n + col;
  const float* wt = w + t * K;
  const float* yr = y + t * K * n + col;
  if (kVec) {
    // Up to 8 slots' values are loaded before the first fma (independent
    // round trips in flight instead of one after another).
    constexpr int kAtOnce = 8;
    float4 acc = *reinterpret_cast<const float4*>(xr);
    for (int j0 = 0; j0 < K; j0 += kAtOnce) {
      float4 v[kAtOnce];
      float wj[kAtOnce];
#pragma unroll
      for (int j = 0; j < kAtOnce; ++j) {
        if (j0 + j < K) wj[j] = wt[j0 + j], v[j] = *reinterpret_cast<const float4*>(yr + int64_t(j0 + j) * n);
      }
#pragma unroll
      for (int j = 0; j < kAtOnce; ++j) {
        if (j0 + j < K) {
          acc = make_float4(fmaf(wj[j], v[j].x, acc.x), fmaf(wj[j], v[j].y, acc.y),
                            fmaf(wj[j], v[j].z, acc.z), fmaf(wj[j], v[j].w, acc.w));
        }
      }
    }
    *reinterpret_cast<float4*>(xr) = acc;
  } else {
    const int64_t m = n - col;  // columns left; this thread takes up to 4
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < m) acc[k] = xr[k];
    }
    for (int j = 0; j < K; ++j) {
      const float wj = wt[j];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (k < m) acc[k] = fmaf(wj, yr[int64_t(j) * n + k], acc[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < m) xr[k] = acc[k];
    }
  }
}

constexpr int kCombineThreads = 128;

// ---- local groups and scatter (experts shared with the host) ---------------------

// One block, a thread per local expert: counts, one warp scans them, then
// each thread copies its expert's pairs.
__global__ void __launch_bounds__(kScanThreads)
    local_groups_kernel(const int32_t* offsets, const int32_t* pairs, const int32_t* local, int n_local,
                        int32_t* local_offsets, int32_t* local_pairs) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  __shared__ int32_t base[kRouteMaxExperts];
  const int i = int(threadIdx.x);
  int begin = 0, count = 0;
  if (i < n_local) {
    begin = offsets[local[i]];
    count = offsets[local[i] + 1] - begin;
    base[i] = count;
  }
  __syncthreads();
  if (i < kWarp) warp_exclusive_scan(base, n_local, i, local_offsets);
  __syncthreads();
  if (i < n_local) {
    for (int k = 0; k < count; ++k) local_pairs[base[i] + k] = pairs[begin + k];
  }
}

// One block, a thread per expert: lo and hi counts, warps 0 and 1 scan
// them, then each thread copies its expert's pairs in order.
__global__ void __launch_bounds__(kScanThreads)
    split_groups_kernel(const int32_t* offsets, const int32_t* pairs, int n_expert, int32_t bound,
                        int32_t* lo_offsets, int32_t* lo_pairs, int32_t* hi_offsets, int32_t* hi_pairs) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  __shared__ int32_t lo_base[kRouteMaxExperts], hi_base[kRouteMaxExperts];
  const int i = int(threadIdx.x);
  int begin = 0, end = 0;
  if (i < n_expert) {
    begin = offsets[i], end = offsets[i + 1];
    int32_t lo = 0;
    for (int k = begin; k < end; ++k) lo += pairs[k] < bound;
    lo_base[i] = lo, hi_base[i] = end - begin - lo;
  }
  __syncthreads();
  if (i < kWarp) {
    warp_exclusive_scan(lo_base, n_expert, i, lo_offsets);
  } else if (i < 2 * kWarp) {
    warp_exclusive_scan(hi_base, n_expert, i - kWarp, hi_offsets);
  }
  __syncthreads();
  if (i < n_expert) {
    int32_t lo = lo_base[i], hi = hi_base[i];
    for (int k = begin; k < end; ++k) {
      const int32_t p = pairs[k];
      if (p < bound) {
        lo_pairs[lo++] = p;
      } else {
        hi_pairs[hi++] = p - bound;
      }
    }
  }
}

__global__ void scatter_rows_kernel(float* dst, const float* src, const int32_t* rows, int64_t n_cols) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t r = blockIdx.x;
  const float* s = src + r * n_cols;
  float* d = dst + int64_t(rows[r]) * n_cols;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < n_cols; c += int64_t(gridDim.y) * blockDim.x)
    d[c] = s[c];
}

}  // namespace

size_t route_scratch_bytes(int64_t n_tokens, int64_t n_expert) {
  if (n_tokens <= kMinChunkTokens || n_expert <= 0) return 0;
  // An upper bound of plan_chunks(m).n_chunks for every m <= n_tokens.
  const int64_t chunks = std::min(kMaxChunks, (n_tokens + kMinChunkTokens - 1) / kMinChunkTokens);
  return size_t(chunks) * size_t(n_expert) * sizeof(int32_t);
}

Status route_and_group(const RouteArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(check_route_args(a));
  const size_t offsets_bytes = size_t(a.n_expert + 1) * sizeof(int32_t);
  if (a.n_tokens == 0) {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.expert_offsets, 0, offsets_bytes, stream));
    return Status::ok();
  }
  const ChunkPlan plan = plan_chunks(a.n_tokens);
  RouteParams p;
  p.logits = a.logits, p.probs = a.probs, p.n_expert = int(a.n_expert), p.n_used = int(a.n_used);
  p.gating = {a.sigmoid, a.selection_bias, a.normalize, a.weight_scale};
  p.n_tokens = a.n_tokens, p.chunk_tokens = plan.chunk_tokens;
  p.selected = a.selected, p.weights = a.weights, p.pairs = a.pairs_by_expert, p.offsets = a.expert_offsets;
  p.chunk_counts = static_cast<int32_t*>(a.scratch);
  const int64_t per_lane = (a.n_expert + kWarp - 1) / kWarp;
  if (per_lane <= 1) {
    launch_route<1>(p, plan.n_chunks, stream);
  } else if (per_lane <= 2) {
    launch_route<2>(p, plan.n_chunks, stream);
  } else if (per_lane <= 4) {
    launch_route<4>(p, plan.n_chunks, stream);
  } else if (per_lane <= 8) {
    launch_route<8>(p, plan.n_chunks, stream);
  } else {
    launch_route<16>(p, plan.n_chunks, stream);
  }
  MOESERVE_RETURN_IF_ERROR(launched("route_and_group (route)"));
  if (plan.n_chunks == 1) return Status::ok();
  detail::launch(chunk_scan_kernel, 1, kScanThreads, 0, stream, p.chunk_counts, int(plan.n_chunks),
                 p.n_expert, p.offsets);
  MOESERVE_RETURN_IF_ERROR(launched("route_and_group (scan)"));
  detail::launch(chunk_scatter_kernel, unsigned(plan.n_chunks), kWarp, size_t(p.n_expert) * sizeof(int32_t),
                 stream, p);
  return launched("route_and_group (scatter)");
}

Status combine_experts(const CombineArgs& a, cudaStream_t stream) {
  const int64_t max_cols = int64_t(65535) * kCombineThreads * 4;  // grid.y limit
  if (a.n_tokens < 0 || a.n_tokens > INT32_MAX || a.n_used < 1 || a.n_used > INT32_MAX || a.n_embd < 1 ||
      a.n_embd > max_cols) {
    return make_error(StatusCode::kInvalidArgument,
                      "combine_experts: bad shape {} tokens x {} slots x {} cols", a.n_tokens, a.n_used,
                      a.n_embd);
  }
  if (a.n_tokens == 0) return Status::ok();
  if (a.x == nullptr || a.y == nullptr || a.weights == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "combine_experts: null x, y or weights");
  }
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  const bool vec = a.n_embd % 4 == 0 && aligned16(a.x) && aligned16(a.y);
  const dim3 grid(unsigned(a.n_tokens),
                  unsigned((a.n_embd + 4 * kCombineThreads - 1) / (4 * kCombineThreads)));
  if (vec) {
    detail::launch(combine_kernel<true>, grid, kCombineThreads, 0, stream, a.x, a.y, a.weights, int(a.n_used),
                   a.n_embd);
  } else {
    detail::launch(combine_kernel<false>, grid, kCombineThreads, 0, stream, a.x, a.y, a.weights,
                   int(a.n_used), a.n_embd);
  }
  return launched("combine_experts");
}

Status local_expert_groups(const LocalGroupsArgs& a, cudaStream_t stream) {
  if (a.n_expert < 1 || a.n_expert > kRouteMaxExperts || a.n_local < 0 || a.n_local > a.n_expert) {
    return make_error(StatusCode::kInvalidArgument, "local_expert_groups: {} local of {} experts (at most {})",
                      a.n_local, a.n_expert, kRouteMaxExperts);
  }
  if (a.offsets == nullptr || a.local_offsets == nullptr || (a.n_local > 0 && (a.local == nullptr || a.pairs == nullptr || a.local_pairs == nullptr))) {
    return make_error(StatusCode::kInvalidArgument, "local_expert_groups: null argument");
  }
  detail::launch(local_groups_kernel, 1, kScanThreads, 0, stream, a.offsets, a.pairs, a.local, int(a.n_local),
                 a.local_offsets, a.local_pairs);
  return launched("local_expert_groups");
}

Status split_expert_groups(const SplitGroupsArgs& a, cudaStream_t stream) {
  if (a.n_expert < 1 || a.n_expert > kRouteMaxExperts || a.bound < 0) {
    return make_error(StatusCode::kInvalidArgument, "split_expert_groups: {} experts (at most {}), bound {}",
                      a.n_expert, kRouteMaxExperts, a.bound);
  }
  if (a.offsets == nullptr || a.pairs == nullptr || a.lo_offsets == nullptr || a.lo_pairs == nullptr ||
      a.hi_offsets == nullptr || a.hi_pairs == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "split_expert_groups: null argument");
  }
  detail::launch(split_groups_kernel, 1, kScanThreads, 0, stream, a.offsets, a.pairs, int(a.n_expert), a.bound,
                 a.lo_offsets, a.lo_pairs, a.hi_offsets, a.hi_pairs);
  return launched("split_expert_groups");
}

Status scatter_rows(const ScatterRowsArgs& a, cudaStream_t stream) {
  if (a.n_rows < 0 || a.n_rows > INT32_MAX || a.n_cols < 1) {
    return make_error(StatusCode::kInvalidArgument, "scatter_rows: bad shape {} x {}", a.n_rows, a.n_cols);
  }
  if (a.n_rows == 0) return Status::ok();
  if (a.dst == nullptr || a.src == nullptr || a.rows == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "scatter_rows: null argument");
  }
  constexpr int kThreads = 256;
  const dim3 grid(unsigned(a.n_rows), unsigned(std::min<int64_t>(8, (a.n_cols + kThreads - 1) / kThreads)));
  detail::launch(scatter_rows_kernel, grid, kThreads, 0, stream, a.dst, a.src, a.rows, a.n_cols);
  return launched("scatter_rows");
}

}  // namespace moeserve::cuda
