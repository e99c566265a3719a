// The Gated DeltaNet mixer and the gated-attention gates on the GPU (see
// gated_delta_net.h). Each sequence's recurrence is serial in its tokens, so
// the parallelism is across channels (conv), heads (norms, delta rule) and
// sequences; the recurrent delta rule keeps a head's 128x128 state in the
// registers of one block for the whole sequence and reads it from and writes
// it to global memory once. Sequences of kChunkedMinTokens or more go to the
// chunked form instead (gated_delta_net_chunked.cu), which works on 64 tokens
// at a time rather than one.
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gated_delta_net.h"
#include "kernels/cuda/gated_delta_net_chunked.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxConvKernel = 8;
constexpr int kStatePerThread = 32;  // state entries a delta-rule thread holds (one column's slice of d_k)
constexpr int kConvThreads = 128;
constexpr int kFlatThreads = 256;
// Sequences of at least one chunk run the chunked delta rule: its cost is a
// chunk's matrices whatever the number of tokens in it, the recurrent
// kernel's one serial step a token. (Not measured yet; the crossover may lie
// lower.)
constexpr int kChunkedMinTokens = kGdnChunk;

Status launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "{}: kernel launch failed: {}", what, cudaGetErrorString(err));
  }
  return Status::ok();
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }
// torch.nn.functional.softplus: identity above 20.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- draft trees ------------------------------------------------------------
__device__ __forceinline__ bool is_tree(const GdnBatch& b, int s) {
  return b.node_tables != nullptr && b.node_tables[int64_t(s) * b.n_layer + b.layer] != nullptr;
}

// x[0..n) = the last n raw inputs of channel c on the way to the tree's row
// i (local), oldest first: row i, its parent, ... the root, then the
// sequence's conv state from its newest row back.
__device__ __forceinline__ void gather_tree_window(const GdnBatch& b, const float* qkv, const float* state,
                                                   int conv_dim, int K, int n, int row0, int i, int c,
                                                   float (&x)[kMaxConvKernel]) {
  int cur = i, back = 0;
#pragma unroll
  for (int j = kMaxConvKernel - 1; j >= 0; --j) {
    if (j >= n) continue;
    if (cur >= 0) {
      x[j] = qkv[int64_t(row0 + cur) * conv_dim + c];
      cur = b.row_parent[row0 + cur];
    } else {
      x[j] = state[int64_t(K - 2 - back) * conv_dim + c];
      ++back;
    }
  }
}

// ---- causal depthwise conv + SiLU ------------------------------------------
// One thread per (channel, row): y = silu(sum_j w[j] x[i - (K-1) + j]) with
// x before the sequence's first row read from the conv state. Out of place,
// so every row reads raw inputs and all rows run at once.
__global__ void conv_silu_kernel(GdnBatch b, const float* qkv, float* y, const float* weight, int conv_dim,
                                 int K) {
  const int c = int(blockIdx.y) * kConvThreads + int(threadIdx.x);
  const int64_t r = blockIdx.x;
  float w[kMaxConvKernel];
  if (c < conv_dim) {
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j) w[j] = j < K ? weight[int64_t(c) * K + j] : 0.0f;
  }
  detail::grid_dependency_wait();
  detail::allow_dependents();
  if (c >= conv_dim) return;
  const int s = b.row_seq[r], row0 = b.seq_rows[2 * s];
  const int i = int(r) - row0;
  const float* state = b.state_tables[int64_t(s) * b.n_layer + b.layer];
  float acc = 0.0f;
  if (is_tree(b, s)) {
    // A draft tree's row: its window runs along its ancestors, then into the state.
    float x[kMaxConvKernel];
    gather_tree_window(b, qkv, state, conv_dim, K, K, row0, i, c, x);
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j) {
      if (j < K) acc += w[j] * x[j];
    }
    y[r * conv_dim + c] = silu(acc);
    return;
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < K) {
      const int idx = i - (K - 1) + j;
      acc += w[j] * (idx >= 0 ? qkv[int64_t(row0 + idx) * conv_dim + c]
                              : state[int64_t(K - 1 + idx) * conv_dim + c]);
    }
  }
  y[r * conv_dim + c] = silu(acc);
}

