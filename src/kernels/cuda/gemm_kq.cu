// Products of K-quant weights (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K), IQ4_XS and the
// codebook i-quants on
// integer tensor cores, with the CPU's own arithmetic (each type's block
// math: kq_blocks.cuh): prefill (gemm, the grouped expert products)
// and the expert products of decode batches. The activations are quantized
// to Q8_K (tensor/quantize.h: per 256 columns d = m / -127, m the value of
// largest |x|, codes rounded to nearest even), each scale group's code
// products are summed exactly in int32 by the MMA (m16n8k32 s8 for the
// 32-column groups of Q4_K/Q5_K/IQ4_XS, m16n8k16 for the 16-column groups
// of Q6_K/Q3_K/Q2_K), the
// groups' sums are scaled by the integer scales in int32, the K-quant mins
// (sum of m_G times the activations' group sums) are one more pair of MMAs,
// and each 256-column block's float result is formed and added in f32
// exactly as the CPU reference's vec_dot does it (kernels/cpu/ref/
// quant_ref.cpp, quant_ref_lowbit.cpp: the same operations in the same
// order, no contraction). A
// row's result is bit for bit what the reference CPU kernels give; the
// accuracy is that of Q8_K activations (~6e-3 relative on random data, as
// the CPU path and llama.cpp's).
// The codebook i-quants (IQ2_XXS..IQ1_M) take the same kernel with their
// grid codes as int8 (kq_blocks_iquants.cuh): expert products at 8 tokens
// 3-4.6x faster than on matvec.cu. Their CPU reference dequantizes to
// floats first, so they agree with it to Q8_K's accuracy, not bit for bit
// (gemm_kq_matches_cpu).
//
// Why (H100, 30b-a3b shapes): the f16 kernel (gemm.cu) decodes every weight
// to a scaled f16 value and multiplies 16x16x16 f16 tiles; with 32 pairs an
// expert (a 512-token prefill of 128 experts, 8 used) its gate/up + down ran
// in 782 us, here 464 us; a dense 512 x 4096 -> 4096 Q4_K product 121 ->
// 167 TFLOP/s. Here a weight is 4 (6) bits turned into a byte by a shift and
// a mask, an MMA does 32 columns, and the scales are applied once a group to
// 4 int32 sums. At decode batches the expert products read their weights at
// 1.0-1.8 TB/s against 0.5-0.9 for the exact kernel (matvec_tc.cu): 1 token
// 26.6 us against 33.0, 8 tokens 110 against 278, 16 tokens 155 against 814.
//
// Work: a CTA owns 16 weight rows a warp (kGateUp: 8 gate rows and the same
// 8 up rows, so a thread holds gate and up of the same outputs) and up to
// kBn tokens (pairs of one expert): 8 warps and 32 tokens for prefill, 4
// warps and 8 or 16 tokens for decode batches. K goes in 256-column blocks
// through a 2-4 stage cp.async pipeline: each warp copies its own rows'
// block (tc_stage.cuh) and the CTA the block's Q8_K activation rows, which
// a kernel before wrote to the caller's scratch (quantize_q8k_kernel, once
// for every CTA); decode batches of up to 8 tokens quantize their rows in
// each CTA instead (one launch less).
// A token's result depends only on its own activation row and the weights:
// not on the other rows of its tile, the tile size or the batch.
// Split K: the dense products of a decode batch (17-64 rows: k, v, q and the
// output projection of 32 sequences) make few CTAs, and each one's walk
// along K through its pipeline is what bounds them (30b-a3b's k product:
// 16 us for 0.6 MB in 8 CTAs). Then each CTA takes one 256-column block
// (grid.z) and writes that block's float result; kq_reduce_kernel adds a
// row's blocks in block order from 0, the same additions the whole walk
// makes, so the bits do not change.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kq_blocks_iquants.cuh"
#include "kernels/cuda/kq_quantize.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/matmul_detail.h"
#include "kernels/cuda/tc_stage.cuh"

