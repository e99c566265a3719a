// Double-precision Gated DeltaNet references. Deliberately naive: no shared
// code with the fp32 kernels beyond the argument structs, so a mistake in one
// (head mapping, state layout, conv taps) does not cancel out in tests.
#include "kernels/cpu/gated_delta_net_reference.h"

#include <cmath>
#include <cstdint>

namespace moeserve::cpu {
namespace {

int64_t packed_or(int64_t stride, int64_t packed) { return stride == 0 ? packed : stride; }

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// Spec §2: GGUF qwen35 tiles V heads over K heads; HF and qwen3next group them.
int64_t k_head(const GdnHeads& h, int64_t v_head) {
  if (h.order == GdnHeadOrder::kTiled) return v_head % h.n_k_heads;
  const int64_t r = h.n_v_heads / h.n_k_heads;
  return v_head / r;
}

// Token-major double tensors, packed.
struct Rows {
  std::vector<double> data;
  int64_t width = 0;
  double* row(int64_t t) { return data.data() + t * width; }
};

// The delta rule on double inputs: q, k [T][n_k·d_k], v [T][n_v·d_v],
// beta, g [T][n_v]; state in/out [n_v][d_k][d_v]; returns o [T][n_v·d_v].
std::vector<double> delta_rule(const GdnHeads& hd, int64_t T, Rows& q, Rows& k, Rows& v, Rows& beta, Rows& g,
                               double q_scale, std::vector<double>& state) {
  const int64_t dk = hd.head_k_dim, dv = hd.head_v_dim;
  std::vector<double> out(size_t(T * hd.n_v_heads * dv), 0.0);
  std::vector<double> kv(static_cast<size_t>(dv));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < hd.n_v_heads; ++h) {
      double* S = state.data() + h * dk * dv;
      const double* qt = q.row(t) + k_head(hd, h) * dk;
      const double* kt = k.row(t) + k_head(hd, h) * dk;
      const double* vt = v.row(t) + h * dv;
      const double decay = std::exp(g.row(t)[h]), b = beta.row(t)[h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        kv[size_t(j)] = 0.0;
        for (int64_t i = 0; i < dk; ++i) kv[size_t(j)] += S[i * dv + j] * kt[i];
      }
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += kt[i] * b * (vt[j] - kv[size_t(j)]);
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0.0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * qt[i];
        out[size_t((t * hd.n_v_heads + h) * dv + j)] = q_scale * o;
      }
    }
  }
  return out;
}

// Copies `width` floats of T rows at `p` (row stride `stride`) into doubles.
Rows widen(const float* p, int64_t T, int64_t stride, int64_t width) {
  Rows r{std::vector<double>(size_t(T * width)), width};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < width; ++i) r.data[size_t(t * width + i)] = p[t * stride + i];
  }
  return r;
}

std::vector<double> widen_flat(const float* p, int64_t n) {
  std::vector<double> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = p[i];
  return r;
}

void l2_normalise(Rows& x, int64_t n_heads, int64_t head_dim, double eps) {
  for (int64_t t = 0; t < int64_t(x.data.size()) / x.width; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      double* p = x.row(t) + h * head_dim;
      double ss = 0.0;
      for (int64_t i = 0; i < head_dim; ++i) ss += p[i] * p[i];
      for (int64_t i = 0; i < head_dim; ++i) p[i] /= std::sqrt(ss + eps);
    }
  }
}

}  // namespace

GdnReferenceResult gdn_delta_rule_reference(const GdnDeltaRuleArgs& a) {
  const GdnHeads& h = a.heads;
  const int64_t T = a.n_tokens, qkw = h.n_k_heads * h.head_k_dim, vw = h.n_v_heads * h.head_v_dim;
  Rows q = widen(a.q, T, packed_or(a.qk_stride, qkw), qkw);
  Rows k = widen(a.k, T, packed_or(a.qk_stride, qkw), qkw);
  Rows v = widen(a.v, T, packed_or(a.v_stride, vw), vw);
  Rows beta = widen(a.beta, T, packed_or(a.gate_stride, h.n_v_heads), h.n_v_heads);
  Rows g = widen(a.g, T, packed_or(a.gate_stride, h.n_v_heads), h.n_v_heads);
  GdnReferenceResult r;
  r.ssm_state = widen_flat(a.state, h.ssm_state_floats());
  r.out = delta_rule(h, T, q, k, v, beta, g, a.q_scale, r.ssm_state);
  return r;
}

GdnReferenceResult gdn_mixer_reference(const GdnMixerArgs& a) {
  const GdnHeads& h = a.heads;
  const int64_t T = a.n_tokens, K = a.conv_kernel, C = h.conv_dim();
  const int64_t qkw = h.n_k_heads * h.head_k_dim, nv = h.n_v_heads, dv = h.head_v_dim;
  GdnReferenceResult r;

  // Conv over the history [state rows ; input rows] of each channel.
  Rows hist = widen(a.conv_state, K - 1, C, C);
  Rows in = widen(a.qkv, T, packed_or(a.qkv_stride, C), C);
  hist.data.insert(hist.data.end(), in.data.begin(), in.data.end());
  Rows q{std::vector<double>(size_t(T * qkw)), qkw}, k = q;
  Rows v{std::vector<double>(size_t(T * nv * dv)), nv * dv};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t ch = 0; ch < C; ++ch) {
      double c = 0.0;
      for (int64_t j = 0; j < K; ++j) c += double(a.conv_weight[ch * K + j]) * hist.row(t + j)[ch];
      const double y = silu(c);
      if (ch < qkw) {
        q.row(t)[ch] = y;
      } else if (ch < 2 * qkw) {
        k.row(t)[ch - qkw] = y;
      } else {
        v.row(t)[ch - 2 * qkw] = y;
      }
    }
  }
  r.conv_state.assign(hist.data.end() - (K - 1) * C, hist.data.end());

  l2_normalise(q, h.n_k_heads, h.head_k_dim, a.l2_eps);
  l2_normalise(k, h.n_k_heads, h.head_k_dim, a.l2_eps);

  const int64_t bas = packed_or(a.ba_stride, nv);
  Rows beta{std::vector<double>(size_t(T * nv)), nv}, g = beta;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < nv; ++i) {
      beta.row(t)[i] = 1.0 / (1.0 + std::exp(-double(a.b[t * bas + i])));
      const double x = double(a.a[t * bas + i]) + a.dt_bias[i];
      g.row(t)[i] = double(a.a_neg[i]) * (x > 30.0 ? x : std::log1p(std::exp(x)));
    }
  }

  r.ssm_state = widen_flat(a.ssm_state, h.ssm_state_floats());
  std::vector<double> o =
      delta_rule(h, T, q, k, v, beta, g, 1.0 / std::sqrt(double(h.head_k_dim)), r.ssm_state);

  const int64_t zs = packed_or(a.z_stride, nv * dv);
  r.out.assign(size_t(T * nv * dv), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < nv; ++i) {
      const double* oh = o.data() + (t * nv + i) * dv;
      double ms = 0.0;
      for (int64_t j = 0; j < dv; ++j) ms += oh[j] * oh[j] / double(dv);
      for (int64_t j = 0; j < dv; ++j) {
        const double z = a.z[t * zs + i * dv + j];
        r.out[size_t((t * nv + i) * dv + j)] =
            a.norm_weight[j] * oh[j] / std::sqrt(ms + a.norm_eps) * silu(z);
      }
    }
  }
  return r;
}

}  // namespace moeserve::cpu
