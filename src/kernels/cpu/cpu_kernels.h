// The CPU kernel table: one set of function pointers per SIMD level
// (reference C++, AVX2, AVX-512), chosen once at run time from CPUID.
//
// Every entry of every level computes the same function; tests run each SIMD
// level against the reference on random data. Callers use cpu_kernels() and
// never name an instruction set.
#pragma once

#include <cstdint>
#include <string_view>

#include "tensor/dtype.h"

namespace moeserve::cpu {

enum class SimdLevel { kReference = 0, kAvx2 = 1, kAvx512 = 2 };
std::string_view simd_level_name(SimdLevel level);

// Dot product of n elements: `w` is a row of weight type T, `x` a row of
// T's vec_dot_type (F32 for float weights, Q8_0 for Q8_0/Q4_0, Q8_K for
// K-quants). n is a multiple of the block size of both.
using VecDotFn = float (*)(int64_t n, const void* w, const void* x);

// Dots of one weight row with n_x activation rows at once (1 <= n_x <=
// kMaxDotColumns): out[i * out_stride] = vec_dot(n, w, x + i * x_stride),
// bit for bit — the row is decoded once for all columns.
constexpr int kMaxDotColumns = 8;
using VecDotColsFn = void (*)(int64_t n, const void* w, const void* x, size_t x_stride, int n_x, float* out,
                              int64_t out_stride);

// Dots of one packed group of kPackRows weight rows (packed_layout.h) with
// n_x activation rows (1 <= n_x <= kMaxDotColumns): out[c * out_stride + r]
// for row r of the group and column c. Each (row, column) result is computed
// by the same operations whatever n_x is, so batching never changes a bit.
using PackedDotFn = void (*)(int64_t n, const void* w, const void* x, size_t x_stride, int n_x, float* out,
                             int64_t out_stride);

// f32 activations -> an activation type (Q8_0 or Q8_K; F16 for the KV
// cache). n multiple of block.
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

// Attention of a block of queries over an f16 KV cache, one KV head group.
//   q:   [n_q][n_head_q_in_group][head_dim] f32 (rows of consecutive query heads
//        that share this KV head)
//   k,v: [n_kv][kv_stride] f16, this head's head_dim values at offset 0 of a row
//   out: same layout as q
//   out must not alias q (it is used as the accumulator).
// Query i sits at position p = q_pos0 + i and sees keys 0..p (causal), or all
// n_kv keys when causal is false. window > 0 additionally hides keys j with
// p - j >= window (sliding-window layers). A query that sees no key gets 0.
struct AttentionArgs {
  const float* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  float* out = nullptr;
  int64_t n_q = 0;             // query tokens
  int64_t n_heads = 1;         // query heads sharing this KV head (GQA group)
  int64_t q_head_stride = 0;   // floats between consecutive heads of one token
  int64_t q_token_stride = 0;  // floats between tokens (q and out)
  int64_t n_kv = 0;            // keys/values present
  int64_t kv_stride = 0;       // f16 elements between consecutive key (value) rows
  int64_t head_dim = 0;
  int64_t q_pos0 = 0;  // position of query 0 (for the causal mask)
  bool causal = true;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
  int64_t window = 0;  // 0: unlimited; else keys j with p - j < window
  // A draft tree's query (speculative decoding): the keys at positions
  // tree_base and after are not cache rows tree_base.. but the query's
  // ancestors, position tree_base + i being cache row tree_base + tree_path[i].
  // The keys are visited in position order either way, so a tree row gives
  // bit for bit what the same row gives after its path is in the cache.
  int64_t tree_base = INT64_MAX;
  const int32_t* tree_path = nullptr;
  // Paged KV (backend::KvView::block_table): cache row r is row
  // block_table[r >> block_shift] << block_shift | (r & mask) of k and v.
  // Null: row r is row r.
  const int32_t* block_table = nullptr;
  int block_shift = 0;
};

struct CpuKernels {
  SimdLevel level = SimdLevel::kReference;

