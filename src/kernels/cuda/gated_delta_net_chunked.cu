// The chunked gated delta rule on the GPU (see gated_delta_net_chunked.h).
//
// Per V head and chunk of L <= 64 tokens, with the cumulative log-decays G_i
// inside the chunk (summed in double, as on the CPU) and the state S0 at the
// chunk's start (the CPU's chunk_step, same order of operations):
//   cm    = tril(beta_i e^{G_i-G_j} k_i.k_j, -1)      (A = I + cm)
//   attn  = tril(e^{G_i-G_j} (q_scale q_i).k_j, 0)
//   delta = A^{-1} beta (v - e^G (K S0))             (forward substitution)
//   o     = e^G (Q S0) + attn delta
//   S     = e^{G_last} S0 + (K e^{G_last-G})^T delta
//
// Work split: one CTA per (V head, sequence, 32 columns of d_v). Given K,
// beta and g, the columns of S evolve independently, so slicing d_v gives
// more CTAs to fill the GPU (the 35B model's 32 V heads make 128 for one
// sequence) for the price of every slice recomputing cm and attn. A CTA
// walks its sequence's chunks in order with all of a chunk in shared memory:
// K and Q transposed (token index contiguous, so a thread's rows of every
// product come in one vector load), cm and attn transposed, the slice of S,
// and the slice of v (then the right-hand side, then delta). No global
// scratch; fp32 FMA throughout, the CPU chunked form being the numerical
// model. Padding rows (i >= L) of a last partial chunk are zero in K, Q, v,
// beta and g, which makes their rows of cm, attn and delta zero.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/gated_delta_net_chunked.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int C = kGdnChunk;
// d_v columns per CTA: the solve runs 8 lanes per column over the CTA.
constexpr int kSlice = kThreads / 8;
// Row stride of the transposed [*][C] tiles: rows stay 16-byte aligned for
// vector loads, and consecutive rows start 4 banks apart, so the transposing
// stores and the column reads of the state update are conflict free.
constexpr int kLd = C + 4;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxDevices = 64;

static_assert(C == 2 * kWarp, "the decay scan gives each lane of one warp two tokens");
static_assert(kThreads == (C / 2) * (kSlice / 4), "state products and output: 2 rows x 4 columns a thread");
static_assert(kThreads == (C / 4) * (C / 4), "cm and attn: a 4 x 4 tile a thread");

// Offsets (floats) of the shared-memory arrays of a CTA, all 16-byte aligned.
template <int DK>
struct Smem {
  static constexpr int kKt = 0;                  // [DK][kLd]: k transposed
  static constexpr int kQt = kKt + DK * kLd;     // [DK][kLd]: q_scale q transposed
  static constexpr int kCmT = kQt + DK * kLd;    // [C][kLd]: cmT[j][i] = cm[i][j]
  static constexpr int kAttnT = kCmT + C * kLd;  // [C][kLd]: attnT[j][i] = attn[i][j]
  static constexpr int kS = kAttnT + C * kLd;    // [DK][kSlice]: the CTA's columns of S
  static constexpr int kD = kS + DK * kSlice;    // [C][kSlice]: v, then the rhs, then delta
  static constexpr int kG = kD + C * kSlice;     // [C] doubles: cumulative log-decay
  static constexpr int kEg = kG + 2 * C;         // [C]: e^{G_i}
  static constexpr int kWl = kEg + C;            // [C]: e^{G_last - G_i}
  static constexpr int kBeta = kWl + C;          // [C]
  static constexpr int kELast = kBeta + C;       // e^{G_last}
  static constexpr size_t kBytes = size_t(kELast + 4) * sizeof(float);

  float *kt, *qt, *cmt, *attnt, *s, *d, *eg, *wl, *beta, *e_last;
  double* G;

  __device__ explicit Smem(float* base)
      : kt(base + kKt),
        qt(base + kQt),
        cmt(base + kCmT),
        attnt(base + kAttnT),
        s(base + kS),
        d(base + kD),
        eg(base + kEg),
        wl(base + kWl),
        beta(base + kBeta),
        e_last(base + kELast),
        G(reinterpret_cast<double*>(base + kG)) {}
};

