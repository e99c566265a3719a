// Matrix products on tensor cores for prefill (any number of tokens) and the
// grouped expert products of a prefill batch.
//
// A block computes a 64 (tokens or pairs) x 128 (weight rows) tile of the
// output, K in steps of 32: each thread decodes one 16-element run of one
// weight row (quant_decode.cuh, straight from the blocks in global memory)
// into f16 (bf16 when the weights are BF16) and turns 8 floats of one
// activation row into 1 to 3 f16 (bf16) terms, by weight type; the tiles go
// to shared memory (two buffers, the next step's loads and decode
// overlapping this step's matrix products), and 8 warps multiply them with
// WMMA (16x16x16, f32 accumulation, portable sm_80..sm_120), one product per
// weight fragment and activation term: the weights are decoded once, only
// the MMA count grows.
//
// Terms per weight type, and what each leaves (errors: relative_error of the
// tests, RMS over a product's outputs, against a double reference on the
// dequantized weights, random normal data, measured on an H100):
//   BF16: 3 bf16 terms, x = hi + mid + lo exactly, each term the top 8
//     significant bits of what is left (truncation: 3 x 8 bits hold the
//     24-bit f32 significand), over f32's whole range. The weights are
//     exact bf16 operands: only the accumulation's error is left, <= 1.5e-7
//     (<= 1.9e-7 through SwiGLU). Not f16 operands: f16 holds a bf16 value
//     only between 2^-17 and 65504, and a tile would need a per-step check
//     and a fallback.
//   F16: 2 f16 terms, x = hi + lo + r, hi = f16(x), lo = f16(x - hi) (the
//     difference exact in f32), |r| <= 2^-24 |x| within f16's range
//     (|x| < 65504; below |x| ~ 0.25 lo is subnormal: |r| <= 2^-25
//     absolute). Exact f16 weights: as BF16, <= 1.4e-7 (1.7e-7 SwiGLU).
//   F32 and the quantized types (Q8_0, Q4_0, and Q2_K..Q6_K, IQ4_XS when the
//     integer kernel is off, and Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, IQ2_XXS,
//     IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): 1 f16
//     term, x rounded to f16 once.
//     The weight is rounded to f16 as well (a dequantized value, code *
//     d*sc - dmin*m, has up to ~21 significant bits, an F32 weight 24), so
//     each product carries two f16 roundings (<= 2^-11 relative each, at
//     most 2^-10 together; |x| < 65504, below 2^-14 absolute 2^-25) whatever
//     x's precision: more terms would remove one of the two, for a second
//     MMA per fragment and two blocks an SM instead of three (measured
//     2.6e-4 .. 4.2e-4 -> 1.6e-4 .. 3.0e-4 for 16 .. 43% of the speed). Error
//     about 3e-4 (measured 2.6e-4 .. 3.6e-4; 3.7e-4 .. 4.3e-4 through
//     SwiGLU, whose output carries both the gate's and the up's error).
//     (Weights must lie within f16's range: MXFP4's 2^(e - 128) scale could
//     in principle leave it, trained weights do not come near.)
// Products of the operand terms are exact in the f32 accumulators.
// Accumulation: with several terms, a K step's (32 columns x terms) products
// go into a fresh fragment, smallest terms first, then that sum is added to
// the running f32 total with a rounded f32 add. The tensor cores' own adds
// truncate: summing everything straight into the total measured 1.8e-6
// relative error at K = 528 on an H100, this 1.4e-7, for 32 more registers
// (two blocks an SM instead of three). With one term the products go
// straight into the total: 1.8e-6 is lost in the f16 roundings' 3e-4, and
// the kernel fits three blocks an SM again (80 registers; gemm_kernel).
//
// For the fused gate/up product the 128 weight rows of a tile are 64 gate
// rows and the same 64 up rows, arranged so that a warp's two accumulator
// fragments hold gate and up of the same outputs: SwiGLU is applied to the
// fragments before they are stored.
//
// Each output element is one K-ordered chain of tensor-core products (and
// f32 adds) that involves only its own activation row, so a token's (pair's)
// result does not depend on the other rows of its tile or batch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
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

