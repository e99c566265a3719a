// Naive double-precision Qwen3 / Qwen3-MoE forward pass written straight from
// model-and-format-specs.md §3, over the float values of a TinyModel. K and V
// are rounded through f16 exactly where the engine's cache stores them, since
// the f16 cache is part of the engine's definition; everything else is double.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/half.h"
#include "models/tiny_qwen3.h"

namespace moeserve::testing {

using Vec = std::vector<double>;

inline Vec ref_matvec(const std::vector<float>& w, size_t offset, int64_t n_out, int64_t n_in, const Vec& x) {
  Vec y(static_cast<size_t>(n_out), 0.0);
  for (int64_t o = 0; o < n_out; ++o) {
    for (int64_t i = 0; i < n_in; ++i) y[size_t(o)] += double(w[offset + size_t(o * n_in + i)]) * x[size_t(i)];
  }
  return y;
}

inline Vec ref_rmsnorm(const double* x, int64_t n, const std::vector<float>& w, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  Vec y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = x[i] * r * double(w[size_t(i)]);
  return y;
}

inline void ref_rope(double* x, int64_t n_rot, int64_t pos, double base) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = double(pos) * std::pow(base, -2.0 * double(i) / double(n_rot));
    const double a = x[i], b = x[i + half];
    x[i] = a * std::cos(theta) - b * std::sin(theta);
    x[i + half] = b * std::cos(theta) + a * std::sin(theta);
  }
}

inline double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }
inline double round_f16(double x) { return fp16_to_fp32(fp32_to_fp16(float(x))); }

inline Vec ref_ffn(const TinyModel& m, const std::string& g, const std::string& u, const std::string& d, size_t e,
                   int64_t H, int64_t F, const Vec& x) {
  Vec gate = ref_matvec(m.t(g), e * size_t(H * F), F, H, x);
  Vec up = ref_matvec(m.t(u), e * size_t(H * F), F, H, x);
  for (int64_t i = 0; i < F; ++i) gate[size_t(i)] = ref_silu(gate[size_t(i)]) * up[size_t(i)];
  return ref_matvec(m.t(d), e * size_t(H * F), H, F, gate);
}

inline Vec ref_moe(const TinyModel& m, int il, const Vec& x) {
  const TinySpec& s = m.spec;
  auto b = [&](std::string_view t) { return keys::blk(il, t); };
  Vec p = ref_matvec(m.t(b(keys::kFfnGateInp)), 0, s.n_expert, s.n_embd, x);
  const double mx = *std::max_element(p.begin(), p.end());
  double sum = 0.0;
  for (double& v : p) sum += (v = std::exp(v - mx));
  for (double& v : p) v /= sum;
  std::vector<int> idx(static_cast<size_t>(s.n_expert));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int c) { return p[size_t(a)] > p[size_t(c)]; });
  double top_sum = 0.0;
  for (int64_t j = 0; j < s.n_expert_used; ++j) top_sum += p[size_t(idx[size_t(j)])];
  Vec out(static_cast<size_t>(s.n_embd), 0.0);
  for (int64_t j = 0; j < s.n_expert_used; ++j) {
    const int e = idx[size_t(j)];
    const Vec y = ref_ffn(m, b(keys::kFfnGateExps), b(keys::kFfnUpExps), b(keys::kFfnDownExps), size_t(e), s.n_embd,
                          s.n_ff_exp, x);
    for (int64_t i = 0; i < s.n_embd; ++i) out[size_t(i)] += p[size_t(e)] / top_sum * y[size_t(i)];
  }
  return out;
}