namespace moeserve::cuda::detail {
namespace {

using kq::kQ8Bytes;
using kq::kQ8D;
using kq::kQ8Pieces;
using kq::kQ8SumHi;
using kq::kQ8SumLo;
using kq::quantize_block;

// ---- Q8_K activation rows (scratch) -------------------------------------------
// Row r's 256-column block b at scratch + (r * n_blocks + b) * kQ8Bytes, in
// kq_blocks.cuh's layout. A CTA stages a block's rows whole (19 16-byte
// pieces).

// One warp a (row, block).
__global__ void __launch_bounds__(256)
    quantize_q8k_kernel(const float* x, int64_t x_stride, int64_t n_rows, int64_t n_blocks, uint8_t* out) {
  grid_dependency_wait();  // launch.cuh: x is written by the kernel before
  allow_dependents();
  const int lane = int(threadIdx.x) & 31;
  const int64_t unit = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (unit >= n_rows * n_blocks) return;
  const int64_t row = unit / n_blocks, b = unit % n_blocks;
  const float4* src = reinterpret_cast<const float4*>(x + row * x_stride + b * 256 + 8 * lane);
  const float4 lo = __ldg(src), hi = __ldg(src + 1);
  const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  quantize_block(v, lane, out + unit * kQ8Bytes);
}

// ---- the product kernel -------------------------------------------------------

// A CTA: kWarps warps, one 16-row MMA tile of weights each, and kBn tokens.
template <DType T, int kBn, int kWarps>
struct KqStage {
  uint8_t w[16 * kWarps][row_stage_bytes<T>()];
  uint8_t x[kBn][kQ8Bytes];
};
// Stages in flight: three where two CTAs an SM still fit (Q4_K, Q5_K), four
// for the small CTAs of decode batches (more bytes in flight an SM).
template <DType T, int kBn>
inline constexpr int kStagesOf = kBn <= 8           ? 4
                                 : T == DType::Q6_K ? 2
                                                    : 3;

// Decode batches of up to 8 tokens (kInline; rows of at most kInlineBlocks
// blocks) quantize their few activation rows in each CTA, into shared memory
// after the stages, instead of a launch before: one kernel boundary less.
constexpr int kInlineBlocks = 8;

template <DType T, int kBn, int kWarps, bool kInline>
__global__ void __launch_bounds__(32 * kWarps, 2) gemm_kq_kernel(const MmProblem p) {
  constexpr int kNt = kBn / 8;  // MMA N tiles (8 tokens each)
  constexpr int kStages = kStagesOf<T, kBn>;
  constexpr int kThreads = 32 * kWarps, kCtaRows = 16 * kWarps;
  using Q = tcdec::Tc<T>;
  using Stage = KqStage<T, kBn, kWarps>;
  extern __shared__ __align__(16) uint8_t kq_smem[];
  Stage* const st = reinterpret_cast<Stage*>(kq_smem);
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, j = lane & 3;
  const bool gate_up = p.mode == MmMode::kGateUp;

  // ---- the CTA's tokens, rows and blocks
  const bool split = p.partials != nullptr;  // dense only: one block a CTA
  int64_t m0 = 0, begin = 0, expert = 0;
  int cnt;
  if (p.mode != MmMode::kDense) {
    grid_dependency_wait();  // launch.cuh: the groups are written by the kernels before
    const Slot s = find_slot(p.offsets, p.n_expert, kBn, blockIdx.x, lane);
    if (s.count == 0) return;  // the same answer in every warp
    begin = s.begin, expert = s.expert, cnt = s.count;
  } else {
    m0 = int64_t(blockIdx.x) * kBn;
    cnt = int(min(int64_t(kBn), p.n_tokens - m0));
  }
  Rows rows;
  rows.lo = p.w0 + expert * p.matrix_stride;
  rows.hi = gate_up ? p.w1 + expert * p.matrix_stride : rows.lo;
  rows.n_rows = p.n_rows, rows.row_bytes = p.row_bytes, rows.pairwise = gate_up;
  rows.first = int64_t(blockIdx.y) * (gate_up ? kCtaRows / 2 : kCtaRows) + warp * (gate_up ? 8 : 16);

  // This lane copies half of row cp_r of its warp's tile; it reads rows g, g + 8.
  const int cp_r = lane >> 1, cp_half = lane & 1;
  const uint8_t* const cp_row = rows.row(cp_r);
  const bool cp_last = rows.last(cp_r);
  const uint8_t* const row_g = rows.row(g);
  const uint8_t* const row_g8 = rows.row(g + 8);
  const int64_t n_blocks = p.n_cols / 256;
  const int64_t b_begin = split ? int64_t(blockIdx.z) : 0, b_end = split ? b_begin + 1 : n_blocks;
  const uint8_t* const q8 = static_cast<const uint8_t*>(p.scratch);
  // Scratch row of token t of the tile (t < cnt).
  auto x_row = [&](int t) -> int64_t {
    return p.mode == MmMode::kDense ? m0 + t : int64_t(__ldg(p.pairs + begin + t)) / p.x_row_div;
  };
  auto issue_weights = [&](int64_t b) {
    issue_row<T>(cp_row + b * Q::kBlockBytes, cp_last, Q::kBlockBytes,
                 &st[b % kStages].w[16 * warp + cp_r][0], cp_half);
  };
  uint8_t* const x_all = kq_smem + kStages * sizeof(Stage);  // kInline: [block][token][kQ8Bytes]
  auto issue_x = [&](int64_t b) {
    if constexpr (!kInline) {
      for (int i = tid; i < cnt * kQ8Pieces; i += kThreads) {
        const int t = i / kQ8Pieces, piece = i % kQ8Pieces;
        cp_async16(&st[b % kStages].x[t][16 * piece], q8 + (x_row(t) * n_blocks + b) * kQ8Bytes + 16 * piece);
      }
    }
  };
  // Weights first (they do not depend on the kernels before), then the activations.
  for (int s = 0; s < kStages - 1; ++s) {
    if (b_begin + s < b_end) issue_weights(b_begin + s);
  }
  if (p.mode == MmMode::kDense) grid_dependency_wait();
  allow_dependents();
  for (int s = 0; s < kStages - 1; ++s) {
    if (b_begin + s < b_end) issue_x(b_begin + s);
    cp_async_commit();
  }
  if constexpr (kInline) {  // visible after the first barrier below
    const int units = cnt * int(n_blocks);
    for (int u = warp; u < units; u += kWarps) {
      const int t = u / int(n_blocks), b = u % int(n_blocks);
      const float4* src = reinterpret_cast<const float4*>(p.x + x_row(t) * p.x_stride + b * 256 + 8 * lane);
      const float4 lo = __ldg(src), hi = __ldg(src + 1);
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      quantize_block(v, lane, x_all + (b * kBn + t) * kQ8Bytes);
    }
  }

  float acc[kNt][4];
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  for (int64_t b = b_begin; b < b_end; ++b) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block b's copies are visible; every warp is done with block b - 1
    if (b + kStages - 1 < b_end) {
      issue_weights(b + kStages - 1);
      issue_x(b + kStages - 1);
    }
    cp_async_commit();

    const Stage& sb = st[b % kStages];
    const uint8_t* const xb = kInline ? x_all + b * kBn * kQ8Bytes : &sb.x[0][0];
    auto xr = [&](int t) { return xb + t * kQ8Bytes; };
    const uint8_t* rg = &sb.w[16 * warp + g][0] + lead16(row_g + b * Q::kBlockBytes);
    const uint8_t* rg8 = &sb.w[16 * warp + g + 8][0] + lead16(row_g8 + b * Q::kBlockBytes);
    kq::Block<T>::template dot<kNt>(rg, rg8, xr, g, j, acc);
  }

