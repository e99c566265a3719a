// matvec / gemm / matmul (kernels/cuda/matmul.h) against a double-precision
// CPU reference on the dequantized weights (tensor/quantize.h), for every
// weight type, at odd sizes, on random data, with poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_detail.h"
#include "kernels_gpu/cuda/cpu_reference_dot.h"
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
// Tensor-core products (gemm.cu). F16 and BF16 weights: exact operands, the
// activations as 2 f16 (3 bf16) terms that carry all their bits: only the
// f32 accumulation on the tensor cores (truncating adds) remains; measured
// <= 1.5e-7 on an H100.
constexpr double kGemmTolExactW = 1e-6;
// K-quants and IQ4_XS (gemm_kq.cu): the CPU's arithmetic, Q8_K
// activations and integer block sums, bit for bit the reference CPU
// kernels; against the double reference that is Q8_K's accuracy (~6e-3 on
// normal data: a step of max|x| / 127 per 256 columns).
constexpr double kGemmTolQ8K = 2e-2;
// Other types (F32, Q8_0, Q4_0, and Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and the
// codebook i-quants, which have no integer kernel): the weight (a dequantized
// value has up to ~21 significant bits; F32 24) and the activation are each
// rounded to f16, ~2^-11 relative each: measured 2.6e-4 .. 3.6e-4 on an
// H100 (about 3e-4 RMS expected); a product's error is at most about
// 2^-10 ~ 1e-3.
constexpr double kGemmTolRoundedW = 1e-3;

double gemm_tol(DType t) {
  if (testing::gemm_uses_q8k(t)) return kGemmTolQ8K;
  return t == DType::F16 || t == DType::BF16 ? kGemmTolExactW : kGemmTolRoundedW;
}

// The smallest column count unit of a type (float types: runs of 16).
int64_t col_unit(DType t) { return dtype_traits(t).quantized ? dtype_block_elems(t) : 16; }

// Row padding that keeps rows legal and moves the rows of the types whose
// blocks are not whole 16-byte pieces off 16-byte boundaries: their row
// alignment (2 for Q8_0, Q4_0, Q6_K, Q5_0, IQ4_NL, Q3_K; 4 for Q4_1, Q2_K; 8
// for Q5_1, IQ4_XS), 2 for MXFP4 (its 17-byte blocks at the odd block counts
// of these shapes then give rows of odd length: rows at odd addresses); the
// others need 16.
size_t row_pad(DType t) {
  const size_t align = cuda::detail::weight_row_align(t);
  return align == 16 ? 16 : std::max<size_t>(align, 2);
}

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
    testing::weight_row(type, src.data() + r * cols, row, cols, seed + uint32_t(r));
    dequantize_row(type, row, m.values.data() + r * cols, cols);
  }
  return m;
}

// y[t][r] = sum_c W[r][c] * x[t][c] in double.
std::vector<float> reference(const QuantMatrix& m, const std::vector<float>& x, int64_t x_stride,
                             int64_t n_tokens) {
  std::vector<float> y(size_t(n_tokens * m.rows));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < m.rows; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < m.cols; ++c)
        s += double(m.values[r * m.cols + c]) * double(x[t * x_stride + c]);
      y[t * m.rows + r] = float(s);
    }
  }
  return y;
}

// The reference CPU kernels' products (Q8_K activations), for the types
// whose gemm reproduces them (the codebook i-quants: the kernel's integer
// formula on the host, cpu_reference_dot.h).
std::vector<float> cpu_reference(const QuantMatrix& m, const std::vector<float>& x, int64_t x_stride,
                                 int64_t n_tokens) {
  const size_t q_bytes = dtype_row_bytes(DType::Q8_K, m.cols);
  std::vector<uint8_t> q(size_t(n_tokens) * q_bytes);
  for (int64_t t = 0; t < n_tokens; ++t)
    quantize_row(DType::Q8_K, x.data() + t * x_stride, q.data() + t * q_bytes, m.cols);
  std::vector<float> y(size_t(n_tokens * m.rows));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < m.rows; ++r) {
      y[size_t(t * m.rows + r)] = testing::gpu_reference_dot_q8k(m.type, m.bytes.data() + r * m.row_bytes,
                                                                 q.data() + t * q_bytes, m.cols);
    }
  }
  return y;
}

bool is_poison(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b == 0xFFFFFFFFu;
}

enum class Path { kMatvec, kGemm, kMatmul, kRows };