// Operand type and number of activation terms of a weight type (see the
// header).
template <class Q>
using OpOf = std::conditional_t<Q::kType == DType::BF16, __nv_bfloat16, __half>;
template <class Q>
inline constexpr int kTermsOf = Q::kType == DType::BF16  ? 3
                                : Q::kType == DType::F16 ? 2
                                                         : 1;

// Shared memory (dynamic): the double-buffered tiles, term 0 the largest;
// after the last K step the same bytes stage the output fragments.
template <class Q>
struct Tiles {
  OpOf<Q> a[2][kTermsOf<Q>][kBM][kLd];
  OpOf<Q> b[2][kBN][kLd];
};
constexpr size_t kStageBytes = sizeof(float) * (kThreads / 32) * 16 * 16;  // per warp: one fragment
template <class Q>
constexpr size_t smem_bytes() {
  return std::max(sizeof(Tiles<Q>), kStageBytes);
}

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
  return make_uint4(
      pack2(v[0], v[1], static_cast<Op*>(nullptr)), pack2(v[2], v[3], static_cast<Op*>(nullptr)),
      pack2(v[4], v[5], static_cast<Op*>(nullptr)), pack2(v[6], v[7], static_cast<Op*>(nullptr)));
}

// 8 activations as one f16 term: x rounded to f16 once.
__device__ __forceinline__ void split8(const float* x, uint4 (&t)[1]) { t[0] = pack8<__half>(x); }

