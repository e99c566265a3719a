// matmul for every weight type against a double-precision matmul of the
// dequantized weights.
//
// Two checks per output y[t][n]:
//  1. Tight: against sum_k w^[n][k] * x^[t][k] with x^ the activations as
//     quantize_activations() converted them (dequantized back): |err| <=
//     1e-5 * sum_k |w^ x^| + 1e-6. Only the float summation may differ.
//  2. Against the original f32 x: |err| <= sum_k |w^[n][k]| * e(k) + the
//     tolerance of 1., where e(k) bounds the activation quantization error of
//     element k: 0 for float weights (x used as is); 0.56 * amax(block)/127
//     for Q8_0 activations (round to nearest: d/2, plus the f16 rounding of
//     the block scale d: 127 * d * 2^-11 = 0.062 d); 0.5 * amax/127 for Q8_K
//     (f32 scale).
// And: 1 and 2 threads give bit-identical y; pre-quantized activations
// (MatmulArgs::x_quant) give bit-identical y.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops_test_util.h"
#include "tensor/quantize.h"
#include "weight_bytes.h"

namespace moeserve::cpu {
namespace {

struct Problem {
  DType type;
  int64_t T, K, N;
  int64_t x_stride, y_stride;
  std::vector<uint8_t> w;     // quantized weights, packed rows
  std::vector<double> w_deq;  // [N][K]
  std::vector<float> x;       // [T][x_stride]

  Problem(DType t, int64_t tokens, int64_t k, int64_t n, uint32_t seed)
      : type(t), T(tokens), K(k), N(n), x_stride(k + 3), y_stride(n + 2) {
    const auto wf = testing::random_normal(N * K, seed, 0.5f);
    w = moeserve::testing::weight_rows(type, wf, N, K, seed);
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < N; ++r) {
      dequantize_row(type, w.data() + size_t(r) * dtype_row_bytes(type, K), row.data(), K);
      w_deq.insert(w_deq.end(), row.begin(), row.end());
    }
    x = testing::random_normal(T * x_stride, seed + 1);
  }

  // The same weights with `tokens` rows of new activations: quantizing the
  // weights is most of a problem's cost (the i-quants' codebook searches,
  // seconds a matrix under the sanitizers' -O0), and a matmul's token
  // handling does not depend on which weights it reads.
  Problem with_tokens(int64_t tokens, uint32_t seed) const {
    Problem p = *this;
    p.T = tokens;
    p.x = testing::random_normal(tokens * x_stride, seed + 1);
    return p;
  }

  std::string name() const {
    return std::string(dtype_name(type)) + " T=" + std::to_string(T) + " K=" + std::to_string(K) +
           " N=" + std::to_string(N);
  }

  MatmulArgs args(std::vector<float>& y, ThreadPool* pool, const CpuKernels* k) const {
    MatmulArgs a;
    a.w = w.data();
    a.w_type = type;
    a.n_rows = N;
    a.n_cols = K;
    a.x = x.data();
    a.n_tokens = T;
    a.x_stride = x_stride;
    a.y = y.data();
    a.y_stride = y_stride;
    a.pool = pool;
    a.kernels = k;
    return a;
  }
};

// The activations exactly as matmul sees them, back in f32.
std::vector<float> converted_activations(const Problem& p, const CpuKernels* k,
                                         std::vector<uint8_t>* packed) {
  const DType at = dtype_traits(p.type).vec_dot_type;
  const size_t row_bytes = activation_row_bytes(p.type, p.K);
  packed->assign(row_bytes * size_t(p.T), 0);
  QuantizeActivationsArgs qa;
  qa.w_type = p.type;
  qa.x = p.x.data();
  qa.n_tokens = p.T;
  qa.n_cols = p.K;
  qa.x_stride = p.x_stride;
  qa.dst = packed->data();
  qa.kernels = k;
  EXPECT_TRUE(quantize_activations(qa).is_ok());
  std::vector<float> out(size_t(p.T * p.K));
  for (int64_t t = 0; t < p.T; ++t)
    dequantize_row(at, packed->data() + size_t(t) * row_bytes, &out[size_t(t * p.K)], p.K);
  return out;
}

// Bound on |x - x^| for each element (see the file comment).
std::vector<double> activation_error_bound(const Problem& p) {
  const DType at = dtype_traits(p.type).vec_dot_type;
  std::vector<double> e(size_t(p.T * p.K), 0.0);
  if (at == DType::F32) return e;
  const int64_t block = dtype_block_elems(at);
  const double factor = at == DType::Q8_0 ? 0.56 : 0.5 * (1 + 1e-6);
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t b0 = 0; b0 < p.K; b0 += block) {
      double amax = 0;
      for (int64_t i = b0; i < b0 + block; ++i)
        amax = std::max(amax, std::fabs(double(p.x[size_t(t * p.x_stride + i)])));
      for (int64_t i = b0; i < b0 + block; ++i) e[size_t(t * p.K + i)] = factor * amax / 127.0;
    }
  }
  return e;
}

