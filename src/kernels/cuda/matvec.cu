// Matrix x vector products on CUDA cores, reading weight blocks as stored:
// the decode path (1..16 tokens) and the grouped expert products of a
// decode step. launch_matvec hands some of them over: the grouped expert
// products of the K-quants, IQ4_XS and the codebook i-quants (IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) to gemm_kq.cu's integer
// kernel, those of Q8_0 and Q4_0 (types with a tensor-core decoder,
// tc_decode.cuh) and matvec_multi of those to matvec_tc.cu. The other
// quantized types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) and the dense products
// of the codebook i-quants run here.
//
// Memory-bound at one token, and x is f32 (4 bytes a column against about
// half a byte of weight), so the layout makes x nearly free and the weight
// stream coalesced:
//  - a block owns 16 rows (kGateUp: 8 gate rows and the same 8 up rows) and
//    its 8 warps split the columns: warp w takes chunks w, w + 8, ... of
//    every row (a chunk: about 84-210 bytes, kMvChunkBlocks blocks; F32:
//    512 bytes, so that a router's 2048-column rows take few round trips);
//  - a warp copies its chunk of the 16 rows into shared memory with 16-byte
//    cp.async (whatever the block size or alignment: each row's span is
//    widened to 16-byte boundaries), double-buffered where it fits;
//  - two lanes share a row (lane and lane + 16 take alternate units of the
//    chunk, quant_decode.cuh), so the 32 lanes of a warp read the same two
//    runs of x at a time: broadcast loads through L1, shared by the warp;
//  - partial sums: lane pair (shuffle), then the 8 warps through shared
//    memory, in warp order;
//  - a dense product's tokens go in groups (dense_token_group(), 4), each
//    group a row of CTAs of its own (grid.y).
// Every sum has a fixed order (set by n_cols and the type only): a token's
// result is bit-identical at n_tokens = 1 and inside a batch of 16, and for
// the grouped products whatever else its expert serves.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_detail.h"
#include "kernels/cuda/matvec_tc.h"
#include "kernels/cuda/quant_decode.cuh"

namespace moeserve::cuda {
namespace detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;  // rows of a block

// Shared-memory geometry of type Q's chunks.
template <class Q>
struct Geometry {
  // F32 rows (the MoE router: 128 rows, 8 blocks) take 512-byte chunks, one
  // stage (68 KB, within the 99 KB of sm_86/89/120): a warp's share of a
  // 2048-column row is 2 round trips instead of 8.
  static constexpr int kChunkBlocks = Q::kType == DType::F32 ? 8 : Q::kMvChunkBlocks;
  static constexpr int kChunkBytes = kChunkBlocks * Q::kBlockBytes;
  static constexpr int kUnits = kChunkBlocks * Q::kUnitsPerBlock;  // per row chunk, even
  // A staged row: the chunk plus up to 15 bytes of alignment slack at each
  // end (rows that may start off 16 bytes), rounded to an odd multiple of 16
  // so that lanes reading the same offset of consecutive rows hit distinct
  // banks.
  static constexpr int kSpan = kChunkBytes + (Q::kRowAlign < 16 ? 30 : 0);
  static constexpr int kRowStage =
      ((kSpan + 15) / 16 % 2 == 1 ? (kSpan + 15) / 16 : (kSpan + 15) / 16 + 1) * 16;
  static constexpr int kWarpStage = kRows * kRowStage;
  static constexpr int kStages = 2 * kWarps * kWarpStage <= 46 * 1024 ? 2 : 1;
  static constexpr int kPieces = kRowStage / 16;  // 16-byte copies per row, at most
  static_assert(kUnits % 2 == 0, "lane pairs split a chunk's units");
};

__device__ __forceinline__ int lead_bytes(const uint8_t* p) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15u);
}

