// y[t][n] = sum_k W[n][k] * x[t][k] for weights of any type, on the CPU.
//
// The activations are converted once to the weight type's vec_dot_type (Q8_0
// for Q8_0/Q4_0, Q8_K for the K-quants, used as is for float weights), then
// the weight rows are split into blocks handed out across the thread pool.
// Within a block all T tokens are computed while the block's rows stay in
// cache, so the weights are read from memory once per call, not once per
// token.
//
// Determinism: every output element is one vec_dot over the same inputs,
// whichever thread computes it, so results are bit-identical for any number
// of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tensor/dtype.h"

namespace moeserve::cpu {

struct MatmulArgs {
  const void* w = nullptr;      // weight rows, row n at w + n * w_row_stride
  DType w_type = DType::F32;
  int64_t n_rows = 0;           // N: outputs per token
  int64_t n_cols = 0;           // K: inputs per token, a multiple of both block sizes
  size_t w_row_stride = 0;      // bytes; 0 = dtype_row_bytes(w_type, K)
  // W is in the packed layout (packed_layout.h): N a multiple of kPackRows,
  // rows contiguous, and the kernel table has packed_dot for w_type.
  bool w_packed = false;
  const float* x = nullptr;     // [T][x_stride] f32 (ignored when x_quant is set)
  int64_t n_tokens = 1;         // T
  int64_t x_stride = 0;         // floats; 0 = K
  float* y = nullptr;           // [T][y_stride] f32, written (not accumulated)
  int64_t y_stride = 0;         // floats; 0 = N
  ThreadPool* pool = nullptr;   // null: the calling thread only
  // Activations already converted by quantize_activations() for this w_type
  // (e.g. one input shared by several experts' matrices): skips conversion.
  const void* x_quant = nullptr;
  // Kernel table; null = cpu_kernels() (tests and benchmarks pick a level).
  const CpuKernels* kernels = nullptr;
};

// Bytes of one token's converted activations for weights of type w_type:
// a row of K elements of its vec_dot_type.
size_t activation_row_bytes(DType w_type, int64_t n_cols);

// Converts T rows of x ([T][x_stride] f32) into dst, packed rows of
// activation_row_bytes(w_type, K) each (the x_quant layout of MatmulArgs).
struct QuantizeActivationsArgs {
  DType w_type = DType::F32;
  const float* x = nullptr;
  int64_t n_tokens = 1;
  int64_t n_cols = 0;
  int64_t x_stride = 0;  // floats; 0 = K
  void* dst = nullptr;
  ThreadPool* pool = nullptr;
  const CpuKernels* kernels = nullptr;
};
Status quantize_activations(const QuantizeActivationsArgs& args);

// Errors (kInvalidArgument / kUnsupported) name the shape or type at fault;
// nothing is written then.
Status matmul(const MatmulArgs& args);

// Several products over the same input (e.g. the q, k and v projections):
// when they share x, its stride, T, K and the activation type, x is
// converted once and all their tiles go to the pool in ONE dispatch (decode
// pays per dispatch); otherwise they run one after another. Same results
// as separate matmul() calls, bit for bit.
Status matmul_group(std::span<const MatmulArgs> group);

}  // namespace moeserve::cpu
