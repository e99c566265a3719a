// Staging of quantized weight rows in shared memory for the tensor-core
// kernels (matvec_tc.cu, gemm_kq.cu): a row's chunk of one K-quant block (256
// columns; 8 blocks of Q8_0 or Q4_0) copied with 16-byte cp.async, at the
// offset its address has within 16 bytes, and the rows of a 16-row MMA tile.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/matmul_common.cuh"
#include "kernels/cuda/tc_decode.cuh"

namespace moeserve::cuda::detail {

// The 16 rows of a tile: rows 0..7 from `lo`, 8..15 from `hi` (kGateUp: gate
// and up rows first..first+7; otherwise one matrix, rows first..first+15).
// Rows past n_rows repeat the last (computed, never stored).
struct Rows {
  const uint8_t* lo;
  const uint8_t* hi;
  int64_t first, n_rows;
  size_t row_bytes;
  bool pairwise;  // kGateUp
  __device__ __forceinline__ int64_t index(int r) const { return first + (pairwise ? (r & 7) : r); }
  __device__ __forceinline__ const uint8_t* row(int r) const {
    return (pairwise && r >= 8 ? hi : lo) + min(index(r), n_rows - 1) * row_bytes;
  }
  // The matrix's last row: its bytes may end the allocation.
  __device__ __forceinline__ bool last(int r) const { return index(r) >= n_rows - 1; }
};

__device__ __forceinline__ int lead16(const uint8_t* p) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15u);
}

template <DType T>
constexpr int row_stage_bytes() {
  using Q = tcdec::Tc<T>;
  // The chunk plus, for 2-byte aligned rows, up to 14 bytes of lead and the
  // words read around a misaligned one; an odd multiple of 16 so that the 8
  // rows a warp reads at once fall in distinct banks.
  const int span = Q::kChunkBytes + (Q::kAligned ? 0 : 34);
  const int units = (span + 15) / 16;
  return 16 * (units % 2 == 1 ? units : units + 1);
}

// Copies `bytes` bytes from `start` (a chunk of one row) to `dst` (its staged
// row, the bytes at lead16(start)): 16-byte pieces half, half + 2, ... (the
// two lanes of a row split them) that never start past the chunk; a matrix's
// last row never has a piece read past its end (its tail: 2-byte loads).
template <DType T>
__device__ __forceinline__ void issue_row(const uint8_t* start, bool last, int bytes, uint8_t* dst,
                                          int half) {
  constexpr int kPieces = row_stage_bytes<T>() / 16;
  const int lead = lead16(start), end = lead + bytes;
  const uint8_t* src = start - lead;
#pragma unroll
  for (int i = 0; i < (kPieces + 1) / 2; ++i) {
    const int piece = 2 * i + half;
    const int n = end - 16 * piece;
    if (piece < kPieces && (n >= 16 || (n > 0 && !last))) cp_async16(dst + 16 * piece, src + 16 * piece);
  }
  if constexpr (!tcdec::Tc<T>::kAligned) {
    if (last && half == 0) {
      for (int b = max(end & ~15, lead); b < end; b += 2) {
        *reinterpret_cast<uint16_t*>(dst + b) = *reinterpret_cast<const uint16_t*>(src + b);
      }
    }
  }
}

}  // namespace moeserve::cuda::detail
