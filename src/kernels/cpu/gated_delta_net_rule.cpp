// The gated delta rule: recurrent (token by token) and chunked forms. See
// gated_delta_net.h for the contract and the spec for the math.
//
// Hot loops keep their partial sums in GCC/Clang vector-extension values
// (VecF), which the compiler maps to registers of whatever instruction set
// the file is built for (SSE2 in the baseline build). Plain float arrays were
// not enough: GCC 12 vectorised the gemm tile along the reduction (p) loop
// and kept the accumulators in memory, 3-5x slower.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/gated_delta_net.h"

namespace moeserve::cpu {
namespace {

// Floats per vector register of the compile-time instruction set.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#elif defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
typedef float VecF __attribute__((vector_size(kLanes * sizeof(float))));

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, VecF v) { std::memcpy(p, &v, sizeof v); }

int64_t stride_or(int64_t stride, int64_t packed) { return stride == 0 ? packed : stride; }

// exp of a log-decay, flushed to exactly 0 below e^−50 (2e-22). Products
// of such factors would otherwise reach fp32 denormals, which are very slow
// on x86 (measured: the chunked form 4x slower with decays down to e^−3 a
// token); a contribution 2e-22 times the state is below fp32 precision.
inline float decay_exp(double log_decay) { return log_decay < -50.0 ? 0.0f : std::exp(float(log_decay)); }

template <typename F>
void for_each_task(ThreadPool* pool, int64_t n, F&& fn) {
  if (pool == nullptr || pool->size() <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  pool->run(n, fn);
}

// GdnDeltaRuleArgs with the strides resolved and the shape checked.
struct DeltaRule {
  const GdnDeltaRuleArgs& a;
  int64_t dk = 0, dv = 0, qk_stride = 0, v_stride = 0, gate_stride = 0, out_stride = 0;

  const float* q(int64_t t, int64_t kh) const { return a.q + t * qk_stride + kh * dk; }
  const float* k(int64_t t, int64_t kh) const { return a.k + t * qk_stride + kh * dk; }
  const float* v(int64_t t, int64_t h) const { return a.v + t * v_stride + h * dv; }
  float* out(int64_t t, int64_t h) const { return a.out + t * out_stride + h * dv; }
  float beta(int64_t t, int64_t h) const { return a.beta[t * gate_stride + h]; }
  float g(int64_t t, int64_t h) const { return a.g[t * gate_stride + h]; }
  float* state(int64_t h) const { return a.state + h * dk * dv; }
};

Status check_stride(const char* fn, const char* name, int64_t stride, int64_t width) {
  if (stride < width) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} {} is below the row width {}", fn, name, stride,
                      width);
  }
  return Status::ok();
}

Status check_delta_rule(const char* fn, DeltaRule& r) {
  const GdnDeltaRuleArgs& a = r.a;
  MOESERVE_RETURN_IF_ERROR(gdn_check_heads(a.heads));
  const GdnHeads& h = a.heads;
  if (a.n_tokens < 0 || a.chunk_size < 1) {
    return make_error(StatusCode::kInvalidArgument, "{}: n_tokens {}, chunk_size {}", fn, a.n_tokens,
                      a.chunk_size);
  }
  r.dk = h.head_k_dim;
  r.dv = h.head_v_dim;
  r.qk_stride = stride_or(a.qk_stride, h.n_k_heads * r.dk);
  r.v_stride = stride_or(a.v_stride, h.n_v_heads * r.dv);
  r.gate_stride = stride_or(a.gate_stride, h.n_v_heads);
  r.out_stride = stride_or(a.out_stride, h.n_v_heads * r.dv);
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "qk_stride", r.qk_stride, h.n_k_heads * r.dk));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "v_stride", r.v_stride, h.n_v_heads * r.dv));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "gate_stride", r.gate_stride, h.n_v_heads));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "out_stride", r.out_stride, h.n_v_heads * r.dv));
  if (a.n_tokens > 0 && (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.beta == nullptr ||
                         a.g == nullptr || a.state == nullptr || a.out == nullptr)) {
    return make_error(StatusCode::kInvalidArgument, "{}: null q, k, v, beta, g, state or out", fn);
  }
  return Status::ok();
}

// ---------------------------------------------------------------- recurrent