// One thread per (channel, sequence), after the conv has read the old state:
// the new state is the last K-1 raw inputs of (old state ++ the sequence's rows).
__global__ void conv_state_kernel(GdnBatch b, const float* qkv, int conv_dim, int K) {
  const int c = int(blockIdx.x) * kConvThreads + int(threadIdx.x);
  const int s = int(blockIdx.y);
  detail::grid_dependency_wait();
  detail::allow_dependents();
  if (c >= conv_dim) return;
  float* state = b.state_tables[int64_t(s) * b.n_layer + b.layer];
  const int row0 = b.seq_rows[2 * s], n = b.seq_rows[2 * s + 1];
  if (is_tree(b, s)) {
    // Each row's conv state into its node state; the sequence's stays.
    float* nodes = b.node_tables[int64_t(s) * b.n_layer + b.layer];
    for (int t = 0; t < n; ++t) {
      float x[kMaxConvKernel];
      gather_tree_window(b, qkv, state, conv_dim, K, K - 1, row0, t, c, x);
#pragma unroll
      for (int j = 0; j < kMaxConvKernel - 1; ++j) {
        if (j < K - 1) nodes[t * b.state_floats + int64_t(j) * conv_dim + c] = x[j];
      }
    }
    return;
  }
  float next[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    const int idx = n - (K - 1) + j;  // local row; < 0: still in the old state
    if (j < K - 1)
      next[j] =
          idx >= 0 ? qkv[int64_t(row0 + idx) * conv_dim + c] : state[int64_t(K - 1 + idx) * conv_dim + c];
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    if (j < K - 1) state[int64_t(j) * conv_dim + c] = next[j];
  }
}

// ---- L2 norm of the q and k heads, and the gates ---------------------------
// One warp per (row, q or k head): x *= rsqrt(sum(x^2) + eps).
__global__ void l2_norm_kernel(float* qkv, int conv_dim, int d, float eps) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t row = blockIdx.x;
  float* x = qkv + row * conv_dim + int64_t(blockIdx.y) * d;
  float ss = 0.0f;
  for (int i = int(threadIdx.x); i < d; i += kWarp) ss += x[i] * x[i];
  const float r = rsqrtf(warp_sum(ss) + eps);
  for (int i = int(threadIdx.x); i < d; i += kWarp) x[i] *= r;
}

__global__ void gates_kernel(float* b, float* a, const float* a_neg, const float* dt_bias, int64_t n,
                             int n_v) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t i = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (i >= n) return;
  const int h = int(i % n_v);
  b[i] = sigmoid(b[i]);
  a[i] = a_neg[h] * softplus(a[i] + dt_bias[h]);
}

