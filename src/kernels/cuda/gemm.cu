// Matrix products on tensor cores for prefill (any number of tokens) and the
// grouped expert products of a prefill batch.
//
// A block computes a 64 (tokens or pairs) x 128 (weight rows) tile of the
// output, K in steps of 32: each thread decodes one 16-element run of one
// weight row (quant_decode.cuh, straight from the blocks in global memory)
// and converts 8 floats of one activation row, both to f16 (bf16 when the
// weights are BF16, which f16 cannot hold); the tiles go to shared memory
// (two buffers, the next step's loads and decode overlapping this step's
// matrix products), and 8 warps multiply them with WMMA (16x16x16, f32
// accumulation, portable sm_80..sm_120). Error: the operands' rounding to
// f16 (about 2^-11 relative) or bf16 (about 2^-8).
//
// For the fused gate/up product the 128 weight rows of a tile are 64 gate
// rows and the same 64 up rows, arranged so that a warp's two accumulator
// fragments hold gate and up of the same outputs: SwiGLU is applied to the
// fragments before they are stored.
//
// Each output element is one K-ordered chain of tensor-core products that
// involves only its own activation row, so a token's (pair's) result does not
// depend on the other rows of its tile or batch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_detail.h"
#include "kernels/cuda/quant_decode.cuh"

namespace moeserve::cuda {
namespace detail {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 64, kBN = 128, kBK = 32;
constexpr int kLd = kBK + 8;  // padded row (elements): conflict-free fragment loads
constexpr int kThreads = 256;

template <class Op>
struct Tiles {
  Op a[2][kBM][kLd];
  Op b[2][kBN][kLd];
  float c[kThreads / 32][16 * 16];  // per-warp staging of an output fragment
};

__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half*) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16*) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <class Op>
__device__ __forceinline__ uint4 pack8(const float* v) {
  return make_uint4(pack2(v[0], v[1], static_cast<Op*>(nullptr)), pack2(v[2], v[3], static_cast<Op*>(nullptr)),
                    pack2(v[4], v[5], static_cast<Op*>(nullptr)), pack2(v[6], v[7], static_cast<Op*>(nullptr)));
}

// One thread's share of a K step: a 16-element weight run and 8 activations.
template <class Q, class Op>
struct StepRegs {
  uint4 b[2];
  uint4 a;

  __device__ __forceinline__ void load(const uint8_t* wrow, const float* xrow, int64_t col_b, int64_t col_a,
                                       int64_t n_cols) {
    constexpr int kRuns = Q::kBlockElems / qdec::kRunLen;
    float v[qdec::kRunLen];
    if (col_b < n_cols) {
      const int64_t g = col_b / qdec::kRunLen;
      const float s = Q::decode(wrow + (g / kRuns) * Q::kBlockBytes, static_cast<int>(g % kRuns), v);
      if constexpr (Q::kScaled) {
#pragma unroll
        for (int i = 0; i < qdec::kRunLen; ++i) v[i] *= s;
      }
    } else {
#pragma unroll
      for (int i = 0; i < qdec::kRunLen; ++i) v[i] = 0.0f;
    }
    b[0] = pack8<Op>(v), b[1] = pack8<Op>(v + 8);
    float xv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (xrow != nullptr && col_a < n_cols) {
      const float4 lo = __ldg(reinterpret_cast<const float4*>(xrow + col_a));
      const float4 hi = __ldg(reinterpret_cast<const float4*>(xrow + col_a) + 1);
      xv[0] = lo.x, xv[1] = lo.y, xv[2] = lo.z, xv[3] = lo.w, xv[4] = hi.x, xv[5] = hi.y, xv[6] = hi.z, xv[7] = hi.w;
    }
    a = pack8<Op>(xv);
  }
};