struct ChunkParams {
  GdnBatch bt;
  float* qkv = nullptr;         // scratch rows [q | k | v], row stride conv_dim
  const float* beta = nullptr;  // [n_rows][n_v]
  const float* g = nullptr;     // [n_rows][n_v]
  int64_t ssm_offset = 0;
  int conv_dim = 0, n_k = 0, n_v = 0, dv = 0, min_tokens = 0;
  float q_scale = 1.0f;
};

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void st4(float* p, float x, float y, float z, float w) {
  *reinterpret_cast<float4*>(p) = make_float4(x, y, z, w);
}

// The CPU's decay_exp: exp of a log-decay, exactly 0 below e^-50.
__device__ __forceinline__ float decay_exp(double log_decay) {
  return log_decay < -50.0 ? 0.0f : expf(float(log_decay));
}

// Warp 0: beta and g of the chunk's tokens (lane l has tokens 2l, 2l+1),
// their cumulative sum G by a warp scan, and the decay factors built on it.
template <int DK>
__device__ void chunk_decays(const ChunkParams& p, const Smem<DK>& sm, int h, int64_t r0, int L, int lane) {
  const int i = 2 * lane;
  float g[2] = {0.0f, 0.0f}, b[2] = {0.0f, 0.0f};
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    if (i + u < L) {
      const int64_t gi = (r0 + i + u) * p.n_v + h;
      g[u] = p.g[gi];
      b[u] = p.beta[gi];
    }
  }
  double incl = double(g[0]) + double(g[1]);
  for (int o = 1; o < kWarp; o <<= 1) {
    const double y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  double excl = __shfl_up_sync(kFull, incl, 1);
  if (lane == 0) excl = 0.0;
  const double G[2] = {excl + double(g[0]), excl + double(g[0]) + double(g[1])};
  const int last = L - 1;
  const double G_last = __shfl_sync(kFull, (last & 1) != 0 ? G[1] : G[0], last / 2);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    sm.G[i + u] = G[u];
    sm.eg[i + u] = decay_exp(G[u]);
    sm.wl[i + u] = i + u < L ? decay_exp(G_last - G[u]) : 0.0f;
    sm.beta[i + u] = b[u];
  }
  if (lane == 0) *sm.e_last = decay_exp(G_last);
}

// All threads: the chunk's k and q (transposed) and this CTA's slice of v;
// zeros for the rows past L. A warp loads tiles of 16 rows x 8 columns, a
// lane 4 columns of one row: 32-byte pieces of 16 rows from global memory,
// and stores of the transpose that land in 32 different banks.
template <int DK>
__device__ void load_chunk(const ChunkParams& p, const Smem<DK>& sm, int h, int j0, int64_t r0, int L) {
  const int tid = int(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  const int qk_width = p.n_k * DK, kh = h % p.n_k;
  constexpr int kRowTiles = C / 16;
  for (int tile = warp; tile < kRowTiles * (DK / 8); tile += kWarps) {
    const int i = (tile % kRowTiles) * 16 + lane % 16;
    const int m = (tile / kRowTiles) * 8 + (lane / 16) * 4;
    float4 k = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q = k;
    if (i < L) {
      const float* row = p.qkv + (r0 + i) * p.conv_dim;
      k = ld4(row + qk_width + kh * DK + m);
      q = ld4(row + kh * DK + m);
    }
    const float kv[4] = {k.x, k.y, k.z, k.w}, qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      sm.kt[(m + u) * kLd + i] = kv[u];
      sm.qt[(m + u) * kLd + i] = qv[u] * p.q_scale;
    }
  }
  const int64_t v_col = 2 * int64_t(qk_width) + int64_t(h) * p.dv + j0;
  for (int f = tid; f < C * kSlice / 4; f += kThreads) {
    const int i = f / (kSlice / 4), c = f % (kSlice / 4) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < L) v = ld4(p.qkv + (r0 + i) * p.conv_dim + v_col + c);
    st4(sm.d + i * kSlice + c, v.x, v.y, v.z, v.w);
  }
  if (warp == 0) chunk_decays(p, sm, h, r0, L, lane);
}