struct ProductRun {
  std::vector<float> y;  // [n_tokens][n_rows], gathered from the strided output
  Status status;
};

// Runs one product on device copies; checks that every output in the
// strided y is written and that the stride padding stays poisoned.
// split_scratch: the scratch gemm_scratch_bytes(args) asks (a K-quant
// decode batch then splits K), else the Q8_K rows' only.
ProductRun run_product(Path path, const QuantMatrix& m, const std::vector<float>& x, int64_t x_stride,
                       int64_t n_tokens, int64_t y_pad = 3, bool split_scratch = false) {
  DeviceArray<uint8_t> dw(m.bytes);
  DeviceArray<float> dx(x);
  const int64_t y_stride = m.rows + y_pad;
  DeviceArray<float> dy(size_t(n_tokens * y_stride));
  dy.poison();
  MatmulArgs a;
  a.w = dw.get(), a.w_type = m.type, a.n_rows = m.rows, a.n_cols = m.cols, a.row_bytes = m.row_bytes;
  a.x = dx.get(), a.x_stride = x_stride, a.n_tokens = n_tokens, a.y = dy.get(), a.y_stride = y_stride;
  DeviceArray<uint8_t> scratch(split_scratch ? cuda::gemm_scratch_bytes(a)
                                             : cuda::gemm_scratch_bytes(m.type, n_tokens, m.cols));
  a.scratch = scratch.get(), a.scratch_bytes = scratch.size();
  ProductRun out;
  out.status = path == Path::kMatvec ? cuda::matvec(a, nullptr)
               : path == Path::kGemm ? cuda::gemm(a, nullptr)
               : path == Path::kRows ? cuda::matvec_rows(a, nullptr)
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

// matvec_rows: any number of tokens, each row bit for bit what matvec gives
// that token (F32 in one launch over 16-token chunks; the others a launch
// a chunk), and the reference within matvec's tolerance.
TEST_P(MatvecGpu, RowsOfAnyBatchEqualMatvecRows) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t cols = 5 * col_unit(type), rows = 37, n_tokens = 53, x_stride = cols + 4;
  const QuantMatrix m = make_matrix(type, rows, cols, 17);
  const std::vector<float> x = random_floats(size_t(n_tokens * x_stride), 18);
  const ProductRun all = run_product(Path::kRows, m, x, x_stride, n_tokens);
  ASSERT_TRUE(all.status.is_ok()) << all.status.to_string();
  const std::vector<float> want = reference(m, x, x_stride, n_tokens);
  EXPECT_LT(relative_error(all.y.data(), want.data(), want.size()), kMatvecTol) << dtype_name(type);
  for (int64_t t : {0, 15, 16, 52}) {
    const std::vector<float> xt(x.begin() + t * x_stride, x.begin() + (t + 1) * x_stride);
    const ProductRun one = run_product(Path::kMatvec, m, xt, x_stride, 1);
    ASSERT_TRUE(one.status.is_ok());
    EXPECT_EQ(std::memcmp(one.y.data(), all.y.data() + t * rows, size_t(rows) * sizeof(float)), 0)
        << dtype_name(type) << ": token " << t << " of 53 differs from its matvec row";
  }
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
  // The last (K-quants): enough CTAs for gemm_kq.cu's 32-token tiles.
  std::vector<Shape> shapes = {{67, 133, 3 * u}, {17, 5, 13 * u}, {130, 260, (u == 256 ? 4 : 33) * u}};
  // 520 tokens: 32-token tiles of 128 rows; 33 x 4100: a decode batch's
  // 16-token tiles of a long product.
  if (testing::gemm_uses_q8k(type)) shapes.push_back({520, 2100, u}), shapes.push_back({33, 4100, u});
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
    if (testing::gemm_uses_q8k(type)) {
      const std::vector<float> cpu = cpu_reference(m, x, x_stride, s.tokens);
      int64_t differ = 0;
      for (size_t i = 0; i < cpu.size(); ++i) differ += std::memcmp(&cpu[i], &got.y[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << dtype_name(type) << " " << s.tokens << "x" << s.cols << " -> " << s.rows
                           << ": outputs that differ from the reference CPU kernels";
    }
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

// matmul(): the matrix x vector kernels up to 16 tokens, except for large
// K-quant (and IQ4_XS) products, which take the integer kernel at every size
// (integer_dense_decode); the codebook i-quants take it only above 16.
TEST_P(GemmGpu, MatmulPicksMatvecUpTo16Tokens) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t cols = 3 * col_unit(type), rows = 45;
  const QuantMatrix m = make_matrix(type, rows, cols, 21);
  EXPECT_FALSE(cuda::integer_dense_decode(type, rows, cols)) << dtype_name(type);
  EXPECT_EQ(cuda::integer_dense_decode(type, cuda::kIntegerDecodeMinWeights / 2048, 2048),
            cuda::detail::gemm_kq_matches_cpu(type))
      << dtype_name(type);
  for (int64_t n : {16, 17}) {
    const std::vector<float> x = random_floats(size_t(n * cols), uint32_t(22 + n));
    const ProductRun via_matmul = run_product(Path::kMatmul, m, x, cols, n);
    const ProductRun direct =
        run_product(n <= cuda::kMatvecMaxTokens ? Path::kMatvec : Path::kGemm, m, x, cols, n);
    ASSERT_TRUE(via_matmul.status.is_ok() && direct.status.is_ok());
    EXPECT_EQ(std::memcmp(via_matmul.y.data(), direct.y.data(), via_matmul.y.size() * sizeof(float)), 0) << n;
  }
}

// gemm() of decode batches (1..16 tokens; what matmul() runs for a large
// K-quant product, integer_dense_decode): every output bit for bit the
// reference CPU kernels', and a token's row the same alone, in batches of
// 5, 8 and 16, and inside a 40-token product (other tiles).
TEST_P(GemmGpu, KQuantDecodeBatchesEqualTheCpuAndPrefill) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  if (!testing::gemm_uses_q8k(type)) GTEST_SKIP() << dtype_name(type) << ": not the integer kernel";
  for (const int64_t cols : {int64_t(2048), int64_t(768)}) {
    const int64_t rows = 133, x_stride = cols + 4;  // partial row tiles
    const QuantMatrix m = make_matrix(type, rows, cols, uint32_t(40 + cols), row_pad(type));
    const std::vector<float> x = random_floats(size_t(40 * x_stride), uint32_t(41 + cols));
    const ProductRun prefill = run_product(Path::kGemm, m, x, x_stride, 40);
    ASSERT_TRUE(prefill.status.is_ok()) << prefill.status.to_string();
    const std::vector<float> cpu = cpu_reference(m, x, x_stride, 16);
    for (const int64_t n : {1, 5, 8, 16}) {
      const std::vector<float> xn(x.begin(), x.begin() + n * x_stride);
      const ProductRun got = run_product(Path::kGemm, m, xn, x_stride, n);
      ASSERT_TRUE(got.status.is_ok()) << got.status.to_string();
      int64_t differ_cpu = 0, differ_prefill = 0;
      for (size_t i = 0; i < got.y.size(); ++i) {
        differ_cpu += std::memcmp(&cpu[i], &got.y[i], sizeof(float)) != 0;
        differ_prefill += std::memcmp(&prefill.y[i], &got.y[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(differ_cpu, 0) << dtype_name(type) << " " << n << " x " << cols
                               << ": outputs unlike the CPU's";
      EXPECT_EQ(differ_prefill, 0) << dtype_name(type) << " " << n << " x " << cols
                                   << ": outputs unlike a 40-token product's";
    }
  }
}

// Dense K-quant decode batches of 17-64 rows whose tiles leave most SMs
// idle split K (one 256-column block a CTA, the blocks' results added in
// order after): the same bits as the whole walk and the CPU's, with partial
// row tiles, 8 and 16 blocks; the split is asked for by the scratch size.
TEST_P(GemmGpu, KQuantSplitKEqualsTheWholeWalkAndTheCpu) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  if (!testing::gemm_uses_q8k(type)) GTEST_SKIP() << dtype_name(type) << ": not the integer kernel";
  for (const int64_t cols : {int64_t(2048), int64_t(4096)}) {
    const int64_t rows = 133, x_stride = cols + 4;
    const QuantMatrix m = make_matrix(type, rows, cols, uint32_t(60 + cols), row_pad(type));
    for (const int64_t n : {17, 32, 64}) {
      cuda::MatmulArgs probe;
      probe.w_type = type, probe.n_rows = rows, probe.n_cols = cols, probe.n_tokens = n;
      EXPECT_GT(cuda::gemm_scratch_bytes(probe), cuda::gemm_scratch_bytes(type, n, cols))
          << n << " x " << cols << ": the split's partials";
      const std::vector<float> x = random_floats(size_t(n * x_stride), uint32_t(61 + n));
      const ProductRun split = run_product(Path::kGemm, m, x, x_stride, n, 3, true);
      const ProductRun whole = run_product(Path::kGemm, m, x, x_stride, n);
      ASSERT_TRUE(split.status.is_ok() && whole.status.is_ok()) << split.status.to_string();
      const std::vector<float> cpu = cpu_reference(m, x, x_stride, n);
      int64_t differ_whole = 0, differ_cpu = 0;
      for (size_t i = 0; i < split.y.size(); ++i) {
        differ_whole += std::memcmp(&split.y[i], &whole.y[i], sizeof(float)) != 0;
        differ_cpu += std::memcmp(&split.y[i], &cpu[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(differ_whole, 0) << dtype_name(type) << " " << n << " x " << cols;
      EXPECT_EQ(differ_cpu, 0) << dtype_name(type) << " " << n << " x " << cols;
    }
  }
  cuda::MatmulArgs prefill;
  prefill.w_type = type, prefill.n_rows = 512, prefill.n_cols = 2048, prefill.n_tokens = 512;
  EXPECT_EQ(cuda::gemm_scratch_bytes(prefill), cuda::gemm_scratch_bytes(type, 512, 2048))
      << "prefill never splits";
}

std::string type_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, MatvecGpu, ::testing::ValuesIn(kGpuWeightDTypes), type_name);
INSTANTIATE_TEST_SUITE_P(AllWeightTypes, GemmGpu, ::testing::ValuesIn(kGpuWeightDTypes), type_name);

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
  // K-quant gemm converts the activations into the caller's scratch: none,
  // or too little, is refused before any launch.
  if (testing::gemm_uses_q8k(DType::Q4_K)) {
    a = ok, a.n_tokens = 17, a.y_stride = 4;
    EXPECT_EQ(cuda::gemm(a, nullptr).code(), StatusCode::kInvalidArgument) << "no scratch";
    a.scratch = buf, a.scratch_bytes = cuda::gemm_scratch_bytes(DType::Q4_K, 17, 256) - 1;
    EXPECT_EQ(cuda::gemm(a, nullptr).code(), StatusCode::kInvalidArgument) << "scratch too small";
  }
  EXPECT_EQ(cuda::gemm_scratch_bytes(DType::BF16, 17, 256), 0u) << "types that convert nothing ahead";
}

}  // namespace
}  // namespace moeserve

// ---- tensor-core matrix x vector path (matvec_tc.cu) ------------------------
// Its decoders (tc_decode.cuh) are checked on the host against the CPU
// dequantizer; the kernels at the decode shapes (several chunks and rounds,
// one and two MMA N tiles, multi-tile CTAs), their batch invariance across
// tile geometries, and matvec_multi against matvec.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "kernels/cuda/tc_decode.cuh"

namespace moeserve {
namespace {

template <DType T>
void check_tc_decoder(uint32_t seed) {
  using Q = cuda::tcdec::Tc<T>;
  const int64_t cols = 3 * cuda::tcdec::kChunkCols;
  std::vector<float> src = random_floats(size_t(cols), seed);
  // Some blocks of very different magnitudes.
  for (int64_t i = 0; i < cols; ++i)
    src[size_t(i)] *= float(1 + (i / 64) % 5) * ((i / 256) % 2 ? 100.0f : 0.01f);
  std::vector<uint8_t> bytes(dtype_row_bytes(T, cols) + 16, 0xAB);
  quantize_row(T, src.data(), bytes.data(), cols);
  std::vector<float> want(static_cast<size_t>(cols), 0.0f);
  dequantize_row(T, bytes.data(), want.data(), cols);
  for (int64_t c = 0; c < cols / cuda::tcdec::kChunkCols; ++c) {
    const uint8_t* row = bytes.data() + c * Q::kChunkBytes;
    float e[16] = {};
    Q::scales(row, 0, e);
    Q::scales(row, 1, e);
    double max_abs = 0.0;
    for (int i = 0; i < cuda::tcdec::kChunkCols; ++i)
      max_abs = std::max(max_abs, std::fabs(double(want[size_t(c * 256 + i)])));
    for (int q = 0; q < cuda::tcdec::kSteps; ++q) {
      float scale = 0.0f, min = 0.0f;
      cuda::tcdec::step_scale<T>(e, q, &scale, &min);
      for (int j = 0; j < 4; ++j) {
        uint32_t pairs[2];
        Q::step(row, q, j, pairs);
        for (int k = 0; k < 4; ++k) {
          const float code = cuda::tcdec::bf16_bits_to_float((pairs[k >> 1] >> (16 * (k & 1))) & 0xFFFFu);
          ASSERT_EQ(code, std::nearbyint(code)) << dtype_name(T) << ": codes are integers";
          const int64_t col = c * 256 + 16 * q + 4 * j + k;
          const double got = double(scale) * double(code) - double(min);
          ASSERT_LE(std::fabs(got - double(want[size_t(col)])), 1e-6 * max_abs)
              << dtype_name(T) << " column " << col << ": step " << q << " lane " << j;
        }
      }
    }
  }
}

TEST(MatvecTcDecode, CodesAndScalesMatchTheDequantizer) {
  check_tc_decoder<DType::Q4_K>(1);
  check_tc_decoder<DType::Q5_K>(2);
  check_tc_decoder<DType::Q6_K>(3);
  check_tc_decoder<DType::Q8_0>(4);
  check_tc_decoder<DType::Q4_0>(5);
}

// Exact from 2^-100 up (the terms are normal floats); below, the last term
// loses bits under 2^-126 (what the MMA reads: each term's top 16 bits).
TEST(MatvecTcDecode, ActivationTermsSumExactly) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-140, 127);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mant(rng), expo(rng));
    uint32_t t[3];
    cuda::tcdec::split3(x, t);
    double sum = 0.0;
    for (uint32_t b : t) sum += double(cuda::tcdec::bf16_bits_to_float(b >> 16));
    if (std::fabs(x) >= std::ldexp(1.0f, -100)) {
      ASSERT_EQ(sum, double(x)) << x;
    } else {
      ASSERT_LE(std::fabs(sum - double(x)), std::ldexp(1.0, -126)) << x;
    }
  }
}

