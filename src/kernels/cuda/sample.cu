// Greedy sampling on the GPU (sample.h). One CTA a row: the logits were just
// written by the LM head and sit in L2, so one SM scans a 152k row in a few
// microseconds; each thread keeps its best (value, index) over a strided
// scan, then the block reduces the pairs. The order "larger value, then
// lower index" is total, so the answer does not depend on the scan's split.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sample.h"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarp = 32;

struct Best {
  float v;
  int i;  // n_cols <= INT32_MAX
};

// NaN as -inf; a candidate beats the current best with a larger value, or an
// equal one at a lower index.
__device__ __forceinline__ void consider(Best& b, float v, int i) {
  if (isnan(v)) v = -INFINITY;
  if (v > b.v || (v == b.v && i < b.i)) b = {v, i};
}

__device__ __forceinline__ Best merge(Best a, Best b) {
  return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}

__device__ __forceinline__ Best warp_best(Best b) {
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    b = merge(b, other);
  }
  return b;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const ArgmaxArgs a) {
  detail::grid_dependency_wait();  // launch.cuh: the logits come from the kernel before
  detail::allow_dependents();
  __shared__ Best partial[kThreads / kWarp];
  const float* row = a.x + int64_t(blockIdx.x) * a.n_cols;
  const int64_t n = a.n_cols;
  Best b{-INFINITY, INT32_MAX};
  // float4 loads over the 16-byte aligned middle of the row, scalars around it.
  const int64_t lead = int64_t((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15) / 4;
  const int64_t head = lead < n ? lead : n;
  const int64_t n4 = (n - head) / 4;
  for (int64_t i = threadIdx.x; i < head; i += kThreads) consider(b, row[i], int(i));
  const float4* v4 = reinterpret_cast<const float4*>(row + head);
  for (int64_t q = threadIdx.x; q < n4; q += kThreads) {
    const float4 f = v4[q];
    const int i = int(head + 4 * q);
    consider(b, f.x, i), consider(b, f.y, i + 1), consider(b, f.z, i + 2), consider(b, f.w, i + 3);
  }
  for (int64_t i = head + 4 * n4 + threadIdx.x; i < n; i += kThreads) consider(b, row[i], int(i));
  b = warp_best(b);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  if (warp != 0) return;
  b = lane < kThreads / kWarp ? partial[lane] : Best{-INFINITY, INT32_MAX};
  b = warp_best(b);
  if (lane == 0) a.out[blockIdx.x] = b.v > -INFINITY ? b.i : 0;
}

// ---- top-k with log-softmax -------------------------------------------------

__device__ __forceinline__ float scaled(float x, float scale, float softcap) {
  float v = x * scale;
  if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
  return isnan(v) ? -INFINITY : v;
}

// The order: larger value first, then the lower index. `after(v, i, pv, pi)`:
// (v, i) comes after (pv, pi).
__device__ __forceinline__ bool after(float v, int i, float pv, int pi) {
  return v < pv || (v == pv && i > pi);
}

__device__ __forceinline__ float block_sum(float v, float* shared) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < kThreads / kWarp; ++w) t += shared[w];
  return t;
}

__device__ __forceinline__ Best block_best(Best b, Best* shared) {
  b = warp_best(b);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  __syncthreads();
  if (lane == 0) shared[warp] = b;
  __syncthreads();
  Best t{-INFINITY, INT32_MAX};
  for (int w = 0; w < kThreads / kWarp; ++w) t = merge(t, shared[w]);
  return t;
}

// One CTA a row. The row's maximum, then the sum of exp(v - max), then k
// rounds each taking the best entry after the previous round's: k + 2
// passes over a row that sits in L2 after the first.
__global__ void __launch_bounds__(kThreads) top_k_kernel(const TopKArgs a) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  __shared__ Best best_shared[kThreads / kWarp];
  __shared__ float sum_shared[kThreads / kWarp];
  const float* row = a.x + int64_t(blockIdx.x) * a.n_cols;
  const int n = int(a.n_cols);
  Best b{-INFINITY, INT32_MAX};
  for (int i = int(threadIdx.x); i < n; i += kThreads) consider(b, scaled(row[i], a.scale, a.softcap), i);
  const Best top = block_best(b, best_shared);
  const float max = top.v;
  float local = 0.0f;
  if (max > -INFINITY) {
    for (int i = int(threadIdx.x); i < n; i += kThreads)
      local += __expf(scaled(row[i], a.scale, a.softcap) - max);
  }
  const float lse = max > -INFINITY ? max + logf(block_sum(local, sum_shared)) : 0.0f;
  Best prev = top;
  for (int j = 0; j < a.k; ++j) {
    Best cur = prev;
    if (j > 0) {
      Best mine{-INFINITY, INT32_MAX};
      bool any = false;
      for (int i = int(threadIdx.x); i < n; i += kThreads) {
        const float v = scaled(row[i], a.scale, a.softcap);
        if (after(v, i, prev.v, prev.i) && (!any || v > mine.v || (v == mine.v && i < mine.i)))
          mine = {v, i}, any = true;
      }
      cur = block_best(mine, best_shared);
    }
    if (threadIdx.x == 0) {
      a.ids[int64_t(blockIdx.x) * a.k + j] = cur.i == INT32_MAX ? 0 : cur.i;
      a.log_probs[int64_t(blockIdx.x) * a.k + j] = cur.v - lse;
    }
    prev = cur;
  }
}

}  // namespace

Status top_k_rows(const TopKArgs& a, cudaStream_t stream) {
  if (a.n_rows < 0 || a.n_rows > INT32_MAX || a.n_cols < 1 || a.n_cols > INT32_MAX || a.k < 1 ||
      a.k > kTopKMax || a.k > a.n_cols) {
    return make_error(StatusCode::kInvalidArgument, "top_k_rows: {} rows x {} cols, k {} (1..{})", a.n_rows,
                      a.n_cols, a.k, kTopKMax);
  }
  if (a.n_rows == 0) return Status::ok();
  if (a.x == nullptr || a.ids == nullptr || a.log_probs == nullptr)
    return make_error(StatusCode::kInvalidArgument, "top_k_rows: null x, ids or log_probs");
  detail::launch(top_k_kernel, unsigned(a.n_rows), kThreads, 0, stream, a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "top_k_rows: kernel launch failed: {}", cudaGetErrorString(err));
  }
  return Status::ok();
}

Status argmax_rows(const ArgmaxArgs& a, cudaStream_t stream) {
  if (a.n_rows < 0 || a.n_rows > INT32_MAX || a.n_cols < 1 || a.n_cols > INT32_MAX) {
    return make_error(StatusCode::kInvalidArgument, "argmax_rows: bad shape {} rows x {} cols", a.n_rows,
                      a.n_cols);
  }
  if (a.n_rows == 0) return Status::ok();
  if (a.x == nullptr || a.out == nullptr)
    return make_error(StatusCode::kInvalidArgument, "argmax_rows: null x or out");
  detail::launch(argmax_kernel, unsigned(a.n_rows), kThreads, 0, stream, a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "argmax_rows: kernel launch failed: {}",
                      cudaGetErrorString(err));
  }
  return Status::ok();
}

}  // namespace moeserve::cuda