// The rows of a block: dense and kDown rows r0.. of one matrix; kGateUp rows
// 0..7 gate rows f0.., 8..15 the same up rows. Rows past n_rows repeat the
// last (computed, never stored).
struct RowSource {
  const uint8_t* lo;  // matrix of rows 0..split-1
  const uint8_t* hi;  // matrix of rows split..15
  int64_t first, n_rows;
  size_t row_bytes;
  int split;
  __device__ __forceinline__ const uint8_t* row(int r) const {
    const int64_t i = r < split ? first + r : first + r - split;
    return (r < split ? lo : hi) + min(i, n_rows - 1) * row_bytes;
  }
  // Row r is its matrix's last: its bytes may end the allocation.
  __device__ __forceinline__ bool last(int r) const {
    return (r < split ? first + r : first + r - split) >= n_rows - 1;
  }
};

// Blocks of chunk c of a row of nb blocks (the last chunk may be short).
template <class Q>
__device__ __forceinline__ int chunk_blocks(int64_t nb, int64_t c) {
  return static_cast<int>(min(int64_t(Geometry<Q>::kChunkBlocks), nb - c * Geometry<Q>::kChunkBlocks));
}

// Copies chunk c of the 16 rows into stage (rows kRowStage apart, each at
// lead_bytes of its address).
template <class Q>
__device__ __forceinline__ void issue_chunk(const RowSource& src, int64_t nb, int64_t c, uint8_t* stage,
                                            int lane) {
  using G = Geometry<Q>;
  const int64_t off = c * G::kChunkBytes;
  const int chunk_bytes = chunk_blocks<Q>(nb, c) * Q::kBlockBytes;
#pragma unroll 1
  for (int k = 0; k < (kRows * G::kPieces + 31) / 32; ++k) {
    const int p = lane + 32 * k;
    if (p >= kRows * G::kPieces) break;
    const int r = p / G::kPieces, piece = p % G::kPieces;
    const uint8_t* start = src.row(r) + off;
    const int lead = lead_bytes(start), end = lead + chunk_bytes;
    const int bytes = min(16, end - 16 * piece);
    // Past the chunk: never read. The matrix's last row may end inside its
    // last piece (2-byte aligned blocks): copied exactly, below.
    if (bytes <= 0 || (bytes < 16 && src.last(r))) continue;
    // Past the chunk lie the rest of the row, its padding or the next row.
    cp_async16(stage + r * G::kRowStage + 16 * piece, start - lead + 16 * piece);
  }
  if constexpr (Q::kRowAlign < 16) {
    // At most one row index (and the rows clamped to it) is the last: lane r
    // copies that row's tail with plain loads, nothing past its bytes: 2
    // bytes at a time where rows end on an even byte, else (MXFP4's 17-byte
    // blocks) 1.
    if (lane < kRows && src.last(lane)) {
      const uint8_t* start = src.row(lane) + off;
      const int lead = lead_bytes(start), end = lead + chunk_bytes, tail = end & ~15;
      uint8_t* dst = stage + lane * G::kRowStage;
      if constexpr (Q::kRowAlign == 1) {
        for (int b = tail; b < end; ++b) dst[b] = start[b - lead];
      } else {
        for (int b = tail; b < end; b += 2) {
          *reinterpret_cast<uint16_t*>(dst + b) = *reinterpret_cast<const uint16_t*>(start - lead + b);
        }
      }
    }
  }
}

