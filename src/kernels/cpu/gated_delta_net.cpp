// Gated DeltaNet CPU kernels around the delta rule (conv, norms, gates, the
// mixer core); the delta rule itself is in gated_delta_net_rule.cpp. See
// gated_delta_net.h for the contracts.
//
// Reductions use explicit independent partial sums, so the compiler
// vectorises them without -ffast-math (it may not reassociate a float sum).
#include "kernels/cpu/gated_delta_net.h"

#include <algorithm>
#include <cmath>

namespace moeserve::cpu {
namespace {

int64_t stride_or(int64_t stride, int64_t packed) { return stride == 0 ? packed : stride; }

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus: identity above 20, where log1p(exp(x)) == x in fp32.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float sum_squares(const float* x, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * x[i + l];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += x[i] * x[i];
  for (float a : acc) s += a;
  return s;
}

// Runs fn(task, thread) for every task, on the pool when there is one.
template <typename F>
void for_each_task(ThreadPool* pool, int64_t n, F&& fn) {
  if (pool == nullptr || pool->size() <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  pool->run(n, fn);
}

Status check_stride(const char* fn, const char* name, int64_t stride, int64_t width) {
  if (stride < width) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} {} is below the row width {}", fn, name, stride,
                      width);
  }
  return Status::ok();
}

// ---------------------------------------------------------------- conv + SiLU

// Channels per conv task: the weights and the K−1 previous rows of a block
// stay in L1 while all T tokens stream through.
constexpr int64_t kConvBlock = 64;

void conv_block(const GdnConvArgs& a, int64_t x_stride, int64_t y_stride, int64_t c0) {
  const int K = a.kernel_size, hist = K - 1;
  const int64_t n = std::min(kConvBlock, a.n_channels - c0);
  float wt[kGdnMaxConvKernel][kConvBlock];   // weights transposed: tap-major
  float win[kGdnMaxConvKernel][kConvBlock];  // ring of the last K−1 raw rows
  for (int64_t c = 0; c < n; ++c) {
    for (int j = 0; j < K; ++j) wt[j][c] = a.weight[(c0 + c) * K + j];
  }
  for (int r = 0; r < hist; ++r) std::copy_n(a.state + r * a.n_channels + c0, n, win[r]);
  int oldest = 0;  // ring slot of tap 0
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    float cur[kConvBlock], acc[kConvBlock];
    // Read the whole raw row before writing y: y may be x.
    std::copy_n(a.x + t * x_stride + c0, n, cur);
    for (int64_t c = 0; c < n; ++c) acc[c] = wt[hist][c] * cur[c];
    for (int r = 0; r < hist; ++r) {
      const float* w = wt[r];
      const float* p = win[(oldest + r) % hist];
      for (int64_t c = 0; c < n; ++c) acc[c] += w[c] * p[c];
    }
    if (hist > 0) {
      std::copy_n(cur, n, win[oldest]);
      oldest = (oldest + 1) % hist;
    }
    float* y = a.y + t * y_stride + c0;
    for (int64_t c = 0; c < n; ++c) y[c] = silu(acc[c]);
  }
  for (int r = 0; r < hist; ++r) std::copy_n(win[(oldest + r) % hist], n, a.state + r * a.n_channels + c0);
}

}  // namespace

