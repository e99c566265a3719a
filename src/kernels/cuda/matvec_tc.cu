// Matrix x vector products of the quantized weight types (Q8_0, Q4_0, Q4_K,
// Q5_K, Q6_K) on tensor cores with exact f32 activations: matvec_multi
// (several matrices sharing one input, e.g. q/k/v, one launch) and the
// grouped expert products of a decode step for Q8_0/Q4_0 (launch_matvec
// hands them over; K-quant experts go to gemm_kq.cu's integer kernel unless
// MOESERVE_CUDA_EXPERT_DECODE=tc). Dense matvec() stays on the CUDA-core
// kernel of matvec.cu, which measured faster for one product at one token.
//
// Why tensor cores: the CUDA-core kernel pays an FMA (plus activation loads)
// per weight and token, so an expert product at 8 tokens ran 8x the work of
// one token although each expert of a decode batch serves 1-2 of them. Here
// a weight's integer code goes into a bf16 MMA operand exactly
// (tc_decode.cuh) and the activations enter as three bf16 terms whose sum is
// the f32 value, so the 16 x 8 products are exact and only the accumulation
// rounds: the work per weight hardly depends on the token count (1..8 tokens
// one N tile, 9..16 two).
// Numerics: each scale group's (32 columns, Q6_K 16) MMA sums start from
// zero, smallest activation terms first, and are scaled and added to an f32
// total with ordinary rounded FMAs: ~1e-7 relative error against f64
// (measured on an H100, 1.0e-7 .. 3.5e-7 over the test shapes), the bound
// of matvec (1e-5) holds.
//
// Work: a CTA owns Wr tiles of 16 weight rows (kGateUp: 8 gate rows and the
// same 8 up rows, so that an MMA thread holds gate and up of one output) and
// the tokens (pairs of one expert) of its slot, at most 16: one or two MMA
// N tiles of 8 (columns past the count repeat the last token, never stored);
// a dense product's tokens go in groups (tc_dense_token_group(), 8), each
// group a row of CTAs of its own (grid.y).
// Its Wr x Wk warps go through the row in chunks of 256 columns: warp (r, k)
// takes chunks k, k + Wk, ... of tile r. Per round (Wk chunks):
//  - each warp's chunk of its 16 rows was copied to shared memory with 16-byte
//    cp.async one round ahead (two lanes a row);
//  - all threads split the round's activations into bf16 terms in the MMA B
//    fragment order (and, for Q4_K/Q5_K, the 32-column sums of x the mins
//    need) in shared memory, once per CTA;
//  - each warp decodes its staged rows' scales into a table, then runs 16 K
//    steps of 3 MMAs (per N tile), flushing each scale group into f32;
//  - the chunk sums go to shared memory and owner threads add them to the
//    outputs' totals in chunk order.
// Every output is (sum over chunks in order) of (sum over scale groups in
// order) of fresh MMA sums, each involving only its own token's activations:
// the order is fixed by the type and n_cols alone, so a token's result is
// bit-identical whatever the batch, the tile shape (Wr, Wk), its column
// within the MMA, or the other matrices of a matvec_multi call.
//
// Measured (H100, matvec_bench decode: graph replays, weights rotated past
// the L2; device copy 2.43 TB/s), 1 / 8 / 16 tokens:
//   experts 8 of 128, gate_up 2048->768 Q4_K + down 768->2048 Q6_K:
//     35.9 / 443 / 1174 us before (CUDA cores), 32.9 / 277 / 804 us here;
//   q+k+v 2048->4096+512+512 Q4_K, one matvec_multi: 9.1 / 18.9 / 50.0 us
//     against 12.9 / 31.3 / 68.7 us for three matvec() calls;
//   one dense product: q 2048->4096 Q4_K 7.5 us (matvec 5.6), LM head
//     2048->151936 Q6_K 189 us (matvec 141), 8 tokens 402 us (422).
// What holds it back (ncu): it is latency-bound, not bandwidth- or
// issue-bound (q, 1 token: 2.4M warp instructions, as the CUDA-core kernel,
// DRAM 14% of peak): each CTA loads, splits x, syncs, runs a dependent
// chain of 48 MMAs per warp, syncs and reduces, at 3 CTAs an SM (80
// registers). Next steps: split x once per launch (or in the kernel that
// writes x) instead of once per CTA, independent MMA chains per term, and a
// persistent multi-stage pipeline across row tiles for long matrices.
// Tried and dropped (2026-11-25, H100, 30b-a3b shapes at one token): a
// CUDA-core kernel with one warp a row reading blocks straight from global
// memory (gate_up 21.8 us, down 17.4, against 19.9 / 14.1 here; ncu: L1 77%
// busy with the per-lane f32 activation loads, DRAM 19%), and the same with
// 8 lanes a row so that x loads serve 4-8 rows (24.1 us, still L1-bound);
// neither a route-written expert table instead of the offsets search nor
// L2 prefetches of the rows changed the time. The weight stream needs more
// bytes in flight per SM than either gets (TMA bulk copies into a
// multi-stage pipeline are the candidate).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_detail.h"
#include "kernels/cuda/matvec_tc.h"
#include "kernels/cuda/tc_decode.cuh"
#include "kernels/cuda/tc_stage.cuh"