// acc[t] += this lane's share of its row . x_t over one staged chunk of
// nbc blocks.
template <class Q, int NT>
__device__ __forceinline__ void compute_chunk(const uint8_t* data, int64_t col_base, int nbc, int h,
                                              const float* x, const int32_t (&xoff)[NT], float (&acc)[NT]) {
  using G = Geometry<Q>;
#pragma unroll
  for (int i = 0; i < G::kUnits / 2; ++i) {
    // Unit 2i + h of the chunk.
    int block, uu;
    if constexpr (Q::kUnitsPerBlock % 2 == 0) {
      block = i / (Q::kUnitsPerBlock / 2), uu = 2 * (i % (Q::kUnitsPerBlock / 2)) + h;
    } else {
      block = 2 * i + h, uu = 0;
    }
    if (block >= nbc) break;  // a short last chunk (units run in block order)
    const uint8_t* blk = data + block * Q::kBlockBytes;
#pragma unroll
    for (int k = 0; k < Q::kUnitRuns; ++k) {
      const int run = Q::unit_run(uu, k);
      float v[qdec::kRunLen];
      const float a = Q::decode(blk, run, v);
      const int64_t col = col_base + int64_t(block) * Q::kBlockElems + qdec::kRunLen * run;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(x + xoff[t] + col);
        float xv[qdec::kRunLen];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 f = __ldg(xp + q);
          xv[4 * q] = f.x, xv[4 * q + 1] = f.y, xv[4 * q + 2] = f.z, xv[4 * q + 3] = f.w;
        }
        if constexpr (Q::kScaled) {
          // Codes times x over the run, scaled once.
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < qdec::kRunLen; ++e) s = fmaf(v[e], xv[e], s);
          acc[t] = fmaf(a, s, acc[t]);
        } else {
          float s = acc[t];
#pragma unroll
          for (int e = 0; e < qdec::kRunLen; ++e) s = fmaf(v[e], xv[e], s);
          acc[t] = s;
        }
      }
    }
  }
}

