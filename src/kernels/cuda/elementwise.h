// Row-wise and element-wise ops of a forward pass on the GPU: embedding
// gather, RMSNorm (plain, fused with a residual add, and over chosen rows),
// SwiGLU, residual add, the softplus gate. f32 activations in device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "tensor/dtype.h"

namespace moeserve::cuda {

// out[t] = dequantized row ids[t] of the table (any weight type).
struct EmbedArgs {
  const void* table = nullptr;
  DType type = DType::F32;
  size_t row_bytes = 0;
  int64_t n_cols = 0;
  const int32_t* ids = nullptr;  // [n_rows] device
  int64_t n_rows = 0;
  float* out = nullptr;  // [n_rows][n_cols]
  // Rows in the table. > 0: an id outside [0, n_table_rows) gives a row of
  // NaN instead of a read past the table (ids live on the device, so the
  // launcher cannot check them). 0: ids are trusted.
  int64_t n_table_rows = 0;
};
Status embed(const EmbedArgs& a, cudaStream_t stream);

// out[r] = x[src_row(r)] / rms(x[src_row(r)]) * w, rows of n_cols;
// src_rows null: src_row(r) = r. out may equal x when src_rows is null.
// w null: no scale. The sum of squares of a row is reduced in an order that
// depends only on n_cols (and on whether the rows are 16-byte aligned), so a
// row's result does not depend on the other rows of the batch.
struct RmsNormArgs {
  const float* x = nullptr;
  const float* w = nullptr;
  float* out = nullptr;
  const int32_t* src_rows = nullptr;  // optional device array [n_rows]
  int64_t n_rows = 0, n_cols = 0;
  float eps = 1e-6f;
};
Status rms_norm(const RmsNormArgs& a, cudaStream_t stream);

// x[r] += delta[r]; out[r] = rmsnorm(x[r]) * w (the residual add fused with
// the next norm). delta null: the norm only.
struct AddRmsNormArgs {
  float* x = nullptr;
  const float* delta = nullptr;
  const float* w = nullptr;
  float* out = nullptr;
  int64_t n_rows = 0, n_cols = 0;
  float eps = 1e-6f;
};
Status add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream);

// The MoE combine fused with the next norm: x[t] += sum over slots j (slot
// order, one fma each, as moe.h's combine_experts) of weights[t][j] *
// y[t * n_used + j]; out[t] = rmsnorm(x[t]) * w. x and out bit for bit what
// combine_experts followed by rms_norm give.
struct CombineRmsNormArgs {
  float* x = nullptr;              // [n_rows][n_cols]
  const float* y = nullptr;        // [n_rows * n_used][n_cols]
  const float* weights = nullptr;  // [n_rows][n_used]
  int64_t n_used = 0;
  const float* w = nullptr;
  float* out = nullptr;
  int64_t n_rows = 0, n_cols = 0;
  float eps = 1e-6f;
};
Status combine_rms_norm(const CombineRmsNormArgs& a, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i], i < n; out may alias gate.
Status swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// y[i] += x[i], i < n.
Status add(float* y, const float* x, int64_t n, cudaStream_t stream);
// x[t][g * group + i] *= softplus(gate[t][g]) for t < n_rows, g < n_gates,
// i < group (Laguna's attention output gate: one gate per head, or per
// element with group 1). softplus(v) = log1p(exp(v)), v itself above 20
// (torch's threshold).
Status mul_softplus(float* x, const float* gate, int64_t n_rows, int64_t n_gates, int64_t group,
                    cudaStream_t stream);
// p[i] = value, i < n (initialising and poisoning buffers).
Status fill_f32(float* p, float value, int64_t n, cudaStream_t stream);

}  // namespace moeserve::cuda
