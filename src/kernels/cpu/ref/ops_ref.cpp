// Reference (plain C++) versions of the ops group of the CPU kernel table.
// They are the definition every SIMD level is tested against, and the
// fallback on CPUs without AVX2, so they favour obviousness over speed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/register.h"

namespace moeserve::cpu::detail {
namespace {

void rms_norm_ref(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += double(x[i]) * double(x[i]);
  const float mean = float(sum_sq / double(std::max<int64_t>(n, 1)));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (w != nullptr ? w[i] : 1.0f);
}

void rope_neox_ref(float* x, int64_t n_rot, const float* cos_sin) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_sin[i], s = cos_sin[half + i];
    const float a = x[i], b = x[half + i];
    x[i] = a * c - b * s;
    x[half + i] = a * s + b * c;
  }
}

float softmax_ref(float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  const float max = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  return max;
}

float silu_scalar(float v) { return v / (1.0f + std::exp(-v)); }

void silu_ref(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu_scalar(x[i]);
}

void swiglu_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu_scalar(gate[i]) * up[i];
}

void axpy_ref(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Total order: larger first, ties to the lower index, NaN last.
bool ranks_before(const float* x, int32_t a, int32_t b) {
  const bool na = std::isnan(x[a]), nb = std::isnan(x[b]);
  if (na || nb) return na && nb ? a < b : nb;
  if (x[a] != x[b]) return x[a] > x[b];
  return a < b;
}

void top_k_ref(const float* x, int64_t n, int64_t k, int32_t* out_idx) {
  if (k <= 0) return;
  const int64_t kk = std::min(k, n);
  std::vector<int32_t> idx(size_t(std::max<int64_t>(n, 0)));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                    [x](int32_t a, int32_t b) { return ranks_before(x, a, b); });
  std::copy(idx.begin(), idx.begin() + kk, out_idx);
  std::fill(out_idx + kk, out_idx + k, -1);
}

// One query row: scores for every visible key, softmax, weighted sum of V.
// The cache row of the key at position j (AttentionArgs::tree_base).
int64_t key_row(const AttentionArgs& a, int64_t j) {
  const int64_t r = j < a.tree_base ? j : a.tree_base + a.tree_path[j - a.tree_base];
  if (a.block_table == nullptr) return r;
  const int64_t rows = int64_t(1) << a.block_shift;
  return int64_t(a.block_table[r / rows]) * rows + r % rows;
}

void attention_row_ref(const AttentionArgs& a, const float* q, float* out, int64_t key_begin, int64_t key_end,
                       std::vector<float>& scores) {
  std::fill(out, out + a.head_dim, 0.0f);
  if (key_end <= key_begin) return;
  scores.resize(size_t(key_end - key_begin));
  for (int64_t j = key_begin; j < key_end; ++j) {
    const uint16_t* k = a.k + key_row(a, j) * a.kv_stride;
    float dot = 0.0f;
    for (int64_t d = 0; d < a.head_dim; ++d) dot += q[d] * fp16_to_fp32(k[d]);
    scores[size_t(j - key_begin)] = dot * a.scale;
  }
  softmax_ref(scores.data(), key_end - key_begin);
  for (int64_t j = key_begin; j < key_end; ++j) {
    const uint16_t* v = a.v + key_row(a, j) * a.kv_stride;
    const float p = scores[size_t(j - key_begin)];
    for (int64_t d = 0; d < a.head_dim; ++d) out[d] += p * fp16_to_fp32(v[d]);
  }
}

void attention_ref(const AttentionArgs& a) {
  std::vector<float> scores;
  for (int64_t t = 0; t < a.n_q; ++t) {
    const int64_t pos = a.q_pos0 + t;
    const int64_t key_end = a.causal ? std::min(a.n_kv, pos + 1) : a.n_kv;
    const int64_t key_begin = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const int64_t off = t * a.q_token_stride + h * a.q_head_stride;
      attention_row_ref(a, a.q + off, a.out + off, key_begin, key_end, scores);
    }
  }
}

}  // namespace

void register_ops_reference(CpuKernels& k) {
  k.rms_norm = rms_norm_ref;
  k.rope_neox = rope_neox_ref;
  k.softmax = softmax_ref;
  k.silu = silu_ref;
  k.swiglu = swiglu_ref;
  k.axpy = axpy_ref;
  k.top_k = top_k_ref;
  k.attention = attention_ref;
}

}  // namespace moeserve::cpu::detail