// This warp's chunks (w, w + kWarps, ...) of the 16 rows; on return, lanes
// r and r + 16 hold row r's warp sum.
// dependency_pending: the kernel has not waited for earlier work yet
// (launch.cuh); the first chunk of weights is requested before it does.
template <class Q, int NT>
__device__ __forceinline__ void warp_rows(const RowSource& src, int64_t nb, const float* x,
                                          const int32_t (&xoff)[NT], float (&acc)[NT], uint8_t* stage,
                                          int warp, int lane, bool dependency_pending) {
  using G = Geometry<Q>;
  const int row = lane & 15, h = lane >> 4;
  const int64_t n_chunks = (nb + G::kChunkBlocks - 1) / G::kChunkBlocks;
  const int64_t mine = warp < n_chunks ? (n_chunks - 1 - warp) / kWarps + 1 : 0;
  if (mine > 0 && G::kStages == 2) {
    issue_chunk<Q>(src, nb, warp, stage, lane);
    cp_async_commit();
  }
  if (dependency_pending) {
    grid_dependency_wait();
    allow_dependents();
  }
  for (int64_t j = 0; j < mine; ++j) {
    const int64_t c = warp + j * kWarps;
    uint8_t* buf = stage + (G::kStages == 2 ? (j & 1) * G::kWarpStage : 0);
    if (G::kStages == 2) {
      if (j + 1 < mine) {
        // The other buffer was last read in step j - 1, before its closing
        // __syncwarp.
        issue_chunk<Q>(src, nb, c + kWarps, stage + ((j + 1) & 1) * G::kWarpStage, lane);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else {
      issue_chunk<Q>(src, nb, c, buf, lane);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncwarp();  // every lane's copies are visible
    const uint8_t* data = buf + row * G::kRowStage + lead_bytes(src.row(row) + c * G::kChunkBytes);
    compute_chunk<Q, NT>(data, c * G::kChunkBlocks * Q::kBlockElems, chunk_blocks<Q>(nb, c), h, x, xoff, acc);
    __syncwarp();
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] += __shfl_xor_sync(kFull, acc[t], 16);
}

template <class Q>
constexpr int smem_bytes() {
  using G = Geometry<Q>;
  return G::kStages * kWarps * G::kWarpStage;
}

// Register cap: enough blocks per SM to keep the weight stream in flight;
// without it the compiler hoists every run's loads of a chunk.
constexpr int min_blocks(int nt) { return nt == 1 ? 4 : nt == 2 ? 3 : 2; }

template <class Q, int NT>
__global__ void __launch_bounds__(kThreads, min_blocks(NT)) mv_kernel(const MmProblem p) {
  static_assert(kWarps * kRows * NT * 4 <= smem_bytes<Q>(), "the warp sums reuse the staging buffers");
  extern __shared__ __align__(16) uint8_t smem[];  // smem_bytes<Q>()
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  // Token slot t reads x + xoff[t] (floats; the launcher checks the range).
  // Slots past the batch repeat the last token and are never stored.
  int32_t xoff[NT];
  int64_t count, begin = 0;
  RowSource src;
  src.n_rows = p.n_rows, src.row_bytes = p.row_bytes, src.split = kRows;
  if (p.mode == MmMode::kDense) {
    // Token group blockIdx.y: tokens begin.. (launch_nt).
    begin = int64_t(blockIdx.y) * NT;
    count = min(int64_t(NT), p.n_tokens - begin);
    src.lo = src.hi = p.w0, src.first = int64_t(blockIdx.x) * kRows;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      xoff[t] = static_cast<int32_t>((begin + min(int64_t(t), count - 1)) * p.x_stride);
    }
  } else {
    grid_dependency_wait();  // the groups come from the routing kernel
    allow_dependents();
    const Slot s = find_slot(p.offsets, p.n_expert, NT, blockIdx.x, lane);
    if (s.count == 0) return;  // the same answer in every warp
    count = s.count, begin = s.begin;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int64_t row = p.pairs[begin + min(t, s.count - 1)] / static_cast<int32_t>(p.x_row_div);
      xoff[t] = static_cast<int32_t>(row * p.x_stride);
    }
    src.lo = src.hi = p.w0 + s.expert * p.matrix_stride;
    if (p.mode == MmMode::kGateUp) {
      src.hi = p.w1 + s.expert * p.matrix_stride, src.split = kRows / 2;
      src.first = int64_t(blockIdx.y) * (kRows / 2);
    } else {
      src.first = int64_t(blockIdx.y) * kRows;
    }
  }

  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  warp_rows<Q, NT>(src, p.n_cols / Q::kBlockElems, p.x, xoff, acc,
                   smem + warp * Geometry<Q>::kStages * Geometry<Q>::kWarpStage, warp, lane,
                   p.mode == MmMode::kDense);

  // Warp sums to shared memory (over the staging buffers), then each output
  // adds the 8 warps' sums in warp order.
  float* red = reinterpret_cast<float*>(smem);  // [kWarps][kRows][NT]
  __syncthreads();
  if (lane < kRows) {
#pragma unroll
    for (int t = 0; t < NT; ++t) red[(warp * kRows + lane) * NT + t] = acc[t];
  }
  __syncthreads();
  const bool gate_up = p.mode == MmMode::kGateUp;
  const int n_out_rows = gate_up ? kRows / 2 : kRows;
  static_assert(kThreads >= kRows * 16, "one thread per output (row, token)");
  if (tid >= n_out_rows * NT) return;
  const int r = tid / NT, t = tid % NT;
  if (t >= count || src.first + r >= p.n_rows) return;
  auto sum_row = [&](int row) {
    float v = red[row * NT + t];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += red[(w * kRows + row) * NT + t];
    return v;
  };
  const int64_t out_row = p.mode == MmMode::kDense ? begin + t : int64_t(p.pairs[begin + t]);
  const float v = gate_up ? silu(sum_row(r)) * sum_row(r + kRows / 2) : sum_row(r);
  p.y[out_row * p.y_stride + src.first + r] = v;
}

// ---- F32 weights, dense: one warp per row --------------------------------
// The MoE router (128 rows of 2048 floats) through mv_kernel gets only
// n_rows / 16 CTAs, each waiting on its chunks in turn: 11 us for 1 MB on an
// H100. Here each warp owns one row and keeps kAhead float4 loads a lane in
// flight (the first before waiting for the activations: weights do not
// depend on earlier work), so 128 rows are 32 CTAs streaming at once.
// Lane l sums float4 columns l, l + 32, ... in order, then a xor butterfly
// (the same bits on every lane): a fixed order for any n_tokens.
constexpr int kF32Warps = 4;
constexpr int kF32Ahead = 16;

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// Block (row group, token chunk): chunk c takes tokens NT*c.. (up to NT):
// many tokens (the router of a prefill chunk) in one launch, each token's
// sum as at one token.
template <int NT>
__global__ void __launch_bounds__(32 * kF32Warps) f32_rows_kernel(MmProblem p) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t t0 = int64_t(blockIdx.y) * NT;
  p.x += t0 * p.x_stride, p.y += t0 * p.y_stride, p.n_tokens = min(int64_t(NT), p.n_tokens - t0);
  const int64_t row = int64_t(blockIdx.x) * kF32Warps + warp;
  const float4* w = reinterpret_cast<const float4*>(p.w0 + min(row, p.n_rows - 1) * p.row_bytes);
  const int64_t n4 = p.n_cols / 4;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 next[kF32Ahead];
#pragma unroll
  for (int k = 0; k < kF32Ahead; ++k) {
    const int64_t i = lane + 32 * k;
    next[k] = i < n4 ? __ldg(w + i) : zero;
  }
  grid_dependency_wait();
  allow_dependents();
  const float4* x[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    x[t] = reinterpret_cast<const float4*>(p.x + min(int64_t(t), p.n_tokens - 1) * p.x_stride);
  }
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int64_t base = 0; base < n4; base += 32 * kF32Ahead) {
    float4 cur[kF32Ahead];
#pragma unroll
    for (int k = 0; k < kF32Ahead; ++k) {
      cur[k] = next[k];
      const int64_t i = base + 32 * kF32Ahead + lane + 32 * k;
      next[k] = i < n4 ? __ldg(w + i) : zero;
    }
#pragma unroll
    for (int k = 0; k < kF32Ahead; ++k) {
      const int64_t i = base + lane + 32 * k;
      if (i >= n4) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] = dot4(cur[k], __ldg(x[t] + i), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(kFull, acc[t], o);
  }
  if (row >= p.n_rows) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (lane == t && t < p.n_tokens) p.y[int64_t(t) * p.y_stride + row] = acc[t];
  }
}