namespace moeserve::cuda {
namespace detail {
namespace {

using tcdec::kChunkCols;
using tcdec::kSteps;

constexpr int kMaxMats = 4;  // matrices of one multi launch
constexpr int kMaxThreads = 256;
constexpr int kMaxOwn = 8;      // outputs a thread totals
constexpr int kTblStride = 18;  // floats a row of the scale table (conflict-free pairs)
constexpr int kBLane = 24;      // bytes of one lane's B operand of a step: 3 terms x 2 words

struct TcMat {
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  int64_t n_rows = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  int64_t tile0 = 0;  // dense: its first CTA
};

struct TcProblem {
  MmMode mode = MmMode::kDense;
  int n_mats = 1;
  TcMat mat[kMaxMats];
  const uint8_t* w1 = nullptr;  // kGateUp: up matrices
  size_t matrix_stride = 0;
  int64_t n_cols = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int64_t n_tokens = 0;
  const int32_t* pairs = nullptr;
  const int32_t* offsets = nullptr;
  int64_t n_expert = 0, x_row_div = 1;
  int token_group = 16;  // dense: tokens a CTA (grid.y: the groups)
  // Geometry (host-chosen).
  int wk = 1, wr = 1;
  int slots = 1;       // token slots of an N tile (<= 8)
  int pair_chunk = 8;  // grouped: pairs per slot
  int rounds = 1, stages = 1;
  int64_t n_chunks = 0;
  int rs = 0;         // bytes of a staged row
  int log2_rows = 4;  // log2(rows of a CTA: wr * (kGateUp ? 8 : 16))
  int tile_b = 0;     // bytes of one (chunk, N tile) B area
  int red_t = 0;      // token stride of the chunk sums
  int off_b = 0, off_x = 0, off_tbl = 0, off_red = 0;
};

// c = A B (a fresh sum) and c += A B.
__device__ __forceinline__ void mma_first(float (&c)[4], const uint32_t (&a)[4], uint2 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "f"(0.0f));
}
__device__ __forceinline__ void mma_add(float (&c)[4], const uint32_t (&a)[4], uint2 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// One warp's MMAs over a staged chunk of n_steps (kFull: all 16) K steps:
// rows g and g + 8 at rg and rg8, their scale table rows at t0 and t8, each N
// tile's B operand (this lane's, step 0) at bp[nt] (steps q_stride apart) and
// its 32-column x sums (tokens 2j, 2j + 1, group 0) at xs[nt].
// acc[nt][0..3]: (row g, token 2j), (g, 2j + 1), (g + 8, 2j), (g + 8, 2j + 1).
template <DType T, int NTILES, bool kFull>
__device__ __forceinline__ void chunk_mma(const uint8_t* rg, const uint8_t* rg8, const float* t0,
                                          const float* t8, const uint8_t* const (&bp)[NTILES],
                                          const float* const (&xs)[NTILES], int q_stride, int ntiles,
                                          int n_steps, int j, float (&acc)[NTILES][4]) {
  using Q = tcdec::Tc<T>;
  float c[NTILES][4];
#pragma unroll
  for (int q = 0; q < kSteps; ++q) {
    if (!kFull && q >= n_steps) break;
    uint32_t pa[2], pb[2];
    Q::step(rg, q, j, pa);
    Q::step(rg8, q, j, pb);
    const uint32_t a[4] = {pa[0], pb[0], pa[1], pb[1]};
    const bool first = Q::kStepScale || (q & 1) == 0;
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
      if (NTILES == 1 || nt < ntiles) {
        const uint8_t* b = bp[nt] + q * q_stride;
        const uint2 b0 = *reinterpret_cast<const uint2*>(b);
        const uint2 b1 = *reinterpret_cast<const uint2*>(b + 8);
        const uint2 b2 = *reinterpret_cast<const uint2*>(b + 16);
        // Smallest terms first.
        if (first) {
          mma_first(c[nt], a, b2);
        } else {
          mma_add(c[nt], a, b2);
        }
        mma_add(c[nt], a, b1);
        mma_add(c[nt], a, b0);
      }
    }
    if (Q::kStepScale || (q & 1) == 1) {
      float s0, m0, s1, m1;
      tcdec::step_scale<T>(t0, q, &s0, &m0);
      tcdec::step_scale<T>(t8, q, &s1, &m1);
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) {
        if (NTILES == 1 || nt < ntiles) {
          acc[nt][0] = fmaf(c[nt][0], s0, acc[nt][0]);
          acc[nt][1] = fmaf(c[nt][1], s0, acc[nt][1]);
          acc[nt][2] = fmaf(c[nt][2], s1, acc[nt][2]);
          acc[nt][3] = fmaf(c[nt][3], s1, acc[nt][3]);
          if constexpr (Q::kMin) {
            const float2 xm = *reinterpret_cast<const float2*>(xs[nt] + (q >> 1) * 8);
            acc[nt][0] = fmaf(-m0, xm.x, acc[nt][0]);
            acc[nt][1] = fmaf(-m0, xm.y, acc[nt][1]);
            acc[nt][2] = fmaf(-m1, xm.x, acc[nt][2]);
            acc[nt][3] = fmaf(-m1, xm.y, acc[nt][3]);
          }
        }
      }
    }
  }
}

template <DType T, int NTILES>
__global__ void __launch_bounds__(kMaxThreads, 3) tc_kernel(const TcProblem p) {
  // launch.cuh: grouped products wait before reading the routing groups;
  // dense ones first request their first chunk of weights.
  if (p.mode != MmMode::kDense) {
    grid_dependency_wait();
    allow_dependents();
  }
  using Q = tcdec::Tc<T>;
  constexpr int kRs = row_stage_bytes<T>();
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int nthreads = static_cast<int>(blockDim.x), nwarps = nthreads >> 5;
  const int wk = p.wk, wr = p.wr, kw = warp % wk, rw = warp / wk;
  const int g = lane >> 2, j = lane & 3;
  const bool gate_up = p.mode == MmMode::kGateUp;
  const int rows_per_tile = gate_up ? 8 : 16;

  // ---- this CTA: matrix, rows, tokens
  TcMat m = p.mat[0];
  int cnt;
  int64_t begin = 0, cta_first;
  const uint8_t* w_lo;
  const uint8_t* w_hi;
  if (p.mode == MmMode::kDense) {
#pragma unroll
    for (int i = 1; i < kMaxMats; ++i) {
      if (i < p.n_mats && int64_t(blockIdx.x) >= p.mat[i].tile0) m = p.mat[i];
    }
    begin = int64_t(blockIdx.y) * p.token_group;  // the group's first token
    cnt = static_cast<int>(min(int64_t(p.token_group), p.n_tokens - begin));
    cta_first = (int64_t(blockIdx.x) - m.tile0) * 16 * wr;
    w_lo = w_hi = m.w;
  } else {
    const Slot s = find_slot(p.offsets, p.n_expert, p.pair_chunk, blockIdx.x, lane);
    if (s.count == 0) return;  // the same answer in every warp
    cnt = s.count, begin = s.begin;
    cta_first = int64_t(blockIdx.y) * rows_per_tile * wr;
    w_lo = w_hi = m.w + s.expert * p.matrix_stride;
    if (gate_up) w_hi = p.w1 + s.expert * p.matrix_stride;
  }
  Rows rows;
  rows.lo = w_lo, rows.hi = w_hi, rows.n_rows = m.n_rows, rows.row_bytes = m.row_bytes,
  rows.pairwise = gate_up;
  rows.first = cta_first + int64_t(rw) * rows_per_tile;

  uint8_t* const bsm = smem + p.off_b;
  float* const xsm = reinterpret_cast<float*>(smem + p.off_x);
  float* const tbl = reinterpret_cast<float*>(smem + p.off_tbl) + warp * 16 * kTblStride;
  float* const red = reinterpret_cast<float*>(smem + p.off_red);
  const int64_t nb = p.n_cols / Q::kBlockElems;
  constexpr int kChunkBlocks = kChunkCols / Q::kBlockElems;
  auto chunk_bytes = [&](int64_t c) {
    return static_cast<int>(min(int64_t(kChunkBlocks), nb - c * kChunkBlocks)) * Q::kBlockBytes;
  };
  auto stage_of = [&](int round) {
    return smem + ((p.stages == 2 ? (round & 1) : 0) * nwarps + warp) * 16 * kRs;
  };

  // The row this lane copies (two lanes a row).
  const int cp_r = lane & 15, cp_half = lane >> 4;
  const uint8_t* const cp_row = rows.row(cp_r);
  const bool cp_last = rows.last(cp_r);
  // The rows this lane reads from a stage, and their leads.
  const uint8_t* const row_g = rows.row(g);
  const uint8_t* const row_g8 = rows.row(g + 8);

  // B lanes: token slot min(g, tokens of the tile - 1).
  const int ntiles = cnt > 8 ? 2 : 1;
  const int q_stride = p.slots * 4 * kBLane;
  const uint8_t* bp[NTILES];
  const float* xs[NTILES];
#pragma unroll
  for (int nt = 0; nt < NTILES; ++nt) {
    const int in_tile = max(1, min(8, cnt - 8 * nt));
    bp[nt] = bsm + (kw * NTILES + nt) * p.tile_b + (min(g, in_tile - 1) * 4 + j) * kBLane;
    xs[nt] = xsm + (kw * NTILES + nt) * 64 + 2 * j;
  }

  // Outputs this thread totals: row o_row of the CTA's R = wr * rows_per_tile,
  // tokens o_tok, o_tok + o_step, ...
  const int o_row = tid & ((wr * rows_per_tile) - 1), o_tok = tid >> p.log2_rows,
            o_step = nthreads >> p.log2_rows;
  const int o_tile = o_row / rows_per_tile, o_in = o_row % rows_per_tile;
  constexpr int kOwn = NTILES == 1 ? kMaxOwn / 2 : kMaxOwn;  // outputs a thread totals (<= 16 / 2 tokens)
  float tot[kOwn][2];
#pragma unroll
  for (int n = 0; n < kOwn; ++n) tot[n][0] = tot[n][1] = 0.0f;

  if (kw < p.n_chunks) {
    issue_row<T>(cp_row + kw * Q::kChunkBytes, cp_last, chunk_bytes(kw), stage_of(0) + cp_r * kRs, cp_half);
  }
  cp_async_commit();
  if (p.mode == MmMode::kDense) {
    grid_dependency_wait();
    allow_dependents();
  }
  for (int round = 0; round < p.rounds; ++round) {
    const int64_t c = int64_t(round) * wk + kw;
    if (round + 1 < p.rounds && c + wk < p.n_chunks) {
      issue_row<T>(cp_row + (c + wk) * Q::kChunkBytes, cp_last, chunk_bytes(c + wk),
                   stage_of(round + 1) + cp_r * kRs, cp_half);
    }
    cp_async_commit();

    // Activations of the round's chunks, token by token: unit u = 4 columns
    // (one lane's B operand of a step); 8 consecutive units = one 32-column
    // group, so its x sum is a fixed 8-lane tree.
    for (int slot = 0; slot < cnt; ++slot) {
      const int64_t xrow =
          p.mode == MmMode::kDense ? begin + slot : int64_t(__ldg(p.pairs + begin + slot)) / p.x_row_div;
      const float* const xr = p.x + xrow * p.x_stride;
      uint8_t* const bslot = bsm + (slot >> 3) * p.tile_b + (slot & 7) * 4 * kBLane;
      for (int u0 = warp * 32; u0 < wk * 64; u0 += nthreads) {
        const int u = u0 + lane;
        const int i8 = u & 7, grp = (u >> 3) & 7, kk = u >> 6;
        const int64_t col = (int64_t(round) * wk + kk) * kChunkCols + 32 * grp + 4 * i8;
        const bool ok = col < p.n_cols;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok) {
          v = __ldg(reinterpret_cast<const float4*>(xr + col));
          uint32_t lo[3], hi[3];
          tcdec::split_pair(v.x, v.y, lo);
          tcdec::split_pair(v.z, v.w, hi);
          uint8_t* dst =
              bslot + kk * NTILES * p.tile_b + (2 * grp + (i8 >> 2)) * q_stride + (i8 & 3) * kBLane;
          *reinterpret_cast<uint2*>(dst) = make_uint2(lo[0], hi[0]);
          *reinterpret_cast<uint2*>(dst + 8) = make_uint2(lo[1], hi[1]);
          *reinterpret_cast<uint2*>(dst + 16) = make_uint2(lo[2], hi[2]);
        }
        if constexpr (Q::kMin) {
          float s4 = (v.x + v.y) + (v.z + v.w);
          s4 += __shfl_xor_sync(kFull, s4, 1);
          s4 += __shfl_xor_sync(kFull, s4, 2);
          s4 += __shfl_xor_sync(kFull, s4, 4);
          if (ok && i8 == 0) xsm[((kk * NTILES + (slot >> 3)) * 8 + grp) * 8 + (slot & 7)] = s4;
        }
      }
    }
    __syncthreads();

    if (c < p.n_chunks) {
      cp_async_wait<1>();
      __syncwarp();
      const uint8_t* stage = stage_of(round);
      const int64_t off = c * Q::kChunkBytes;
      Q::scales(stage + cp_r * kRs + lead16(cp_row + off), cp_half, tbl + cp_r * kTblStride);
      __syncwarp();
      const uint8_t* rg = stage + g * kRs + lead16(row_g + off);
      const uint8_t* rg8 = stage + (g + 8) * kRs + lead16(row_g8 + off);
      float acc[NTILES][4];
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
      const float* t0 = tbl + g * kTblStride;
      const float* t8 = tbl + (g + 8) * kTblStride;
      const int n_steps = static_cast<int>(min(int64_t(kSteps), (p.n_cols - c * kChunkCols) / 16));
      if (Q::kBlockElems == kChunkCols || n_steps == kSteps) {
        chunk_mma<T, NTILES, true>(rg, rg8, t0, t8, bp, xs, q_stride, ntiles, kSteps, j, acc);
      } else if constexpr (Q::kBlockElems < kChunkCols) {
        chunk_mma<T, NTILES, false>(rg, rg8, t0, t8, bp, xs, q_stride, ntiles, n_steps, j, acc);
      }
      float* out = red + (kw * wr + rw) * 16 * p.red_t;
#pragma unroll
      for (int nt = 0; nt < NTILES; ++nt) {
        const int tk = 8 * nt + 2 * j;
        if (tk < cnt) out[g * p.red_t + tk] = acc[nt][0], out[(g + 8) * p.red_t + tk] = acc[nt][2];
        if (tk + 1 < cnt)
          out[g * p.red_t + tk + 1] = acc[nt][1], out[(g + 8) * p.red_t + tk + 1] = acc[nt][3];
      }
    }
    __syncthreads();
    // Totals: the round's chunk sums in chunk order.
    const int k_valid = static_cast<int>(min(int64_t(wk), p.n_chunks - int64_t(round) * wk));
    const float* part = red + o_tile * 16 * p.red_t + o_in * p.red_t;
#pragma unroll
    for (int n = 0; n < kOwn; ++n) {
      const int tk = o_tok + n * o_step;
      if (tk < cnt) {
        for (int kk = 0; kk < k_valid; ++kk) {
          tot[n][0] += part[kk * wr * 16 * p.red_t + tk];
          if (gate_up) tot[n][1] += part[kk * wr * 16 * p.red_t + 8 * p.red_t + tk];
        }
      }
    }
  }

