// The packed (16-row interleaved) K-quant layout and its kernels:
//  - pack_rows / unpack_rows are exact inverses (every bit kept);
//  - the scalar reference packed dot agrees with the row-major reference
//    vec_dot within float rounding (same integer sums, other float order);
//  - every SIMD packed kernel equals the scalar reference BIT FOR BIT, for
//    1..13 columns, so batching never changes a result;
//  - matmul on packed weights: close to row-major, 1 thread == 2 threads bit
//    for bit, and clear errors for shapes or levels it cannot take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_layout.h"
#include "ops_test_util.h"
#include "tensor/quantize.h"

namespace moeserve::cpu {
namespace {

constexpr DType kPackedTypes[] = {DType::Q4_K, DType::Q6_K};

struct Weights {
  DType type;
  int64_t rows, cols;
  std::vector<uint8_t> row_major, packed;

  Weights(DType t, int64_t n_rows, int64_t n_cols, uint32_t seed) : type(t), rows(n_rows), cols(n_cols) {
    const auto f = testing::random_normal(rows * cols, seed, 0.5f);
    row_major.resize(dtype_row_bytes(type, cols) * size_t(rows));
    quantize_rows(type, f.data(), row_major.data(), rows, cols);
    packed.resize(row_major.size());
    pack_rows(type, row_major.data(), dtype_row_bytes(type, cols), packed.data(), rows, cols);
  }
  size_t row_bytes() const { return dtype_row_bytes(type, cols); }
};

// n_x rows of Q8_K activations of length cols.
std::vector<uint8_t> activations(int64_t n_x, int64_t cols, uint32_t seed) {
  const auto x = testing::random_normal(n_x * cols, seed);
  const size_t rb = activation_row_bytes(DType::Q4_K, cols);
  std::vector<uint8_t> q(rb * size_t(n_x));
  const CpuKernels& ref = *cpu_kernels_for(SimdLevel::kReference);
  for (int64_t i = 0; i < n_x; ++i)
    ref.quantize_row[dtype_slot(DType::Q8_K)](x.data() + i * cols, q.data() + size_t(i) * rb, cols);
  return q;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(PackedLayout, PackThenUnpackRestoresEveryByte) {
  for (DType type : kPackedTypes) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    // Arbitrary bytes, not just valid blocks: the layout keeps every bit.
    const int64_t rows = 48, cols = 768;
    std::vector<uint8_t> src(dtype_row_bytes(type, cols) * size_t(rows));
    std::mt19937 rng(5);
    for (uint8_t& b : src) b = uint8_t(rng());
    std::vector<uint8_t> packed(src.size()), back(src.size());
    pack_rows(type, src.data(), dtype_row_bytes(type, cols), packed.data(), rows, cols);
    EXPECT_NE(packed, src);
    unpack_rows(type, packed.data(), back.data(), rows, cols);
    EXPECT_EQ(back, src);
  }
}

TEST(PackedLayout, PacksFromAStridedSource) {
  const DType type = DType::Q4_K;
  const int64_t rows = 16, cols = 256;
  const size_t rb = dtype_row_bytes(type, cols), stride = rb + 40;
  Weights w(type, rows, cols, 3);
  std::vector<uint8_t> strided(stride * size_t(rows), 0xAB);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(strided.data() + size_t(r) * stride, w.row_major.data() + size_t(r) * rb, rb);
  std::vector<uint8_t> packed(w.packed.size());
  pack_rows(type, strided.data(), stride, packed.data(), rows, cols);
  EXPECT_EQ(packed, w.packed);
}

TEST(PackedReference, AgreesWithRowMajorVecDot) {
  const CpuKernels& ref = *cpu_kernels_for(SimdLevel::kReference);
  for (DType type : kPackedTypes) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const int64_t cols = 1024;
    Weights w(type, 32, cols, 11);
    const auto x = activations(3, cols, 12);
    const size_t xs = activation_row_bytes(type, cols);
    std::vector<float> out(3 * 32);
    for (int64_t g = 0; g < 2; ++g) {
      packed_dot_reference(type)(cols, w.packed.data() + size_t(g) * kPackRows * w.row_bytes(), x.data(), xs,
                                 3, out.data() + g * kPackRows, 32);
    }
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t r = 0; r < 32; ++r) {
        const float want = ref.vec_dot[dtype_slot(type)](cols, w.row_major.data() + size_t(r) * w.row_bytes(),
                                                         x.data() + size_t(c) * xs);
        EXPECT_NEAR(out[size_t(c * 32 + r)], want, 1e-5 * (1.0 + std::abs(want)))
            << "row " << r << " col " << c;
      }
    }
  }
}