using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Writes a warp's 32 x 32 output tile (fragments [i][j]: tile rows 32wm +
// 16i, weight rows 16wn + 64j) a fragment at a time through its staging
// area; kGateUp: fragment j = 0 holds gate, j = 1 up of the same outputs,
// and SwiGLU of the pair is stored. Rows past count / n_rows are dropped.
__device__ __forceinline__ void store_warp_tile(const MmProblem& p, FragC (&acc)[2][2], float* stage, int wm,
                                                int wn, int lane, int64_t m0, int64_t n0, int64_t begin,
                                                int64_t count) {
  const bool gate_up = p.mode == MmMode::kGateUp;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (gate_up && j == 1) continue;  // fragment j = 1 (up) went into j = 0
      if (gate_up) {
        FragC h;
#pragma unroll
        for (int e = 0; e < h.num_elements; ++e) h.x[e] = silu(acc[i][0].x[e]) * acc[i][1].x[e];
        wmma::store_matrix_sync(stage, h, 16, wmma::mem_row_major);
      } else {
        wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
      }
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int m = 32 * wm + 16 * i + (e >> 4);
        const int64_t n = n0 + 16 * wn + 64 * j + (e & 15);
        if (m >= count || n >= p.n_rows) continue;
        const int64_t out_row = p.mode == MmMode::kDense ? m0 + m : p.pairs[begin + m];
        p.y[out_row * p.y_stride + n] = stage[e];
      }
      __syncwarp();
    }
  }
}

template <class Q>
using OpOf = std::conditional_t<Q::kType == DType::BF16, __nv_bfloat16, __half>;

template <class Q>
__global__ void __launch_bounds__(kThreads) gemm_kernel(const MmProblem p) {
  using Op = OpOf<Q>;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Op, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, Op, wmma::col_major>;
  __shared__ __align__(128) Tiles<Op> sm;

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const bool gate_up = p.mode == MmMode::kGateUp;
  // Rows of the tile: tokens m0.. (dense) or pairs begin.. of one expert.
  int64_t m0 = 0, begin = 0, expert = 0, count = 0;
  const int64_t n0 = int64_t(blockIdx.y) * (gate_up ? kBN / 2 : kBN);
  if (p.mode == MmMode::kDense) {
    m0 = int64_t(blockIdx.x) * kBM;
    count = min(int64_t(kBM), p.n_tokens - m0);
  } else {
    const Slot s = find_slot(p.offsets, p.n_expert, kBM, blockIdx.x, lane);
    if (s.count == 0) return;  // the same answer in every warp: the whole block leaves
    begin = s.begin, expert = s.expert, count = s.count;
  }

  // This thread's weight row (tile row rb, run k2 of each K step).
  const int rb = tid >> 1, k2 = tid & 1;
  const uint8_t* wrow;
  {
    const uint8_t* w = p.w0 + expert * p.matrix_stride;
    int64_t row = n0 + rb;
    if (gate_up) {
      row = n0 + (rb & (kBN / 2 - 1));
      if (rb >= kBN / 2) w = p.w1 + expert * p.matrix_stride;
    }
    wrow = w + min(row, p.n_rows - 1) * p.row_bytes;  // rows past the end: computed, never stored
  }
  // This thread's activation row (tile row ra, 8 columns c8 of each K step).
  const int ra = tid >> 2, c8 = tid & 3;
  const float* xrow = nullptr;
  if (ra < count) {
    xrow = p.mode == MmMode::kDense ? p.x + (m0 + ra) * p.x_stride
                                    : p.x + (p.pairs[begin + ra] / p.x_row_div) * p.x_stride;
  }

  const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows 32wm.., weight rows 16wn + 64j
  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }

  const int64_t n_steps = (p.n_cols + kBK - 1) / kBK;
  StepRegs<Q, Op> regs;
  auto load_step = [&](int64_t s) { regs.load(wrow, xrow, s * kBK + 16 * k2, s * kBK + 8 * c8, p.n_cols); };
  auto store_step = [&](int buf) {
    *reinterpret_cast<uint4*>(&sm.b[buf][rb][16 * k2]) = regs.b[0];
    *reinterpret_cast<uint4*>(&sm.b[buf][rb][16 * k2 + 8]) = regs.b[1];
    *reinterpret_cast<uint4*>(&sm.a[buf][ra][8 * c8]) = regs.a;
  };
  load_step(0);
  store_step(0);
  __syncthreads();
  for (int64_t s = 0; s < n_steps; ++s) {
    const int cur = static_cast<int>(s & 1);
    if (s + 1 < n_steps) load_step(s + 1);  // global loads in flight during the products
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      FragA fa[2];
      FragB fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sm.a[cur][32 * wm + 16 * i][kk], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sm.b[cur][16 * wn + 64 * j][kk], kLd);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    // Buffer cur^1 was last read in step s-1, before the barrier that ended it.
    if (s + 1 < n_steps) store_step(cur ^ 1);
    __syncthreads();
  }

  store_warp_tile(p, acc, sm.c[warp], wm, wn, lane, m0, n0, begin, count);
}