  const int64_t grow = cta_first + o_row;
  if (grow < m.n_rows) {
#pragma unroll
    for (int n = 0; n < kOwn; ++n) {
      const int tk = o_tok + n * o_step;
      if (tk < cnt) {
        const int64_t out_row = p.mode == MmMode::kDense ? begin + tk : int64_t(__ldg(p.pairs + begin + tk));
        m.y[out_row * m.y_stride + grow] = gate_up ? silu(tot[n][0]) * tot[n][1] : tot[n][0];
      }
    }
  }
}

// ---- host side ---------------------------------------------------------------

struct DeviceLimits {
  int sms = 0;
  int smem_optin = 0;
};

DeviceLimits device_limits() {
  constexpr int kMaxDevices = 64;
  static DeviceLimits cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) dev = 0;
  DeviceLimits& l = cache[dev];
  if (l.sms == 0) {
    DeviceLimits v;
    cudaDeviceGetAttribute(&v.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&v.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (v.sms <= 0) v.sms = 1;
    if (v.smem_optin < 48 * 1024) v.smem_optin = 48 * 1024;
    l = v;  // benign race: every writer stores the same values
  }
  return l;
}

// Shared-memory layout of a geometry; returns the bytes.
template <DType T, int NTILES>
int layout(TcProblem& p) {
  const int nwarps = p.wk * p.wr;
  p.rs = row_stage_bytes<T>();
  p.log2_rows = (p.mode == MmMode::kGateUp ? 3 : 4) + (p.wr == 4 ? 2 : p.wr == 2 ? 1 : 0);
  p.tile_b = kSteps * p.slots * 4 * kBLane;
  p.red_t = NTILES == 1 ? p.slots : 16;
  int at = p.stages * nwarps * 16 * p.rs;
  p.off_b = at;
  at += p.wk * NTILES * p.tile_b;
  p.off_x = at;
  if (tcdec::Tc<T>::kMin) at += p.wk * NTILES * 64 * 4;
  p.off_tbl = at;
  at += nwarps * 16 * kTblStride * 4;
  p.off_red = at;
  at += p.wk * p.wr * 16 * p.red_t * 4;
  return at;
}

