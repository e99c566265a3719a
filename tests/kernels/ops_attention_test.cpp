// Attention: the reference against a naive double-precision version that
// materialises the scores, then every SIMD level against the reference.
//
// Values are uniform in [-1, 1], so every output is a convex combination of
// numbers in [-1, 1]. Tolerances (absolute): reference vs double 2e-6 (float
// dot products of up to 256 terms and sums over up to 300 keys); SIMD vs
// reference 1e-5 (different summation order, vector exp of ~2 ulp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "ops_test_util.h"

namespace moeserve::cpu {
namespace {

using testing::expect_close;

struct AttnCase {
  int64_t n_q = 1;
  int64_t n_heads = 1;
  int64_t head_dim = 64;
  int64_t n_kv = 1;
  int64_t q_pos0 = 0;
  bool causal = true;
  int64_t window = 0;
};

std::string describe(const AttnCase& c) {
  return "n_q=" + std::to_string(c.n_q) + " heads=" + std::to_string(c.n_heads) +
         " d=" + std::to_string(c.head_dim) + " n_kv=" + std::to_string(c.n_kv) +
         " pos0=" + std::to_string(c.q_pos0) + (c.causal ? " causal" : " full") +
         " window=" + std::to_string(c.window);
}

// Buffers with padded strides, so a kernel that ignores a stride fails.
struct AttnData {
  std::vector<float> q;
  std::vector<uint16_t> k, v;
  AttentionArgs args;

  AttnData(const AttnCase& c, uint32_t seed) {
    const int64_t head_stride = c.head_dim + 3;
    const int64_t token_stride = c.n_heads * head_stride + 5;
    const int64_t kv_stride = c.head_dim + 8;
    q = testing::random_normal(c.n_q * token_stride, seed, 2.0f);
    const auto kf = testing::random_floats(c.n_kv * kv_stride, seed + 1);
    const auto vf = testing::random_floats(c.n_kv * kv_stride, seed + 2);
    for (float f : kf) k.push_back(fp32_to_fp16(f));
    for (float f : vf) v.push_back(fp32_to_fp16(f));
    args.q = q.data();
    args.k = k.data();
    args.v = v.data();
    args.n_q = c.n_q;
    args.n_heads = c.n_heads;
    args.q_head_stride = head_stride;
    args.q_token_stride = token_stride;
    args.n_kv = c.n_kv;
    args.kv_stride = kv_stride;
    args.head_dim = c.head_dim;
    args.q_pos0 = c.q_pos0;
    args.causal = c.causal;
    args.scale = float(1.0 / std::sqrt(double(c.head_dim)));
    args.window = c.window;
  }

  // Runs `fn` into a fresh output buffer (NaN-filled: untouched slots that
  // are compared would show up) and returns the compared elements only.
  std::vector<float> run(void (*fn)(const AttentionArgs&)) {
    std::vector<float> out(q.size(), NAN);
    AttentionArgs a = args;
    a.out = out.data();
    fn(a);
    return gather(out);
  }

  template <typename T>
  std::vector<T> gather(const std::vector<T>& out) const {
    std::vector<T> g;
    for (int64_t t = 0; t < args.n_q; ++t) {
      for (int64_t h = 0; h < args.n_heads; ++h) {
        const int64_t off = t * args.q_token_stride + h * args.q_head_stride;
        g.insert(g.end(), out.begin() + off, out.begin() + off + args.head_dim);
      }
    }
    return g;
  }
};

// Scores materialised in double, plain softmax, weighted sum.
std::vector<double> naive_attention(const AttnData& d) {
  const AttentionArgs& a = d.args;
  std::vector<double> out(d.q.size(), 0.0);
  for (int64_t t = 0; t < a.n_q; ++t) {
    const int64_t pos = a.q_pos0 + t;
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const float* q = a.q + t * a.q_token_stride + h * a.q_head_stride;
      double* o = out.data() + t * a.q_token_stride + h * a.q_head_stride;
      std::vector<double> s(size_t(a.n_kv), -INFINITY);
      double max = -INFINITY;
      for (int64_t j = 0; j < a.n_kv; ++j) {
        const bool visible = (!a.causal || j <= pos) && (a.window <= 0 || pos - j < a.window);
        if (!visible) continue;
        double dot = 0;
        for (int64_t i = 0; i < a.head_dim; ++i) dot += double(q[i]) * fp16_to_fp32(a.k[j * a.kv_stride + i]);
        s[size_t(j)] = dot * double(a.scale);
        max = std::max(max, s[size_t(j)]);
      }
      if (max == -INFINITY) continue;  // nothing visible: zeros
      double sum = 0;
      for (double& x : s) sum += x = std::exp(x - max);
      for (int64_t j = 0; j < a.n_kv; ++j) {
        for (int64_t i = 0; i < a.head_dim; ++i) {
          o[i] += s[size_t(j)] / sum * fp16_to_fp32(a.v[j * a.kv_stride + i]);
        }
      }
    }
  }
  return d.gather(out);
}

std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cases;
  for (int64_t heads : {1, 2, 4, 8}) {
    for (int64_t dim : {64, 128}) {
      for (int64_t n_kv : {1, 2, 31, 33, 100, 300}) {
        cases.push_back({1, heads, dim, n_kv, n_kv - 1, true, 0});  // decode: last position
      }
      cases.push_back({5, heads, dim, 40, 35, true, 0});     // prefill chunk after context
      cases.push_back({7, heads, dim, 7, 0, true, 0});       // prompt from position 0
      cases.push_back({3, heads, dim, 64, 10, true, 0});     // keys past the queries: masked
      cases.push_back({4, heads, dim, 50, 20, false, 0});    // non-causal block
      cases.push_back({3, heads, dim, 300, 297, true, 16});  // sliding window
    }
  }
  // Odd shapes: head_dim not a multiple of 8 or 16, groups beyond 8 heads.
  cases.push_back({2, 3, 20, 45, 43, true, 0});
  cases.push_back({1, 12, 72, 129, 128, true, 0});
  cases.push_back({2, 16, 256, 70, 68, true, 0});
  cases.push_back({1, 1, 8, 1, 0, true, 0});
  cases.push_back({2, 2, 64, 10, 40, true, 0});  // positions past n_kv: all keys
  cases.push_back({1, 2, 64, 10, 30, true, 5});  // window past every key: zeros
  return cases;
}

