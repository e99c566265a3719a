// The weight decoders of the CUDA matrix kernels (qdec::Traits,
// kernels/cuda/quant_decode.cuh) run on the host, against the CPU reference
// dequantize_row, for every weight type the GPU reads: each run of each
// block, from blocks at every offset the type's row alignment allows (MXFP4:
// every byte). They are host and device code, so this needs no GPU: a wrong
// decoder shows here by type and run before any kernel runs. The codebook
// i-quants (no quantizer) are checked on random blocks with finite scales,
// their device codebooks against the reference tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/kq_iquant_codes.cuh"
#include "kernels/cuda/matmul_detail.h"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels_gpu/cuda/gpu_test_util.h"
#include "tensor/iquant_grids.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

using testing::random_floats;

// Block size, row alignment and the unit bookkeeping the kernels rely on
// (matvec.cu: a chunk's units split between two lanes, each run of a block
// in exactly one unit).
template <DType T>
void check_layout() {
  using Q = cuda::qdec::Traits<T>;
  const std::string name(dtype_name(T));
  if (dtype_traits(T).quantized) {
    EXPECT_EQ(Q::kBlockElems, dtype_block_elems(T)) << name;
    EXPECT_EQ(size_t(Q::kBlockBytes), dtype_traits(T).block_bytes) << name;
  } else {
    EXPECT_EQ(size_t(Q::kBlockBytes), dtype_row_bytes(T, Q::kBlockElems)) << name;
  }
  EXPECT_EQ(size_t(Q::kRowAlign), cuda::detail::weight_row_align(T)) << name << ": kRowAlign";
  EXPECT_EQ(Q::kBlockBytes % Q::kRowAlign, 0) << name << ": blocks keep the row alignment";
  const int runs = Q::kBlockElems / cuda::qdec::kRunLen;
  EXPECT_EQ(Q::kUnitsPerBlock * Q::kUnitRuns, runs) << name;
  EXPECT_TRUE(Q::kUnitsPerBlock == 1 || Q::kUnitsPerBlock % 2 == 0) << name;
  EXPECT_EQ(Q::kMvChunkBlocks * Q::kUnitsPerBlock % 2, 0) << name << ": a chunk's units split in two";
  std::vector<int> seen(size_t(runs), 0);
  for (int u = 0; u < Q::kUnitsPerBlock; ++u) {
    for (int k = 0; k < Q::kUnitRuns; ++k) {
      const int r = Q::unit_run(u, k);
      ASSERT_TRUE(r >= 0 && r < runs) << name << ": unit " << u << " run " << k << " -> " << r;
      ++seen[size_t(r)];
    }
  }
  for (int r = 0; r < runs; ++r) EXPECT_EQ(seen[size_t(r)], 1) << name << ": run " << r << " in units";
}

// Every run decodes to dequantize_row's values: kScaled types as a * v
// bit for bit (the reference's own product), the others (v the element:
// fma(q, scale, min) against the reference's two roundings) within one
// rounding of the block's largest term.
template <DType T>
void check_values(uint32_t seed) {
  using Q = cuda::qdec::Traits<T>;
  const std::string name(dtype_name(T));
  const int64_t n = 6 * 256;  // whole blocks of every type
  std::vector<float> src = random_floats(size_t(n), seed);
  // Blocks of very different magnitudes, and an offset the minimums of
  // Q4_1 / Q5_1 / Q2_K must carry.
  for (int64_t i = 0; i < n; ++i) {
    src[size_t(i)] = src[size_t(i)] * float(1 + (i / 32) % 5) * ((i / 256) % 2 ? 100.0f : 0.01f) +
                     ((i / 512) == 1 ? 3.0f : 0.0f);
  }
  const size_t bytes = dtype_row_bytes(T, n);
  std::vector<uint8_t> row(bytes);
  testing::weight_row(T, src.data(), row.data(), n, seed);
  std::vector<float> want(static_cast<size_t>(n));
  dequantize_row(T, row.data(), want.data(), n);

  std::vector<uint8_t> buf(bytes + 48);
  uint8_t* base = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) % 16) % 16;
  const int64_t n_blocks = n / Q::kBlockElems, runs = Q::kBlockElems / cuda::qdec::kRunLen;
  for (int off = 0; off < 16; off += Q::kRowAlign) {
    std::memset(buf.data(), 0xAB, buf.size());
    std::memcpy(base + off, row.data(), bytes);
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* w = want.data() + b * Q::kBlockElems;
      double max_abs = 0.0;
      for (int i = 0; i < Q::kBlockElems; ++i) max_abs = std::max(max_abs, std::fabs(double(w[i])));
      for (int r = 0; r < runs; ++r) {
        float v[cuda::qdec::kRunLen];
        const float a = Q::decode(base + off + b * Q::kBlockBytes, r, v);
        for (int i = 0; i < cuda::qdec::kRunLen; ++i) {
          const float expect = w[cuda::qdec::kRunLen * r + i];
          const int64_t col = b * Q::kBlockElems + cuda::qdec::kRunLen * r + i;
          if constexpr (requires { Q::element(base, 0); }) {
            // The element decoder of dequantize.cu and embed.cu.
            ASSERT_EQ(Q::element(base + off + b * Q::kBlockBytes, cuda::qdec::kRunLen * r + i), expect)
                << name << " element, offset " << off << " column " << col;
          }
          if constexpr (Q::kScaled) {
            ASSERT_EQ(a * v[i], expect) << name << " offset " << off << " column " << col << " (run " << r
                                        << "): a " << a << " v " << v[i];
          } else {
            ASSERT_EQ(a, 1.0f) << name;
            ASSERT_NEAR(v[i], expect, 2e-6 * max_abs)
                << name << " offset " << off << " column " << col << " (run " << r << ")";
          }
        }
      }
    }
  }
}