TEST(PackedKernels, EverySimdLevelMatchesTheReferenceBitForBit) {
  bool any = false;
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    const CpuKernels* k = cpu_kernels_for(level);
    if (k == nullptr) continue;
    for (DType type : kPackedTypes) {
      if (k->packed_dot[dtype_slot(type)] == nullptr) continue;
      any = true;
      SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(dtype_name(type)));
      for (int64_t cols : {256, 512, 1024, 2816}) {
        Weights w(type, kPackRows, cols, uint32_t(cols));
        const size_t xs = activation_row_bytes(type, cols);
        for (int n_x : {1, 2, 3, 4, 5, 8}) {
          const auto x = activations(n_x, cols, uint32_t(cols + n_x));
          std::vector<float> got(size_t(n_x) * kPackRows, -1.0f), want(got.size(), -2.0f);
          k->packed_dot[dtype_slot(type)](cols, w.packed.data(), x.data(), xs, n_x, got.data(), kPackRows);
          packed_dot_reference(type)(cols, w.packed.data(), x.data(), xs, n_x, want.data(), kPackRows);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(bits(got[i]), bits(want[i])) << "K=" << cols << " n_x=" << n_x << " element " << i;
          }
        }
      }
    }
  }
  if (!any) GTEST_SKIP() << "this CPU has no SIMD packed kernels";
}

TEST(PackedKernels, ColumnsComputedTogetherEqualColumnsAlone) {
  const CpuKernels& k = cpu_kernels();
  for (DType type : kPackedTypes) {
    if (k.packed_dot[dtype_slot(type)] == nullptr) GTEST_SKIP() << "no packed kernels at this level";
    SCOPED_TRACE(std::string(dtype_name(type)));
    const int64_t cols = 512, n_x = 13;
    Weights w(type, kPackRows, cols, 21);
    const auto x = activations(n_x, cols, 22);
    const size_t xs = activation_row_bytes(type, cols);
    std::vector<float> together(size_t(n_x) * kPackRows), alone(kPackRows);
    packed_dot_columns(k, type, cols, w.packed.data(), x.data(), xs, n_x, together.data(), kPackRows);
    for (int64_t c = 0; c < n_x; ++c) {
      k.packed_dot[dtype_slot(type)](cols, w.packed.data(), x.data() + size_t(c) * xs, xs, 1, alone.data(),
                                     kPackRows);
      for (int r = 0; r < kPackRows; ++r)
        ASSERT_EQ(bits(together[size_t(c * kPackRows + r)]), bits(alone[size_t(r)]));
    }
  }
}

MatmulArgs packed_args(const Weights& w, const std::vector<float>& x, int64_t T, std::vector<float>& y,
                       bool packed, ThreadPool* pool) {
  MatmulArgs a;
  a.w = packed ? w.packed.data() : w.row_major.data();
  a.w_type = w.type;
  a.n_rows = w.rows;
  a.n_cols = w.cols;
  a.w_packed = packed;
  a.x = x.data();
  a.n_tokens = T;
  a.y = y.data();
  a.pool = pool;
  return a;
}

TEST(PackedMatmul, MatchesRowMajorAndIsThreadCountInvariant) {
  if (cpu_kernels().packed_dot[dtype_slot(DType::Q4_K)] == nullptr) GTEST_SKIP() << "no packed kernels here";
  ThreadPool two(2);
  for (DType type : kPackedTypes) {
    for (int64_t T : {1, 7, 20}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " T=" + std::to_string(T));
      Weights w(type, 96, 512, 31);
      const auto x = testing::random_normal(T * w.cols, 32);
      std::vector<float> rm(size_t(T * w.rows)), p1(rm.size()), p2(rm.size());
      ASSERT_TRUE(matmul(packed_args(w, x, T, rm, false, nullptr)).is_ok());
      ASSERT_TRUE(matmul(packed_args(w, x, T, p1, true, nullptr)).is_ok());
      ASSERT_TRUE(matmul(packed_args(w, x, T, p2, true, &two)).is_ok());
      for (size_t i = 0; i < rm.size(); ++i) {
        ASSERT_NEAR(p1[i], rm[i], 1e-5 * (1.0 + std::abs(rm[i]))) << "element " << i;
        ASSERT_EQ(bits(p1[i]), bits(p2[i])) << "threads, element " << i;
      }
    }
  }
}