// matvec_multi of `mats` (one input x, cols columns, contiguous rows): each
// product's output [n_tokens][rows], every element checked written.
std::vector<std::vector<float>> run_multi(const std::vector<const QuantMatrix*>& mats,
                                          const std::vector<float>& x, int64_t cols, int64_t n_tokens) {
  DeviceArray<float> dx(x);
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw;
  std::vector<std::unique_ptr<DeviceArray<float>>> dy;
  std::vector<cuda::MatmulArgs> args;
  for (const QuantMatrix* m : mats) {
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(m->bytes));
    dy.push_back(std::make_unique<DeviceArray<float>>(size_t(n_tokens * m->rows)));
    dy.back()->poison();
    cuda::MatmulArgs a;
    a.w = dw.back()->get(), a.w_type = m->type, a.n_rows = m->rows, a.n_cols = m->cols,
    a.row_bytes = m->row_bytes;
    a.x = dx.get(), a.x_stride = cols, a.n_tokens = n_tokens, a.y = dy.back()->get(), a.y_stride = m->rows;
    args.push_back(a);
  }
  const Status st = cuda::matvec_multi(args.data(), int(args.size()), nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::vector<float>> out;
  for (auto& d : dy) {
    out.push_back(d->download());
    int64_t unwritten = 0;
    for (float v : out.back()) unwritten += is_poison(v);
    EXPECT_EQ(unwritten, 0) << "outputs not written";
  }
  return out;
}