// cm and attn, a 4 x 4 tile of each a thread: rows i0.., columns j0...
template <int DK>
__device__ void intra_chunk(const Smem<DK>& sm) {
  const int tid = int(threadIdx.x), i0 = tid / 16 * 4, j0 = tid % 16 * 4;
  float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 4
  for (int m = 0; m < DK; ++m) {
    const float4 a = ld4(sm.kt + m * kLd + i0), q = ld4(sm.qt + m * kLd + i0), b = ld4(sm.kt + m * kLd + j0);
    const float ka[4] = {a.x, a.y, a.z, a.w}, qa[4] = {q.x, q.y, q.z, q.w}, kb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int x = 0; x < 4; ++x) {
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        kk[x][y] += ka[x] * kb[y];
        qk[x][y] += qa[x] * kb[y];
      }
    }
  }
#pragma unroll
  for (int y = 0; y < 4; ++y) {
    const int j = j0 + y;
    float cm[4], at[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int i = i0 + x;
      // Right of the diagonal G_i - G_j > 0 and its exp could overflow: 0 there.
      const float e = j <= i ? decay_exp(sm.G[i] - sm.G[j]) : 0.0f;
      cm[x] = j < i ? sm.beta[i] * e * kk[x][y] : 0.0f;
      at[x] = e * qk[x][y];
    }
    st4(sm.cmt + j * kLd + i0, cm[0], cm[1], cm[2], cm[3]);
    st4(sm.attnt + j * kLd + i0, at[0], at[1], at[2], at[3]);
  }
}

// K S0 and Q S0 on the CTA's columns, 2 rows x 4 columns a thread (rows
// i.., columns c..): K S0 turns v into the right-hand side beta (v - e^G K S0)
// in place; e^G Q S0 stays in pq for the output.
template <int DK>
__device__ void state_products(const Smem<DK>& sm, float pq[2][4]) {
  const int tid = int(threadIdx.x), c = tid % 8 * 4, i = tid / 8 * 2;
  float pk[2][4] = {};
#pragma unroll
  for (int x = 0; x < 2; ++x) {
#pragma unroll
    for (int y = 0; y < 4; ++y) pq[x][y] = 0.0f;
  }
#pragma unroll 4
  for (int m = 0; m < DK; ++m) {
    const float2 k = ld2(sm.kt + m * kLd + i), q = ld2(sm.qt + m * kLd + i);
    const float4 s = ld4(sm.s + m * kSlice + c);
    const float ka[2] = {k.x, k.y}, qa[2] = {q.x, q.y}, sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
    for (int x = 0; x < 2; ++x) {
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        pk[x][y] += ka[x] * sv[y];
        pq[x][y] += qa[x] * sv[y];
      }
    }
  }
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int row = i + x;
    const float eg = sm.eg[row], b = sm.beta[row];
    const float4 v = ld4(sm.d + row * kSlice + c);
    const float va[4] = {v.x, v.y, v.z, v.w};
    float r[4];
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      r[y] = b * (va[y] - eg * pk[x][y]);
      pq[x][y] *= eg;
    }
    st4(sm.d + row * kSlice + c, r[0], r[1], r[2], r[3]);
  }
}

// delta = (I + cm)^{-1} rhs, column by column: 8 adjacent lanes share a
// column, lane r holding rows 8r..8r+7 in registers. Step j takes the final
// delta_j from its owner (a shuffle) and subtracts cm[i][j] delta_j from
// every row; cm is 0 on and above the diagonal, so rows <= j are unchanged
// and every lane runs the same unrolled code.
template <int DK>
__device__ void solve_chunk(const Smem<DK>& sm) {
  const int tid = int(threadIdx.x), lane = tid % kWarp, col = tid / 8, r = tid % 8;
  const int group = lane & ~7;
  float d[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) d[u] = sm.d[(8 * r + u) * kSlice + col];
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const float dj = __shfl_sync(kFull, d[j % 8], group + j / 8);
    const float4 c0 = ld4(sm.cmt + j * kLd + 8 * r), c1 = ld4(sm.cmt + j * kLd + 8 * r + 4);
    const float cm[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
    for (int u = 0; u < 8; ++u) d[u] -= cm[u] * dj;
  }
#pragma unroll
  for (int u = 0; u < 8; ++u) sm.d[(8 * r + u) * kSlice + col] = d[u];
}