  // ---- outputs: rows g and g + 8 of the warp's tile, tokens 8nt + 2j, + 1
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 8 * nt + 2 * j + h;
      if (t >= cnt) continue;
      const int64_t out_row = p.mode == MmMode::kDense ? m0 + t : int64_t(__ldg(p.pairs + begin + t));
      float* y =
          split ? p.partials + (b_begin * p.n_tokens + out_row) * p.n_rows : p.y + out_row * p.y_stride;
      if (gate_up) {
        const int64_t f = rows.index(g);
        if (f < p.n_rows) y[f] = silu(acc[nt][h]) * acc[nt][2 + h];
      } else {
        const int64_t r0 = rows.index(g), r8 = rows.index(g + 8);
        if (r0 < p.n_rows) y[r0] = acc[nt][h];
        if (r8 < p.n_rows) y[r8] = acc[nt][2 + h];
      }
    }
  }
}

// A split product's rows: y = the blocks' results added in block order from 0.
__global__ void __launch_bounds__(256) kq_reduce_kernel(const MmProblem p) {
  grid_dependency_wait();  // launch.cuh: the partials are written by the kernel before
  allow_dependents();
  const int64_t t = blockIdx.y, r = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (r >= p.n_rows) return;
  const int64_t n_blocks = p.n_cols / 256, stride = p.n_tokens * p.n_rows;
  const float* src = p.partials + t * p.n_rows + r;
  float acc = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b) acc = __fadd_rn(acc, src[b * stride]);
  p.y[t * p.y_stride + r] = acc;
}

