// Row-interleaved ("packed") layouts of K-quant weights for the CPU kernels.
//
// Why: a one-row dot product spends most of its instructions on per-row
// bookkeeping (unpacking that row's scales, one horizontal sum per row), and
// decode is then compute-bound on a small CPU instead of memory-bound. In the
// packed layout kPackRows = 16 consecutive rows are interleaved block by
// block so that one 512-bit register holds the same 4 bytes of all 16 rows:
// each SIMD lane is a row, the activations are broadcast, and the per-row
// scales and results are vectors — no horizontal sums at all.
//
// The packed matrix has exactly the bytes of the row-major one, only in a
// different order, so offsets of groups, experts and matrices are unchanged:
// rows [16g, 16g + 16) occupy bytes [g * 16 * row_bytes, (g + 1) * ...).
// Within a group, block b of the 16 rows is one packed block of
// 16 * block_bytes bytes at b * 16 * block_bytes:
//
//   Q4_K (2304 bytes):  d[16] f16 | dmin[16] f16 | scales as 3 planes of 16
//     dwords (plane p, lane r = bytes 4p..4p+3 of row r's 12 scale bytes) |
//     qs as 32 planes of 16 dwords (plane 8c + i, lane r = row r's
//     qs[32c + 4i .. 32c + 4i + 3]).
//   Q6_K (3360 bytes):  per half h = 0, 1 and quad i = 0..7, three planes
//     P0..P2 of 16 dwords: byte k of lane r of Pt holds, in bits 0..5, the
//     6-bit code of row r's element 128h + 32t + 4i + k, and in bits 6..7
//     bits 2t..2t+1 of the code of element 128h + 96 + 4i + k |
//     scales as 16 rows of 16 bytes (byte r of row s = lane r's scales[s]) |
//     d[16] f16.
//
// A plane is 64 bytes: one aligned-size load per register. Q4_K is a pure
// byte rearrangement; Q6_K regroups the bits of its codes (the 6-bit codes
// whole in one byte take 3 AVX-512 ops fewer per 4 code vectors than the
// nibble + 2-bit split). Either way every bit is kept.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "tensor/dtype.h"

namespace moeserve::cpu {

inline constexpr int kPackRows = 16;

// Types with a packed layout (the kernels of a SIMD level may still lack it:
// see CpuKernels::packed_dot).
bool has_packed_layout(DType type);

// Rearranges n_rows rows (a multiple of kPackRows) of n_cols elements from
// row-major `src` (rows src_row_stride bytes apart) into `dst` (packed, rows
// dtype_row_bytes(type, n_cols) apart). Every bit is kept: unpack_rows()
// restores the original exactly, whatever the bytes. type must have a packed layout.
void pack_rows(DType type, const void* src, size_t src_row_stride, void* dst, int64_t n_rows, int64_t n_cols);
void unpack_rows(DType type, const void* src, void* dst, int64_t n_rows, int64_t n_cols);

// Plain scalar PackedDotFn for a type with a packed layout: the definition
// the SIMD kernels must match bit for bit (tests). Not in any kernel table —
// a level without SIMD packed kernels keeps its weights row-major.
PackedDotFn packed_dot_reference(DType type);

}  // namespace moeserve::cpu
