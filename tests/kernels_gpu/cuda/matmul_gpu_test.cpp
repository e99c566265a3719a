// matvec / gemm / matmul (kernels/cuda/matmul.h) against a double-precision
// CPU reference on the dequantized weights (tensor/quantize.h), for every
// weight type, at odd sizes, on random data, with poisoned outputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.h"
#include "kernels_gpu/cuda/gpu_test_util.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

using cuda::MatmulArgs;
using testing::DeviceArray;
using testing::random_floats;
using testing::relative_error;

// f32 sums of exactly decoded weights: a few ulps of f32 over the row.
constexpr double kMatvecTol = 1e-5;
// Operands rounded to f16 (2^-11) in the tensor-core products.
constexpr double kGemmTolF16 = 2e-3;
// BF16 weights keep bf16 operands (range), so x is rounded to 2^-8.
constexpr double kGemmTolBF16 = 1e-2;

double gemm_tol(DType t) { return t == DType::BF16 ? kGemmTolBF16 : kGemmTolF16; }

// The smallest column count unit of a type (float types: runs of 16).
int64_t col_unit(DType t) { return dtype_traits(t).quantized ? dtype_block_elems(t) : 16; }

// Row padding that keeps rows legal: 2 bytes shifts the 2-byte aligned
// block types off 4- and 16-byte boundaries; the others need 16.
size_t row_pad(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q6_K ? 2 : 16; }

// A quantized matrix with optional row padding, and its exact f32 values.
struct QuantMatrix {
  DType type;
  int64_t rows, cols;
  size_t row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantize_row of each row
};

QuantMatrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed, size_t pad = 0) {
  QuantMatrix m{type, rows, cols, dtype_row_bytes(type, cols) + pad, {}, {}};
  m.bytes.assign(size_t(rows) * m.row_bytes, 0xAB);  // padding bytes: garbage
  m.values.resize(size_t(rows * cols));
  const std::vector<float> src = random_floats(size_t(rows * cols), seed);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * m.row_bytes;
    quantize_row(type, src.data() + r * cols, row, cols);
    dequantize_row(type, row, m.values.data() + r * cols, cols);
  }
  return m;
}

// y[t][r] = sum_c W[r][c] * x[t][c] in double.
std::vector<float> reference(const QuantMatrix& m, const std::vector<float>& x, int64_t x_stride, int64_t n_tokens) {
  std::vector<float> y(size_t(n_tokens * m.rows));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < m.rows; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < m.cols; ++c) s += double(m.values[r * m.cols + c]) * double(x[t * x_stride + c]);
      y[t * m.rows + r] = float(s);
    }
  }
  return y;
}

bool is_poison(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b == 0xFFFFFFFFu;
}

enum class Path { kMatvec, kGemm, kMatmul };

struct ProductRun {
  std::vector<float> y;  // [n_tokens][n_rows], gathered from the strided output
  Status status;
};

// Runs one product on device copies; checks that every output in the
// strided y is written and that the stride padding stays poisoned.
ProductRun run_product(Path path, const QuantMatrix& m, const std::vector<float>& x, int64_t x_stride, int64_t n_tokens,
                int64_t y_pad = 3) {
  DeviceArray<uint8_t> dw(m.bytes);
  DeviceArray<float> dx(x);
  const int64_t y_stride = m.rows + y_pad;
  DeviceArray<float> dy(size_t(n_tokens * y_stride));
  dy.poison();
  MatmulArgs a;
  a.w = dw.get(), a.w_type = m.type, a.n_rows = m.rows, a.n_cols = m.cols, a.row_bytes = m.row_bytes;
  a.x = dx.get(), a.x_stride = x_stride, a.n_tokens = n_tokens, a.y = dy.get(), a.y_stride = y_stride;
  ProductRun out;
  out.status = path == Path::kMatvec ? cuda::matvec(a, nullptr)
               : path == Path::kGemm ? cuda::gemm(a, nullptr)
                                     : cuda::matmul(a, nullptr);
  if (!out.status.is_ok()) return out;
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    out.status = make_error(StatusCode::kInternal, "kernel failed: {}", cudaGetErrorString(err));
    return out;
  }
  const std::vector<float> raw = dy.download();
  out.y.resize(size_t(n_tokens * m.rows));
  int64_t unwritten = 0, past_end = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < y_stride; ++r) {
      const float v = raw[t * y_stride + r];
      if (r >= m.rows) {
        past_end += !is_poison(v);
      } else {
        unwritten += is_poison(v);
        out.y[t * m.rows + r] = v;
      }
    }
  }
  EXPECT_EQ(unwritten, 0) << "outputs not written";
  EXPECT_EQ(past_end, 0) << "outputs written past n_rows";
  return out;
}