// ---- the gated delta rule -------------------------------------------------
// Block (V head h, sequence s), d_v * P threads (P = d_k / 32): thread
// (v, p) holds S[p*32 .. p*32+31][v] of the head's state. Per token:
//   S *= exp(g); kv = S^T k; delta = beta (v - kv); S += k delta^T;
//   o = q_scale S^T q
// with the two column sums reduced over the P lanes of a column (adjacent
// lanes of one warp). k and q of the token go through shared memory; the
// output replaces v in qkv. Sequences of skip_from tokens or more, past
// the decode rows (GdnBatch::decode_rows), are left to the chunked kernel.
template <int P>
__global__ void delta_rule_kernel(GdnBatch bt, float* qkv, const float* beta, const float* g,
                                  int64_t ssm_offset, int conv_dim, int n_k, int n_v, int dk, int dv,
                                  float q_scale, int skip_from) {
  extern __shared__ float kq[];  // [2][dk]: k, then q
  const int h = int(blockIdx.x), s = int(blockIdx.y);
  const int tid = int(threadIdx.x), v = tid / P, p = tid % P;
  const int kh = h % n_k, k0 = p * kStatePerThread;
  detail::grid_dependency_wait();
  detail::allow_dependents();
  float* state = bt.state_tables[int64_t(s) * bt.n_layer + bt.layer] + ssm_offset + int64_t(h) * dk * dv;
  const int row0 = bt.seq_rows[2 * s], n = bt.seq_rows[2 * s + 1];
  if (n >= skip_from && !bt.decoding(row0, n)) return;  // the whole block: n is the sequence's
  // A draft tree: each row starts from its parent's state (in the registers
  // when the parent is the row before) and leaves its own in its node state.
  float* nodes = is_tree(bt, s)
                     ? bt.node_tables[int64_t(s) * bt.n_layer + bt.layer] + ssm_offset + int64_t(h) * dk * dv
                     : nullptr;
  float S[kStatePerThread];
#pragma unroll
  for (int i = 0; i < kStatePerThread; ++i) S[i] = state[int64_t(k0 + i) * dv + v];
  const int qk_width = n_k * dk;
  for (int t = 0; t < n; ++t) {
    if (nodes != nullptr && t > 0) {
      const int parent = bt.row_parent[row0 + t];
      if (parent != t - 1) {
        // This thread's own entries, written by it earlier: no barrier needed.
#pragma unroll
        for (int i = 0; i < kStatePerThread; ++i)
          S[i] = nodes[parent * bt.state_floats + int64_t(k0 + i) * dv + v];
      }
    }
    float* row = qkv + int64_t(row0 + t) * conv_dim;
    __syncthreads();  // the last token's k and q are no longer read
    for (int i = tid; i < dk; i += int(blockDim.x)) {
      kq[i] = row[qk_width + kh * dk + i];
      kq[dk + i] = row[kh * dk + i];
    }
    __syncthreads();
    const int64_t gi = int64_t(row0 + t) * n_v + h;
    const float decay = expf(g[gi]), b = beta[gi];
    float* vp = row + 2 * qk_width + h * dv + v;
    const float vt = *vp;
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < kStatePerThread; ++i) {
      S[i] *= decay;
      kv += S[i] * kq[k0 + i];
    }
#pragma unroll
    for (int o = P / 2; o > 0; o >>= 1) kv += __shfl_xor_sync(0xffffffffu, kv, o);
    const float delta = b * (vt - kv);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kStatePerThread; ++i) {
      S[i] += kq[k0 + i] * delta;
      o += S[i] * kq[dk + k0 + i];
    }
#pragma unroll
    for (int off = P / 2; off > 0; off >>= 1) o += __shfl_xor_sync(0xffffffffu, o, off);
    if (p == 0) *vp = o * q_scale;  // after every lane of the column read vt (the shuffles above)
    if (nodes != nullptr) {
#pragma unroll
      for (int i = 0; i < kStatePerThread; ++i) nodes[t * bt.state_floats + int64_t(k0 + i) * dv + v] = S[i];
    }
  }
  if (nodes != nullptr) return;  // a tree leaves the sequence's state as it was
#pragma unroll
  for (int i = 0; i < kStatePerThread; ++i) state[int64_t(k0 + i) * dv + v] = S[i];
}

// ---- gated RMSNorm --------------------------------------------------------
// One warp per (row, V head): out = w * o * rsqrt(mean(o^2) + eps) * silu(z).
__global__ void gated_norm_kernel(const float* qkv, const float* z, float* out, const float* w, int conv_dim,
                                  int v_offset, int n_v, int dv, float eps) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t row = blockIdx.x;
  const int h = int(blockIdx.y);
  const float* o = qkv + row * conv_dim + v_offset + h * dv;
  float ss = 0.0f;
  for (int i = int(threadIdx.x); i < dv; i += kWarp) ss += o[i] * o[i];
  const float r = rsqrtf(warp_sum(ss) / float(dv) + eps);
  const int64_t base = row * int64_t(n_v) * dv + int64_t(h) * dv;
  for (int i = int(threadIdx.x); i < dv; i += kWarp) out[base + i] = w[i] * (o[i] * r) * silu(z[base + i]);
}

// ---- gates of gated attention and the shared expert ---------------------
__global__ void split_q_gate_kernel(const float* qg, float* q, float* gate, int64_t n, int hd) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t i = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;  // index into q
  if (i >= n) return;
  const int64_t head = i / hd, c = i % hd;
  q[i] = qg[head * 2 * hd + c];
  gate[i] = qg[head * 2 * hd + hd + c];
}

__global__ void mul_sigmoid_kernel(float* x, const float* gate, int64_t n) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t i = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (i < n) x[i] *= sigmoid(gate[i]);
}

__global__ void add_sigmoid_scaled_kernel(float* y, const float* x, const float* s, int64_t n,
                                          int64_t n_cols) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t i = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (i < n) y[i] += sigmoid(s[i / n_cols]) * x[i];
}