template <DType T>
Status launch_type(const MmProblem& p, cudaStream_t stream) {
  dim3 grid;
  if (p.mode == MmMode::kDense) {
    grid.x = static_cast<unsigned>((p.n_tokens + kBM - 1) / kBM);
    grid.y = static_cast<unsigned>((p.n_rows + kBN - 1) / kBN);
  } else {
    // Tiles of kBM pairs per expert: at most n_pairs / kBM full ones plus
    // one partial per non-empty expert; blocks past the real count exit.
    grid.x = static_cast<unsigned>(p.n_pairs / kBM + std::min(p.n_expert, p.n_pairs) + 1);
    const int64_t rows_per_tile = p.mode == MmMode::kGateUp ? kBN / 2 : kBN;
    grid.y = static_cast<unsigned>((p.n_rows + rows_per_tile - 1) / rows_per_tile);
  }
  if (grid.y > 65535) return make_error(StatusCode::kInvalidArgument, "gemm: {} rows is too many", p.n_rows);
  gemm_kernel<qdec::Traits<T>><<<grid, kThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "gemm ({}): launch failed: {}", dtype_name(T), cudaGetErrorString(err));
  }
  return Status::ok();
}

}  // namespace

Status launch_gemm(const MmProblem& p, cudaStream_t stream) {
  switch (p.type) {
    case DType::F32: return launch_type<DType::F32>(p, stream);
    case DType::F16: return launch_type<DType::F16>(p, stream);
    case DType::BF16: return launch_type<DType::BF16>(p, stream);
    case DType::Q8_0: return launch_type<DType::Q8_0>(p, stream);
    case DType::Q4_0: return launch_type<DType::Q4_0>(p, stream);
    case DType::Q4_K: return launch_type<DType::Q4_K>(p, stream);
    case DType::Q5_K: return launch_type<DType::Q5_K>(p, stream);
    case DType::Q6_K: return launch_type<DType::Q6_K>(p, stream);
    default: break;
  }
  return make_error(StatusCode::kUnsupported, "gemm: weight type {} is not supported", dtype_name(p.type));
}

}  // namespace detail

namespace {

Status check_dense(const char* what, const MatmulArgs& a) {
  MOESERVE_RETURN_IF_ERROR(detail::check_weights(what, a.w_type, a.w, a.n_rows, a.n_cols, a.row_bytes));
  // A single row's stride is never used.
  MOESERVE_RETURN_IF_ERROR(detail::check_activations(what, a.x, a.n_tokens > 1 ? a.x_stride : a.n_cols, a.n_cols));
  if (a.y == nullptr || (a.n_tokens > 1 && a.y_stride < a.n_rows)) {
    return make_error(StatusCode::kInvalidArgument, "{}: null y or y_stride {} < n_rows {}", what, a.y_stride,
                      a.n_rows);
  }
  return Status::ok();
}

detail::MmProblem dense_problem(const MatmulArgs& a) {
  detail::MmProblem p;
  p.mode = detail::MmMode::kDense, p.type = a.w_type;
  p.w0 = static_cast<const uint8_t*>(a.w), p.row_bytes = a.row_bytes;
  p.n_rows = a.n_rows, p.n_cols = a.n_cols;
  p.x = a.x, p.x_stride = a.x_stride, p.y = a.y, p.y_stride = a.y_stride, p.n_tokens = a.n_tokens;
  return p;
}

}  // namespace

Status matvec(const MatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1 || a.n_tokens > kMatvecMaxTokens) {
    return make_error(StatusCode::kInvalidArgument, "matvec: n_tokens {} outside 1..{}", a.n_tokens,
                      kMatvecMaxTokens);
  }
  MOESERVE_RETURN_IF_ERROR(check_dense("matvec", a));
  return detail::launch_matvec(dense_problem(a), stream);
}

Status gemm(const MatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1) return make_error(StatusCode::kInvalidArgument, "gemm: n_tokens {} < 1", a.n_tokens);
  MOESERVE_RETURN_IF_ERROR(check_dense("gemm", a));
  return detail::launch_gemm(dense_problem(a), stream);
}

Status matmul(const MatmulArgs& a, cudaStream_t stream) {
  return a.n_tokens <= kMatvecMaxTokens ? matvec(a, stream) : gemm(a, stream);
}

}  // namespace moeserve::cuda
