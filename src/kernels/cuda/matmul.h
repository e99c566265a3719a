// Quantized matrix products on the GPU, reading weights as stored in the GGUF
// (no dequantized copy): every weight type the project reads (F32, F16, BF16,
// Q8_0, Q4_0, Q4_K, Q5_K, Q6_K). Activations are f32 rows in device memory.
// All functions only enqueue work on `stream` and return launch errors.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "tensor/dtype.h"

namespace moeserve::cuda {

// y[t][r] = dot(W row r, x[t]) for t < n_tokens, r < n_rows.
// W: n_rows rows of n_cols elements of w_type, row r at w + r * row_bytes.
//
// Contract of every function here (checked; kInvalidArgument otherwise,
// kUnsupported for Q8_K weights):
//  - n_cols a multiple of the type's block (32 or 256; 16 for F32/F16/BF16);
//  - w 16-byte aligned; row_bytes >= the row's size and a multiple of 16
//    (F32, F16, BF16, Q4_K, Q5_K) or of 2 (Q8_0, Q4_0, Q6_K: GGUF rows of
//    these need not be 16-byte aligned);
//  - activation rows 16-byte aligned, their stride a multiple of 4 floats.
// Weight bytes are read as stored (no dequantized copy), never past the
// last byte of a row. Outputs are written, never read.
// Numerics: matvec sums exactly decoded weights times x in f32 (relative
// error ~1e-7 of the f64 result); matvec_multi and the decode expert
// products of quantized weights take exact integer codes on tensor cores and
// x as an exact sum of three bf16 terms, each scale group's sum scaled and
// added in f32 (the same ~1e-7);
// gemm multiplies on tensor cores, accumulating in f32: F16 and BF16
// weights are exact operands and x enters as 2 f16 (3 bf16) terms that
// carry all its bits (~1.5e-7); K-quant weights (Q2_K..Q6_K) and IQ4_XS take
// the CPU's arithmetic: x quantized to Q8_K, integer block sums, bit for
// bit the reference CPU kernels (Q8_K's accuracy, ~6e-3 on random data;
// gemm_kq.cu), and the codebook i-quants the same integer arithmetic (their
// CPU reference dequantizes first: equal to it to Q8_K's accuracy); the
// other types (F32, Q8_0, Q4_0) are rounded to f16, and x
// once too (~3e-4; gemm.cu).
// Both are deterministic,
// and a token's row of y does not depend on the other tokens of the batch
// (nor, in gemm, on its position in it): each output is one fixed-order sum.
struct MatmulArgs {
  const void* w = nullptr;
  DType w_type = DType::F32;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  size_t row_bytes = 0;
  const float* x = nullptr;  // [n_tokens][x_stride], n_cols used
  int64_t x_stride = 0;      // elements
  int64_t n_tokens = 0;
  float* y = nullptr;    // [n_tokens][y_stride], n_rows written
  int64_t y_stride = 0;  // elements
  // Device scratch for gemm(): at least gemm_scratch_bytes(w_type, n_tokens,
  // n_cols) bytes, 16-byte aligned (the Q8_K rows of K-quant products);
  // unused by the matrix x vector paths.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

// Scratch a gemm() over `n_rows` activation rows of `n_cols` needs (0 for
// the weight types that convert nothing ahead).
size_t gemm_scratch_bytes(DType w_type, int64_t n_rows, int64_t n_cols);
// What a dense product's gemm() can use: the above, plus the per-block
// results of a K-quant decode batch (17-64 rows) that splits K over more
// CTAs (gemm_kq.cu; same bits). With less it runs unsplit.
size_t gemm_scratch_bytes(const MatmulArgs& a);

// Rows up to which matmul() takes the matrix x vector path (the weight
// types integer_dense_decode() leaves there).
inline constexpr int64_t kMatvecMaxTokens = 16;

// Whether matmul() takes the integer kernel of gemm_kq.cu (Q8_K
// activations, the CPU's arithmetic) at every token count: K-quant (and
// IQ4_XS) products of at least kIntegerDecodeMinWeights weights (LM heads,
// the FFNs of large dense models); not the codebook i-quants, whose grid
// lookups make that kernel slower than the f32 one at one token. At decode
// batches (2..16 rows: batched decode, a verify)
// the f32 matrix x vector kernels pay an FMA and an activation load per
// weight and token; the integer kernel reads each weight once into an MMA
// (H200, the 2048 x 151936 Q6_K LM head: 1 / 8 / 16 tokens 139 / 422 / 961
// us on the f32 kernel, 147 / 159 / 151 us here). Smaller products stay on
// the f32 kernels: there the integer kernel's sequential K loop costs more
// than it saves at one token (the 4096 -> 2048 output projection 9.9 us
// against 5.1; 16 tokens 14.5 against 46). One kernel for every count keeps
// a token's result independent of the batch (decode == verify == prefill,
// bit for bit, and equal to the CPU's). MOESERVE_CUDA_DENSE_DECODE=exact
// keeps 1..16 tokens on the f32 kernels (comparisons).
inline constexpr int64_t kIntegerDecodeMinWeights = int64_t(1) << 26;
bool integer_dense_decode(DType w_type, int64_t n_rows, int64_t n_cols);

// The matrix x vector kernels (decode, batched decode, verify): n_tokens in
// 1..kMatvecMaxTokens. Each output element is reduced in an order that does
// not depend on n_tokens, so a token's row is bit-identical whatever else
// is in the batch.
Status matvec(const MatmulArgs& a, cudaStream_t stream);
// Any n_tokens, each token's row bit-identical to what matvec() gives it
// (products whose rows must not depend on how a batch was cut: the F32
// router). F32 weights take one launch for all tokens, the other types one
// matvec() per 16 tokens.
Status matvec_rows(const MatmulArgs& a, cudaStream_t stream);
// Several matrix x vector products sharing one input (an attention layer's
// q, k and v): products[i] must all have the same x, x_stride, n_tokens
// (1..kMatvecMaxTokens) and n_cols; each has its own weights (any type) and
// output. The quantized products of one type run as one launch (up to 4
// matrices) of the tensor-core kernels that the expert products use
// (matvec_tc.cu); float ones as matvec(). Same accuracy as matvec() (~1e-7
// relative) but not the same bits: call it for a product always or never.
// A token's row does not depend on n_tokens or on the other products.
Status matvec_multi(const MatmulArgs* products, int n_products, cudaStream_t stream);
// Prefill: any n_tokens, tensor cores on weight tiles dequantized in shared
// memory (f16 operands, bf16 for BF16 weights; f32 accumulation; precision
// by weight type as above).
Status gemm(const MatmulArgs& a, cudaStream_t stream);
// matvec() for n_tokens <= kMatvecMaxTokens, else gemm().
Status matmul(const MatmulArgs& a, cudaStream_t stream);

// ---- grouped expert products (MoE) ---------------------------------------
// Expert products: K-quant weights take gemm's integer kernels at every
// batch size (Q8_K activations, the CPU's arithmetic: decode, batched decode
// and prefill alike; MOESERVE_CUDA_EXPERT_DECODE=tc puts decode batches on
// the exact matvec kernels instead); the other types run the matvec kernels
// for decode batches (n_tokens <= kMatvecMaxTokens; all of an expert's pairs
// in one pass over its rows) and the gemm kernels for larger ones. A pair's
// result never depends on the other pairs of its expert.
// Grids are sized from n_tokens * n_used and n_expert (the groups stay on
// the device); blocks without work exit at once. gate and up must share
// type, shape and layout; matrix_stride follows the row_bytes rule above.
//
// The (token, slot) pairs of one layer, grouped by expert on the device
// (see moe.h: route_and_group): pairs_by_expert lists pair ids (token *
// n_used + slot) expert by expert, expert e owning entries
// [expert_offsets[e], expert_offsets[e + 1]).
struct ExpertGroups {
  const int32_t* pairs_by_expert = nullptr;  // [n_tokens * n_used]
  const int32_t* expert_offsets = nullptr;   // [n_expert + 1]
  int64_t n_expert = 0;
  int64_t n_used = 0;  // slots per token (top-k)
  int64_t n_tokens = 0;
  // The matvec kernels at any n_tokens (a speculative verify's rows): each
  // pair then gets the bits a decode step's pair gets.
  bool decode_kernels = false;
};

// Whether a grouped product of this weight type gives a pair the same bits
// at every n_tokens (gemm_kq.cu's integer kernel: the K-quants, IQ4_XS and
// the codebook i-quants, decode and prefill alike); the other types round
// differently above kMatvecMaxTokens.
bool expert_kernel_ignores_batch(DType type);

// A stack of n_expert matrices, matrix e at w + e * matrix_stride.
struct ExpertWeights {
  const void* w = nullptr;
  DType type = DType::F32;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  size_t row_bytes = 0;
  size_t matrix_stride = 0;
};

// h[pair][f] = silu(dot(gate_e row f, x[token])) * dot(up_e row f, x[token])
// for every pair, e its expert: gate and up read in one pass, SwiGLU fused.
struct ExpertGateUpArgs {
  ExpertWeights gate, up;  // each n_ff rows of n_embd
  ExpertGroups groups;
  const float* x = nullptr;  // [n_tokens][n_embd]
  float* h = nullptr;        // [n_tokens * n_used][n_ff]
  // gemm_scratch_bytes(type, n_tokens, n_embd) bytes (see MatmulArgs; the
  // K-quant kernels need it at every batch size).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};
Status expert_gate_up(const ExpertGateUpArgs& a, cudaStream_t stream);

// y[pair][r] = dot(down_e row r, h[pair]) for every pair (unweighted; the
// weighted combine is moe.h's combine_experts, in a fixed slot order).
struct ExpertDownArgs {
  ExpertWeights down;  // n_embd rows of n_ff
  ExpertGroups groups;
  const float* h = nullptr;  // [n_tokens * n_used][n_ff]
  float* y = nullptr;        // [n_tokens * n_used][n_embd]
  // gemm_scratch_bytes(type, n_tokens * n_used, n_ff) bytes.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};
Status expert_down(const ExpertDownArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda
