// Dequantization bit for bit as llama.cpp's: tests/data/quant/<type>.bin
// hold blocks written by llama.cpp's own quantizer and the values its own
// dequantizer gives them (scripts/quant/make_llama_fixtures.sh, from the
// llama.cpp release node-llama-cpp bundles). Every weight type's reference
// dequantizer and every CPU kernel level's must give exactly those values;
// each level's dot product must agree with them within float rounding.
// Our quantizer's error on the same matrix is printed beside llama.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

struct Fixture {
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

// Empty on success, else what is wrong with the file.
std::string read_fixture(const std::string& path, Fixture& f) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open: " + path;
  uint32_t head[4];
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(head), sizeof head);
  in.read(reinterpret_cast<char*>(&n), sizeof n);
  if (!in || head[0] != 0x4651534du) return "not a fixture: " + path;
  const auto type = dtype_from_gguf_id(head[1]);
  if (!type) return "unknown type id in " + path;
  f.type = *type, f.rows = head[2], f.cols = head[3];
  if (n != dtype_row_bytes(f.type, f.cols) * size_t(f.rows)) return "wrong byte count in " + path;
  f.bytes.resize(n);
  f.values.resize(size_t(f.rows * f.cols));
  in.read(reinterpret_cast<char*>(f.bytes.data()), std::streamsize(n));
  in.read(reinterpret_cast<char*>(f.values.data()), std::streamsize(f.values.size() * sizeof(float)));
  if (!in) return "truncated: " + path;
  return {};
}

class LlamaFixture : public ::testing::TestWithParam<const char*> {
 protected:
  Fixture load() {
    Fixture f;
    std::string path = MOESERVE_TEST_DATA_DIR;
    path.append("/quant/").append(GetParam()).append(".bin");
    const std::string why = read_fixture(path, f);
    EXPECT_TRUE(why.empty()) << why;
    return f;
  }
};

TEST_P(LlamaFixture, DequantizesBitForBitAsLlamaCpp) {
  const Fixture f = load();
  ASSERT_FALSE(f.bytes.empty());
  const size_t row_bytes = dtype_row_bytes(f.type, f.cols);
  std::vector<float> got(static_cast<size_t>(f.cols));
  for (int64_t r = 0; r < f.rows; ++r) {
    dequantize_row(f.type, f.bytes.data() + size_t(r) * row_bytes, got.data(), f.cols);
    for (int64_t c = 0; c < f.cols; ++c) {
      ASSERT_EQ(got[size_t(c)], f.values[size_t(r * f.cols + c)]) << GetParam() << " row " << r << " col " << c;
    }
    // Every kernel level's dequantizer too.
    for (cpu::SimdLevel level : {cpu::SimdLevel::kReference, cpu::SimdLevel::kAvx2, cpu::SimdLevel::kAvx512}) {
      const cpu::CpuKernels* k = cpu::cpu_kernels_for(level);
      if (k == nullptr || k->dequantize_row[dtype_slot(f.type)] == nullptr) continue;
      std::vector<float> lv(static_cast<size_t>(f.cols));
      k->dequantize_row[dtype_slot(f.type)](f.bytes.data() + size_t(r) * row_bytes, lv.data(), f.cols);
      for (int64_t c = 0; c < f.cols; ++c) {
        ASSERT_EQ(lv[size_t(c)], f.values[size_t(r * f.cols + c)])
            << GetParam() << " " << cpu::simd_level_name(level) << " row " << r << " col " << c;
      }
    }
  }
}

// Each level's dot product of llama.cpp's blocks with quantized activations
// against the double-precision dot of llama.cpp's values with the same
// activations.
TEST_P(LlamaFixture, DotProductsOfLlamaCppBlocks) {
  const Fixture f = load();
  ASSERT_FALSE(f.bytes.empty());
  const DType xt = dtype_traits(f.type).vec_dot_type;
  std::vector<float> x(static_cast<size_t>(f.cols)), xd(static_cast<size_t>(f.cols));
  for (int64_t c = 0; c < f.cols; ++c) x[size_t(c)] = std::sin(0.91f * float(c)) + 0.3f;
  std::vector<uint8_t> xq(dtype_row_bytes(xt, f.cols));
  quantize_row(xt, x.data(), xq.data(), f.cols);
  dequantize_row(xt, xq.data(), xd.data(), f.cols);
  const size_t row_bytes = dtype_row_bytes(f.type, f.cols);
  for (int64_t r = 0; r < f.rows; ++r) {
    double want = 0, magnitude = 0;
    for (int64_t c = 0; c < f.cols; ++c) {
      const double p = double(f.values[size_t(r * f.cols + c)]) * xd[size_t(c)];
      want += p, magnitude += std::fabs(p);
    }
    for (cpu::SimdLevel level : {cpu::SimdLevel::kReference, cpu::SimdLevel::kAvx2, cpu::SimdLevel::kAvx512}) {
      const cpu::CpuKernels* k = cpu::cpu_kernels_for(level);
      if (k == nullptr) continue;
      const float got = k->vec_dot[dtype_slot(f.type)](f.cols, f.bytes.data() + size_t(r) * row_bytes, xq.data());
      EXPECT_NEAR(got, want, 1e-5 * magnitude + 1e-7) << GetParam() << " " << cpu::simd_level_name(level);
    }
  }
}

// Our quantizer against llama.cpp's on the same matrix (where we have one):
// relative RMS error, printed; ours may not be worse by more than 10%.
TEST_P(LlamaFixture, OurQuantizerIsNoWorseThanLlamaCpps) {
  const Fixture f = load();
  ASSERT_FALSE(f.bytes.empty());
  if (!dtype_has_quantizer(f.type)) GTEST_SKIP() << GetParam() << ": read only";
  // The fixture's source matrix (scripts/quant/llama_fixtures.c's value()).
  std::vector<float> src(f.values.size());
  for (int64_t r = 0; r < f.rows; ++r) {
    for (int64_t c = 0; c < f.cols; ++c) {
      const float base = std::sin(0.37f * float(c) + 1.3f * float(r)) * (0.5f + 0.25f * float(r));
      const float wobble = 0.2f * std::cos(0.011f * float(c * c) + float(r));
      float v = base + wobble;
      if ((c * 7 + r * 3) % 97 == 0) v *= 8.0f;
      src[size_t(r * f.cols + c)] = v * 0.05f;
    }
  }
  std::vector<uint8_t> q(f.bytes.size());
  quantize_rows(f.type, src.data(), q.data(), f.rows, f.cols);
  std::vector<float> ours(src.size());
  const size_t row_bytes = dtype_row_bytes(f.type, f.cols);
  for (int64_t r = 0; r < f.rows; ++r) {
    dequantize_row(f.type, q.data() + size_t(r) * row_bytes, ours.data() + r * f.cols, f.cols);
  }
  double e_ours = 0, e_llama = 0, sig = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    e_ours += (double(src[i]) - ours[i]) * (double(src[i]) - ours[i]);
    e_llama += (double(src[i]) - f.values[i]) * (double(src[i]) - f.values[i]);
    sig += double(src[i]) * src[i];
  }
  const double ours_pct = 100 * std::sqrt(e_ours / sig), llama_pct = 100 * std::sqrt(e_llama / sig);
  std::printf("%-8s relative RMS error: ours %.3f%%, llama.cpp %.3f%%\n", GetParam(), ours_pct, llama_pct);
  EXPECT_LE(ours_pct, 1.10 * llama_pct + 0.01) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaFixture,
                         ::testing::Values("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K",
                                           "q6_K", "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs", "iq2_s",
                                           "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace moeserve