class MatvecGpu : public ::testing::TestWithParam<DType> {};

TEST_P(MatvecGpu, MatchesDoubleReference) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t u = col_unit(type);
  struct Shape {
    int64_t rows, cols;
    size_t pad;
  };
  // Odd rows and blocks; the long row spans several shared-memory chunks
  // and ends in a partial one; padded rows shift the 2-byte aligned types.
  const Shape shapes[] = {{37, 3 * u, 0}, {5, (u == 256 ? 19 : 75) * u, 0}, {9, 7 * u, row_pad(type)}};
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    const QuantMatrix m = make_matrix(type, s.rows, s.cols, seed++, s.pad);
    for (int64_t n_tokens : {1, 3, 16}) {
      const int64_t x_stride = s.cols + 4;
      const std::vector<float> x = random_floats(size_t(n_tokens * x_stride), seed++);
      const ProductRun got = run_product(Path::kMatvec, m, x, x_stride, n_tokens);
      ASSERT_TRUE(got.status.is_ok()) << got.status.to_string();
      const std::vector<float> want = reference(m, x, x_stride, n_tokens);
      EXPECT_LT(relative_error(got.y.data(), want.data(), want.size()), kMatvecTol)
          << dtype_name(type) << " " << s.rows << "x" << s.cols << " tokens " << n_tokens;
    }
  }
}

TEST_P(MatvecGpu, TokenResultsDoNotDependOnTheBatch) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t cols = 11 * col_unit(type), rows = 21;
  const QuantMatrix m = make_matrix(type, rows, cols, 7);
  const std::vector<float> x = random_floats(size_t(16 * cols), 8);
  const ProductRun batch = run_product(Path::kMatvec, m, x, cols, 16);
  ASSERT_TRUE(batch.status.is_ok()) << batch.status.to_string();
  // Each token alone, and tokens 3.. in a batch of 5 (another kernel width).
  for (int64_t t = 0; t < 16; ++t) {
    const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
    const ProductRun one = run_product(Path::kMatvec, m, xt, cols, 1);
    ASSERT_TRUE(one.status.is_ok());
    EXPECT_EQ(std::memcmp(one.y.data(), batch.y.data() + t * rows, size_t(rows) * sizeof(float)), 0)
        << dtype_name(type) << ": token " << t << " differs from its batch of 16";
  }
  const std::vector<float> x5(x.begin() + 3 * cols, x.begin() + 8 * cols);
  const ProductRun five = run_product(Path::kMatvec, m, x5, cols, 5);
  ASSERT_TRUE(five.status.is_ok());
  EXPECT_EQ(std::memcmp(five.y.data(), batch.y.data() + 3 * rows, size_t(5 * rows) * sizeof(float)), 0);
}

class GemmGpu : public ::testing::TestWithParam<DType> {};

TEST_P(GemmGpu, MatchesDoubleReference) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t u = col_unit(type);
  struct Shape {
    int64_t tokens, rows, cols;
  };
  // Partial tiles in every direction (64 tokens x 128 rows x 32 columns);
  // float types also end in a half K step (cols % 32 == 16).
  const Shape shapes[] = {{67, 133, 3 * u}, {17, 5, 13 * u}, {130, 260, (u == 256 ? 4 : 33) * u}};
  uint32_t seed = 300;
  for (const Shape& s : shapes) {
    const QuantMatrix m = make_matrix(type, s.rows, s.cols, seed++, row_pad(type));
    const int64_t x_stride = s.cols + 8;
    const std::vector<float> x = random_floats(size_t(s.tokens * x_stride), seed++);
    const ProductRun got = run_product(Path::kGemm, m, x, x_stride, s.tokens);
    ASSERT_TRUE(got.status.is_ok()) << got.status.to_string();
    const std::vector<float> want = reference(m, x, x_stride, s.tokens);
    EXPECT_LT(relative_error(got.y.data(), want.data(), want.size()), gemm_tol(type))
        << dtype_name(type) << " " << s.tokens << "x" << s.cols << " -> " << s.rows;
  }
}