unsigned flat_blocks(int64_t n) { return unsigned((n + kFlatThreads - 1) / kFlatThreads); }

Status check(const GdnArgs& a) {
  const char* fn = "gated_delta_net";
  if (a.n_k_heads < 1 || a.n_v_heads < 1 || a.n_v_heads % a.n_k_heads != 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} V heads are not a multiple of {} K heads", fn,
                      a.n_v_heads, a.n_k_heads);
  }
  if (a.head_k_dim < kStatePerThread || a.head_k_dim % kStatePerThread != 0 || a.head_k_dim > 512 ||
      a.head_v_dim < 1 || a.head_v_dim * (a.head_k_dim / kStatePerThread) > 1024 ||
      a.head_v_dim * (a.head_k_dim / kStatePerThread) % kWarp != 0) {
    return make_error(
        StatusCode::kInvalidArgument,
        "{}: head sizes d_k {} / d_v {} unsupported on the GPU (d_k a multiple of 32 up to 512, "
        "d_v * d_k / 32 a multiple of 32 up to 1024)",
        fn, a.head_k_dim, a.head_v_dim);
  }
  if (a.conv_kernel < 1 || a.conv_kernel > kMaxConvKernel) {
    return make_error(StatusCode::kInvalidArgument, "{}: conv kernel {} outside 1..{}", fn, a.conv_kernel,
                      kMaxConvKernel);
  }
  if (a.batch.n_rows > 0 && (a.scratch == nullptr || a.batch.row_seq == nullptr || a.qkv == nullptr)) {
    return make_error(StatusCode::kInvalidArgument, "{}: null qkv, scratch or row table", fn);
  }
  if (a.batch.n_seq < 0 || a.batch.n_seq > 65535 || a.batch.n_rows < 0 || a.batch.n_rows > INT32_MAX) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} sequences / {} rows out of range", fn,
                      a.batch.n_seq, a.batch.n_rows);
  }
  return Status::ok();
}

template <int P>
void launch_delta_rule(const GdnArgs& a, int64_t ssm_offset, int conv_dim, int skip_from,
                       cudaStream_t stream) {
  const dim3 grid(unsigned(a.n_v_heads), unsigned(a.batch.n_seq));
  const int threads = int(a.head_v_dim) * P;
  const size_t smem = size_t(2 * a.head_k_dim) * sizeof(float);
  detail::launch(delta_rule_kernel<P>, grid, threads, smem, stream, a.batch, a.scratch, a.b, a.a, ssm_offset,
                 conv_dim, int(a.n_k_heads), int(a.n_v_heads), int(a.head_k_dim), int(a.head_v_dim),
                 1.0f / std::sqrt(float(a.head_k_dim)), skip_from);
}

// The recurrent kernel for sequences shorter than skip_from tokens.
Status recurrent_delta_rule(const GdnArgs& a, int64_t ssm_offset, int conv_dim, int skip_from,
                            cudaStream_t stream) {
  switch (a.head_k_dim / kStatePerThread) {
    case 1:
      launch_delta_rule<1>(a, ssm_offset, conv_dim, skip_from, stream);
      break;
    case 2:
      launch_delta_rule<2>(a, ssm_offset, conv_dim, skip_from, stream);
      break;
    case 4:
      launch_delta_rule<4>(a, ssm_offset, conv_dim, skip_from, stream);
      break;
    case 8:
      launch_delta_rule<8>(a, ssm_offset, conv_dim, skip_from, stream);
      break;
    case 16:
      launch_delta_rule<16>(a, ssm_offset, conv_dim, skip_from, stream);
      break;
    default:
      return make_error(StatusCode::kInvalidArgument, "gated_delta_net: d_k {} is not 32 x a power of two",
                        a.head_k_dim);
  }
  return launched("gated_delta_net (delta rule)");
}

// Per call, from the batch: when it has a chunk's worth of rows (some
// sequence may be a prefill) and the shapes suit the chunked kernel, that
// kernel takes the sequences of kChunkedMinTokens or more and the recurrent
// one the rest (decode rows); the recurrent launch is left out when the
// batch's only sequence is long. The host does not know the sequence
// lengths (they are in device memory), so each kernel skips the others'.
// MOESERVE_GDN_CHUNKED=0 keeps every sequence on the recurrent kernel (for
// comparisons).
bool chunked_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESERVE_GDN_CHUNKED");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

