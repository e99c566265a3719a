// The grouped expert products of one decode token (each expert has at most
// one pair) for the types of gemm_kq.cu's integer kernel: a warp per weight
// row (gate and up rows together for kGateUp), its lanes along K, four
// lanes a 256-column block (kq_lanes.cuh: dp4a on the Q8_K activations).
//
// Why: gemm_kq.cu's kernel gives each warp 16 rows and walks K one block
// after another, so one token's products (8 experts of 2048 x 768) make
// only ~6 warps an SM, each a long chain of dependent decode steps; the
// codebook i-quants' decode (grid lookups, sign expansion) made that chain
// the bound: 34-41 us for a 30b-a3b layer's experts, whose IQ2_XXS weights
// (9.7 MB) stream in ~4 us. Here a warp takes two rows (gate/up: 3,072
// warps for 8 experts x 768 outputs) and the decode of a row's blocks runs
// in parallel across its lanes. H200, that layer's experts at one token,
// us, gemm_kq.cu's tiles -> here: Q4_K 22.3 -> 18.2, Q6_K 33.1 -> 30.6,
// Q2_K 24.1 -> 15.0, IQ4_XS 33.6 -> 22.4, IQ3_S 41.3 -> 28.6, IQ2_XXS
// 36.9 -> 21.7, IQ1_M 37.3 -> 24.8.

// The bits are gemm_kq.cu's: each block's integer sums are exact, its float
// is formed with the same operations, and a row's blocks are added in block
// order from 0 (kq_lanes.cuh). So a speculative verify (many tokens, the
// MMA kernel) gives every pair its decode step's bits, and the K-quants and
// IQ4_XS stay bit for bit the reference CPU kernels'.
//
// A CTA: kWarps warps of one pair (expert), kRowsAtOnce rows a warp; it
// quantizes its pair's activation row to Q8_K in shared memory first (one
// block a warp), as gemm_kq.cu's one-token tiles do (one launch less than a
// quantize kernel before).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/kq_lanes.cuh"
#include "kernels/cuda/kq_quantize.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_detail.h"

namespace moeserve::cuda::detail {
namespace {

using kq::kQ8Bytes;
using kq::kQ8D;

constexpr int kWarps = 8;
// Activation rows of up to this many blocks (16,384 columns: 19 KB of shared memory).
constexpr int kMaxBlocks = 64;

// kStep blocks of a row a warp step (4 lanes a block), 8 / kStep rows at
// once, kIters such steps of rows a warp.
template <DType T, int kStep, int kIters>
__global__ void __launch_bounds__(32 * kWarps) kq_vec_kernel(const MmProblem p) {
  constexpr int kLanesPerRow = 4 * kStep, kRowsAtOnce = 32 / kLanesPerRow;
  using Q = tcdec::Tc<T>;
  using L = kq::Lane<T>;
  extern __shared__ __align__(16) uint8_t xq_all[];  // [block][kQ8Bytes]
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  grid_dependency_wait();  // launch.cuh: the groups and x are written by the kernels before
  const Slot slot = find_slot(p.offsets, p.n_expert, 1, blockIdx.x, lane);
  if (slot.count == 0) return;  // the same answer in every warp
  const int64_t pair = __ldg(p.pairs + slot.begin);
  const int n_blocks = int(p.n_cols / 256);
  const float* x = p.x + (pair / p.x_row_div) * p.x_stride;
  for (int b = warp; b < n_blocks; b += kWarps) {
    const float4* src = reinterpret_cast<const float4*>(x + b * 256 + 8 * lane);
    const float4 lo = __ldg(src), hi = __ldg(src + 1);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    kq::quantize_block(v, lane, xq_all + b * kQ8Bytes);
  }
  allow_dependents();
  __syncthreads();

  const bool gate_up = p.mode == MmMode::kGateUp;
  const int sub = lane / kLanesPerRow, in_row = lane % kLanesPerRow, quarter = in_row & 3;
  const int first_lane = sub * kLanesPerRow;
  // The warp's rows: kIters steps of kRowsAtOnce. A row past the end
  // computes the last row (its lanes take part in the shuffles) and writes
  // nothing.
  int64_t rows[kIters];
  const uint8_t* w0[kIters];
  const uint8_t* w1[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    rows[it] = ((int64_t(blockIdx.y) * kWarps + warp) * kIters + it) * kRowsAtOnce + sub;
    const int64_t r = min(rows[it], p.n_rows - 1);
    w0[it] = p.w0 + slot.expert * p.matrix_stride + r * p.row_bytes;
    w1[it] = gate_up ? p.w1 + slot.expert * p.matrix_stride + r * p.row_bytes : w0[it];
  }
  float acc0[kIters], acc1[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) acc0[it] = acc1[it] = 0.0f;
  for (int b0 = 0; b0 < n_blocks; b0 += kStep) {
    const int b = b0 + (in_row >> 2);
    const bool has = b < n_blocks;
    const uint8_t* const xq = xq_all + (has ? b : 0) * kQ8Bytes;
    const float xd = *reinterpret_cast<const float*>(xq + kQ8D);
    float f0[kIters], f1[kIters];
    // The rows' sums first (their loads in flight together), then the reductions.
    kq::LaneSums s0[kIters], s1[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (has) {
        s0[it] = L::sums(w0[it] + b * Q::kBlockBytes, xq, quarter);
        if (gate_up) s1[it] = L::sums(w1[it] + b * Q::kBlockBytes, xq, quarter);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      s0[it] = kq::quad_sum(s0[it]);
      if (gate_up) s1[it] = kq::quad_sum(s1[it]);
      f0[it] = f1[it] = 0.0f;
      if (has && quarter == 0) {
        f0[it] = L::block_float(w0[it] + b * Q::kBlockBytes, xd, s0[it]);
        if (gate_up) f1[it] = L::block_float(w1[it] + b * Q::kBlockBytes, xd, s1[it]);
      }
    }
    // The blocks' floats in block order (gemm_kq.cu adds them so).
    for (int i = 0; i < kStep && b0 + i < n_blocks; ++i) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        acc0[it] = __fadd_rn(acc0[it], __shfl_sync(kFull, f0[it], first_lane + 4 * i));
        if (gate_up) acc1[it] = __fadd_rn(acc1[it], __shfl_sync(kFull, f1[it], first_lane + 4 * i));
      }
    }
  }
  if (in_row == 0) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (rows[it] < p.n_rows)
        p.y[pair * p.y_stride + rows[it]] = gate_up ? silu(acc0[it]) * acc1[it] : acc0[it];
    }
  }
}