// Columns of S handled together: kStripV registers each of kv, δ and o.
constexpr int64_t kStripV = 4, kStrip = kStripV * kLanes;

struct Token {
  const float* q;
  const float* k;
  const float* v;  // the strip's first column
  float* out;      // the strip's first column; may be v
  float decay, beta, q_scale;
};

// One token on the columns [0, kStrip) of S (row stride dv). Both passes
// over the strip (Sᵀk, then the rank-1 update and Sᵀq) find its d_k × kStrip
// floats in L1.
void recurrent_strip(float* S, int64_t dk, int64_t dv, const Token& tk) {
  VecF kv[kStripV] = {}, delta[kStripV], o[kStripV] = {};
  for (int64_t m = 0; m < dk; ++m) {
    const float km = tk.k[m];
    const float* s = S + m * dv;
    for (int64_t u = 0; u < kStripV; ++u) kv[u] += km * load(s + u * kLanes);
  }
  // δ = β(v − (decay·S)ᵀk), the decay applied once to the sum.
  for (int64_t u = 0; u < kStripV; ++u) delta[u] = tk.beta * (load(tk.v + u * kLanes) - tk.decay * kv[u]);
  for (int64_t m = 0; m < dk; ++m) {
    const float km = tk.k[m], qm = tk.q[m];
    float* s = S + m * dv;
    for (int64_t u = 0; u < kStripV; ++u) {
      const VecF x = tk.decay * load(s + u * kLanes) + km * delta[u];
      store(s + u * kLanes, x);
      o[u] += qm * x;
    }
  }
  for (int64_t u = 0; u < kStripV; ++u) store(tk.out + u * kLanes, tk.q_scale * o[u]);  // v already read
}

// The same on columns [0, w), w < kStrip: head dims that are not a multiple
// of kStrip (tests; no released model).
void recurrent_strip_tail(float* S, int64_t dk, int64_t dv, const Token& tk, int64_t w) {
  float kv[kStrip] = {}, delta[kStrip], o[kStrip] = {};
  for (int64_t m = 0; m < dk; ++m) {
    for (int64_t c = 0; c < w; ++c) kv[c] += tk.k[m] * S[m * dv + c];
  }
  for (int64_t c = 0; c < w; ++c) delta[c] = tk.beta * (tk.v[c] - tk.decay * kv[c]);
  for (int64_t m = 0; m < dk; ++m) {
    for (int64_t c = 0; c < w; ++c) {
      const float x = tk.decay * S[m * dv + c] + tk.k[m] * delta[c];
      S[m * dv + c] = x;
      o[c] += tk.q[m] * x;
    }
  }
  for (int64_t c = 0; c < w; ++c) tk.out[c] = tk.q_scale * o[c];
}

void recurrent_head(const DeltaRule& r, int64_t h) {
  const int64_t dv = r.dv, kh = r.a.heads.k_head_of(h);
  float* S = r.state(h);
  for (int64_t t = 0; t < r.a.n_tokens; ++t) {
    Token tk{r.q(t, kh), r.k(t, kh), r.v(t, h), r.out(t, h), decay_exp(r.g(t, h)), r.beta(t, h), r.a.q_scale};
    int64_t j = 0;
    for (; j + kStrip <= dv; j += kStrip, tk.v += kStrip, tk.out += kStrip)
      recurrent_strip(S + j, r.dk, dv, tk);
    if (j < dv) recurrent_strip_tail(S + j, r.dk, dv, tk, dv - j);
  }
}

// ---------------------------------------------------------------- chunked

// A row-major matrix: element [i][j] at p[i * ld + j].
template <typename T>
struct Mat {
  T* p;
  int64_t ld;
};

// C[M][N] = (accumulate ? C : 0) + alpha · A[M][K] · B[K][N].
struct Gemm {
  Mat<const float> a, b;
  Mat<float> c;
  int64_t m, n, k;
  float alpha = 1.0f;
  bool accumulate = false;
  bool lower_a = false;  // A[i][p] is zero for p > i: row i sums p ≤ i only
  bool lower_c = false;  // only C[i][j], j ≤ i, is needed (more may be written)
};

// A full tile: kTileM rows × kTileNV registers of accumulators.
constexpr int64_t kTileM = 4, kTileNV = 2, kTileN = kTileNV * kLanes;