template <DType T>
void check_type(uint32_t seed) {
  check_layout<T>();
  check_values<T>(seed);
}

// The types check_type runs below.
constexpr DType kChecked[] = {DType::F32,   DType::F16,     DType::BF16,   DType::Q8_0,  DType::Q4_0,
                              DType::Q4_K,  DType::Q5_K,    DType::Q6_K,   DType::Q4_1,  DType::Q5_0,
                              DType::Q5_1,  DType::IQ4_NL,  DType::IQ4_XS, DType::MXFP4, DType::Q2_K,
                              DType::Q3_K,  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                              DType::IQ3_S, DType::IQ1_S,   DType::IQ1_M};

TEST(QuantDecodeHost, RunsOfEveryGpuTypeMatchTheDequantizer) {
  check_type<DType::F32>(1);
  check_type<DType::F16>(2);
  check_type<DType::BF16>(3);
  check_type<DType::Q8_0>(4);
  check_type<DType::Q4_0>(5);
  check_type<DType::Q4_K>(6);
  check_type<DType::Q5_K>(7);
  check_type<DType::Q6_K>(8);
  check_type<DType::Q4_1>(9);
  check_type<DType::Q5_0>(10);
  check_type<DType::Q5_1>(11);
  check_type<DType::IQ4_NL>(12);
  check_type<DType::IQ4_XS>(13);
  check_type<DType::MXFP4>(14);
  check_type<DType::Q2_K>(15);
  check_type<DType::Q3_K>(16);
  check_type<DType::IQ2_XXS>(17);
  check_type<DType::IQ2_XS>(18);
  check_type<DType::IQ2_S>(19);
  check_type<DType::IQ3_XXS>(20);
  check_type<DType::IQ3_S>(21);
  check_type<DType::IQ1_S>(22);
  check_type<DType::IQ1_M>(23);
}

// The codebook i-quants as integers (kq_iquant_codes.cuh, gemm_kq.cu's
// integer kernel): dfac * iscale * code is every element of
// dequantize_row's, bit for bit (each product is exact: an f16 d times a
// power of two, a 5-bit odd scale and a 7-bit code), and the codes fit the
// s8 MMA operand.
template <DType T>
void check_integer_split(uint32_t seed) {
  const std::string name(dtype_name(T));
  const int64_t n = 6 * 256;
  const std::vector<float> src = random_floats(size_t(n), seed);
  std::vector<uint8_t> row(dtype_row_bytes(T, n));
  testing::weight_row(T, src.data(), row.data(), n, seed);
  std::vector<float> want(static_cast<size_t>(n));
  dequantize_row(T, row.data(), want.data(), n);
  const size_t block_bytes = dtype_traits(T).block_bytes;
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* blk = row.data() + size_t(b) * block_bytes;
    const float dfac = cuda::qdec::IqInt<T>::dfac(blk);
    for (int c = 0; c < 256; ++c) {
      const uint32_t codes = cuda::qdec::iq_codes4<T>(blk, c >> 3, (c >> 2) & 1);
      const int code = int8_t(uint8_t(codes >> (8 * (c & 3))));
      const int scale = cuda::qdec::IqInt<T>::iscale(blk, c >> 4);
      ASSERT_TRUE(scale % 2 == 1 && scale > 0 && scale < 32) << name << " scale " << scale;
      ASSERT_LE(std::abs(code), 64) << name;
      ASSERT_EQ(dfac * float(scale) * float(code), want[size_t(b * 256 + c)])
          << name << " block " << b << " column " << c << ": dfac " << dfac << " scale " << scale << " code "
          << code;
    }
  }
}