// 8 activations as the f16 terms hi, lo (see the header): t[0] = hi, t[1] = lo.
__device__ __forceinline__ void split8(const float* x, uint4 (&t)[2]) {
  uint32_t hi[4], lo[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const __half2 h = __floats2half2_rn(x[2 * q], x[2 * q + 1]);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x[2 * q] - hf.x, x[2 * q + 1] - hf.y);  // the differences are exact
    hi[q] = *reinterpret_cast<const uint32_t*>(&h);
    lo[q] = *reinterpret_cast<const uint32_t*>(&l);
  }
  t[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  t[1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

// 8 activations as the bf16 terms hi, mid, lo with x = hi + mid + lo exactly:
// each term is what is left truncated to bf16 (its top 16 bits), and the
// last remainder has at most 8 significant bits, so it is a bf16 value.
__device__ __forceinline__ void split8(const float* x, uint4 (&t)[3]) {
  uint32_t w[3][4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t b[2][3];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float v = x[2 * q + h];
      const uint32_t b0 = __float_as_uint(v) & 0xFFFF0000u;
      const float r1 = v - __uint_as_float(b0);  // exact
      const uint32_t b1 = __float_as_uint(r1) & 0xFFFF0000u;
      const float r2 = r1 - __uint_as_float(b1);  // exact, and a bf16 value
      b[h][0] = b0, b[h][1] = b1, b[h][2] = __float_as_uint(r2);
    }
    // The top halves of the two words: element 2q low, 2q + 1 high.
#pragma unroll
    for (int k = 0; k < 3; ++k) w[k][q] = __byte_perm(b[0][k], b[1][k], 0x7632);
  }
#pragma unroll
  for (int k = 0; k < 3; ++k) t[k] = make_uint4(w[k][0], w[k][1], w[k][2], w[k][3]);
}

// One thread's share of a K step: a 16-element weight run and the terms of
// 8 activations.
template <class Q>
struct StepRegs {
  using Op = OpOf<Q>;
  uint4 b[2];
  uint4 a[kTermsOf<Q>];

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
      xv[0] = lo.x, xv[1] = lo.y, xv[2] = lo.z, xv[3] = lo.w, xv[4] = hi.x, xv[5] = hi.y, xv[6] = hi.z,
      xv[7] = hi.w;
    }
    split8(xv, a);
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

// kMinBlocks: blocks an SM (the register budget). Several terms: 2 (the
// running total beside the K step's sum and the terms need up to 128
// registers; no spills on sm_90a, 8-24 bytes for BF16 elsewhere). One term:
// built twice, for 3 blocks an SM (80 registers: no spills on sm_86..sm_120,
// 8 bytes for Q8_0/Q4_0/Q6_K on sm_80) and for 2 (about 105, more loads in
// flight: faster when at most two blocks an SM have work anyway);
// launch_type picks by grid size. The two builds are the same PTX but for
// .minnctapersm, with the same floating-point instructions in the SASS, so
// a token's row has the same bits whichever runs (checked on an H100 for
// every type: 40 tokens alone, 132 blocks, and within 200, 528 blocks).
template <class Q, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gemm_kernel(const MmProblem p) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  using Op = OpOf<Q>;
  constexpr int kTerms = kTermsOf<Q>;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Op, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, Op, wmma::col_major>;
  extern __shared__ __align__(128) uint4 gemm_smem[];  // (as bytes, ptxas spilled at 80 registers)
  Tiles<Q>& sm = *reinterpret_cast<Tiles<Q>*>(gemm_smem);

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
  StepRegs<Q> regs;
  auto load_step = [&](int64_t s) { regs.load(wrow, xrow, s * kBK + 16 * k2, s * kBK + 8 * c8, p.n_cols); };
  auto store_step = [&](int buf) {
    *reinterpret_cast<uint4*>(&sm.b[buf][rb][16 * k2]) = regs.b[0];
    *reinterpret_cast<uint4*>(&sm.b[buf][rb][16 * k2 + 8]) = regs.b[1];
    if constexpr (kTerms == 1) {  // (the loop form of this spills F32 at 80 registers on sm_90a)
      *reinterpret_cast<uint4*>(&sm.a[buf][0][ra][8 * c8]) = regs.a[0];
    } else {
#pragma unroll
      for (int t = 0; t < kTerms; ++t) *reinterpret_cast<uint4*>(&sm.a[buf][t][ra][8 * c8]) = regs.a[t];
    }
  };
  load_step(0);
  store_step(0);
  __syncthreads();
  for (int64_t s = 0; s < n_steps; ++s) {
    const int cur = static_cast<int>(s & 1);
    if (s + 1 < n_steps) load_step(s + 1);  // global loads in flight during the products
    // This step's products into c, the smallest terms first.
    auto products = [&](FragC(&c)[2][2]) {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        FragB fb[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sm.b[cur][16 * wn + 64 * j][kk], kLd);
#pragma unroll
        for (int t = kTerms - 1; t >= 0; --t) {
          FragA fa[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sm.a[cur][t][32 * wm + 16 * i][kk], kLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], fa[i], fb[j], c[i][j]);
          }
        }
      }
    };
    if constexpr (kTerms == 1) {
      products(acc);  // straight into the total (see the header)
    } else {
      FragC part[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(part[i][j], 0.0f);
      }
      products(part);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < acc[i][j].num_elements; ++e) acc[i][j].x[e] += part[i][j].x[e];
        }
      }
    }
    // Buffer cur^1 was last read in step s-1, before the barrier that ended it.
    if (s + 1 < n_steps) store_step(cur ^ 1);
    __syncthreads();
  }

  // The tiles are dead (the loop ended on a barrier): their bytes stage the output.
  store_warp_tile(p, acc, reinterpret_cast<float*>(gemm_smem) + warp * 256, wm, wn, lane, m0, n0, begin,
                  count);
}

// Per-device state, set once: the SM count (0 until known) and whether a
// kernel's shared memory opt-in is done.
constexpr int kMaxDevices = 64;