void gemm_tile(const Gemm& g, int64_t i0, int64_t j0, int64_t k_end) {
  VecF acc[kTileM][kTileNV] = {};
  const float* a = g.a.p + i0 * g.a.ld;
  for (int64_t p = 0; p < k_end; ++p) {
    const float* b = g.b.p + p * g.b.ld + j0;
    VecF bv[kTileNV];
    for (int64_t u = 0; u < kTileNV; ++u) bv[u] = load(b + u * kLanes);
    for (int64_t r = 0; r < kTileM; ++r) {
      const float ar = a[r * g.a.ld + p];
      for (int64_t u = 0; u < kTileNV; ++u) acc[r][u] += ar * bv[u];
    }
  }
  for (int64_t r = 0; r < kTileM; ++r) {
    float* c = g.c.p + (i0 + r) * g.c.ld + j0;
    for (int64_t u = 0; u < kTileNV; ++u) {
      const VecF prev = g.accumulate ? load(c + u * kLanes) : VecF{};
      store(c + u * kLanes, prev + g.alpha * acc[r][u]);
    }
  }
}

// An edge tile of rm ≤ kTileM rows × rn ≤ kTileN columns, one element at a time.
void gemm_edge(const Gemm& g, int64_t i0, int64_t j0, int64_t rm, int64_t rn, int64_t k_end) {
  for (int64_t r = 0; r < rm; ++r) {
    float acc[kTileN] = {};
    for (int64_t p = 0; p < k_end; ++p) {
      const float ar = g.a.p[(i0 + r) * g.a.ld + p];
      for (int64_t x = 0; x < rn; ++x) acc[x] += ar * g.b.p[p * g.b.ld + j0 + x];
    }
    float* c = g.c.p + (i0 + r) * g.c.ld + j0;
    for (int64_t x = 0; x < rn; ++x) c[x] = (g.accumulate ? c[x] : 0.0f) + g.alpha * acc[x];
  }
}

void gemm(const Gemm& g) {
  for (int64_t i0 = 0; i0 < g.m; i0 += kTileM) {
    const int64_t rm = std::min(kTileM, g.m - i0);
    const int64_t k_end = g.lower_a ? std::min(g.k, i0 + rm) : g.k;
    // Right of the diagonal: whole tiles only, so most tiles stay full.
    const int64_t n_end = g.lower_c ? std::min(g.n, (i0 + rm + kTileN - 1) / kTileN * kTileN) : g.n;
    for (int64_t j0 = 0; j0 < n_end; j0 += kTileN) {
      const int64_t rn = std::min(kTileN, n_end - j0);
      if (rm == kTileM && rn == kTileN) {
        gemm_tile(g, i0, j0, k_end);
      } else {
        gemm_edge(g, i0, j0, rm, rn, k_end);
      }
    }
  }
}

// Per-thread scratch of the chunked form, for chunks of up to C tokens.
struct ChunkScratch {
  int64_t C = 0;
  std::vector<float> buf;
  std::vector<double> G;  // cumulative log-decay inside the chunk
  float *q, *k, *kt, *ktw, *d, *pk, *pq, *cm, *attn, *beta;

  ChunkScratch(int64_t chunk, int64_t dk, int64_t dv) : C(chunk), G(size_t(chunk)) {
    buf.resize(size_t(4 * C * dk + 3 * C * dv + 2 * C * C + C));
    float* p = buf.data();
    auto take = [&p](int64_t n) { return std::exchange(p, p + n); };
    q = take(C * dk);    // q rows · q_scale
    k = take(C * dk);    // k rows
    kt = take(dk * C);   // k transposed, row stride C
    ktw = take(dk * C);  // kt[m][i] · exp(G_last − G_i)
    d = take(C * dv);    // v, then the right-hand side, solved in place into δ
    pk = take(C * dv);   // K·S0
    pq = take(C * dv);   // Q·S0, then the output rows
    cm = take(C * C);    // k·k, then β_i e^{G_i−G_j} k_i·k_j for j < i (0 elsewhere)
    attn = take(C * C);  // q·k, then e^{G_i−G_j} q_i·k_j for j ≤ i (0 elsewhere)
    beta = take(C);
  }
};