template <int NT>
Status launch_f32_rows(const MmProblem& p, cudaStream_t stream) {
  const int64_t blocks = (p.n_rows + kF32Warps - 1) / kF32Warps, chunks = (p.n_tokens + NT - 1) / NT;
  if (blocks > INT32_MAX || chunks > 65535) {
    return make_error(StatusCode::kInvalidArgument, "matvec (F32): {} rows x {} tokens is too many", p.n_rows,
                      p.n_tokens);
  }
  const dim3 grid{unsigned(blocks), unsigned(chunks)};
  const cudaError_t err = launch(f32_rows_kernel<NT>, grid, 32 * kF32Warps, 0, stream, p);
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "matvec (F32, {} tokens): launch failed: {}", NT,
                      cudaGetErrorString(err));
  }
  return Status::ok();
}

Status launch_f32_dense(const MmProblem& p, int nt, cudaStream_t stream) {
  if (nt <= 1) return launch_f32_rows<1>(p, stream);
  if (nt <= 2) return launch_f32_rows<2>(p, stream);
  if (nt <= 4) return launch_f32_rows<4>(p, stream);
  // Up to 64 tokens (batched decode's routers) in chunks of 4: 8x the CTAs
  // of 16-token chunks at 32 tokens (the 128-row router is 32 row groups),
  // the 1 MB of weights read again from the L2 per chunk. H200, 32 tokens:
  // 14.5 us in chunks of 16. A token's sum is the same in any chunk size.
  if (p.n_tokens <= 64) return launch_f32_rows<4>(p, stream);
  return launch_f32_rows<16>(p, stream);
}

