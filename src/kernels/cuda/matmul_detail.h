// Internal to the matrix-product kernels (matvec.cu, gemm.cu,
// expert_matmul.cu): one problem description for the dense product and the
// two grouped expert products, so each kernel family has one kernel per
// weight type whose mode is a run-time (block-uniform) switch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "tensor/dtype.h"

namespace moeserve::cuda::detail {

enum class MmMode : int {
  kDense,   // y[t][r] = W[r] . x[t]
  kGateUp,  // h[p][f] = silu(G_e[f] . x[tok(p)]) * (U_e[f] . x[tok(p)])
  kDown,    // y[p][r] = D_e[r] . h[p]
};

struct MmProblem {
  MmMode mode = MmMode::kDense;
  DType type = DType::F32;
  const uint8_t* w0 = nullptr;  // dense: W; grouped: gate (kGateUp) or down (kDown) of expert 0
  const uint8_t* w1 = nullptr;  // kGateUp: up of expert 0
  size_t row_bytes = 0;
  size_t matrix_stride = 0;  // grouped: bytes between experts' matrices
  int64_t n_rows = 0, n_cols = 0;
  const float* x = nullptr;  // activation rows, x_stride floats apart
  int64_t x_stride = 0;
  float* y = nullptr;  // output rows, y_stride floats apart
  int64_t y_stride = 0;
  int64_t n_tokens = 0;  // dense: rows of x; grouped: tokens of the batch
  // Grouped only: pair p reads activation row p / x_row_div (n_used for
  // kGateUp, 1 for kDown) and writes output row p.
  const int32_t* pairs = nullptr;
  const int32_t* offsets = nullptr;
  int64_t n_expert = 0;
  int64_t n_pairs = 0;
  int64_t x_row_div = 1;
  // gemm scratch (MatmulArgs::scratch).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  // Dense K-quant products split along K (gemm_kq.cu): [n_blocks][n_tokens]
  // [n_rows] per-block results, summed in block order into y after.
  float* partials = nullptr;
};

// Validation shared by the public entry points: the weight pointer/rows/type
// contract of every kernel here.
Status check_weights(const char* what, DType type, const void* w, int64_t n_rows, int64_t n_cols,
                     size_t row_bytes);
// Alignment (bytes) a row start (and row_bytes, matrix_stride) of this weight
// type must have: 16 where the kernels read whole 16-byte pieces of a block,
// else what the block length allows (qdec::Traits::kRowAlign): 2 for Q8_0,
// Q4_0, Q6_K, Q5_0, IQ4_NL, Q3_K and the i-quants but IQ1_M; 4 for Q4_1,
// Q2_K; 8 for Q5_1, IQ4_XS, IQ1_M; 1 for MXFP4 (17-byte blocks).
size_t weight_row_align(DType type);
Status check_activations(const char* what, const void* p, int64_t stride, int64_t n_used_cols);

// CUDA-core kernels (matvec.cu), 16 rows a block. Dense: n_tokens <=
// kMatvecMaxTokens; grouped: any batch, the pairs of each expert taken
// min(n_tokens, 16) (rounded up to a power of two) at a time.
Status launch_matvec(const MmProblem& p, cudaStream_t stream);
// Tensor-core kernels (gemm.cu): any batch. K-quant weights go to
// launch_gemm_kq (gemm_kq.cu) unless MOESERVE_CUDA_KQ_GEMM=0.
Status launch_gemm(const MmProblem& p, cudaStream_t stream);
// Whether launch_gemm hands this weight type to the integer kernel.
bool gemm_kq_type(DType t);
// Whether that kernel's results are bit for bit the reference CPU kernels'
// (the K-quants and IQ4_XS; the codebook i-quants' CPU reference
// dequantizes to floats first: Q8_K's accuracy, kq_iquant_codes.cuh).
bool gemm_kq_matches_cpu(DType t);
// MOESERVE_CUDA_EXPERT_DECODE=tc: K-quant experts of decode batches on
// matvec_tc.cu (exact activations; Q2_K, Q3_K, IQ4_XS: matvec.cu) instead
// of the integer kernel.
bool expert_decode_on_tc();
// Integer tensor-core kernels for Q2_K..Q6_K, IQ4_XS and the codebook
// i-quants with Q8_K activations (the CPU's arithmetic, bit for bit the
// reference CPU kernels where gemm_kq_matches_cpu): any batch. The
// activation rows are quantized into p.scratch first (gemm_kq_scratch_bytes).
Status launch_gemm_kq(const MmProblem& p, cudaStream_t stream);
size_t gemm_kq_scratch_bytes(int64_t n_rows, int64_t n_cols);
// Scratch a dense K-quant product of n_tokens activation rows through an
// n_rows x n_cols matrix can use beyond gemm_kq_scratch_bytes: its per-block
// results where it splits K (decode batches of few CTAs; 0 where it does not).
size_t gemm_kq_split_bytes(int64_t n_tokens, int64_t n_rows, int64_t n_cols);
// One decode token's grouped expert products of those types (kq_vec.cu): a
// warp a row, gemm_kq.cu's bits; no scratch. launch_gemm_kq hands them over
// where kq_vec_takes (MOESERVE_CUDA_KQ_VEC=0: never).
bool kq_vec_takes(const MmProblem& p);
Status launch_kq_vec(const MmProblem& p, cudaStream_t stream);

}  // namespace moeserve::cuda::detail
