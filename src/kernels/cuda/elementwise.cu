// Row-wise and element-wise kernels of a forward pass: RMSNorm (plain, over
// gathered rows, fused with the residual add), SwiGLU, residual add, the
// softplus gate, fill.
// All are memory-bound: the goal is coalesced (float4 where aligned) loads
// and, for the norms, a reduction whose order is fixed by the row length so
// results are deterministic and independent of the batch.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

Status launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "{}: kernel launch failed: {}", what, cudaGetErrorString(err));
  }
  return Status::ok();
}

// ---- RMSNorm -------------------------------------------------------------

// Sum over the block, every thread gets the total. The xor butterfly adds
// (a + b) on one lane and (b + a) on its partner, so all lanes hold the same
// bits; the cross-warp step reads the partials in warp order. The order
// depends only on blockDim.x, never on timing.
__device__ float block_sum(float v, float* partials) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int n_warps = int(blockDim.x) / kWarp;
  if (n_warps == 1) return v;
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partials[lane] : 0.0f;
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Four consecutive elements (group g) of a row of n. Thread t owns groups
// t, t + blockDim.x, ... in both paths, so the float4 path and the scalar
// path (unaligned rows, n % 4 != 0) add the squares in the same order.
template <bool kVec>
__device__ __forceinline__ void load4(const float* row, int64_t g, int64_t n, float v[4]) {
  if (kVec) {
    const float4 q = reinterpret_cast<const float4*>(row)[g];
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = 4 * g + k < n ? row[4 * g + k] : 0.0f;
  }
}

template <bool kVec>
__device__ __forceinline__ void store4(float* row, int64_t g, int64_t n, const float v[4]) {
  if (kVec) {
    reinterpret_cast<float4*>(row)[g] = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (4 * g + k < n) row[4 * g + k] = v[k];
    }
  }
}

struct NormParams {
  const float* x = nullptr;      // rows read (after the add, for kAdd)
  float* x_io = nullptr;         // kAdd: x, updated in place
  const float* delta = nullptr;  // kAdd: optional
  const float* w = nullptr;      // optional
  float* out = nullptr;
  const int32_t* src_rows = nullptr;
  int64_t n = 0;
  float eps = 0.0f;
  // kAdd with slots: delta is sum_j slot_weights[r][j] * y[r * n_slots + j].
  const float* y = nullptr;
  const float* slot_weights = nullptr;
  int n_slots = 0;
};

constexpr int kSlotsAtOnce = 8;

// One block per output row. Pass 1 (optionally adding delta into x) sums
// the squares; pass 2 rereads the thread's own elements (L1/L2 hits) and
// writes x * scale * w in the CPU reference's order of products.
template <bool kVec, bool kAdd>
__global__ void rms_norm_kernel(NormParams p) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  __shared__ float partials[kMaxThreads / kWarp];
  const int64_t r = blockIdx.x;
  const int64_t src = p.src_rows != nullptr ? p.src_rows[r] : r;
  const int64_t n = p.n, n_groups = (n + 3) / 4;
  const float* x = kAdd ? p.x_io + r * n : p.x + src * n;
  float sum = 0.0f;
  for (int64_t g = threadIdx.x; g < n_groups; g += blockDim.x) {
    float v[4];
    load4<kVec>(x, g, n, v);
    if (kAdd && p.delta != nullptr) {
      float d[4];
      load4<kVec>(p.delta + r * n, g, n, d);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] += d[k];
      store4<kVec>(p.x_io + r * n, g, n, v);
    } else if (kAdd && p.y != nullptr) {
      // The MoE combine: one fma per slot, in slot order (moe.cu). Up to
      // kSlotsAtOnce slots' rows are loaded before the first fma: in a
      // decode step this CTA is alone on the GPU, and 8 dependent round
      // trips to L2 were most of its time (9.8 us a layer, measured).
      for (int j0 = 0; j0 < p.n_slots; j0 += kSlotsAtOnce) {
        float d[kSlotsAtOnce][4], wj[kSlotsAtOnce];
#pragma unroll
        for (int j = 0; j < kSlotsAtOnce; ++j) {
          if (j0 + j < p.n_slots) {
            wj[j] = p.slot_weights[r * p.n_slots + j0 + j];
            load4<kVec>(p.y + (r * p.n_slots + j0 + j) * n, g, n, d[j]);
          }
        }
#pragma unroll
        for (int j = 0; j < kSlotsAtOnce; ++j) {
          if (j0 + j < p.n_slots) {
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = fmaf(wj[j], d[j][k], v[k]);
          }
        }
      }
      store4<kVec>(p.x_io + r * n, g, n, v);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) sum += v[k] * v[k];
  }
  sum = block_sum(sum, partials);
  const float scale = 1.0f / sqrtf(sum / float(n) + p.eps);
  float* out = p.out + r * n;
  for (int64_t g = threadIdx.x; g < n_groups; g += blockDim.x) {
    float v[4], w[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    load4<kVec>(x, g, n, v);
    if (p.w != nullptr) load4<kVec>(p.w, g, n, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = v[k] * scale * w[k];
    store4<kVec>(out, g, n, v);
  }
}

// About two groups of four per thread: enough loads in flight per thread,
// whole warps, at most one full block. A function of n only (see header).
int norm_threads(int64_t n) {
  const int64_t groups = (n + 3) / 4;
  const int64_t want = ((groups + 1) / 2 + kWarp - 1) / kWarp * kWarp;
  return int(want < kWarp ? kWarp : want > kMaxThreads ? kMaxThreads : want);
}

template <bool kAdd>
Status launch_norm(const NormParams& p, int64_t n_rows, bool vec, cudaStream_t stream, const char* what) {
  const int threads = norm_threads(p.n);
  if (vec) {
    detail::launch(rms_norm_kernel<true, kAdd>, unsigned(n_rows), threads, 0, stream, p);
  } else {
    detail::launch(rms_norm_kernel<false, kAdd>, unsigned(n_rows), threads, 0, stream, p);
  }
  return launched(what);
}

Status check_rows(const char* what, int64_t n_rows, int64_t n_cols) {
  if (n_rows < 0 || n_rows > INT32_MAX || n_cols <= 0 || n_cols > INT32_MAX) {
    return make_error(StatusCode::kInvalidArgument, "{}: bad shape {} rows x {} cols", what, n_rows, n_cols);
  }
  return Status::ok();
}

// ---- element-wise --------------------------------------------------------

struct SwigluOp {
  __device__ float operator()(float gate, float up) const { return gate / (1.0f + expf(-gate)) * up; }
};
struct AddOp {
  __device__ float operator()(float y, float x) const { return y + x; }
};

// out[i] = op(a[i], b[i]); out may alias a. Grid-stride over float4s when
// every pointer is 16-byte aligned, the n % 4 tail (or everything) scalar.
template <class Op>
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, bool vec) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  const Op op;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_vec = vec ? n / 4 : 0;
  for (int64_t i = tid; i < n_vec; i += stride) {
    const float4 x = reinterpret_cast<const float4*>(a)[i];
    const float4 y = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(out)[i] = make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
  }
  for (int64_t i = 4 * n_vec + tid; i < n; i += stride) out[i] = op(a[i], b[i]);
}

__global__ void fill_kernel(float* p, float value, int64_t n) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = value;
}

// x[i] *= softplus(gate[i / group]): consecutive threads share a gate
// (broadcast loads) and write consecutive x.
__global__ void mul_softplus_kernel(float* x, const float* gate, int64_t n, int64_t group) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = gate[i / group];
    x[i] *= v > 20.0f ? v : log1pf(expf(v));
  }
}

constexpr int kFlatThreads = 256;
constexpr int64_t kMaxFlatBlocks = 1 << 16;  // the grid-stride loops cover the rest

unsigned flat_blocks(int64_t work) {
  const int64_t b = (work + kFlatThreads - 1) / kFlatThreads;
  return unsigned(b < 1 ? 1 : b > kMaxFlatBlocks ? kMaxFlatBlocks : b);
}

template <class Op>
Status launch_binary(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream,
                     const char* what) {
  if (n < 0) return make_error(StatusCode::kInvalidArgument, "{}: negative length {}", what, n);
  if (n == 0) return Status::ok();
  if (a == nullptr || b == nullptr || out == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "{}: null pointer", what);
  }
  const bool vec = aligned16(a) && aligned16(b) && aligned16(out);
  detail::launch(binary_kernel<Op>, flat_blocks(vec ? n / 4 + 3 : n), kFlatThreads, 0, stream, a, b, out, n,
                 vec);
  return launched(what);
}

}  // namespace