void check_against_double(const Problem& p, const std::vector<float>& y, const CpuKernels* k) {
  std::vector<uint8_t> packed;
  const auto xq = converted_activations(p, k, &packed);
  const auto err = activation_error_bound(p);
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) {
      double tight = 0, tight_abs = 0, exact = 0, quant_bound = 0;
      for (int64_t i = 0; i < p.K; ++i) {
        const double wv = p.w_deq[size_t(n * p.K + i)];
        const double xv = xq[size_t(t * p.K + i)];
        tight += wv * xv;
        tight_abs += std::fabs(wv * xv);
        exact += wv * p.x[size_t(t * p.x_stride + i)];
        quant_bound += std::fabs(wv) * err[size_t(t * p.K + i)];
      }
      const double got = y[size_t(t * p.y_stride + n)];
      const double sum_tol = 1e-5 * tight_abs + 1e-6;
      ASSERT_LE(std::fabs(got - tight), sum_tol)
          << p.name() << " t=" << t << " n=" << n << " (vs converted x)";
      ASSERT_LE(std::fabs(got - exact), quant_bound + sum_tol)
          << p.name() << " t=" << t << " n=" << n << " (vs f32 x)";
    }
  }
}

class MatmulTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTypes, MatchesDoubleAndIsThreadCountInvariant) {
  ThreadPool pool2(2);
  uint32_t seed = 1000 + uint32_t(GetParam());
  for (int64_t K : {256, 512, 1024 + 256}) {
    for (int64_t N : {1, 5, 67, 130}) {
      const Problem weights(GetParam(), 1, K, N, seed += 7);
      for (int64_t T : {1, 2, 7, 33}) {
        const Problem p = weights.with_tokens(T, seed + uint32_t(T));
        std::vector<float> y1(size_t(T * p.y_stride), -1.0f), y2 = y1;
        ASSERT_TRUE(matmul(p.args(y1, nullptr, nullptr)).is_ok()) << p.name();
        ASSERT_TRUE(matmul(p.args(y2, &pool2, nullptr)).is_ok()) << p.name();
        check_against_double(p, y1, nullptr);
        for (int64_t t = 0; t < T; ++t) {  // stride padding must stay untouched
          for (int64_t n = N; n < p.y_stride; ++n) ASSERT_EQ(y1[size_t(t * p.y_stride + n)], -1.0f);
        }
        ASSERT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0)
            << p.name() << ": 1 and 2 threads differ";
      }
    }
  }
}