// The tensor-core kernel (through matvec_multi) at decode shapes: several
// chunks (and rounds: 4096 columns), short rows (768), a partial last chunk
// (Q8_0, 2080), misaligned rows, one and two N tiles; against the double
// reference with matvec's bound.
TEST(MatvecTcGpu, DecodeShapesMatchDoubleReference) {
  MOESERVE_REQUIRE_GPU();
  struct Shape {
    DType type;
    int64_t rows, cols;
    size_t pad;
  };
  const Shape shapes[] = {{DType::Q4_K, 300, 2048, 0}, {DType::Q6_K, 133, 4096, 2},
                          {DType::Q6_K, 70, 768, 0},   {DType::Q5_K, 40, 1024, 0},
                          {DType::Q8_0, 50, 2080, 2},  {DType::Q4_0, 45, 4096, 0}};
  uint32_t seed = 500;
  for (const Shape& s : shapes) {
    const QuantMatrix m = make_matrix(s.type, s.rows, s.cols, seed++, s.pad);
    for (int64_t n_tokens : {1, 2, 8, 9, 16}) {
      const std::vector<float> x = random_floats(size_t(n_tokens * s.cols), seed++);
      const std::vector<std::vector<float>> got = run_multi({&m}, x, s.cols, n_tokens);
      const std::vector<float> want = reference(m, x, s.cols, n_tokens);
      const double err = relative_error(got[0].data(), want.data(), want.size());
      EXPECT_LT(err, kMatvecTol) << dtype_name(s.type) << " " << s.cols << " -> " << s.rows << " tokens "
                                 << n_tokens;
      if (n_tokens == 16) {
        std::printf("  %-5s %5ld -> %-4ld: relative error %.2e\n", std::string(dtype_name(s.type)).c_str(),
                    long(s.cols), long(s.rows), err);
      }
    }
  }
}