Status rms_norm(const RmsNormArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(check_rows("rms_norm", a.n_rows, a.n_cols));
  if (a.n_rows == 0) return Status::ok();
  if (a.x == nullptr || a.out == nullptr)
    return make_error(StatusCode::kInvalidArgument, "rms_norm: null x or out");
  if (a.src_rows != nullptr && a.out == a.x) {
    // Another block may still read a row this one overwrites.
    return make_error(StatusCode::kInvalidArgument, "rms_norm: out must not alias x when src_rows is given");
  }
  NormParams p;
  p.x = a.x, p.w = a.w, p.out = a.out, p.src_rows = a.src_rows, p.n = a.n_cols, p.eps = a.eps;
  const bool vec =
      a.n_cols % 4 == 0 && aligned16(a.x) && aligned16(a.out) && (a.w == nullptr || aligned16(a.w));
  return launch_norm<false>(p, a.n_rows, vec, stream, "rms_norm");
}

Status add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(check_rows("add_rms_norm", a.n_rows, a.n_cols));
  if (a.n_rows == 0) return Status::ok();
  if (a.x == nullptr || a.out == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "add_rms_norm: null x or out");
  }
  NormParams p;
  p.x_io = a.x, p.delta = a.delta, p.w = a.w, p.out = a.out, p.n = a.n_cols, p.eps = a.eps;
  const bool vec = a.n_cols % 4 == 0 && aligned16(a.x) && aligned16(a.out) &&
                   (a.w == nullptr || aligned16(a.w)) && (a.delta == nullptr || aligned16(a.delta));
  return launch_norm<true>(p, a.n_rows, vec, stream, "add_rms_norm");
}

Status combine_rms_norm(const CombineRmsNormArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(check_rows("combine_rms_norm", a.n_rows, a.n_cols));
  if (a.n_rows == 0) return Status::ok();
  if (a.x == nullptr || a.out == nullptr || a.y == nullptr || a.weights == nullptr || a.n_used < 1 ||
      a.n_used > 1024) {
    return make_error(StatusCode::kInvalidArgument, "combine_rms_norm: null x/out/y/weights or n_used {}",
                      a.n_used);
  }
  NormParams p;
  p.x_io = a.x, p.y = a.y, p.slot_weights = a.weights, p.n_slots = int(a.n_used);
  p.w = a.w, p.out = a.out, p.n = a.n_cols, p.eps = a.eps;
  const bool vec = a.n_cols % 4 == 0 && aligned16(a.x) && aligned16(a.out) && aligned16(a.y) &&
                   (a.w == nullptr || aligned16(a.w));
  return launch_norm<true>(p, a.n_rows, vec, stream, "combine_rms_norm");
}

Status swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  return launch_binary<SwigluOp>(gate, up, out, n, stream, "swiglu");
}

Status add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  return launch_binary<AddOp>(y, x, y, n, stream, "add");
}

Status mul_softplus(float* x, const float* gate, int64_t n_rows, int64_t n_gates, int64_t group,
                    cudaStream_t stream) {
  if (n_rows < 0 || n_gates < 0 || group < 0) {
    return make_error(StatusCode::kInvalidArgument, "mul_softplus: bad shape {} rows x {} gates x {}", n_rows,
                      n_gates, group);
  }
  const int64_t n = n_rows * n_gates * group;
  if (n == 0) return Status::ok();
  if (x == nullptr || gate == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "mul_softplus: null pointer");
  }
  detail::launch(mul_softplus_kernel, flat_blocks(n), kFlatThreads, 0, stream, x, gate, n, group);
  return launched("mul_softplus");
}

Status fill_f32(float* p, float value, int64_t n, cudaStream_t stream) {
  if (n < 0) return make_error(StatusCode::kInvalidArgument, "fill_f32: negative length {}", n);
  if (n == 0) return Status::ok();
  if (p == nullptr) return make_error(StatusCode::kInvalidArgument, "fill_f32: null pointer");
  detail::launch(fill_kernel, flat_blocks(n), kFlatThreads, 0, stream, p, value, n);
  return launched("fill_f32");
}

}  // namespace moeserve::cuda