// Every SIMD level through matmul (a level's own quantizer and vec_dot).
TEST_P(MatmulTypes, EveryLevelMatchesDouble) {
  ThreadPool pool2(2);
  for (SimdLevel level : {SimdLevel::kReference, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    const CpuKernels* k = cpu_kernels_for(level);
    if (k == nullptr) continue;
    const Problem p(GetParam(), 3, 512, 37, 77 + uint32_t(level));
    std::vector<float> y(size_t(p.T * p.y_stride));
    ASSERT_TRUE(matmul(p.args(y, &pool2, k)).is_ok()) << p.name() << " " << simd_level_name(level);
    SCOPED_TRACE(std::string(simd_level_name(level)));
    check_against_double(p, y, k);
  }
}

TEST_P(MatmulTypes, PreQuantizedActivationsGiveIdenticalResults) {
  const Problem p(GetParam(), 5, 512, 40, 4242);
  std::vector<uint8_t> packed;
  converted_activations(p, nullptr, &packed);
  std::vector<float> y_internal(size_t(p.T * p.y_stride)), y_pre(y_internal.size());
  ASSERT_TRUE(matmul(p.args(y_internal, nullptr, nullptr)).is_ok());
  MatmulArgs a = p.args(y_pre, nullptr, nullptr);
  a.x = nullptr;
  a.x_quant = packed.data();
  ASSERT_TRUE(matmul(a).is_ok());
  EXPECT_EQ(std::memcmp(y_internal.data(), y_pre.data(), y_pre.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, MatmulTypes, ::testing::ValuesIn(kWeightDTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST(Matmul, RejectsBadShapesAndTypes) {
  const Problem p(DType::Q4_K, 1, 256, 4, 5);
  std::vector<float> y(16);
  MatmulArgs a = p.args(y, nullptr, nullptr);
  a.n_cols = 128;  // not a multiple of 256
  EXPECT_EQ(matmul(a).code(), StatusCode::kInvalidArgument);
  a = p.args(y, nullptr, nullptr);
  a.w_type = DType::Q8_K;
  EXPECT_EQ(matmul(a).code(), StatusCode::kUnsupported);
  a = p.args(y, nullptr, nullptr);
  a.w = nullptr;
  EXPECT_EQ(matmul(a).code(), StatusCode::kInvalidArgument);
  a = p.args(y, nullptr, nullptr);
  a.w_row_stride = 10;  // shorter than a row
  EXPECT_EQ(matmul(a).code(), StatusCode::kInvalidArgument);
  a = p.args(y, nullptr, nullptr);
  a.y_stride = 2;  // shorter than N
  EXPECT_EQ(matmul(a).code(), StatusCode::kInvalidArgument);
  a = p.args(y, nullptr, nullptr);
  a.n_tokens = 0;  // nothing to do
  EXPECT_TRUE(matmul(a).is_ok());
}

TEST(Matmul, WeightRowStrideIsHonoured) {
  // Rows of a larger matrix: take every other row via the stride.
  const Problem p(DType::Q8_0, 2, 256, 10, 99);
  const size_t row = dtype_row_bytes(DType::Q8_0, 256);
  std::vector<float> y_all(size_t(p.T * p.y_stride)), y_odd(size_t(p.T * 5));
  ASSERT_TRUE(matmul(p.args(y_all, nullptr, nullptr)).is_ok());
  MatmulArgs a = p.args(y_odd, nullptr, nullptr);
  a.w = p.w.data() + row;  // row 1, 3, 5, ...
  a.w_row_stride = 2 * row;
  a.n_rows = 5;
  a.y_stride = 5;
  ASSERT_TRUE(matmul(a).is_ok());
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t i = 0; i < 5; ++i)
      EXPECT_EQ(y_odd[size_t(t * 5 + i)], y_all[size_t(t * p.y_stride + 2 * i + 1)]);
  }
}

}  // namespace
}  // namespace moeserve::cpu

namespace moeserve::cpu {
namespace {

// matmul_group: products sharing x (as q/k/v do, with different types of
// the same activation type) give exactly the separate matmul() results, in
// one dispatch; products that cannot share fall back to one at a time.
TEST(MatmulGroup, EqualsSeparateProductsBitForBit) {
  ThreadPool pool(2);
  for (int64_t T : {1, 3, 9}) {
    Problem q(DType::Q4_K, T, 512, 40, 7), k(DType::Q6_K, T, 512, 13, 8), v(DType::Q4_K, T, 512, 29, 9);
    k.x = q.x;  // one shared input
    v.x = q.x;
    std::vector<float> yq(size_t(T * q.y_stride)), yk(size_t(T * k.y_stride)), yv(size_t(T * v.y_stride));
    std::vector<float> gq(yq.size()), gk(yk.size()), gv(yv.size());
    ASSERT_TRUE(matmul(q.args(yq, &pool, nullptr)).is_ok());
    ASSERT_TRUE(matmul(k.args(yk, &pool, nullptr)).is_ok());
    ASSERT_TRUE(matmul(v.args(yv, &pool, nullptr)).is_ok());
    MatmulArgs group[] = {q.args(gq, &pool, nullptr), k.args(gk, &pool, nullptr), v.args(gv, &pool, nullptr)};
    group[1].x = group[0].x;
    group[2].x = group[0].x;
    ASSERT_TRUE(matmul_group(group).is_ok());
    EXPECT_EQ(gq, yq) << "T=" << T;
    EXPECT_EQ(gk, yk) << "T=" << T;
    EXPECT_EQ(gv, yv) << "T=" << T;
    // A different activation type (f32 weights) in the group: still right.
    Problem f(DType::F32, T, 512, 7, 10);
    f.x = q.x;
    std::vector<float> yf(size_t(T * f.y_stride)), gf(yf.size());
    ASSERT_TRUE(matmul(f.args(yf, &pool, nullptr)).is_ok());
    MatmulArgs mixed[] = {q.args(gq, &pool, nullptr), f.args(gf, &pool, nullptr)};
    mixed[1].x = mixed[0].x;
    ASSERT_TRUE(matmul_group(mixed).is_ok());
    EXPECT_EQ(gf, yf);
    EXPECT_EQ(gq, yq);
  }
}

}  // namespace
}  // namespace moeserve::cpu