// Enough rows that 16 tokens take CTAs of several row tiles (and 1 token
// one tile a CTA): every token's row is still the one it gets alone.
TEST(MatvecTcGpu, TokenResultsDoNotDependOnTheTileShape) {
  MOESERVE_REQUIRE_GPU();
  for (DType type : {DType::Q4_K, DType::Q6_K}) {
    const int64_t rows = 9000, cols = 512;
    const QuantMatrix m = make_matrix(type, rows, cols, 31);
    const std::vector<float> x = random_floats(size_t(16 * cols), 32);
    const std::vector<float> batch = run_multi({&m}, x, cols, 16)[0];
    for (int64_t n : {1, 4, 9}) {
      for (int64_t t0 : {int64_t(0), 16 - n}) {
        const std::vector<float> part(x.begin() + t0 * cols, x.begin() + (t0 + n) * cols);
        const std::vector<float> got = run_multi({&m}, part, cols, n)[0];
        EXPECT_EQ(std::memcmp(got.data(), batch.data() + t0 * rows, size_t(n * rows) * sizeof(float)), 0)
            << dtype_name(type) << ": tokens " << t0 << ".." << t0 + n - 1;
      }
    }
  }
}

// q, k and v in one call (mixed types, a float one included): each product
// is what it is alone (bit for bit: one kernel per type, rows independent),
// the float one exactly matvec's, all within matvec's bound of the double
// reference.
TEST(MatvecTcGpu, MultiMatchesSeparateProductsAndTheReference) {
  MOESERVE_REQUIRE_GPU();
  const int64_t cols = 512;
  const DType types[] = {DType::Q4_K, DType::Q4_K, DType::Q6_K, DType::F32, DType::Q6_K};
  const int64_t rows[] = {160, 33, 48, 20, 7};
  std::vector<QuantMatrix> mats;
  for (int i = 0; i < 5; ++i)
    mats.push_back(make_matrix(types[i], rows[i], cols, uint32_t(40 + i), row_pad(types[i])));
  std::vector<const QuantMatrix*> all;
  for (const QuantMatrix& m : mats) all.push_back(&m);
  for (int64_t n_tokens : {1, 5, 16}) {
    const std::vector<float> x = random_floats(size_t(n_tokens * cols), uint32_t(50 + n_tokens));
    const std::vector<std::vector<float>> got = run_multi(all, x, cols, n_tokens);
    for (size_t i = 0; i < mats.size(); ++i) {
      const std::vector<float> alone = run_multi({&mats[i]}, x, cols, n_tokens)[0];
      EXPECT_EQ(std::memcmp(got[i].data(), alone.data(), alone.size() * sizeof(float)), 0)
          << "product " << i << " (" << dtype_name(types[i]) << "), tokens " << n_tokens;
      const std::vector<float> want = reference(mats[i], x, cols, n_tokens);
      EXPECT_LT(relative_error(got[i].data(), want.data(), want.size()), kMatvecTol)
          << "product " << i << " (" << dtype_name(types[i]) << "), tokens " << n_tokens;
      if (types[i] == DType::F32) {
        const ProductRun one = run_product(Path::kMatvec, mats[i], x, cols, n_tokens, 0);
        ASSERT_TRUE(one.status.is_ok());
        EXPECT_EQ(std::memcmp(got[i].data(), one.y.data(), got[i].size() * sizeof(float)), 0)
            << "float: matvec";
      }
    }
  }
  cuda::MatmulArgs bad[2];
  bad[0].w_type = bad[1].w_type = DType::Q4_K;
  bad[0].n_tokens = 1, bad[1].n_tokens = 2;
  EXPECT_EQ(cuda::matvec_multi(bad, 2, nullptr).code(), StatusCode::kInvalidArgument) << "different inputs";
}

}  // namespace
}  // namespace moeserve