Status gdn_conv_silu(const GdnConvArgs& a) {
  const char* fn = "gdn_conv_silu";
  if (a.kernel_size < 1 || a.kernel_size > kGdnMaxConvKernel || a.n_tokens < 0 || a.n_channels < 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: kernel_size {} (1..{}), n_tokens {}, n_channels {}",
                      fn, a.kernel_size, kGdnMaxConvKernel, a.n_tokens, a.n_channels);
  }
  const int64_t xs = stride_or(a.x_stride, a.n_channels), ys = stride_or(a.y_stride, a.n_channels);
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "x_stride", xs, a.n_channels));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "y_stride", ys, a.n_channels));
  if (a.n_tokens == 0 || a.n_channels == 0) return Status::ok();
  if (a.x == nullptr || a.y == nullptr || a.weight == nullptr || (a.kernel_size > 1 && a.state == nullptr)) {
    return make_error(StatusCode::kInvalidArgument, "{}: null x, y, weight or state", fn);
  }
  const int64_t n_blocks = (a.n_channels + kConvBlock - 1) / kConvBlock;
  for_each_task(a.pool, n_blocks, [&](int64_t blk, int) { conv_block(a, xs, ys, blk * kConvBlock); });
  return Status::ok();
}

Status gdn_l2_norm(const GdnL2NormArgs& a) {
  const int64_t stride = stride_or(a.stride, a.n_heads * a.head_dim);
  if (a.n_tokens < 0 || a.n_heads < 0 || a.head_dim < 0) {
    return make_error(StatusCode::kInvalidArgument, "gdn_l2_norm: negative shape");
  }
  MOESERVE_RETURN_IF_ERROR(check_stride("gdn_l2_norm", "stride", stride, a.n_heads * a.head_dim));
  if (a.n_tokens > 0 && a.n_heads > 0 && a.x == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "gdn_l2_norm: null x");
  }
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t h = 0; h < a.n_heads; ++h) {
      float* x = a.x + t * stride + h * a.head_dim;
      const float inv = 1.0f / std::sqrt(sum_squares(x, a.head_dim) + a.eps);
      for (int64_t i = 0; i < a.head_dim; ++i) x[i] *= inv;
    }
  }
  return Status::ok();
}

Status gdn_gates(const GdnGateArgs& a) {
  const char* fn = "gdn_gates";
  if (a.n_tokens < 0 || a.n_heads < 0)
    return make_error(StatusCode::kInvalidArgument, "{}: negative shape", fn);
  const int64_t bs = stride_or(a.b_stride, a.n_heads), as = stride_or(a.a_stride, a.n_heads);
  const int64_t os = stride_or(a.out_stride, a.n_heads);
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "b_stride", bs, a.n_heads));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "a_stride", as, a.n_heads));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "out_stride", os, a.n_heads));
  if (a.n_tokens == 0 || a.n_heads == 0) return Status::ok();
  if (a.b == nullptr || a.a == nullptr || a.a_neg == nullptr || a.dt_bias == nullptr || a.beta == nullptr ||
      a.g == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "{}: null b, a, a_neg, dt_bias, beta or g", fn);
  }
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const float b = a.b[t * bs + h], x = a.a[t * as + h];  // read both first: outputs may alias
      a.beta[t * os + h] = sigmoid(b);
      a.g[t * os + h] = a.a_neg[h] * softplus(x + a.dt_bias[h]);
    }
  }
  return Status::ok();
}

Status gdn_gated_norm(const GdnGatedNormArgs& a) {
  const char* fn = "gdn_gated_norm";
  if (a.n_tokens < 0 || a.n_heads < 0 || a.head_dim < 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: negative shape", fn);
  }
  const int64_t width = a.n_heads * a.head_dim;
  const int64_t xs = stride_or(a.x_stride, width), zs = stride_or(a.z_stride, width);
  const int64_t ys = stride_or(a.y_stride, width);
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "x_stride", xs, width));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "z_stride", zs, width));
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "y_stride", ys, width));
  if (a.n_tokens == 0 || width == 0) return Status::ok();
  if (a.x == nullptr || a.z == nullptr || a.weight == nullptr || a.y == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "{}: null x, z, weight or y", fn);
  }
  for_each_task(a.pool, a.n_tokens, [&](int64_t t, int) {
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const float* x = a.x + t * xs + h * a.head_dim;
      const float* z = a.z + t * zs + h * a.head_dim;
      float* y = a.y + t * ys + h * a.head_dim;
      const float inv = 1.0f / std::sqrt(sum_squares(x, a.head_dim) / float(a.head_dim) + a.eps);
      for (int64_t i = 0; i < a.head_dim; ++i) y[i] = a.weight[i] * (x[i] * inv) * silu(z[i]);
    }
  });
  return Status::ok();
}