int sm_count() {
  static std::atomic<int> counts[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  int n = counts[dev].load(std::memory_order_relaxed);
  if (n == 0 && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) {
    counts[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Shared memory past the 48 KB default needs an opt-in, once per device.
template <class Q, int kMinBlocks>
Status allow_smem() {
  constexpr size_t bytes = smem_bytes<Q>();
  if constexpr (bytes <= 48 * 1024) {
    return Status::ok();
  } else {
    static std::atomic<bool> done[kMaxDevices];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess && dev >= 0 && dev < kMaxDevices && done[dev].load(std::memory_order_acquire)) {
      return Status::ok();
    }
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(gemm_kernel<Q, kMinBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(bytes));
    }
    if (err != cudaSuccess) {
      return make_error(StatusCode::kInternal, "gemm ({}): {} bytes of shared memory: {}",
                        dtype_name(Q::kType), bytes, cudaGetErrorString(err));
    }
    if (dev >= 0 && dev < kMaxDevices) done[dev].store(true, std::memory_order_release);
    return Status::ok();
  }
}

template <class Q, int kMinBlocks>
Status launch_kernel(const MmProblem& p, dim3 grid, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR((allow_smem<Q, kMinBlocks>()));
  detail::launch(gemm_kernel<Q, kMinBlocks>, grid, kThreads, smem_bytes<Q>(), stream, p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "gemm ({}): launch failed: {}", dtype_name(Q::kType),
                      cudaGetErrorString(err));
  }
  return Status::ok();
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
  using Q = qdec::Traits<T>;
  if constexpr (kTermsOf<Q> == 1) {
    // The 2-block build where a dense grid fits in one wave of two blocks an
    // SM (e.g. 512 tokens x 4096 rows on 132 SMs: 123.9 TFLOP/s against
    // 110.7 on an H100); otherwise (more blocks, and the grouped products,
    // whose grid is only an upper bound) the 3-block one (512 x 2048 ->
    // 6144: 121.2 against 112.1, one wave of three against two of two).
    const int64_t blocks = int64_t(grid.x) * grid.y;
    if (p.mode == MmMode::kDense && blocks <= 2 * int64_t(sm_count()))
      return launch_kernel<Q, 2>(p, grid, stream);
    return launch_kernel<Q, 3>(p, grid, stream);
  } else {
    return launch_kernel<Q, 2>(p, grid, stream);
  }
}

}  // namespace

Status launch_gemm(const MmProblem& p, cudaStream_t stream) {
  if (gemm_kq_type(p.type)) return launch_gemm_kq(p, stream);
  switch (p.type) {
    case DType::F32:
      return launch_type<DType::F32>(p, stream);
    case DType::F16:
      return launch_type<DType::F16>(p, stream);
    case DType::BF16:
      return launch_type<DType::BF16>(p, stream);
    case DType::Q8_0:
      return launch_type<DType::Q8_0>(p, stream);
    case DType::Q4_0:
      return launch_type<DType::Q4_0>(p, stream);
    case DType::Q4_K:
      return launch_type<DType::Q4_K>(p, stream);
    case DType::Q5_K:
      return launch_type<DType::Q5_K>(p, stream);
    case DType::Q6_K:
      return launch_type<DType::Q6_K>(p, stream);
    case DType::Q4_1:
      return launch_type<DType::Q4_1>(p, stream);
    case DType::Q5_0:
      return launch_type<DType::Q5_0>(p, stream);
    case DType::Q5_1:
      return launch_type<DType::Q5_1>(p, stream);
    case DType::IQ4_NL:
      return launch_type<DType::IQ4_NL>(p, stream);
    case DType::IQ4_XS:
      return launch_type<DType::IQ4_XS>(p, stream);
    case DType::MXFP4:
      return launch_type<DType::MXFP4>(p, stream);
    case DType::Q2_K:
      return launch_type<DType::Q2_K>(p, stream);
    case DType::Q3_K:
      return launch_type<DType::Q3_K>(p, stream);
    case DType::IQ2_XXS:
      return launch_type<DType::IQ2_XXS>(p, stream);
    case DType::IQ2_XS:
      return launch_type<DType::IQ2_XS>(p, stream);
    case DType::IQ2_S:
      return launch_type<DType::IQ2_S>(p, stream);
    case DType::IQ3_XXS:
      return launch_type<DType::IQ3_XXS>(p, stream);
    case DType::IQ3_S:
      return launch_type<DType::IQ3_S>(p, stream);
    case DType::IQ1_S:
      return launch_type<DType::IQ1_S>(p, stream);
    case DType::IQ1_M:
      return launch_type<DType::IQ1_M>(p, stream);
    default:
      break;
  }
  return make_error(StatusCode::kUnsupported, "gemm: weight type {} is not supported", dtype_name(p.type));
}

}  // namespace detail