Status delta_rule(const GdnArgs& a, int64_t ssm_offset, int conv_dim, cudaStream_t stream) {
  // (A batch with draft trees runs every sequence on the recurrent kernel,
  // which has the tree form.)
  const bool chunked = chunked_enabled() && a.batch.n_rows - a.batch.decode_rows >= kChunkedMinTokens &&
                       a.batch.node_tables == nullptr && delta_rule_chunked_supported(a);
  if (!chunked || a.batch.n_seq > 1 || a.batch.decode_rows > 0) {
    MOESERVE_RETURN_IF_ERROR(
        recurrent_delta_rule(a, ssm_offset, conv_dim, chunked ? kChunkedMinTokens : INT_MAX, stream));
  }
  if (!chunked) return Status::ok();
  return delta_rule_chunked(a, ssm_offset, conv_dim, kChunkedMinTokens, stream);
}

}  // namespace

Status gated_delta_net(const GdnArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(check(a));
  if (a.batch.n_seq == 0 || a.batch.n_rows == 0) return Status::ok();
  const int64_t qk = a.n_k_heads * a.head_k_dim;
  const int conv_dim = int(2 * qk + a.n_v_heads * a.head_v_dim);
  const unsigned channel_blocks = unsigned((conv_dim + kConvThreads - 1) / kConvThreads);
  detail::launch(conv_silu_kernel, dim3(unsigned(a.batch.n_rows), channel_blocks), kConvThreads, 0, stream,
                 a.batch, a.qkv, a.scratch, a.conv_weight, conv_dim, a.conv_kernel);
  detail::launch(conv_state_kernel, dim3(channel_blocks, unsigned(a.batch.n_seq)), kConvThreads, 0, stream,
                 a.batch, a.qkv, conv_dim, a.conv_kernel);
  MOESERVE_RETURN_IF_ERROR(launched("gated_delta_net (conv)"));
  detail::launch(l2_norm_kernel, dim3(unsigned(a.batch.n_rows), unsigned(2 * a.n_k_heads)), kWarp, 0, stream,
                 a.scratch, conv_dim, int(a.head_k_dim), a.l2_eps);
  const int64_t n_gates = a.batch.n_rows * a.n_v_heads;
  detail::launch(gates_kernel, flat_blocks(n_gates), kFlatThreads, 0, stream, a.b, a.a, a.a_neg, a.dt_bias,
                 n_gates, int(a.n_v_heads));
  MOESERVE_RETURN_IF_ERROR(launched("gated_delta_net (norms, gates)"));
  const int64_t ssm_offset = int64_t(a.conv_kernel - 1) * conv_dim;
  MOESERVE_RETURN_IF_ERROR(delta_rule(a, ssm_offset, conv_dim, stream));
  detail::launch(gated_norm_kernel, dim3(unsigned(a.batch.n_rows), unsigned(a.n_v_heads)), kWarp, 0, stream,
                 a.scratch, a.z, a.out, a.norm_w, conv_dim, int(2 * qk), int(a.n_v_heads), int(a.head_v_dim),
                 a.norm_eps);
  return launched("gated_delta_net (gated norm)");
}

Status split_q_gate(const float* qg, float* q, float* gate, int64_t n_rows, int64_t n_head, int64_t head_dim,
                    cudaStream_t stream) {
  const int64_t n = n_rows * n_head * head_dim;
  if (n == 0) return Status::ok();
  detail::launch(split_q_gate_kernel, flat_blocks(n), kFlatThreads, 0, stream, qg, q, gate, n, int(head_dim));
  return launched("split_q_gate");
}

Status mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  detail::launch(mul_sigmoid_kernel, flat_blocks(n), kFlatThreads, 0, stream, x, gate, n);
  return launched("mul_sigmoid");
}

Status add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t n_rows, int64_t n_cols,
                          cudaStream_t stream) {
  const int64_t n = n_rows * n_cols;
  if (n == 0) return Status::ok();
  detail::launch(add_sigmoid_scaled_kernel, flat_blocks(n), kFlatThreads, 0, stream, y, x, s, n, n_cols);
  return launched("add_sigmoid_scaled");
}

}  // namespace moeserve::cuda