// Chooses (Wr, Wk) and the layout for `nt` tokens a CTA (nt_eff on average)
// and `ctas(wr)` CTAs; returns the dynamic shared memory bytes, or -1.
template <DType T, int NTILES, class Ctas>
int choose_geometry(TcProblem& p, int nt, int nt_eff, Ctas&& ctas) {
  const DeviceLimits lim = device_limits();
  p.n_chunks = (p.n_cols + kChunkCols - 1) / kChunkCols;
  p.slots = std::min(8, nt);
  // Rows a CTA: one tile for few tokens (most parallel); for more tokens,
  // 2 or 4 tiles share the activation split (done once a CTA), 2 even if the
  // CTAs then leave SMs idle (from 9 tokens the split is most of the work).
  int wr = 1;
  if (nt_eff >= 9) {
    wr = 10 * ctas(4) >= 9 * int64_t(lim.sms) ? 4 : 2;
  } else if (nt_eff >= 3) {
    wr = 10 * ctas(2) >= 9 * int64_t(lim.sms) ? 2 : 1;
  }
  for (;; wr /= 2) {
    for (int wk = static_cast<int>(std::min<int64_t>(p.n_chunks, (kMaxThreads / 32) / wr)); wk >= 1;
         wk /= 2) {
      p.wr = wr, p.wk = wk;
      p.rounds = static_cast<int>((p.n_chunks + wk - 1) / wk);
      p.stages = p.rounds > 1 ? 2 : 1;
      const int bytes = layout<T, NTILES>(p);
      if (bytes <= lim.smem_optin) return bytes;
    }
    if (wr == 1) return -1;
  }
}