namespace {

Status check_dense(const char* what, const MatmulArgs& a) {
  MOESERVE_RETURN_IF_ERROR(detail::check_weights(what, a.w_type, a.w, a.n_rows, a.n_cols, a.row_bytes));
  // A single row's stride is never used.
  MOESERVE_RETURN_IF_ERROR(
      detail::check_activations(what, a.x, a.n_tokens > 1 ? a.x_stride : a.n_cols, a.n_cols));
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
  p.scratch = a.scratch, p.scratch_bytes = a.scratch_bytes;
  return p;
}

}  // namespace

size_t gemm_scratch_bytes(DType w_type, int64_t n_rows, int64_t n_cols) {
  return detail::gemm_kq_type(w_type) ? detail::gemm_kq_scratch_bytes(n_rows, n_cols) : 0;
}

size_t gemm_scratch_bytes(const MatmulArgs& a) {
  if (!detail::gemm_kq_type(a.w_type)) return 0;
  return detail::gemm_kq_scratch_bytes(a.n_tokens, a.n_cols) +
         detail::gemm_kq_split_bytes(a.n_tokens, a.n_rows, a.n_cols);
}

Status matvec(const MatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1 || a.n_tokens > kMatvecMaxTokens) {
    return make_error(StatusCode::kInvalidArgument, "matvec: n_tokens {} outside 1..{}", a.n_tokens,
                      kMatvecMaxTokens);
  }
  MOESERVE_RETURN_IF_ERROR(check_dense("matvec", a));
  return detail::launch_matvec(dense_problem(a), stream);
}

Status matvec_rows(const MatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1)
    return make_error(StatusCode::kInvalidArgument, "matvec_rows: n_tokens {} < 1", a.n_tokens);
  MOESERVE_RETURN_IF_ERROR(check_dense("matvec_rows", a));
  // F32: every chunk of 16 tokens in one launch (the kernel's grid has a
  // token-chunk axis); the other types one matvec() launch per chunk.
  if (a.w_type == DType::F32) return detail::launch_matvec(dense_problem(a), stream);
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kMatvecMaxTokens) {
    MatmulArgs chunk = a;
    chunk.x = a.x + t0 * a.x_stride;
    chunk.y = a.y + t0 * a.y_stride;
    chunk.n_tokens = std::min(kMatvecMaxTokens, a.n_tokens - t0);
    MOESERVE_RETURN_IF_ERROR(detail::launch_matvec(dense_problem(chunk), stream));
  }
  return Status::ok();
}

Status gemm(const MatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1) return make_error(StatusCode::kInvalidArgument, "gemm: n_tokens {} < 1", a.n_tokens);
  MOESERVE_RETURN_IF_ERROR(check_dense("gemm", a));
  return detail::launch_gemm(dense_problem(a), stream);
}

bool integer_dense_decode(DType w_type, int64_t n_rows, int64_t n_cols) {
  static const bool exact = [] {
    const char* v = std::getenv("MOESERVE_CUDA_DENSE_DECODE");
    return v != nullptr && std::string(v) == "exact";
  }();
  return !exact && detail::gemm_kq_matches_cpu(w_type) && n_rows * n_cols >= kIntegerDecodeMinWeights;
}

Status matmul(const MatmulArgs& a, cudaStream_t stream) {
  const bool small = a.n_tokens <= kMatvecMaxTokens && !integer_dense_decode(a.w_type, a.n_rows, a.n_cols);
  return small ? matvec(a, stream) : gemm(a, stream);
}

}  // namespace moeserve::cuda