// Logits [T][n_vocab] at every position of `tokens` (positions 0..T-1).
inline std::vector<Vec> reference_forward(const TinyModel& m, const std::vector<int32_t>& tokens) {
  const TinySpec& s = m.spec;
  const int64_t T = int64_t(tokens.size()), H = s.n_embd, hd = s.head_dim;
  const int64_t qd = s.n_head * hd, kvd = s.n_head_kv * hd, group = s.n_head / s.n_head_kv;
  std::vector<Vec> x(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const auto& e = m.t(std::string(keys::kTokenEmbd));
    x[size_t(t)].assign(e.begin() + tokens[size_t(t)] * H, e.begin() + (tokens[size_t(t)] + 1) * H);
  }
  for (int il = 0; il < int(s.n_layer); ++il) {
    auto b = [&](std::string_view t) { return keys::blk(il, t); };
    std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const Vec xn = ref_rmsnorm(x[size_t(t)].data(), H, m.t(b(keys::kAttnNorm)), s.eps);
      q[size_t(t)] = ref_matvec(m.t(b(keys::kAttnQ)), 0, qd, H, xn);
      k[size_t(t)] = ref_matvec(m.t(b(keys::kAttnK)), 0, kvd, H, xn);
      v[size_t(t)] = ref_matvec(m.t(b(keys::kAttnV)), 0, kvd, H, xn);
      for (int64_t h = 0; h < s.n_head; ++h) {
        Vec n = ref_rmsnorm(q[size_t(t)].data() + h * hd, hd, m.t(b(keys::kAttnQNorm)), s.eps);
        ref_rope(n.data(), hd, t, s.rope_base);
        std::copy(n.begin(), n.end(), q[size_t(t)].begin() + h * hd);
      }
      for (int64_t h = 0; h < s.n_head_kv; ++h) {
        Vec n = ref_rmsnorm(k[size_t(t)].data() + h * hd, hd, m.t(b(keys::kAttnKNorm)), s.eps);
        ref_rope(n.data(), hd, t, s.rope_base);
        std::copy(n.begin(), n.end(), k[size_t(t)].begin() + h * hd);
      }
      for (double& z : k[size_t(t)]) z = round_f16(z);
      for (double& z : v[size_t(t)]) z = round_f16(z);
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec attn(static_cast<size_t>(qd), 0.0);
      for (int64_t h = 0; h < s.n_head; ++h) {
        const int64_t g = h / group;
        Vec score(static_cast<size_t>(t + 1));
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int64_t i = 0; i < hd; ++i) d += q[size_t(t)][size_t(h * hd + i)] * k[size_t(j)][size_t(g * hd + i)];
          score[size_t(j)] = d / std::sqrt(double(hd));
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0.0;
        for (double& z : score) sum += (z = std::exp(z - mx));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t i = 0; i < hd; ++i) {
            attn[size_t(h * hd + i)] += score[size_t(j)] / sum * v[size_t(j)][size_t(g * hd + i)];
          }
        }
      }
      const Vec o = ref_matvec(m.t(b(keys::kAttnOutput)), 0, H, qd, attn);
      for (int64_t i = 0; i < H; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
      const Vec xn = ref_rmsnorm(x[size_t(t)].data(), H, m.t(b(keys::kFfnNorm)), s.eps);
      const Vec f = s.arch == "qwen3moe"
                        ? ref_moe(m, il, xn)
                        : ref_ffn(m, b(keys::kFfnGate), b(keys::kFfnUp), b(keys::kFfnDown), 0, H, s.n_ff, xn);
      for (int64_t i = 0; i < H; ++i) x[size_t(t)][size_t(i)] += f[size_t(i)];
    }
  }
  std::vector<Vec> logits(static_cast<size_t>(T));
  const std::string out_name = s.tied_output ? std::string(keys::kTokenEmbd) : std::string(keys::kOutput);
  for (int64_t t = 0; t < T; ++t) {
    const Vec xn = ref_rmsnorm(x[size_t(t)].data(), H, m.t(std::string(keys::kOutputNorm)), s.eps);
    logits[size_t(t)] = ref_matvec(m.t(out_name), 0, s.n_vocab, H, xn);
  }
  return logits;
}

}  // namespace moeserve::testing
