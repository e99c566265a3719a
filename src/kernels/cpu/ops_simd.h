// The element-wise and reduction ops of the CPU kernel table, written once
// over a vector wrapper V (simd_f32.h) and instantiated by ops_avx2.cpp and
// ops_avx512.cpp. Same rules as simd_f32.h: SIMD files only, everything in an
// anonymous namespace, no STL. Attention lives in attention_simd.h.
//
// Tails (n not a multiple of the width) go through masked loads and stores,
// so every element takes the same arithmetic path as the full vectors.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd_f32.h"

namespace {

// exp(x) for a vector. x = n*ln2 + r with n = round(x/ln2) and |r| <= ln2/2
// (ln2 split in a short high part, exact in n*hi, and a low correction), then
// exp(r) by its degree-7 Taylor polynomial (truncation error r^8/8! < 6e-9
// relative, below half an ulp) and 2^n added to the exponent bits.
// Measured error under 1 ulp (relative < 1e-7) for x in [-87.33, 88.72]; below the
// result is 0 (the true value is a subnormal < 1.2e-38), above it +inf; NaN
// stays NaN.
template <class V>
typename V::Reg vexp(typename V::Reg x) {
  using Reg = typename V::Reg;
  constexpr float kMaxArg = 88.72283935546875f;   // ln(FLT_MAX) rounded up
  constexpr float kMinArg = -87.3365478515625f;   // ln(FLT_MIN)
  constexpr float kLog2e = 1.44269502162933349609f;
  constexpr float kLn2Hi = 0.693145751953125f;    // 16 significant bits
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  const Reg clamped = V::min(V::max(x, V::set1(kMinArg)), V::set1(kMaxArg));
  const Reg n = V::round_nearest(V::mul(clamped, V::set1(kLog2e)));
  Reg r = V::fnmadd(n, V::set1(kLn2Hi), clamped);
  r = V::fnmadd(n, V::set1(kLn2Lo), r);
  // Horner on 1 + r + r^2/2! + ... + r^7/7!
  Reg p = V::set1(1.0f / 5040.0f);
  p = V::fmadd(p, r, V::set1(1.0f / 720.0f));
  p = V::fmadd(p, r, V::set1(1.0f / 120.0f));
  p = V::fmadd(p, r, V::set1(1.0f / 24.0f));
  p = V::fmadd(p, r, V::set1(1.0f / 6.0f));
  p = V::fmadd(p, r, V::set1(0.5f));
  p = V::fmadd(p, r, V::set1(1.0f));
  p = V::fmadd(p, r, V::set1(1.0f));
  Reg result = V::add_to_exponent(p, n);
  result = V::select(V::gt(x, V::set1(kMaxArg)), V::set1(INFINITY), result);
  result = V::select(V::lt(x, V::set1(kMinArg)), V::zero(), result);
  return V::select(V::is_nan(x), x, result);
}

// x / (1 + exp(-x)); for x < -88.7 exp(-x) is inf and the result -0.
template <class V>
typename V::Reg vsilu(typename V::Reg x) {
  const typename V::Reg e = vexp<V>(V::sub(V::zero(), x));
  return V::div(x, V::add(V::set1(1.0f), e));
}

template <class V>
void rms_norm_simd(const float* x, const float* w, float* y, int64_t n, float eps) {
  constexpr int W = V::kWidth;
  typename V::Reg acc0 = V::zero(), acc1 = V::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const auto a = V::load(x + i), b = V::load(x + i + W);
    acc0 = V::fmadd(a, a, acc0);
    acc1 = V::fmadd(b, b, acc1);
  }
  for (; i < n; i += W) {
    const auto a = (n - i >= W) ? V::load(x + i) : V::load_partial(x + i, n - i);
    acc0 = V::fmadd(a, a, acc0);
  }
  const float mean = V::reduce_add(V::add(acc0, acc1)) / float(n > 0 ? n : 1);
  const auto scale = V::set1(1.0f / std::sqrt(mean + eps));
  for (i = 0; i < n; i += W) {
    const int64_t left = n - i;
    auto v = V::mul(left >= W ? V::load(x + i) : V::load_partial(x + i, left), scale);
    if (w != nullptr) v = V::mul(v, left >= W ? V::load(w + i) : V::load_partial(w + i, left));
    if (left >= W) {
      V::store(y + i, v);
    } else {
      V::store_partial(y + i, v, left);
    }
  }
}

// cos_sin: n_rot/2 cosines then n_rot/2 sines (see cpu_kernels.h).
template <class V>
void rope_neox_simd(float* x, int64_t n_rot, const float* cos_sin) {
  constexpr int W = V::kWidth;
  const int64_t half = n_rot / 2;
  float* x1 = x + half;
  const float* sn = cos_sin + half;
  for (int64_t i = 0; i < half; i += W) {
    const int64_t left = half - i;
    const bool full = left >= W;
    const auto a = full ? V::load(x + i) : V::load_partial(x + i, left);
    const auto b = full ? V::load(x1 + i) : V::load_partial(x1 + i, left);
    const auto c = full ? V::load(cos_sin + i) : V::load_partial(cos_sin + i, left);
    const auto s = full ? V::load(sn + i) : V::load_partial(sn + i, left);
    const auto ra = V::fnmadd(b, s, V::mul(a, c));  // a*cos - b*sin
    const auto rb = V::fmadd(a, s, V::mul(b, c));   // a*sin + b*cos
    if (full) {
      V::store(x + i, ra);
      V::store(x1 + i, rb);
    } else {
      V::store_partial(x + i, ra, left);
      V::store_partial(x1 + i, rb, left);
    }
  }
}

