// Flash-style attention over an f16 KV cache, written once over a vector
// wrapper V (simd_f32.h) for the AVX2 and AVX-512 files. Same rules as
// simd_f32.h: SIMD files only, anonymous namespace, no STL.
//
// For each query token, the query heads of the GQA group are handled R at a
// time (R <= 8, a template parameter so the accumulators live in registers).
// Keys are visited in tiles of kKeyTile: scores for the tile, then the online
// softmax update (running max m, running sum l, output rescaled by
// exp(m_old - m_new)), then the tile's V rows are accumulated into `out`,
// which serves as the accumulator (so out must not alias q). Each K and V row
// is converted from f16 once per tile and shared by the R heads.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/simd_f32.h"

namespace {

constexpr int kKeyTile = 32;
constexpr int kMaxRowsPerPass = 8;

struct AttnRows {
  const float* q[kMaxRowsPerPass];
  float* out[kMaxRowsPerPass];
  float m[kMaxRowsPerPass];
  float l[kMaxRowsPerPass];
};

// The cache row of the key at position j (AttentionArgs::tree_base). Here,
// not in a shared header: code inlined from a header into a SIMD file could
// be picked by the linker for callers on CPUs without those instructions.
inline int64_t key_row(const moeserve::cpu::AttentionArgs& a, int64_t j) {
  const int64_t r = j < a.tree_base ? j : a.tree_base + a.tree_path[j - a.tree_base];
  if (a.block_table == nullptr) return r;
  const int64_t mask = (int64_t(1) << a.block_shift) - 1;
  return (int64_t(a.block_table[r >> a.block_shift]) << a.block_shift) | (r & mask);
}

// s[r][jj] = scale * dot(q_r, k_row(j0 + jj)) for jj < n_keys.
template <class V, int R>
void attn_scores(const AttnRows& rows, const moeserve::cpu::AttentionArgs& a, int64_t j0, int n_keys,
                 float (*s)[kKeyTile]) {
  constexpr int W = V::kWidth;
  const int64_t d = a.head_dim;
  for (int jj = 0; jj < n_keys; ++jj) {
    const uint16_t* k = a.k + key_row(a, j0 + jj) * a.kv_stride;
    typename V::Reg acc[R];
    for (int r = 0; r < R; ++r) acc[r] = V::zero();
    int64_t i = 0;
    for (; i + W <= d; i += W) {
      const auto kv = V::load_f16(k + i);
      for (int r = 0; r < R; ++r) acc[r] = V::fmadd(V::load(rows.q[r] + i), kv, acc[r]);
    }
    if (i < d) {
      const auto kv = V::load_f16_partial(k + i, d - i);
      for (int r = 0; r < R; ++r) acc[r] = V::fmadd(V::load_partial(rows.q[r] + i, d - i), kv, acc[r]);
    }
    for (int r = 0; r < R; ++r) s[r][jj] = V::reduce_add(acc[r]) * a.scale;
  }
}

// Online-softmax update of one row: turns s[0..n) into probabilities relative
// to the new running max and rescales the row's accumulated output.
template <class V>
void attn_softmax_update(float* s, int n, float* m, float* l, float* out, int64_t head_dim) {
  constexpr int W = V::kWidth;
  auto vmax = V::set1(-INFINITY);
  for (int i = 0; i < n; i += W) {
    vmax = V::max(vmax, n - i >= W ? V::load(s + i) : V::load_partial(s + i, n - i, -INFINITY));
  }
  const float m_new = std::fmax(*m, V::reduce_max(vmax));
  const auto vm = V::set1(m_new);
  auto vsum = V::zero();
  for (int i = 0; i < n; i += W) {
    const int left = n - i;
    const auto p = vexp<V>(V::sub(left >= W ? V::load(s + i) : V::load_partial(s + i, left, -INFINITY), vm));
    vsum = V::add(vsum, p);
    if (left >= W) {
      V::store(s + i, p);
    } else {
      V::store_partial(s + i, p, left);
    }
  }
  const float alpha = std::exp(*m - m_new);  // 0 on the first tile (m = -inf)
  if (alpha != 1.0f) {
    const auto va = V::set1(alpha);
    for (int64_t i = 0; i < head_dim; i += W) {
      const int64_t left = head_dim - i;
      if (left >= W) {
        V::store(out + i, V::mul(V::load(out + i), va));
      } else {
        V::store_partial(out + i, V::mul(V::load_partial(out + i, left), va), left);
      }
    }
  }
  *l = *l * alpha + V::reduce_add(vsum);
  *m = m_new;
}

// out_r += sum_jj p[r][jj] * v_row(j0 + jj), one W-wide column strip at a time
// so the R accumulators stay in registers across the tile.
template <class V, int R>
void attn_accumulate_v(const AttnRows& rows, const moeserve::cpu::AttentionArgs& a, int64_t j0, int n_keys,
                       float (*p)[kKeyTile]) {
  constexpr int W = V::kWidth;
  const int64_t d = a.head_dim;
  for (int64_t i = 0; i < d; i += W) {
    const int64_t left = d - i;
    const bool full = left >= W;
    typename V::Reg acc[R];
    for (int r = 0; r < R; ++r)
      acc[r] = full ? V::load(rows.out[r] + i) : V::load_partial(rows.out[r] + i, left);
    for (int jj = 0; jj < n_keys; ++jj) {
      const uint16_t* v = a.v + key_row(a, j0 + jj) * a.kv_stride + i;
      const auto vv = full ? V::load_f16(v) : V::load_f16_partial(v, left);
      for (int r = 0; r < R; ++r) acc[r] = V::fmadd(V::set1(p[r][jj]), vv, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      if (full) {
        V::store(rows.out[r] + i, acc[r]);
      } else {
        V::store_partial(rows.out[r] + i, acc[r], left);
      }
    }
  }
}

template <class V, int R>
void attn_rows(AttnRows& rows, const moeserve::cpu::AttentionArgs& a, int64_t key_begin, int64_t key_end) {
  constexpr int W = V::kWidth;
  for (int r = 0; r < R; ++r) {
    rows.m[r] = -INFINITY;
    rows.l[r] = 0.0f;
    for (int64_t i = 0; i < a.head_dim; i += W) {
      const int64_t left = a.head_dim - i;
      if (left >= W) {
        V::store(rows.out[r] + i, V::zero());
      } else {
        V::store_partial(rows.out[r] + i, V::zero(), left);
      }
    }
  }
  float s[R][kKeyTile];
  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyTile) {
    const int n_keys = int(key_end - j0 < kKeyTile ? key_end - j0 : kKeyTile);
    attn_scores<V, R>(rows, a, j0, n_keys, s);
    for (int r = 0; r < R; ++r)
      attn_softmax_update<V>(s[r], n_keys, &rows.m[r], &rows.l[r], rows.out[r], a.head_dim);
    attn_accumulate_v<V, R>(rows, a, j0, n_keys, s);
  }
  for (int r = 0; r < R; ++r) {
    const auto inv = V::set1(rows.l[r] > 0.0f ? 1.0f / rows.l[r] : 0.0f);
    for (int64_t i = 0; i < a.head_dim; i += W) {
      const int64_t left = a.head_dim - i;
      if (left >= W) {
        V::store(rows.out[r] + i, V::mul(V::load(rows.out[r] + i), inv));
      } else {
        V::store_partial(rows.out[r] + i, V::mul(V::load_partial(rows.out[r] + i, left), inv), left);
      }
    }
  }
}

template <class V>
void attention_simd(const moeserve::cpu::AttentionArgs& a) {
  for (int64_t t = 0; t < a.n_q; ++t) {
    const int64_t pos = a.q_pos0 + t;
    int64_t key_end = a.causal ? (pos + 1 < a.n_kv ? pos + 1 : a.n_kv) : a.n_kv;
    int64_t key_begin = a.window > 0 ? pos - a.window + 1 : 0;
    if (key_begin < 0) key_begin = 0;
    if (key_end < key_begin) key_end = key_begin;  // nothing visible: output zeros
    for (int64_t h0 = 0; h0 < a.n_heads; h0 += kMaxRowsPerPass) {
      const int64_t left = a.n_heads - h0;
      const int rows_now = int(left < kMaxRowsPerPass ? left : kMaxRowsPerPass);
      AttnRows rows;
      for (int r = 0; r < rows_now; ++r) {
        const int64_t off = t * a.q_token_stride + (h0 + r) * a.q_head_stride;
        rows.q[r] = a.q + off;
        rows.out[r] = a.out + off;
      }
      switch (rows_now) {
        case 1:
          attn_rows<V, 1>(rows, a, key_begin, key_end);
          break;
        case 2:
          attn_rows<V, 2>(rows, a, key_begin, key_end);
          break;
        case 3:
          attn_rows<V, 3>(rows, a, key_begin, key_end);
          break;
        case 4:
          attn_rows<V, 4>(rows, a, key_begin, key_end);
          break;
        case 5:
          attn_rows<V, 5>(rows, a, key_begin, key_end);
          break;
        case 6:
          attn_rows<V, 6>(rows, a, key_begin, key_end);
          break;
        case 7:
          attn_rows<V, 7>(rows, a, key_begin, key_end);
          break;
        default:
          attn_rows<V, 8>(rows, a, key_begin, key_end);
          break;
      }
    }
  }
}

}  // namespace