template <DType T, int kStep, int kIters>
Status launch_step(const MmProblem& p, cudaStream_t stream) {
  const int64_t rows_per_cta = int64_t(kWarps) * (8 / kStep) * kIters;
  const int64_t row_tiles = (p.n_rows + rows_per_cta - 1) / rows_per_cta;
  if (row_tiles > 65535 || p.n_pairs > int64_t(INT32_MAX)) {
    return make_error(StatusCode::kInvalidArgument, "kq_vec: {} rows x {} pairs is too many", p.n_rows,
                      p.n_pairs);
  }
  const size_t bytes = size_t(p.n_cols / 256) * kQ8Bytes;
  // Past the default 48 KB of shared memory only with kMaxBlocks > 161; none here.
  static_assert(size_t(kMaxBlocks) * kQ8Bytes <= 48 * 1024);
  detail::launch(kq_vec_kernel<T, kStep, kIters>, dim3(unsigned(p.n_pairs), unsigned(row_tiles)), 32 * kWarps,
                 bytes, stream, p);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "kq_vec ({}): launch failed: {}", dtype_name(T),
                      cudaGetErrorString(err));
  }
  return Status::ok();
}

// Row steps a warp: 2 (H200, a 30b-a3b layer's experts at one token, gate/up
// + down in us for 1 / 2 / 4 steps: Q4_K 20.8 / 18.2 / 21.1, Q6_K 34.5 /
// 30.6 / 39.7, Q2_K 18.2 / 15.0 / 17.7, IQ2_XXS 22.9 / 21.7 / 25.8, IQ1_M
// 26.2 / 24.8 / 25.8). MOESERVE_CUDA_KQ_VEC_ITERS=1|2|4 fixes it (comparisons).
int iters_override() {
  static const int n = [] {
    const char* v = std::getenv("MOESERVE_CUDA_KQ_VEC_ITERS");
    const int i = v == nullptr ? 0 : std::atoi(v);
    return i == 1 || i == 2 || i == 4 ? i : 0;
  }();
  return n;
}

template <DType T, int kStep>
Status launch_iters(const MmProblem& p, int iters, cudaStream_t stream) {
  if (iters == 1) return launch_step<T, kStep, 1>(p, stream);
  if (iters == 2) return launch_step<T, kStep, 2>(p, stream);
  return launch_step<T, kStep, 4>(p, stream);
}

template <DType T>
Status launch_type(const MmProblem& p, cudaStream_t stream) {
  const int64_t n_blocks = p.n_cols / 256;
  const int iters = iters_override() > 0 ? iters_override() : 2;
  if (n_blocks <= 2) return launch_iters<T, 2>(p, iters, stream);
  if (n_blocks <= 4) return launch_iters<T, 4>(p, iters, stream);
  return launch_iters<T, 8>(p, iters, stream);
}

}  // namespace

bool kq_vec_takes(const MmProblem& p) {
  // MOESERVE_CUDA_KQ_VEC=0: gemm_kq.cu's one-token tiles instead (comparisons).
  static const bool enabled = [] {
    const char* v = std::getenv("MOESERVE_CUDA_KQ_VEC");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled && p.mode != MmMode::kDense && p.n_tokens == 1 && p.n_cols % 256 == 0 &&
         p.n_cols / 256 <= kMaxBlocks && p.n_rows > 0 && p.n_pairs > 0;
}

Status launch_kq_vec(const MmProblem& p, cudaStream_t stream) {
  return kq::dispatch_type(p.type, "kq_vec",
                           [&](auto type) { return launch_type<decltype(type)::value>(p, stream); });
}

}  // namespace moeserve::cuda::detail