TEST(QuantDecodeHost, CodebookIQuantsAsIntegersMatchTheDequantizer) {
  check_integer_split<DType::IQ2_XXS>(31);
  check_integer_split<DType::IQ2_XS>(32);
  check_integer_split<DType::IQ2_S>(33);
  check_integer_split<DType::IQ3_XXS>(34);
  check_integer_split<DType::IQ3_S>(35);
  check_integer_split<DType::IQ1_S>(36);
  check_integer_split<DType::IQ1_M>(37);
}

// The device copies of the codebooks (iquant_grids_device.cuh; plain host
// arrays in this host-compiled test) are the reference tables, entry for
// entry, and the computed sign bytes are kIqSigns.
template <typename T, size_t N>
void expect_same_table(const T (&device)[N], const T (&reference)[N], const char* name) {
  for (size_t i = 0; i < N; ++i) ASSERT_EQ(device[i], reference[i]) << name << " entry " << i;
}

TEST(QuantDecodeHost, DeviceCodebooksEqualTheReference) {
  namespace g = cuda::qdec::grids;
  expect_same_table(g::kIq2xxs<>, kIq2xxsGrid, "iq2_xxs");
  expect_same_table(g::kIq2xs<>, kIq2xsGrid, "iq2_xs");
  expect_same_table(g::kIq2s<>, kIq2sGrid, "iq2_s");
  expect_same_table(g::kIq3xxs<>, kIq3xxsGrid, "iq3_xxs");
  expect_same_table(g::kIq3s<>, kIq3sGrid, "iq3_s");
  expect_same_table(g::kIq1s<>, kIq1sGrid, "iq1_s");
  for (uint32_t s = 0; s < 128; ++s) EXPECT_EQ(cuda::qdec::iq_signs(s), kIqSigns[s]) << "signs " << s;
}

// A type added to kGpuWeightDTypes needs its decoder checked above.
TEST(QuantDecodeHost, CoversEveryGpuWeightType) {
  for (DType t : kGpuWeightDTypes) {
    EXPECT_NE(std::find(std::begin(kChecked), std::end(kChecked), t), std::end(kChecked))
        << dtype_name(t) << ": no host check of its decoder";
  }
}

// MXFP4's block scale on the device side equals the host's for every
// exponent (the subnormal 2^-128 and 2^-127 at e = 0, 1 included).
TEST(QuantDecodeHost, Mxfp4ScaleMatchesTheHost) {
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(cuda::qdec::mxfp4_block_scale(uint32_t(e)), mxfp4_scale(uint8_t(e))) << "e " << e;
  }
}

// The packed tables give every value, one at a time and four at a time.
TEST(QuantDecodeHost, TableLookupsGiveEveryValue) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(cuda::qdec::table_value(c, cuda::qdec::iq4nl_table()), kIq4nlValues[c]) << "iq4_nl code " << c;
    EXPECT_EQ(cuda::qdec::table_value(c, cuda::qdec::mxfp4_table()), kMxfp4Values[c]) << "mxfp4 code " << c;
  }
  for (uint32_t k = 0; k < 65536; k += 7) {
    const int codes[4] = {int(k & 15), int((k >> 4) & 15), int((k >> 8) & 15), int((k >> 12) & 15)};
    const uint32_t word =
        uint32_t(codes[0]) | uint32_t(codes[1]) << 8 | uint32_t(codes[2]) << 16 | uint32_t(codes[3]) << 24;
    const uint32_t got = cuda::qdec::table_lookup4(word, cuda::qdec::iq4nl_table());
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(int8_t(got >> (8 * j)), kIq4nlValues[codes[j]]) << "codes word " << word << " byte " << j;
    }
  }
}

}  // namespace
}  // namespace moeserve