Status gdn_mixer_core(const GdnMixerArgs& a) {
  const char* fn = "gdn_mixer_core";
  MOESERVE_RETURN_IF_ERROR(gdn_check_heads(a.heads));
  const GdnHeads& h = a.heads;
  const int64_t qk_width = h.n_k_heads * h.head_k_dim, conv_dim = h.conv_dim();
  const int64_t qkv_stride = stride_or(a.qkv_stride, conv_dim);
  MOESERVE_RETURN_IF_ERROR(check_stride(fn, "qkv_stride", qkv_stride, conv_dim));
  if (a.n_tokens < 0) return make_error(StatusCode::kInvalidArgument, "{}: n_tokens {}", fn, a.n_tokens);
  if (a.n_tokens == 0) return Status::ok();

  GdnConvArgs conv;
  conv.x = conv.y = a.qkv;
  conv.x_stride = conv.y_stride = qkv_stride;
  conv.n_tokens = a.n_tokens;
  conv.n_channels = conv_dim;
  conv.kernel_size = a.conv_kernel;
  conv.weight = a.conv_weight;
  conv.state = a.conv_state;
  conv.pool = a.pool;
  MOESERVE_RETURN_IF_ERROR(gdn_conv_silu(conv));

  for (int64_t part = 0; part < 2; ++part) {  // q, then k
    GdnL2NormArgs l2{a.qkv + part * qk_width, qkv_stride, a.n_tokens, h.n_k_heads, h.head_k_dim, a.l2_eps};
    MOESERVE_RETURN_IF_ERROR(gdn_l2_norm(l2));
  }

  GdnGateArgs gates;
  gates.b = gates.beta = a.b;
  gates.a = gates.g = a.a;
  gates.b_stride = gates.a_stride = gates.out_stride = a.ba_stride;
  gates.a_neg = a.a_neg;
  gates.dt_bias = a.dt_bias;
  gates.n_tokens = a.n_tokens;
  gates.n_heads = h.n_v_heads;
  MOESERVE_RETURN_IF_ERROR(gdn_gates(gates));

  float* v = a.qkv + 2 * qk_width;
  GdnDeltaRuleArgs dr;
  dr.heads = h;
  dr.n_tokens = a.n_tokens;
  dr.q = a.qkv;
  dr.k = a.qkv + qk_width;
  dr.v = dr.out = v;
  dr.qk_stride = dr.v_stride = dr.out_stride = qkv_stride;
  dr.beta = a.b;
  dr.g = a.a;
  dr.gate_stride = a.ba_stride;
  dr.q_scale = 1.0f / std::sqrt(float(h.head_k_dim));
  dr.state = a.ssm_state;
  dr.chunk_size = a.chunk_size;
  dr.pool = a.pool;
  MOESERVE_RETURN_IF_ERROR(a.form == GdnForm::kRecurrent ? gdn_delta_rule_recurrent(dr)
                           : a.form == GdnForm::kChunked ? gdn_delta_rule_chunked(dr)
                                                         : gdn_delta_rule(dr));

  GdnGatedNormArgs norm;
  norm.x = v;
  norm.x_stride = qkv_stride;
  norm.z = a.z;
  norm.z_stride = a.z_stride;
  norm.weight = a.norm_weight;
  norm.y = a.out;
  norm.y_stride = a.out_stride;
  norm.n_tokens = a.n_tokens;
  norm.n_heads = h.n_v_heads;
  norm.head_dim = h.head_v_dim;
  norm.eps = a.norm_eps;
  norm.pool = a.pool;
  return gdn_gated_norm(norm);
}

}  // namespace moeserve::cpu