// o = e^G Q S0 + attn delta on the thread's 2 x 4 of state_products, written
// over v of the chunk's first L rows (v_out: the chunk's first row, the
// CTA's first column).
template <int DK>
__device__ void chunk_output(const Smem<DK>& sm, const float pq[2][4], float* v_out, int conv_dim, int L) {
  const int tid = int(threadIdx.x), c = tid % 8 * 4, i = tid / 8 * 2;
  float o[2][4];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
#pragma unroll
    for (int y = 0; y < 4; ++y) o[x][y] = pq[x][y];
  }
  for (int j = 0; j <= i + 1; ++j) {  // attn is 0 right of the diagonal
    const float2 a = ld2(sm.attnt + j * kLd + i);
    const float4 d = ld4(sm.d + j * kSlice + c);
    const float aa[2] = {a.x, a.y}, dd[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int x = 0; x < 2; ++x) {
#pragma unroll
      for (int y = 0; y < 4; ++y) o[x][y] += aa[x] * dd[y];
    }
  }
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    if (i + x < L) st4(v_out + int64_t(i + x) * conv_dim + c, o[x][0], o[x][1], o[x][2], o[x][3]);
  }
}

// S = e^{G_last} S0 + (K e^{G_last-G})^T delta on the CTA's columns: a thread
// owns rows prow + 32 r of S and 4 columns c...
template <int DK>
__device__ void update_state(const Smem<DK>& sm, int L) {
  constexpr int R = DK / 32;
  const int tid = int(threadIdx.x), c = tid % 8 * 4, prow = tid / 8;
  float acc[R][4] = {};
  for (int i = 0; i < L; ++i) {
    const float w = sm.wl[i];
    const float4 d = ld4(sm.d + i * kSlice + c);
    const float dd[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float k = sm.kt[(prow + 32 * r) * kLd + i] * w;
#pragma unroll
      for (int y = 0; y < 4; ++y) acc[r][y] += k * dd[y];
    }
  }
  const float e = *sm.e_last;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float* s = sm.s + (prow + 32 * r) * kSlice + c;
    const float4 s0 = ld4(s);
    st4(s, e * s0.x + acc[r][0], e * s0.y + acc[r][1], e * s0.z + acc[r][2], e * s0.w + acc[r][3]);
  }
}

// Block (V head, sequence, slice of kSlice columns of d_v), kThreads threads.
template <int DK>
__global__ void __launch_bounds__(kThreads, 1) delta_rule_chunked_kernel(ChunkParams p) {
  extern __shared__ float4 smem_raw[];
  const Smem<DK> sm(reinterpret_cast<float*>(smem_raw));
  const int h = int(blockIdx.x), s = int(blockIdx.y), j0 = int(blockIdx.z) * kSlice;
  const int tid = int(threadIdx.x);
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int64_t row0 = p.bt.seq_rows[2 * s];
  const int n = p.bt.seq_rows[2 * s + 1];
  if (n < p.min_tokens || p.bt.decoding(row0, n)) return;  // the recurrent kernel's
  float* state =
      p.bt.state_tables[int64_t(s) * p.bt.n_layer + p.bt.layer] + p.ssm_offset + int64_t(h) * DK * p.dv + j0;
  for (int f = tid; f < DK * kSlice; f += kThreads) sm.s[f] = state[int64_t(f / kSlice) * p.dv + f % kSlice];
  float* v_out = p.qkv + 2 * int64_t(p.n_k) * DK + int64_t(h) * p.dv + j0;
  for (int t0 = 0; t0 < n; t0 += C) {
    const int L = min(C, n - t0);
    const int64_t r0 = row0 + t0;
    load_chunk(p, sm, h, j0, r0, L);
    __syncthreads();
    intra_chunk(sm);
    float pq[2][4];
    state_products(sm, pq);
    __syncthreads();
    solve_chunk(sm);
    __syncthreads();
    chunk_output(sm, pq, v_out + r0 * p.conv_dim, p.conv_dim, L);
    update_state(sm, L);
    __syncthreads();  // before the next chunk's loads replace K, Q and v
  }
  for (int f = tid; f < DK * kSlice; f += kThreads) state[int64_t(f / kSlice) * p.dv + f % kSlice] = sm.s[f];
}