// Loads one chunk and builds the decay-weighted intra-chunk matrices.
void load_chunk(const DeltaRule& r, int64_t h, int64_t t0, int64_t L, ChunkScratch& s) {
  const int64_t dk = r.dk, dv = r.dv, C = s.C, kh = r.a.heads.k_head_of(h);
  double G = 0.0;  // double: differences of long fp32 cumsums lose digits
  for (int64_t i = 0; i < L; ++i) {
    const float* q = r.q(t0 + i, kh);
    const float* k = r.k(t0 + i, kh);
    for (int64_t m = 0; m < dk; ++m) {
      s.q[i * dk + m] = q[m] * r.a.q_scale;
      s.k[i * dk + m] = k[m];
      s.kt[m * C + i] = k[m];
    }
    std::copy_n(r.v(t0 + i, h), dv, s.d + i * dv);
    s.beta[i] = r.beta(t0 + i, h);
    G += double(r.g(t0 + i, h));
    s.G[size_t(i)] = G;
  }
  gemm({.a = {s.k, dk}, .b = {s.kt, C}, .c = {s.cm, C}, .m = L, .n = L, .k = dk, .lower_c = true});
  gemm({.a = {s.q, dk}, .b = {s.kt, C}, .c = {s.attn, C}, .m = L, .n = L, .k = dk, .lower_c = true});
  for (int64_t i = 0; i < L; ++i) {
    float* cm = s.cm + i * C;
    float* attn = s.attn + i * C;
    for (int64_t j = 0; j <= i; ++j) {
      const float e = decay_exp(s.G[size_t(i)] - s.G[size_t(j)]);
      cm[j] = j < i ? s.beta[i] * e * cm[j] : 0.0f;
      attn[j] *= e;
    }
    std::fill(cm + i + 1, cm + L, 0.0f);
    std::fill(attn + i + 1, attn + L, 0.0f);
  }
}

// δ ← (I + cm)⁻¹ δ for the unit lower-triangular I + cm, in row blocks: the
// rows above a block are subtracted by one product, then the block's own
// rows one after another.
void solve_lower(ChunkScratch& s, int64_t L, int64_t dv) {
  constexpr int64_t kBlock = 16;
  for (int64_t b0 = 0; b0 < L; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, L - b0);
    if (b0 > 0) {
      const Mat<const float> done{s.d, dv}, rows{s.cm + b0 * s.C, s.C};
      gemm({.a = rows,
            .b = done,
            .c = {s.d + b0 * dv, dv},
            .m = nb,
            .n = dv,
            .k = b0,
            .alpha = -1.0f,
            .accumulate = true});
    }
    for (int64_t i = b0 + 1; i < b0 + nb; ++i) {
      float* __restrict di = s.d + i * dv;
      for (int64_t j = b0; j < i; ++j) {
        const float c = s.cm[i * s.C + j];
        const float* __restrict dj = s.d + j * dv;
        for (int64_t x = 0; x < dv; ++x) di[x] -= c * dj[x];
      }
    }
  }
}

// One chunk of L tokens of V head h against the state S0 at its start:
//   δ = A⁻¹ β(v − e^G ⊙ K S0),  A = I + tril(β k kᵀ ⊙ e^{G_i−G_j}, −1)
//   o = e^G ⊙ Q S0 + (Q Kᵀ ⊙ e^{G_i−G_j} ⊙ causal) δ
//   S ← e^{G_last} S0 + (K ⊙ e^{G_last−G})ᵀ δ
// δ is u − w·S0 of the spec's u/w form, solved for the right-hand side
// directly: one triangular solve of width d_v instead of d_v + d_k.
void chunk_step(const DeltaRule& r, int64_t h, int64_t t0, int64_t L, ChunkScratch& s) {
  const int64_t dk = r.dk, dv = r.dv, C = s.C;
  float* S = r.state(h);
  load_chunk(r, h, t0, L, s);
  gemm({.a = {s.k, dk}, .b = {S, dv}, .c = {s.pk, dv}, .m = L, .n = dv, .k = dk});
  gemm({.a = {s.q, dk}, .b = {S, dv}, .c = {s.pq, dv}, .m = L, .n = dv, .k = dk});
  for (int64_t i = 0; i < L; ++i) {
    const float eg = decay_exp(s.G[size_t(i)]), b = s.beta[i];
    float* di = s.d + i * dv;
    float* pq = s.pq + i * dv;
    const float* pk = s.pk + i * dv;
    for (int64_t j = 0; j < dv; ++j) {
      di[j] = b * (di[j] - eg * pk[j]);
      pq[j] *= eg;
    }
  }
  solve_lower(s, L, dv);
  const Mat<const float> attn{s.attn, C}, delta{s.d, dv};
  gemm(
      {.a = attn, .b = delta, .c = {s.pq, dv}, .m = L, .n = dv, .k = L, .accumulate = true, .lower_a = true});
  for (int64_t i = 0; i < L; ++i) std::copy_n(s.pq + i * dv, dv, r.out(t0 + i, h));  // v is in s.d already

  const double G_last = s.G[size_t(L - 1)];
  for (int64_t i = 0; i < L; ++i) {
    const float w = decay_exp(G_last - s.G[size_t(i)]);
    for (int64_t m = 0; m < dk; ++m) s.ktw[m * C + i] = s.kt[m * C + i] * w;
  }
  const float e_last = decay_exp(G_last);
  for (int64_t x = 0; x < dk * dv; ++x) S[x] *= e_last;
  gemm({.a = {s.ktw, C}, .b = delta, .c = {S, dv}, .m = dk, .n = dv, .k = L, .accumulate = true});
}

}  // namespace