template <class Q, int NT>
Status launch_nt(const MmProblem& p, cudaStream_t stream) {
  dim3 grid;
  if (p.mode == MmMode::kDense) {
    // Tokens in groups of NT, a group's CTAs beside the others' (a token's
    // sum does not depend on its group: header).
    const int64_t groups = (p.n_tokens + NT - 1) / NT;
    if (groups > 65535) {
      return make_error(StatusCode::kInvalidArgument, "matvec: {} tokens is too many", p.n_tokens);
    }
    grid.x = static_cast<unsigned>((p.n_rows + kRows - 1) / kRows), grid.y = static_cast<unsigned>(groups);
  } else {
    // Chunks of NT pairs per expert: at most n_pairs / NT full ones plus one
    // partial per non-empty expert. Blocks past the real count exit at once.
    const int64_t slots = p.n_pairs / NT + std::min(p.n_expert, p.n_pairs) + 1;
    const int64_t rows_per_cta = p.mode == MmMode::kGateUp ? kRows / 2 : kRows;
    const int64_t row_tiles = (p.n_rows + rows_per_cta - 1) / rows_per_cta;
    if (row_tiles > 65535) {
      return make_error(StatusCode::kInvalidArgument, "expert matvec: {} rows is too many", p.n_rows);
    }
    grid.x = static_cast<unsigned>(slots), grid.y = static_cast<unsigned>(row_tiles);
  }
  constexpr int kSmem = smem_bytes<Q>();
  if constexpr (kSmem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(mv_kernel<Q, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) {
      return make_error(StatusCode::kInternal, "matvec ({}): shared memory {}: {}", dtype_name(p.type), kSmem,
                        cudaGetErrorString(err));
    }
  }
  launch(mv_kernel<Q, NT>, grid, kThreads, kSmem, stream, p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "matvec ({}, {} tokens): launch failed: {}", dtype_name(p.type),
                      NT, cudaGetErrorString(err));
  }
  return Status::ok();
}

// Tokens a CTA of a dense product takes (MOESERVE_CUDA_DENSE_GROUP=1..16,
// default 4): more tokens run as groups of CTAs side by side, each reading
// the weights again (from the L2 after the first). A CTA of 16 tokens
// measured ~9x one token's time (H200, 30b-a3b output projection 4096 ->
// 2048 Q4_K: 78 us against 8.4), its registers and x loads the limit, and
// a small matrix (768 rows: 48 CTAs) leaves most SMs idle.
int dense_token_group() {
  static const int group = [] {
    const char* v = std::getenv("MOESERVE_CUDA_DENSE_GROUP");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n == 1 || n == 2 || n == 4 || n == 8 || n == 16 ? n : 4;
  }();
  return group;
}

template <DType T>
Status launch_type(const MmProblem& p, int nt, cudaStream_t stream) {
  using Q = qdec::Traits<T>;
  if (p.mode == MmMode::kDense) nt = std::min(nt, dense_token_group());
  if (nt <= 1) return launch_nt<Q, 1>(p, stream);
  if (nt <= 2) return launch_nt<Q, 2>(p, stream);
  if (nt <= 4) return launch_nt<Q, 4>(p, stream);
  if (nt <= 8) return launch_nt<Q, 8>(p, stream);
  return launch_nt<Q, 16>(p, stream);
}

bool is_weight_type(DType t) { return gpu_reads_weight_type(t); }

}  // namespace

size_t weight_row_align(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q6_K:
      return 2;
    case DType::Q4_1:
      return qdec::Traits<DType::Q4_1>::kRowAlign;
    case DType::Q5_0:
      return qdec::Traits<DType::Q5_0>::kRowAlign;
    case DType::Q5_1:
      return qdec::Traits<DType::Q5_1>::kRowAlign;
    case DType::IQ4_NL:
      return qdec::Traits<DType::IQ4_NL>::kRowAlign;
    case DType::IQ4_XS:
      return qdec::Traits<DType::IQ4_XS>::kRowAlign;
    case DType::MXFP4:
      return qdec::Traits<DType::MXFP4>::kRowAlign;
    case DType::Q2_K:
      return qdec::Traits<DType::Q2_K>::kRowAlign;
    case DType::Q3_K:
      return qdec::Traits<DType::Q3_K>::kRowAlign;
    case DType::IQ2_XXS:
      return qdec::Traits<DType::IQ2_XXS>::kRowAlign;
    case DType::IQ2_XS:
      return qdec::Traits<DType::IQ2_XS>::kRowAlign;
    case DType::IQ2_S:
      return qdec::Traits<DType::IQ2_S>::kRowAlign;
    case DType::IQ3_XXS:
      return qdec::Traits<DType::IQ3_XXS>::kRowAlign;
    case DType::IQ3_S:
      return qdec::Traits<DType::IQ3_S>::kRowAlign;
    case DType::IQ1_S:
      return qdec::Traits<DType::IQ1_S>::kRowAlign;
    case DType::IQ1_M:
      return qdec::Traits<DType::IQ1_M>::kRowAlign;
    default:
      return 16;
  }
}