// Raises the kernel's dynamic shared-memory limit once per device.
template <int DK>
Status allow_smem() {
  static std::atomic<bool> done[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  const bool tracked = err == cudaSuccess && dev >= 0 && dev < kMaxDevices;
  if (tracked && done[dev].load(std::memory_order_acquire)) return Status::ok();
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(delta_rule_chunked_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(Smem<DK>::kBytes));
  }
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal,
                      "gated_delta_net (chunked, d_k {}): {} bytes of shared memory: {}", DK,
                      Smem<DK>::kBytes, cudaGetErrorString(err));
  }
  if (tracked) done[dev].store(true, std::memory_order_release);
  return Status::ok();
}

template <int DK>
Status launch_chunked(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(allow_smem<DK>());
  cudaError_t err =
      detail::launch(delta_rule_chunked_kernel<DK>, grid, kThreads, Smem<DK>::kBytes, stream, p);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "gated_delta_net (chunked delta rule): kernel launch failed: {}",
                      cudaGetErrorString(err));
  }
  return Status::ok();
}

size_t smem_bytes(int64_t dk) {
  switch (dk) {
    case 32:
      return Smem<32>::kBytes;
    case 64:
      return Smem<64>::kBytes;
    case 128:
      return Smem<128>::kBytes;
    default:
      return 0;
  }
}

}  // namespace

bool delta_rule_chunked_supported(const GdnArgs& a) {
  const size_t bytes = smem_bytes(a.head_k_dim);
  if (bytes == 0 || a.head_v_dim % kSlice != 0 || a.head_v_dim / kSlice > 65535 ||
      reinterpret_cast<uintptr_t>(a.scratch) % 16 != 0) {
    return false;
  }
  // Consumer GPUs (sm_86, 89, 120) allow about 99 KB a block: d_k 128 does
  // not fit there and stays on the recurrent kernel.
  int dev = 0, optin = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
         size_t(optin) >= bytes;
}

Status delta_rule_chunked(const GdnArgs& a, int64_t ssm_offset, int conv_dim, int min_tokens,
                          cudaStream_t stream) {
  if (!delta_rule_chunked_supported(a)) {
    return make_error(StatusCode::kInvalidArgument,
                      "gated_delta_net (chunked): d_k {} / d_v {} unsupported (d_k 32, 64 or 128, d_v a "
                      "multiple of {}, 16-byte aligned scratch, enough shared memory)",
                      a.head_k_dim, a.head_v_dim, kSlice);
  }
  if (a.batch.n_seq == 0 || a.batch.n_rows == 0) return Status::ok();
  ChunkParams p;
  p.bt = a.batch;
  p.qkv = a.scratch;
  p.beta = a.b;
  p.g = a.a;
  p.ssm_offset = ssm_offset;
  p.conv_dim = conv_dim;
  p.n_k = int(a.n_k_heads);
  p.n_v = int(a.n_v_heads);
  p.dv = int(a.head_v_dim);
  p.min_tokens = min_tokens;
  p.q_scale = 1.0f / std::sqrt(float(a.head_k_dim));
  const dim3 grid(unsigned(a.n_v_heads), unsigned(a.batch.n_seq), unsigned(a.head_v_dim / kSlice));
  switch (a.head_k_dim) {
    case 32:
      return launch_chunked<32>(p, grid, stream);
    case 64:
      return launch_chunked<64>(p, grid, stream);
    default:
      return launch_chunked<128>(p, grid, stream);
  }
}

}  // namespace moeserve::cuda