// ---- host side ----------------------------------------------------------------

constexpr int kMaxDevices = 64;

// The activation rows quantized once for every CTA, into the scratch.
Status quantize_into_scratch(const MmProblem& p, cudaStream_t stream) {
  const int64_t x_rows = p.mode == MmMode::kDown ? p.n_pairs : p.n_tokens;
  const size_t need = gemm_kq_scratch_bytes(x_rows, p.n_cols);
  if (p.scratch == nullptr || p.scratch_bytes < need || reinterpret_cast<uintptr_t>(p.scratch) % 16 != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "gemm ({}): needs {} bytes of 16-byte aligned scratch for the Q8_K activations, got {}",
                      dtype_name(p.type), need, p.scratch == nullptr ? 0 : p.scratch_bytes);
  }
  const int64_t units = x_rows * (p.n_cols / 256);
  if ((units + 7) / 8 > int64_t(INT32_MAX)) {
    return make_error(StatusCode::kInvalidArgument, "gemm: {} activation rows is too many", x_rows);
  }
  detail::launch(quantize_q8k_kernel, dim3(unsigned((units + 7) / 8)), 256, 0, stream, p.x, p.x_stride,
                 x_rows, p.n_cols / 256, static_cast<uint8_t*>(p.scratch));
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "gemm: Q8_K launch failed: {}", cudaGetErrorString(err));
  }
  return Status::ok();
}

template <DType T, int kBn, int kWarps, bool kInline = false>
Status launch_kq(const MmProblem& p, int64_t n_slots, cudaStream_t stream, int64_t splits = 1) {
  if constexpr (!kInline) MOESERVE_RETURN_IF_ERROR(quantize_into_scratch(p, stream));
  constexpr size_t bytes = sizeof(KqStage<T, kBn, kWarps>) * kStagesOf<T, kBn> +
                           (kInline ? size_t(kInlineBlocks) * kBn * kQ8Bytes : 0);
  const int64_t rows_per_cta = p.mode == MmMode::kGateUp ? 8 * kWarps : 16 * kWarps;
  const int64_t row_tiles = (p.n_rows + rows_per_cta - 1) / rows_per_cta;
  if (row_tiles > 65535 || n_slots > int64_t(INT32_MAX)) {
    return make_error(StatusCode::kInvalidArgument, "gemm: {} rows x {} tiles is too many", p.n_rows,
                      n_slots);
  }
  const dim3 grid{unsigned(n_slots), unsigned(row_tiles), unsigned(splits)};
  static std::atomic<bool> opted[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess && (dev < 0 || dev >= kMaxDevices || !opted[dev].load(std::memory_order_acquire))) {
    err = cudaFuncSetAttribute(gemm_kq_kernel<T, kBn, kWarps, kInline>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (err == cudaSuccess && dev >= 0 && dev < kMaxDevices)
      opted[dev].store(true, std::memory_order_release);
  }
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "gemm ({}): {} bytes of shared memory: {}", dtype_name(T), bytes,
                      cudaGetErrorString(err));
  }
  detail::launch(gemm_kq_kernel<T, kBn, kWarps, kInline>, grid, 32 * kWarps, bytes, stream, p);
  if (p.partials != nullptr) {
    const dim3 reduce_grid{unsigned((p.n_rows + 255) / 256), unsigned(p.n_tokens), 1u};
    detail::launch(kq_reduce_kernel, reduce_grid, 256, 0, stream, p);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "gemm ({}): launch failed: {}", dtype_name(T),
                      cudaGetErrorString(err));
  }
  return Status::ok();
}