Status check_weights(const char* what, DType type, const void* w, int64_t n_rows, int64_t n_cols,
                     size_t row_bytes) {
  if (!is_weight_type(type)) {
    return make_error(StatusCode::kUnsupported, "{}: weight type {} is not supported", what, uint32_t(type));
  }
  if (w == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: null weights", what);
  if (n_rows <= 0 || n_cols <= 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: bad shape {} x {}", what, n_rows, n_cols);
  }
  // Float types are read in runs of 16 elements.
  const int64_t unit = dtype_traits(type).quantized ? dtype_block_elems(type) : qdec::kRunLen;
  if (n_cols % unit != 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: n_cols {} is not a multiple of {} for {}", what,
                      n_cols, unit, dtype_name(type));
  }
  if (row_bytes < dtype_row_bytes(type, n_cols) || row_bytes % weight_row_align(type) != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: row_bytes {} for {} x {} (needs >= {}, a multiple of {})", what, row_bytes, n_cols,
                      dtype_name(type), dtype_row_bytes(type, n_cols), weight_row_align(type));
  }
  if ((reinterpret_cast<uintptr_t>(w) & 15) != 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: weights are not 16-byte aligned", what);
  }
  return Status::ok();
}

Status check_activations(const char* what, const void* p, int64_t stride, int64_t n_used_cols) {
  if (p == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: null pointer", what);
  if ((reinterpret_cast<uintptr_t>(p) & 15) != 0 || stride % 4 != 0 || stride < n_used_cols) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: rows must be 16-byte aligned with a stride (here {}) >= {} and a multiple of 4",
                      what, stride, n_used_cols);
  }
  return Status::ok();
}

bool dense_matvec_on_tensor_cores() {
  static const bool tc = [] {
    const char* v = std::getenv("MOESERVE_CUDA_DENSE_MATVEC");
    return v != nullptr && std::strcmp(v, "tc") == 0;
  }();
  return tc;
}

bool expert_decode_on_tc() {
  static const bool on = [] {
    const char* v = std::getenv("MOESERVE_CUDA_EXPERT_DECODE");
    return v != nullptr && std::strcmp(v, "tc") == 0;
  }();
  return on;
}