Status gdn_check_heads(const GdnHeads& h) {
  if (h.n_k_heads <= 0 || h.n_v_heads <= 0 || h.n_v_heads % h.n_k_heads != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "gated delta net: n_v_heads {} is not a positive multiple of n_k_heads {}", h.n_v_heads,
                      h.n_k_heads);
  }
  if (h.head_k_dim <= 0 || h.head_v_dim <= 0 || h.head_k_dim > kGdnMaxHeadDim ||
      h.head_v_dim > kGdnMaxHeadDim) {
    return make_error(StatusCode::kInvalidArgument, "gated delta net: head dims {}x{} outside 1..{}",
                      h.head_k_dim, h.head_v_dim, kGdnMaxHeadDim);
  }
  return Status::ok();
}

Status gdn_delta_rule_recurrent(const GdnDeltaRuleArgs& args) {
  DeltaRule r{args};
  MOESERVE_RETURN_IF_ERROR(check_delta_rule("gdn_delta_rule_recurrent", r));
  if (args.n_tokens == 0) return Status::ok();
  for_each_task(args.pool, args.heads.n_v_heads, [&](int64_t h, int) { recurrent_head(r, h); });
  return Status::ok();
}

Status gdn_delta_rule_chunked(const GdnDeltaRuleArgs& args) {
  DeltaRule r{args};
  MOESERVE_RETURN_IF_ERROR(check_delta_rule("gdn_delta_rule_chunked", r));
  if (args.n_tokens == 0) return Status::ok();
  const int64_t C = std::min(args.chunk_size, args.n_tokens);
  const int threads = args.pool == nullptr ? 1 : args.pool->size();
  std::vector<ChunkScratch> scratch;
  scratch.reserve(size_t(threads));  // no reallocation: the scratch pointers stay valid
  for (int i = 0; i < threads; ++i) scratch.emplace_back(C, r.dk, r.dv);
  for_each_task(args.pool, args.heads.n_v_heads, [&](int64_t h, int thread) {
    for (int64_t t0 = 0; t0 < args.n_tokens; t0 += C) {
      chunk_step(r, h, t0, std::min(C, args.n_tokens - t0), scratch[size_t(thread)]);
    }
  });
  return Status::ok();
}

// Tokens from which the chunked form is faster, measured on the 35B shapes
// on a 2-core Xeon VM: with AVX2 or AVX-512 code it wins from 16 tokens
// (1.3-1.8x at T = 64..512); in the SSE2 baseline build (4 lanes, no FMA)
// the recurrent form is as fast or faster at every T.
constexpr int64_t kChunkedMinTokens = kLanes >= 8 ? 16 : std::numeric_limits<int64_t>::max();

Status gdn_delta_rule(const GdnDeltaRuleArgs& args) {
  return args.n_tokens < kChunkedMinTokens ? gdn_delta_rule_recurrent(args) : gdn_delta_rule_chunked(args);
}

}  // namespace moeserve::cpu