template <DType T, int NTILES>
Status launch_geometry(TcProblem& p, int nt, int nt_eff, int64_t n_slots, cudaStream_t stream) {
  const bool grouped = p.mode != MmMode::kDense;
  const int64_t tile_rows = p.mode == MmMode::kGateUp ? 8 : 16;
  auto ctas = [&](int wr) {
    if (grouped) return n_slots * ((p.mat[0].n_rows + tile_rows * wr - 1) / (tile_rows * wr));
    int64_t n = 0;
    for (int i = 0; i < p.n_mats; ++i) n += (p.mat[i].n_rows + 16 * wr - 1) / (16 * wr);
    return n * ((p.n_tokens + p.token_group - 1) / p.token_group);
  };
  const int bytes = choose_geometry<T, NTILES>(p, nt, nt_eff, ctas);
  if (bytes < 0) {
    return make_error(StatusCode::kInternal, "matvec ({}): no tile fits in shared memory", dtype_name(T));
  }
  dim3 grid;
  if (grouped) {
    const int64_t tiles = (p.mat[0].n_rows + tile_rows * p.wr - 1) / (tile_rows * p.wr);
    if (tiles > 65535 || n_slots > (int64_t(1) << 31) - 1) {
      return make_error(StatusCode::kInvalidArgument, "expert matvec: {} rows is too many", p.mat[0].n_rows);
    }
    grid.x = static_cast<unsigned>(n_slots), grid.y = static_cast<unsigned>(tiles);
  } else {
    int64_t n = 0;
    for (int i = 0; i < p.n_mats; ++i) {
      p.mat[i].tile0 = n;
      n += (p.mat[i].n_rows + 16 * p.wr - 1) / (16 * p.wr);
    }
    if (n > (int64_t(1) << 31) - 1) return make_error(StatusCode::kInvalidArgument, "matvec: too many rows");
    grid.x = static_cast<unsigned>(n);
    grid.y = static_cast<unsigned>((p.n_tokens + p.token_group - 1) / p.token_group);
  }
  if (bytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(tc_kernel<T, NTILES>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) {
      return make_error(StatusCode::kInternal, "matvec ({}): shared memory {}: {}", dtype_name(T), bytes,
                        cudaGetErrorString(err));
    }
  }
  detail::launch(tc_kernel<T, NTILES>, grid, 32 * p.wk * p.wr, bytes, stream, p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "matvec ({}, {} tokens): launch failed: {}", dtype_name(T), nt,
                      cudaGetErrorString(err));
  }
  return Status::ok();
}