// One token: the tiles shrink as the dispatch goes (guided over the bytes
// left in the whole group), so products big enough for many tiles, at any
// thread count, must still write every row exactly as one thread does; and a
// group must equal its products run one by one.
TEST(PackedMatmul, OneTokenGuidedTilesCoverEveryRowAtAnyThreadCount) {
  if (cpu_kernels().packed_dot[dtype_slot(DType::Q4_K)] == nullptr) GTEST_SKIP() << "no packed kernels here";
  const int64_t cols = 1024;
  Weights q(DType::Q4_K, 1200, cols, 51), k(DType::Q6_K, 304, cols, 52), v(DType::Q4_K, 16, cols, 53);
  const auto x = testing::random_normal(cols, 54);
  std::vector<float> want_q(size_t(q.rows)), want_k(size_t(k.rows)), want_v(size_t(v.rows));
  ASSERT_TRUE(matmul(packed_args(q, x, 1, want_q, true, nullptr)).is_ok());
  ASSERT_TRUE(matmul(packed_args(k, x, 1, want_k, true, nullptr)).is_ok());
  ASSERT_TRUE(matmul(packed_args(v, x, 1, want_v, true, nullptr)).is_ok());
  for (int threads : {2, 3, 5, 16}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadPool pool(threads);
    std::vector<float> got_q(want_q.size(), NAN), got_k(want_k.size(), NAN), got_v(want_v.size(), NAN);
    ASSERT_TRUE(matmul(packed_args(q, x, 1, got_q, true, &pool)).is_ok());
    for (size_t i = 0; i < got_q.size(); ++i)
      ASSERT_EQ(bits(got_q[i]), bits(want_q[i])) << "alone, row " << i;
    std::fill(got_q.begin(), got_q.end(), NAN);
    const MatmulArgs group[] = {packed_args(q, x, 1, got_q, true, &pool),
                                packed_args(k, x, 1, got_k, true, &pool),
                                packed_args(v, x, 1, got_v, true, &pool)};
    ASSERT_TRUE(matmul_group(group).is_ok());
    for (size_t i = 0; i < got_q.size(); ++i)
      ASSERT_EQ(bits(got_q[i]), bits(want_q[i])) << "group q, row " << i;
    for (size_t i = 0; i < got_k.size(); ++i)
      ASSERT_EQ(bits(got_k[i]), bits(want_k[i])) << "group k, row " << i;
    for (size_t i = 0; i < got_v.size(); ++i)
      ASSERT_EQ(bits(got_v[i]), bits(want_v[i])) << "group v, row " << i;
  }
}

TEST(PackedMatmul, RejectsShapesAndLevelsItCannotTake) {
  Weights w(DType::Q4_K, 32, 256, 41);
  const auto x = testing::random_normal(w.cols, 42);
  std::vector<float> y(size_t(w.rows));
  MatmulArgs a = packed_args(w, x, 1, y, true, nullptr);
  a.kernels = cpu_kernels_for(SimdLevel::kReference);  // no packed kernels there
  EXPECT_EQ(matmul(a).code(), StatusCode::kUnsupported);
  if (cpu_kernels().packed_dot[dtype_slot(DType::Q4_K)] == nullptr) return;
  a.kernels = nullptr;
  a.n_rows = 24;  // not a multiple of 16
  EXPECT_EQ(matmul(a).code(), StatusCode::kInvalidArgument);
  a.n_rows = 32;
  a.w_row_stride = w.row_bytes() + 16;  // packed rows must be contiguous
  EXPECT_EQ(matmul(a).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve::cpu