int sm_count_of_device() {
  static std::atomic<int> counts[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 132;
  int n = counts[dev].load(std::memory_order_relaxed);
  if (n == 0 && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) {
    counts[dev].store(n, std::memory_order_relaxed);
  }
  return n > 0 ? n : 132;
}

// Whether a dense product splits K (header): decode batches of 17-64 rows
// whose 16-token tiles of 128 rows leave more than half the SMs idle.
// MOESERVE_CUDA_KQ_SPLIT=0 keeps the whole walk (comparisons).
bool dense_splits_k(int64_t n_tokens, int64_t n_rows, int64_t n_cols) {
  static const bool off = [] {
    const char* v = std::getenv("MOESERVE_CUDA_KQ_SPLIT");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  if (off || n_tokens <= 16 || n_tokens > 64 || n_cols / 256 < 2) return false;
  const int64_t ctas = (n_tokens + 15) / 16 * ((n_rows + 127) / 128);
  return 2 * ctas <= sm_count_of_device();
}

// The partials' place in the scratch: after the Q8_K rows, 256-byte aligned.
size_t split_offset(int64_t n_tokens, int64_t n_cols) {
  return (gemm_kq_scratch_bytes(n_tokens, n_cols) + 255) / 256 * 256;
}

// MOESERVE_CUDA_KQ_POLICY=legacy: expert tiles by token count (comparisons).
bool legacy_tiles() {
  static const bool legacy = [] {
    const char* v = std::getenv("MOESERVE_CUDA_KQ_POLICY");
    return v != nullptr && std::strcmp(v, "legacy") == 0;
  }();
  return legacy;
}

// Tokens an expert's tile takes in a decode batch. Up to 8 tokens, 8 (the
// activations quantized in each CTA); then 16 until experts have 8 pairs on
// average (n_pairs / n_expert under even routing), 32 past that. H200,
// 30b-a3b (8 layers, 128 experts, top-8), aggregate tok/s by tile at 32 /
// 64 / 128 sequences: 32-token tiles (the token count chose them before)
// 10,252 / 16,088 / 25,922; 16: 11,208 / 17,947 / 27,801; 8-token tiles at
// 32 sequences 9,880 (each of the many CTAs quantizing its tokens again). A
// pair's result is the same in any tile. MOESERVE_CUDA_KQ_EXPERT_BN=8|16|32
// fixes it, MOESERVE_CUDA_KQ_POLICY=legacy takes the token count's tile
// (comparisons).
int64_t expert_tile_tokens(const MmProblem& p) {
  static const int64_t fixed = [] {
    const char* v = std::getenv("MOESERVE_CUDA_KQ_EXPERT_BN");
    const int64_t n = v == nullptr ? 0 : std::atoll(v);
    return n == 8 || n == 16 || n == 32 ? n : int64_t(0);
  }();
  if (fixed > 0) return fixed;
  if (p.n_tokens <= 8) return 8;
  if (legacy_tiles()) return p.n_tokens <= 16 ? 16 : 32;
  const int64_t mean = (p.n_pairs + p.n_expert - 1) / std::max<int64_t>(p.n_expert, 1);
  return mean <= 8 ? 16 : 32;
}

template <DType T>
Status launch_kq_type(const MmProblem& p, cudaStream_t stream) {
  if (p.mode == MmMode::kDense) {
    // Decode batches of large products (matmul.h: integer_dense_decode, an
    // LM head): 16-token tiles of 64 rows, whatever the token count. Small
    // tiles keep more CTAs an SM streaming weights (H200, the 2048 x 151936
    // Q6_K head: 16 tokens 151 us in these, 8 tokens 240 us in 8-token
    // tiles of four stages); a token's bits are the same in every tile.
    if (p.n_tokens <= 16) return launch_kq<T, 16, 4>(p, 1, stream);
    if (dense_splits_k(p.n_tokens, p.n_rows, p.n_cols) &&
        p.scratch_bytes >= gemm_kq_scratch_bytes(p.n_tokens, p.n_cols) +
                               gemm_kq_split_bytes(p.n_tokens, p.n_rows, p.n_cols)) {
      MmProblem split = p;
      split.partials =
          reinterpret_cast<float*>(static_cast<uint8_t*>(p.scratch) + split_offset(p.n_tokens, p.n_cols));
      return launch_kq<T, 16, 8>(split, (p.n_tokens + 15) / 16, stream, p.n_cols / 256);
    }
    // 32 tokens a CTA, 16 where that leaves SMs idle (k/v products of a
    // 512-token prompt: 4 row tiles of 128). (Smaller CTAs of 1-2 warps
    // for the small products of a 32-row decode batch measured slower on an
    // H200: 30b-a3b's k product 21 us in 32 one-warp CTAs against 16 us in
    // 8 of 8 warps; each CTA's walk along K is the bound, not the SMs.)
    const int64_t ctas32 = ((p.n_tokens + 31) / 32) * ((p.n_rows + 127) / 128);
    if (ctas32 < int64_t(sm_count_of_device())) return launch_kq<T, 16, 8>(p, (p.n_tokens + 15) / 16, stream);
    return launch_kq<T, 32, 8>(p, (p.n_tokens + 31) / 32, stream);
  }
  if (kq_vec_takes(p)) return launch_kq_vec(p, stream);  // one token: kq_vec.cu, the same bits
  // Tiles of bn pairs an expert: at most n_pairs / bn full ones plus one
  // partial per non-empty expert; CTAs past the real count exit. Decode
  // tiles (8 or 16 pairs) take 64 weight rows a CTA (8 experts x 2048 rows:
  // 256 CTAs, not 128).
  const int64_t bn = expert_tile_tokens(p);
  const int64_t slots = p.n_pairs / bn + std::min(p.n_expert, p.n_pairs) + 1;
  static const bool inline_ok = [] {  // MOESERVE_CUDA_KQ_INLINE=0: always the launch before (comparisons)
    const char* v = std::getenv("MOESERVE_CUDA_KQ_INLINE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  // (16 tokens quantized in every CTA measured slower than the launch.)
  if (inline_ok && bn == 8 && p.n_cols / 256 <= kInlineBlocks)
    return launch_kq<T, 8, 4, true>(p, slots, stream);
  if (bn == 8) return launch_kq<T, 8, 4>(p, slots, stream);
  if (bn == 16) return launch_kq<T, 16, 4>(p, slots, stream);
  return launch_kq<T, 32, 8>(p, slots, stream);
}

}  // namespace

bool gemm_kq_type(DType t) {
  if (!kq::kq_type(t)) return false;
  // MOESERVE_CUDA_KQ_GEMM=0: the f16 kernel of gemm.cu (for comparisons).
  static const bool enabled = [] {
    const char* v = std::getenv("MOESERVE_CUDA_KQ_GEMM");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

bool gemm_kq_matches_cpu(DType t) { return gemm_kq_type(t) && kq::kq_cpu_exact_type(t); }

size_t gemm_kq_scratch_bytes(int64_t n_rows, int64_t n_cols) {
  return size_t(std::max<int64_t>(n_rows, 0)) * size_t(std::max<int64_t>(n_cols, 0) / 256) * kQ8Bytes;
}

size_t gemm_kq_split_bytes(int64_t n_tokens, int64_t n_rows, int64_t n_cols) {
  if (!dense_splits_k(n_tokens, n_rows, n_cols)) return 0;
  const size_t partials = size_t(n_cols / 256) * size_t(n_tokens) * size_t(n_rows) * sizeof(float);
  return split_offset(n_tokens, n_cols) - gemm_kq_scratch_bytes(n_tokens, n_cols) + partials;
}

Status launch_gemm_kq(const MmProblem& p, cudaStream_t stream) {
  if (p.n_cols % 256 != 0) {
    return make_error(StatusCode::kInvalidArgument, "gemm: {} columns is not a multiple of 256", p.n_cols);
  }
  return kq::dispatch_type(p.type, "gemm_kq",
                           [&](auto type) { return launch_kq_type<decltype(type)::value>(p, stream); });
}

}  // namespace moeserve::cuda::detail