template <DType T>
Status launch_type(TcProblem& p, int nt, int nt_eff, int64_t n_slots, cudaStream_t stream) {
  if (nt <= 8) return launch_geometry<T, 1>(p, nt, nt_eff, n_slots, stream);
  return launch_geometry<T, 2>(p, nt, nt_eff, n_slots, stream);
}

Status launch_tc(TcProblem& p, DType type, int nt, int nt_eff, int64_t n_slots, cudaStream_t stream) {
  switch (type) {
    case DType::Q8_0:
      return launch_type<DType::Q8_0>(p, nt, nt_eff, n_slots, stream);
    case DType::Q4_0:
      return launch_type<DType::Q4_0>(p, nt, nt_eff, n_slots, stream);
    case DType::Q4_K:
      return launch_type<DType::Q4_K>(p, nt, nt_eff, n_slots, stream);
    case DType::Q5_K:
      return launch_type<DType::Q5_K>(p, nt, nt_eff, n_slots, stream);
    case DType::Q6_K:
      return launch_type<DType::Q6_K>(p, nt, nt_eff, n_slots, stream);
    default:
      break;
  }
  return make_error(StatusCode::kUnsupported, "matvec: weight type {} has no tensor-core path",
                    dtype_name(type));
}

// Pairs a slot of a grouped product takes (its N tiles: 8 pairs one, 16
// two). Up to 8 tokens all of them. From 9 tokens 16, unless the experts
// serve 8 pairs or fewer on average (a verify or batched decode step of 16
// rows over 32+ experts: ~2-4 each): one N tile then, half the MMAs and
// activation splits, and the few experts with more than 8 pairs take a
// second slot. A token's result does not depend on the slot (header).
// MOESERVE_CUDA_TC_PAIR_CHUNK=16 keeps 16 from 9 tokens.
int tc_pair_chunk(int nt, int64_t n_pairs, int64_t used) {
  static const int forced = [] {
    const char* v = std::getenv("MOESERVE_CUDA_TC_PAIR_CHUNK");
    return v != nullptr && std::strcmp(v, "16") == 0 ? 16 : 0;
  }();
  if (nt <= 8) return nt;
  if (forced != 0) return forced;
  const int64_t mean_pairs = (n_pairs + used - 1) / std::max<int64_t>(used, 1);
  return mean_pairs <= 8 ? 8 : 16;
}