  VecDotFn vec_dot[kDTypeSlots] = {};  // indexed by weight type
  // Multi-column vec_dot (indexed by weight type); null: call vec_dot per
  // column (vec_dot_columns() below does either).
  VecDotColsFn vec_dot_cols[kDTypeSlots] = {};
  // Packed row groups (indexed by weight type); null: no packed layout at
  // this level, weights stay row-major.
  PackedDotFn packed_dot[kDTypeSlots] = {};
  QuantizeRowFn quantize_row[kDTypeSlots] = {};  // indexed by target type (Q8_0, Q8_K, F16)
  // Dequantize a weight row to f32 (indexed by weight type).
  void (*dequantize_row[kDTypeSlots])(const void* src, float* dst, int64_t n) = {};

  // y = x * rsqrt(mean(x^2) + eps) * w   (w may be null: no scale). y may alias x.
  void (*rms_norm)(const float* x, const float* w, float* y, int64_t n, float eps) = nullptr;
  // NEOX rotate-half RoPE on the first n_rot (even) dims of one head vector,
  // in place: pair (x[i], x[i + n_rot/2]) is rotated by angle theta_i of this
  // position. cos_sin holds n_rot/2 cosines followed by n_rot/2 sines
  // (rope_table.h builds it), a layout that needs no shuffles in SIMD code.
  void (*rope_neox)(float* x, int64_t n_rot, const float* cos_sin) = nullptr;
  // In-place softmax; returns the max (for tests and online softmax users);
  // n == 0 returns -inf.
  float (*softmax)(float* x, int64_t n) = nullptr;
  // out[i] = silu(x[i]) ; out may alias x
  void (*silu)(const float* x, float* out, int64_t n) = nullptr;
  // out[i] = silu(gate[i]) * up[i] ; out may alias gate
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n) = nullptr;
  // Indices of the k largest values (ties: lower index first, NaN ranks below
  // everything), sorted by value descending. k <= n; if k > n the entries
  // past n are set to -1. n < 2^31.
  void (*top_k)(const float* x, int64_t n, int64_t k, int32_t* out_idx) = nullptr;
  void (*attention)(const AttentionArgs& args) = nullptr;
};

// out[i * out_stride] = vec_dot(w, x_i) for n_x columns (any n_x >= 0), in
// groups of kMaxDotColumns through vec_dot_cols where the level has it.
inline void vec_dot_columns(const CpuKernels& k, DType w_type, int64_t n, const void* w, const void* x,
                            size_t x_stride, int64_t n_x, float* out, int64_t out_stride) {
  const VecDotColsFn cols = k.vec_dot_cols[dtype_slot(w_type)];
  const auto* xb = static_cast<const uint8_t*>(x);
  if (cols == nullptr || n_x == 1) {
    const VecDotFn dot = k.vec_dot[dtype_slot(w_type)];
    for (int64_t i = 0; i < n_x; ++i) out[i * out_stride] = dot(n, w, xb + size_t(i) * x_stride);
    return;
  }
  for (int64_t i = 0; i < n_x; i += kMaxDotColumns) {
    const int m = int(n_x - i < kMaxDotColumns ? n_x - i : kMaxDotColumns);
    cols(n, w, xb + size_t(i) * x_stride, x_stride, m, out + i * out_stride, out_stride);
  }
}

// packed_dot over any number of columns (n_x >= 0), kMaxDotColumns at a time.
inline void packed_dot_columns(const CpuKernels& k, DType w_type, int64_t n, const void* w_group,
                               const void* x, size_t x_stride, int64_t n_x, float* out, int64_t out_stride) {
  const PackedDotFn dot = k.packed_dot[dtype_slot(w_type)];
  const auto* xb = static_cast<const uint8_t*>(x);
  for (int64_t i = 0; i < n_x; i += kMaxDotColumns) {
    const int m = int(n_x - i < kMaxDotColumns ? n_x - i : kMaxDotColumns);
    dot(n, w_group, xb + size_t(i) * x_stride, x_stride, m, out + i * out_stride, out_stride);
  }
}

// The best level this CPU supports (the environment variable MOESERVE_SIMD=
// reference|avx2|avx512 can only lower it, for debugging and benchmarks;
// avx512-novbmi keeps AVX-512 without its VBMI kernels).
const CpuKernels& cpu_kernels();
// The table of one level, or nullptr when this CPU cannot run it.
const CpuKernels* cpu_kernels_for(SimdLevel level);

}  // namespace moeserve::cpu