Status launch_matvec(const MmProblem& p, cudaStream_t stream) {
  // Grouped expert products of quantized weights: tensor-core kernels (an
  // expert with few pairs costs what one token does). Dense products stay
  // here: at one token this kernel measured faster on an H100 (q 2048 -> 4096
  // Q4_K: 5.6 us against 7.5; matvec_tc.cu's header has the numbers).
  // K-quant (and IQ4_XS) experts: the integer kernel of gemm_kq.cu (Q8_K
  // activations, the CPU's arithmetic), measured faster than the exact one
  // at every decode batch (H100, 30b-a3b shapes, gate_up + down: 1 token
  // 28.1 us against 33.0; 8 tokens 110 against 278; 16: 167 against 814).
  // The codebook i-quants' experts too (H200, the same shapes: 8 tokens
  // 127-150 us against 437-583 here; 1 token 34.8-41.3 against 35.2-37.4,
  // and 21.7-28.6 since one token runs on kq_vec.cu).
  // MOESERVE_CUDA_EXPERT_DECODE=tc keeps them on matvec_tc.cu (exact x)
  // where it decodes them, else here.
  if (p.mode != MmMode::kDense && !expert_decode_on_tc() && gemm_kq_type(p.type))
    return launch_gemm_kq(p, stream);
  if (p.mode != MmMode::kDense && matvec_tc_type(p.type)) return launch_matvec_tc(p, stream);
  // Dense products of the tensor-core types on matvec_tc.cu at every token
  // count (MOESERVE_CUDA_DENSE_MATVEC=tc): the same bits at 1..16 tokens as
  // here, and a 16-token product costs ~2x one token there against ~5x here
  // (a verify's output projection); at one token this kernel is the faster.
  if (p.mode == MmMode::kDense && matvec_tc_type(p.type) && dense_matvec_on_tensor_cores()) {
    return launch_matvec_tc(p, stream);
  }
  // The kernels address activation rows with 32-bit float offsets.
  if (p.n_tokens * p.x_stride >= (int64_t(1) << 31)) {
    return make_error(StatusCode::kInvalidArgument, "matvec: {} activation rows of {} floats is too many",
                      p.n_tokens, p.x_stride);
  }
  // Grouped: an expert serves each token at most once, so it has at most
  // n_tokens pairs; taking them that many at a time reads its rows once.
  // (Dense F32 problems of more tokens run in chunks of 16: matvec_rows.)
  const int nt = static_cast<int>(std::min<int64_t>(p.n_tokens, kMatvecMaxTokens));
  switch (p.type) {
    case DType::F32:
      return p.mode == MmMode::kDense ? launch_f32_dense(p, nt, stream)
                                      : launch_type<DType::F32>(p, nt, stream);
    case DType::F16:
      return launch_type<DType::F16>(p, nt, stream);
    case DType::BF16:
      return launch_type<DType::BF16>(p, nt, stream);
    case DType::Q8_0:
      return launch_type<DType::Q8_0>(p, nt, stream);
    case DType::Q4_0:
      return launch_type<DType::Q4_0>(p, nt, stream);
    case DType::Q4_K:
      return launch_type<DType::Q4_K>(p, nt, stream);
    case DType::Q5_K:
      return launch_type<DType::Q5_K>(p, nt, stream);
    case DType::Q6_K:
      return launch_type<DType::Q6_K>(p, nt, stream);
    case DType::Q4_1:
      return launch_type<DType::Q4_1>(p, nt, stream);
    case DType::Q5_0:
      return launch_type<DType::Q5_0>(p, nt, stream);
    case DType::Q5_1:
      return launch_type<DType::Q5_1>(p, nt, stream);
    case DType::IQ4_NL:
      return launch_type<DType::IQ4_NL>(p, nt, stream);
    case DType::IQ4_XS:
      return launch_type<DType::IQ4_XS>(p, nt, stream);
    case DType::MXFP4:
      return launch_type<DType::MXFP4>(p, nt, stream);
    case DType::Q2_K:
      return launch_type<DType::Q2_K>(p, nt, stream);
    case DType::Q3_K:
      return launch_type<DType::Q3_K>(p, nt, stream);
    case DType::IQ2_XXS:
      return launch_type<DType::IQ2_XXS>(p, nt, stream);
    case DType::IQ2_XS:
      return launch_type<DType::IQ2_XS>(p, nt, stream);
    case DType::IQ2_S:
      return launch_type<DType::IQ2_S>(p, nt, stream);
    case DType::IQ3_XXS:
      return launch_type<DType::IQ3_XXS>(p, nt, stream);
    case DType::IQ3_S:
      return launch_type<DType::IQ3_S>(p, nt, stream);
    case DType::IQ1_S:
      return launch_type<DType::IQ1_S>(p, nt, stream);
    case DType::IQ1_M:
      return launch_type<DType::IQ1_M>(p, nt, stream);
    default:
      break;
  }
  return make_error(StatusCode::kUnsupported, "matvec: weight type {} is not supported", dtype_name(p.type));
}

}  // namespace detail

}  // namespace moeserve::cuda
