// GPU kernels of the Qwen3.5 hybrid layers: the Gated DeltaNet mixer
// between its input projections and out_proj (the CPU's gdn_mixer_core,
// kernels/cpu/gated_delta_net.h, for every sequence of a batch), and the
// gated-attention / shared-expert gates. f32 activations in device memory.
//
// The mixer runs, per sequence s (rows seq_rows[s] of the batch) with its
// state of this layer (state_tables[s * n_layer + layer]: conv state
// [(K-1)][conv_dim] then SSM state [n_v][d_k][d_v], read and replaced):
//   causal conv + SiLU of qkv into scratch (rows in parallel), L2 norm of the q and k heads,
//   beta = sigmoid(b), g = a_neg * softplus(a + dt_bias) in place of b and a,
//   the gated delta rule (its output replaces the v part of scratch), then
//   out = norm_w * rmsnorm(o) * silu(z) per V head.
// V head h reads K head h % n_k (GGUF's tiled order). The delta rule runs
// token by token for short sequences (decode; each head's state in
// registers) and in chunks of 64 tokens for sequences of 64 or more when
// d_k is 32, 64 or 128 and d_v a multiple of 32 (prefill; the CPU's chunked
// form, gated_delta_net_chunked.h). Neither needs memory beyond scratch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace moeserve::cuda {

struct GdnBatch {
  const int32_t* seq_rows = nullptr;     // [n_seq][2] device: first row, rows
  const int32_t* row_seq = nullptr;      // [n_rows] device: each row's sequence
  float* const* state_tables = nullptr;  // [n_seq][n_layer] device
  int64_t n_seq = 0, n_layer = 0;
  int layer = 0;
  int64_t n_rows = 0;
  // Draft trees (speculative decoding; null: none). A sequence whose
  // node-state table entry [n_seq][n_layer] is not null is a tree: its row
  // t follows row_parent[row0 + t] (a row of the same sequence; -1: the
  // root, which follows the sequence's state), the state after each row is
  // written to its node state ([rows][state_floats], conv then SSM, as the
  // sequence's), and the sequence's own state is left as it was.
  const int32_t* row_parent = nullptr;
  float* const* node_tables = nullptr;
  int64_t state_floats = 0;
  // Rows [0, decode_rows) are decoding sequences' (decode, a verify chain):
  // they take the recurrent kernel whatever their count, so a verify row's
  // output and state are its decode step's bit for bit. Sequences past
  // them of kGdnChunk rows or more take the chunked kernel.
  int64_t decode_rows = 0;
  // Whether a sequence's rows [row0, row0 + n) are decoding rows (above).
  __host__ __device__ bool decoding(int64_t row0, int64_t n) const { return row0 + n <= decode_rows; }
};

struct GdnArgs {
  GdnBatch batch;
  int64_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0;
  int conv_kernel = 4;
  const float* qkv = nullptr;          // [n_rows][conv_dim], read only
  float* scratch = nullptr;            // [n_rows][conv_dim]: the conv's output, then q, k and o
  float* b = nullptr;                  // [n_rows][n_v]
  float* a = nullptr;                  // [n_rows][n_v]
  const float* z = nullptr;            // [n_rows][n_v d_v]
  float* out = nullptr;                // [n_rows][n_v d_v]; may be z
  const float* conv_weight = nullptr;  // [conv_dim][conv_kernel]
  const float* a_neg = nullptr;        // [n_v]
  const float* dt_bias = nullptr;      // [n_v]
  const float* norm_w = nullptr;       // [d_v]
  float l2_eps = 1e-6f, norm_eps = 1e-6f;
};

// kInvalidArgument for sizes outside what the kernels handle: conv kernel
// 1..8, d_k a multiple of 32 up to 512 with d_v * d_k / 32 <= 1024 threads,
// d_v <= 1024, n_v a multiple of n_k.
Status gated_delta_net(const GdnArgs& a, cudaStream_t stream);

// q[t][h] = qg[t][h][0..hd), gate[t][h] = qg[t][h][hd..2hd).
Status split_q_gate(const float* qg, float* q, float* gate, int64_t n_rows, int64_t n_head, int64_t head_dim,
                    cudaStream_t stream);
// x *= sigmoid(gate), n elements.
Status mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);
// y[t] += sigmoid(s[t]) * x[t], rows of n_cols.
Status add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t n_rows, int64_t n_cols,
                          cudaStream_t stream);

}  // namespace moeserve::cuda