// Tokens a CTA of a dense product takes (MOESERVE_CUDA_TC_DENSE_GROUP=1..16,
// default 8: one N tile); more tokens run as groups of CTAs side by side,
// each splitting its own tokens' activations and reading the rows again
// (from the L2 after the first). One CTA of 16 tokens ran a 16-row verify's
// q/k/v at 5.8x one token's time (H200, 30b-a3b shapes: 61 us against
// 10.6), the activation split of 16 tokens its longest part. A token's
// result does not depend on its group (header).
int tc_dense_token_group() {
  static const int group = [] {
    const char* v = std::getenv("MOESERVE_CUDA_TC_DENSE_GROUP");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n >= 1 && n <= 16 ? n : 8;
  }();
  return group;
}

TcProblem common_problem(const MmProblem& p) {
  TcProblem t;
  t.mode = p.mode;
  t.n_mats = 1;
  t.mat[0].w = p.w0, t.mat[0].row_bytes = p.row_bytes, t.mat[0].n_rows = p.n_rows;
  t.mat[0].y = p.y, t.mat[0].y_stride = p.y_stride;
  t.w1 = p.w1, t.matrix_stride = p.matrix_stride;
  t.n_cols = p.n_cols, t.x = p.x, t.x_stride = p.x_stride, t.n_tokens = p.n_tokens;
  t.pairs = p.pairs, t.offsets = p.offsets, t.n_expert = p.n_expert, t.x_row_div = p.x_row_div;
  return t;
}

}  // namespace

bool matvec_tc_type(DType t) { return tcdec::tc_type(t); }

Status launch_matvec_tc(const MmProblem& p, cudaStream_t stream) {
  if (p.n_tokens * p.x_stride >= (int64_t(1) << 31) && p.mode == MmMode::kDense) {
    return make_error(StatusCode::kInvalidArgument, "matvec: {} activation rows of {} floats is too many",
                      p.n_tokens, p.x_stride);
  }
  TcProblem t = common_problem(p);
  if (p.mode == MmMode::kDense) {
    const int nt = static_cast<int>(std::min<int64_t>(p.n_tokens, tc_dense_token_group()));
    t.token_group = nt;
    return launch_tc(t, p.type, nt, nt, 0, stream);
  }
  // Grouped: an expert serves each token at most once, so up to 16 tokens
  // all its pairs fit one slot of min(n_tokens, 16) (rounded to the N tiles)
  // and its rows are read once; more tokens take 16 pairs a slot.
  const int nt = static_cast<int>(std::min<int64_t>(p.n_tokens, kMatvecMaxTokens));
  const int64_t used = std::min(p.n_expert, p.n_pairs);
  t.pair_chunk = tc_pair_chunk(nt, p.n_pairs, used);
  const int64_t n_slots = p.n_tokens <= t.pair_chunk ? used : p.n_pairs / t.pair_chunk + used + 1;
  const int nt_eff =
      static_cast<int>(std::min<int64_t>(nt, (p.n_pairs + used - 1) / std::max<int64_t>(used, 1)));
  return launch_tc(t, p.type, t.pair_chunk, nt_eff, n_slots, stream);
}

}  // namespace detail