TEST_P(GemmGpu, TokenResultsDoNotDependOnTheBatch) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t cols = 5 * col_unit(type), rows = 70;
  const QuantMatrix m = make_matrix(type, rows, cols, 11);
  const std::vector<float> x = random_floats(size_t(130 * cols), 12);
  const ProductRun big = run_product(Path::kGemm, m, x, cols, 130);
  ASSERT_TRUE(big.status.is_ok()) << big.status.to_string();
  // Tokens 50..90 alone sit at other positions of other tiles.
  const std::vector<float> part(x.begin() + 50 * cols, x.begin() + 90 * cols);
  const ProductRun small = run_product(Path::kGemm, m, part, cols, 40);
  ASSERT_TRUE(small.status.is_ok());
  EXPECT_EQ(std::memcmp(small.y.data(), big.y.data() + 50 * rows, size_t(40 * rows) * sizeof(float)), 0)
      << dtype_name(type);
}

TEST_P(GemmGpu, MatmulPicksMatvecUpTo16Tokens) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t cols = 3 * col_unit(type), rows = 45;
  const QuantMatrix m = make_matrix(type, rows, cols, 21);
  for (int64_t n : {16, 17}) {
    const std::vector<float> x = random_floats(size_t(n * cols), uint32_t(22 + n));
    const ProductRun via_matmul = run_product(Path::kMatmul, m, x, cols, n);
    const ProductRun direct = run_product(n <= cuda::kMatvecMaxTokens ? Path::kMatvec : Path::kGemm, m, x, cols, n);
    ASSERT_TRUE(via_matmul.status.is_ok() && direct.status.is_ok());
    EXPECT_EQ(std::memcmp(via_matmul.y.data(), direct.y.data(), via_matmul.y.size() * sizeof(float)), 0) << n;
  }
}

std::string type_name(const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); }

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, MatvecGpu, ::testing::ValuesIn(kWeightDTypes), type_name);
INSTANTIATE_TEST_SUITE_P(AllWeightTypes, GemmGpu, ::testing::ValuesIn(kWeightDTypes), type_name);

// Argument checks come before any CUDA call, so they need no GPU.
TEST(MatmulGpuArgs, RejectsBadArguments) {
  alignas(16) static float buf[4096];
  MatmulArgs ok;
  ok.w = buf, ok.w_type = DType::Q4_K, ok.n_rows = 4, ok.n_cols = 256;
  ok.row_bytes = dtype_row_bytes(DType::Q4_K, 256);
  ok.x = buf, ok.x_stride = 256, ok.n_tokens = 2, ok.y = buf, ok.y_stride = 4;
  auto expect_code = [](MatmulArgs a, StatusCode code, const char* what) {
    EXPECT_EQ(cuda::matvec(a, nullptr).code(), code) << "matvec: " << what;
    EXPECT_EQ(cuda::gemm(a, nullptr).code(), code) << "gemm: " << what;
  };
  MatmulArgs a = ok;
  a.n_cols = 300;  // not a multiple of 256
  expect_code(a, StatusCode::kInvalidArgument, "n_cols");
  a = ok, a.w = nullptr;
  expect_code(a, StatusCode::kInvalidArgument, "null w");
  a = ok, a.w = reinterpret_cast<const uint8_t*>(buf) + 2;
  expect_code(a, StatusCode::kInvalidArgument, "unaligned w");
  a = ok, a.row_bytes = 100;
  expect_code(a, StatusCode::kInvalidArgument, "row_bytes");
  a = ok, a.x = buf + 1;
  expect_code(a, StatusCode::kInvalidArgument, "unaligned x");
  a = ok, a.x_stride = 100;
  expect_code(a, StatusCode::kInvalidArgument, "x_stride");
  a = ok, a.y_stride = 2;
  expect_code(a, StatusCode::kInvalidArgument, "y_stride");
  a = ok, a.w_type = DType::Q8_K;
  expect_code(a, StatusCode::kUnsupported, "q8_K weights");
  a = ok, a.w_type = DType::F32, a.n_cols = 40, a.row_bytes = 160, a.x_stride = 40;
  expect_code(a, StatusCode::kInvalidArgument, "f32 n_cols not a multiple of 16");
  a = ok, a.n_tokens = 0;
  expect_code(a, StatusCode::kInvalidArgument, "no tokens");
  a = ok, a.n_tokens = cuda::kMatvecMaxTokens + 1, a.x_stride = 256, a.y_stride = 4;
  EXPECT_EQ(cuda::matvec(a, nullptr).code(), StatusCode::kInvalidArgument) << "matvec past 16 tokens";
}

}  // namespace
}  // namespace moeserve