template <class V>
float softmax_simd(float* x, int64_t n) {
  constexpr int W = V::kWidth;
  if (n <= 0) return -INFINITY;
  auto vmax = V::set1(-INFINITY);
  for (int64_t i = 0; i < n; i += W) {
    vmax = V::max(vmax, n - i >= W ? V::load(x + i) : V::load_partial(x + i, n - i, -INFINITY));
  }
  const float max = V::reduce_max(vmax);
  const auto m = V::set1(max);
  auto vsum = V::zero();
  for (int64_t i = 0; i < n; i += W) {
    const int64_t left = n - i;
    if (left >= W) {
      const auto e = vexp<V>(V::sub(V::load(x + i), m));
      V::store(x + i, e);
      vsum = V::add(vsum, e);
    } else {
      const auto e = vexp<V>(V::sub(V::load_partial(x + i, left, -INFINITY), m));  // pad -> 0
      V::store_partial(x + i, e, left);
      vsum = V::add(vsum, e);
    }
  }
  const auto inv = V::set1(1.0f / V::reduce_add(vsum));
  for (int64_t i = 0; i < n; i += W) {
    const int64_t left = n - i;
    if (left >= W) {
      V::store(x + i, V::mul(V::load(x + i), inv));
    } else {
      V::store_partial(x + i, V::mul(V::load_partial(x + i, left), inv), left);
    }
  }
  return max;
}

template <class V>
void silu_simd(const float* x, float* out, int64_t n) {
  constexpr int W = V::kWidth;
  for (int64_t i = 0; i < n; i += W) {
    const int64_t left = n - i;
    if (left >= W) {
      V::store(out + i, vsilu<V>(V::load(x + i)));
    } else {
      V::store_partial(out + i, vsilu<V>(V::load_partial(x + i, left)), left);
    }
  }
}

template <class V>
void swiglu_simd(const float* gate, const float* up, float* out, int64_t n) {
  constexpr int W = V::kWidth;
  for (int64_t i = 0; i < n; i += W) {
    const int64_t left = n - i;
    if (left >= W) {
      V::store(out + i, V::mul(vsilu<V>(V::load(gate + i)), V::load(up + i)));
    } else {
      const auto g = vsilu<V>(V::load_partial(gate + i, left));
      V::store_partial(out + i, V::mul(g, V::load_partial(up + i, left)), left);
    }
  }
}

template <class V>
void axpy_simd(float a, const float* x, float* y, int64_t n) {
  constexpr int W = V::kWidth;
  const auto va = V::set1(a);
  for (int64_t i = 0; i < n; i += W) {
    const int64_t left = n - i;
    if (left >= W) {
      V::store(y + i, V::fmadd(va, V::load(x + i), V::load(y + i)));
    } else {
      V::store_partial(y + i, V::fmadd(va, V::load_partial(x + i, left), V::load_partial(y + i, left)), left);
    }
  }
}

// ---- top_k ------------------------------------------------------------------
// Order: larger value first, ties to the lower index, NaN after everything.
inline bool topk_beats(const float* x, int32_t a, int32_t b) {
  const float va = x[a], vb = x[b];
  const bool na = va != va, nb = vb != vb;
  if (na || nb) return na && nb ? a < b : nb;
  if (va != vb) return va > vb;
  return a < b;
}

// Min-heap on the out array itself: heap[0] is the weakest kept index.
inline void topk_sift_down(const float* x, int32_t* heap, int64_t size, int64_t pos) {
  for (;;) {
    int64_t weakest = pos;
    const int64_t l = 2 * pos + 1, r = l + 1;
    if (l < size && topk_beats(x, heap[weakest], heap[l])) weakest = l;
    if (r < size && topk_beats(x, heap[weakest], heap[r])) weakest = r;
    if (weakest == pos) return;
    const int32_t t = heap[pos];
    heap[pos] = heap[weakest];
    heap[weakest] = t;
    pos = weakest;
  }
}

inline void topk_offer(const float* x, int32_t* heap, int64_t k, int32_t idx) {
  if (topk_beats(x, idx, heap[0])) {
    heap[0] = idx;
    topk_sift_down(x, heap, k, 0);
  }
}

// A heap of the best k seen so far; the vector compare skips, W elements at a
// time, everything that cannot beat the weakest kept value. Indices only grow,
// so an element equal to the weakest never beats it.
template <class V>
void top_k_simd(const float* x, int64_t n, int64_t k, int32_t* out) {
  constexpr int W = V::kWidth;
  if (k <= 0) return;
  const int64_t kk = k < n ? k : n;
  for (int64_t j = kk; j < k; ++j) out[j] = -1;
  if (kk <= 0) return;
  for (int64_t i = 0; i < kk; ++i) out[i] = int32_t(i);
  for (int64_t i = kk / 2; i-- > 0;) topk_sift_down(x, out, kk, i);
  int64_t i = kk;
  for (; i + W <= n; i += W) {
    const float thr = x[out[0]];
    const auto v = V::load(x + i);
    // NaN threshold: any non-NaN value beats it.
    const auto pass = thr == thr ? V::gt(v, V::set1(thr)) : V::ge(v, V::set1(-INFINITY));
    for (unsigned bits = V::mask_bits(pass); bits != 0; bits &= bits - 1) {
      topk_offer(x, out, kk, int32_t(i + __builtin_ctz(bits)));
    }
  }
  for (; i < n; ++i) topk_offer(x, out, kk, int32_t(i));
  // Heap sort: move the weakest to the back, strongest ends up first.
  for (int64_t size = kk; size > 1; --size) {
    const int32_t t = out[0];
    out[0] = out[size - 1];
    out[size - 1] = t;
    topk_sift_down(x, out, size - 1, 0);
  }
}

}  // namespace