TEST(AttentionReference, MatchesNaiveDouble) {
  uint32_t seed = 100;
  for (const AttnCase& c : attention_cases()) {
    AttnData d(c, seed += 3);
    const auto want = naive_attention(d);
    const auto got = d.run(cpu_kernels_for(SimdLevel::kReference)->attention);
    expect_close(got, want, 2e-6, 0.0, describe(c));
  }
}

TEST(AttentionReference, SingleVisibleKeyReturnsItsValue) {
  AttnCase c{1, 2, 64, 5, 0, true, 0};  // position 0 sees only key 0
  AttnData d(c, 9);
  const auto got = d.run(cpu_kernels_for(SimdLevel::kReference)->attention);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(got[size_t(h * 64 + i)], fp16_to_fp32(d.v[size_t(i)]));
  }
}

class AttentionSimd : public testing::SimdLevelTest {};

TEST_P(AttentionSimd, MatchesReference) {
  uint32_t seed = 500;
  for (const AttnCase& c : attention_cases()) {
    AttnData d(c, seed += 5);
    const auto want = d.run(ref_->attention);
    const auto got = d.run(simd_->attention);
    expect_close(got, want, 1e-5, 0.0, describe(c));
  }
}

TEST_P(AttentionSimd, LargeScoresDoNotOverflow) {
  // Scores of several hundred: the online max must keep exp() in range.
  AttnCase c{2, 4, 128, 200, 198, true, 0};
  AttnData d(c, 77);
  for (float& x : d.q) x *= 60.0f;
  const auto want = naive_attention(d);
  const auto got = d.run(simd_->attention);
  // Scores ~70 carry float rounding of ~1e-4, which moves the weights by as
  // much; the point here is that nothing becomes inf or NaN.
  expect_close(got, want, 1e-3, 0.0, "large scores");
}

// Paged KV: the same keys scattered over blocks in a shuffled order, read
// through the block table, give bit for bit the contiguous result (the keys
// are visited in the same order), on the reference and every SIMD level.
AttnData paged_copy(const AttnData& d, int shift, std::vector<int32_t>& table, uint32_t seed) {
  AttnData p = d;
  const int64_t rows = int64_t(1) << shift, n_blocks = (d.args.n_kv + rows - 1) / rows;
  table.resize(size_t(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t(b + 2);  // blocks 0, 1 unused
  std::mt19937 rng(seed);
  std::shuffle(table.begin(), table.end(), rng);
  const size_t stride = size_t(d.args.kv_stride);
  p.k.assign(size_t(n_blocks + 2) * size_t(rows) * stride, 0x7e00);  // NaN where nothing was put
  p.v = p.k;
  for (int64_t j = 0; j < d.args.n_kv; ++j) {
    const size_t at = size_t((int64_t(table[size_t(j >> shift)]) << shift) | (j & (rows - 1))) * stride;
    std::copy_n(d.k.begin() + j * int64_t(stride), stride, p.k.begin() + int64_t(at));
    std::copy_n(d.v.begin() + j * int64_t(stride), stride, p.v.begin() + int64_t(at));
  }
  p.args.q = p.q.data();
  p.args.k = p.k.data();
  p.args.v = p.v.data();
  p.args.block_table = table.data();
  p.args.block_shift = shift;
  return p;
}

TEST_P(AttentionSimd, BlockTableGivesTheContiguousResult) {
  uint32_t seed = 900;
  for (const AttnCase& c : attention_cases()) {
    for (int shift : {0, 2, 4}) {
      AttnData d(c, seed += 3);
      std::vector<int32_t> table;
      AttnData p = paged_copy(d, shift, table, seed);
      for (auto* k : {ref_, simd_}) {
        const auto want = d.run(k->attention);
        const auto got = p.run(k->attention);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << describe(c) << " shift " << shift;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, AttentionSimd, ::testing::Values(SimdLevel::kAvx2, SimdLevel::kAvx512),
                         testing::simd_param_name);

}  // namespace
}  // namespace moeserve::cpu