// ---- several matrices sharing one input ------------------------------------

Status matvec_multi(const MatmulArgs* products, int n_products, cudaStream_t stream) {
  if (products == nullptr || n_products < 1) {
    return make_error(StatusCode::kInvalidArgument, "matvec_multi: no products");
  }
  const MatmulArgs& a0 = products[0];
  for (int i = 0; i < n_products; ++i) {
    const MatmulArgs& a = products[i];
    if (a.n_tokens < 1 || a.n_tokens > kMatvecMaxTokens) {
      return make_error(StatusCode::kInvalidArgument, "matvec_multi: n_tokens {} outside 1..{}", a.n_tokens,
                        kMatvecMaxTokens);
    }
    if (a.x != a0.x || a.x_stride != a0.x_stride || a.n_tokens != a0.n_tokens || a.n_cols != a0.n_cols) {
      return make_error(StatusCode::kInvalidArgument, "matvec_multi: product {} has another input", i);
    }
    MOESERVE_RETURN_IF_ERROR(
        detail::check_weights("matvec_multi", a.w_type, a.w, a.n_rows, a.n_cols, a.row_bytes));
    MOESERVE_RETURN_IF_ERROR(
        detail::check_activations("matvec_multi", a.x, a.n_tokens > 1 ? a.x_stride : a.n_cols, a.n_cols));
    if (a.y == nullptr || (a.n_tokens > 1 && a.y_stride < a.n_rows)) {
      return make_error(StatusCode::kInvalidArgument, "matvec_multi: null y or y_stride {} < n_rows {}",
                        a.y_stride, a.n_rows);
    }
  }
  if (a0.n_tokens * a0.x_stride >= (int64_t(1) << 31)) {
    return make_error(StatusCode::kInvalidArgument, "matvec_multi: activation rows too large");
  }
  bool done[64] = {};
  if (n_products > 64)
    return make_error(StatusCode::kInvalidArgument, "matvec_multi: {} products", n_products);
  for (int i = 0; i < n_products; ++i) {
    if (done[i]) continue;
    const DType type = products[i].w_type;
    if (!detail::matvec_tc_type(type)) {
      // Float weights: the CUDA-core kernel, one launch each.
      detail::MmProblem p;
      p.mode = detail::MmMode::kDense, p.type = type;
      p.w0 = static_cast<const uint8_t*>(products[i].w), p.row_bytes = products[i].row_bytes;
      p.n_rows = products[i].n_rows, p.n_cols = products[i].n_cols;
      p.x = products[i].x, p.x_stride = products[i].x_stride, p.n_tokens = products[i].n_tokens;
      p.y = products[i].y, p.y_stride = products[i].y_stride;
      MOESERVE_RETURN_IF_ERROR(detail::launch_matvec(p, stream));
      done[i] = true;
      continue;
    }
    detail::TcProblem t;
    t.mode = detail::MmMode::kDense;
    t.n_mats = 0;
    t.n_cols = a0.n_cols, t.x = a0.x, t.x_stride = a0.x_stride, t.n_tokens = a0.n_tokens;
    for (int k = i; k < n_products && t.n_mats < detail::kMaxMats; ++k) {
      if (done[k] || products[k].w_type != type) continue;
      detail::TcMat& m = t.mat[t.n_mats++];
      m.w = static_cast<const uint8_t*>(products[k].w), m.row_bytes = products[k].row_bytes;
      m.n_rows = products[k].n_rows, m.y = products[k].y, m.y_stride = products[k].y_stride;
      done[k] = true;
    }
    const int nt = static_cast<int>(std::min<int64_t>(a0.n_tokens, detail::tc_dense_token_group()));
    t.token_group = nt;
    MOESERVE_RETURN_IF_ERROR(detail::launch_tc(t, type, nt, nt, 0, stream));
  }
  return Status::ok();
}

}  // namespace moeserve::cuda
