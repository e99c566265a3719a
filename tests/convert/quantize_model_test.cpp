#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "convert/quantize_model.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "tensor/quantize.h"

namespace moeserve::convert {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kHidden = 256, kLayers = 8, kExperts = 4, kExpertFf = 256, kVocab = 64;

struct SourceTensor {
  std::string name;
  DType type;
  std::vector<int64_t> ne;
};

std::vector<SourceTensor> source_tensors() {
  std::vector<SourceTensor> out = {{"token_embd.weight", DType::F32, {kHidden, kVocab}},
                                   {"output_norm.weight", DType::F32, {kHidden}},
                                   {"output.weight", DType::F16, {kHidden, kVocab}}};
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    out.push_back({p + "attn_norm.weight", DType::F32, {kHidden}});
    out.push_back({p + "attn_q.weight", DType::Q8_0, {kHidden, 64}});  // a quantized source
    out.push_back({p + "attn_v.weight", DType::BF16, {kHidden, 32}});
    out.push_back({p + "ffn_gate_inp.weight", DType::F32, {kHidden, kExperts}});
    out.push_back({p + "ffn_gate_exps.weight", DType::BF16, {kHidden, kExpertFf, kExperts}});
    out.push_back({p + "ffn_down_exps.weight", DType::F32, {kExpertFf, kHidden, kExperts}});
  }
  return out;
}

class QuantizeModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moeserve_quant_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    GgufWriter w;
    w.set_string("general.architecture", "qwen3moe");
    w.set_u32("qwen3moe.block_count", kLayers);
    w.set_u32("qwen3moe.expert_count", kExperts);
    w.set_string("custom.key", "kept");
    w.set_u32("general.file_type", 0);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (const SourceTensor& t : source_tensors()) {
      int64_t n = 1;
      for (int64_t d : t.ne) n *= d;
      std::vector<float> values(static_cast<size_t>(n));
      for (float& v : values) v = dist(rng);
      std::vector<uint8_t> bytes(dtype_row_bytes(t.type, t.ne[0]) * size_t(n / t.ne[0]));
      quantize_rows(t.type, values.data(), bytes.data(), n / t.ne[0], t.ne[0]);
      ASSERT_TRUE(w.add_tensor(t.name, t.type, t.ne, bytes).is_ok());
    }
    ASSERT_TRUE(w.write(input()).is_ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string input() const { return (dir_ / "in.gguf").string(); }
  std::string output() const { return (dir_ / "out.gguf").string(); }

  Result<QuantizeSummary> run(FileType type, int threads = 2) {
    return quantize_model({input(), output(), type, threads, ProgressOptions::Mode::kOff});
  }
  fs::path dir_;
};

std::vector<float> values_of(const GgufTensorInfo& t) {
  std::vector<float> out(size_t(t.n_elements()));
  for (int64_t r = 0; r < t.n_rows(); ++r) {
    dequantize_row(t.type, t.data + size_t(r) * t.row_bytes(), out.data() + r * t.ne[0], t.ne[0]);
  }
  return out;
}

TEST_F(QuantizeModel, Q4KMAppliesTheMixAndStaysClose) {
  auto summary = run(FileType::kQ4_K_M);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  auto in = GgufFile::open(input());
  auto out = GgufFile::open(output());
  ASSERT_TRUE(in.is_ok() && out.is_ok());
  EXPECT_EQ(out->get_string("custom.key"), "kept");
  EXPECT_EQ(out->get_int("general.file_type"), 15);
  EXPECT_EQ(out->get_int("general.quantization_version"), 2);
  EXPECT_EQ(out->tensors().size(), in->tensors().size());
  EXPECT_EQ(summary->n_tensors, in->tensors().size());

  // use_more_bits(i, 8): layers 0 and 7, and (i - 1) % 3 == 2 -> 3, 6.
  auto want_type = [](const std::string& name) {
    if (name.find("norm") != std::string::npos || name.find("gate_inp") != std::string::npos) return DType::F32;
    if (name == "output.weight") return DType::Q6_K;
    if (name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos) {
      const int layer = name[4] - '0';
      return (layer == 0 || layer == 3 || layer == 6 || layer == 7) ? DType::Q6_K : DType::Q4_K;
    }
    return DType::Q4_K;
  };
  size_t q6 = 0;
  for (const GgufTensorInfo& t : out->tensors()) {
    EXPECT_EQ(t.type, want_type(t.name)) << t.name;
    q6 += t.type == DType::Q6_K;
    const GgufTensorInfo* src = in->find_tensor(t.name);
    ASSERT_NE(src, nullptr);
    EXPECT_EQ(t.shape_string(), src->shape_string());
    const std::vector<float> a = values_of(*src), b = values_of(t);
    double err = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      err += (a[i] - b[i]) * (a[i] - b[i]);
      norm += a[i] * a[i];
    }
    const double rel = std::sqrt(err / norm);
    EXPECT_LT(rel, t.type == DType::Q4_K ? 0.12 : 0.04) << t.name << " " << dtype_name(t.type);
    if (t.type == DType::F32) {
      EXPECT_EQ(a, b) << t.name;
    }
  }
  EXPECT_EQ(summary->by_type.at("q6_K").tensors, q6);
  EXPECT_LT(summary->bytes_after, summary->bytes_before);
  EXPECT_NE(format_quantize_summary(*summary).find("q4_K"), std::string::npos);
}

TEST_F(QuantizeModel, F32IsExactAndThreadCountDoesNotMatter) {
  ASSERT_TRUE(run(FileType::kF32).is_ok());
  auto in = GgufFile::open(input());
  auto out = GgufFile::open(output());
  ASSERT_TRUE(in.is_ok() && out.is_ok());
  for (const GgufTensorInfo& t : out->tensors()) {
    EXPECT_EQ(t.type, DType::F32);
    EXPECT_EQ(values_of(t), values_of(*in->find_tensor(t.name))) << t.name;
  }
  EXPECT_FALSE(out->has("general.quantization_version"));

  // Same bytes with 1 and 2 threads.
  ASSERT_TRUE(run(FileType::kQ6_K, 1).is_ok());
  auto one = GgufFile::open(output());
  ASSERT_TRUE(one.is_ok());
  std::vector<uint8_t> first(one->bytes().begin(), one->bytes().end());
  ASSERT_TRUE(run(FileType::kQ6_K, 2).is_ok());
  auto two = GgufFile::open(output());
  ASSERT_TRUE(two.is_ok());
  EXPECT_TRUE(std::equal(first.begin(), first.end(), two->bytes().begin(), two->bytes().end()));
}

TEST_F(QuantizeModel, Q80AndQ40AndMissingInput) {
  ASSERT_TRUE(run(FileType::kQ8_0).is_ok());
  auto out = GgufFile::open(output());
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out->find_tensor("blk.1.attn_q.weight")->type, DType::Q8_0);
  EXPECT_EQ(out->find_tensor("output.weight")->type, DType::Q8_0);
  EXPECT_EQ(out->get_int("general.file_type"), 7);

  ASSERT_TRUE(run(FileType::kQ4_0).is_ok());
  out = GgufFile::open(output());
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out->find_tensor("blk.1.ffn_gate_exps.weight")->type, DType::Q4_0);
  EXPECT_EQ(out->find_tensor("output.weight")->type, DType::Q6_K);

  auto missing = quantize_model({(dir_ / "nope.gguf").string(), output(), FileType::kQ8_0, 1, ProgressOptions::Mode::kOff});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("nope.gguf"), std::string::npos);
}

// With an imatrix: the expert tensors it has entries for are quantized
// with each expert's importance (lower importance-weighted error than
// without), the others plain and counted; a wrong shape is an error.
TEST_F(QuantizeModel, ImatrixWeightsTheExpertsAndCountsTheMissing) {
  Imatrix im;
  std::mt19937 rng(3);
  std::lognormal_distribution<float> skew(0.0f, 2.0f);
  for (int l = 0; l < kLayers; ++l) {
    ImatrixEntry e{.n_cols = kHidden, .n_mat = kExperts, .in_sum2 = {}, .counts = {}};
    for (int64_t i = 0; i < kHidden * kExperts; ++i) e.in_sum2.push_back(skew(rng));
    e.counts.assign(size_t(kExperts), 1.0f);
    e.counts[1] = 0.0f;  // expert 1 never routed to: quantized plain
    im.entries["blk." + std::to_string(l) + ".ffn_gate_exps.weight"] = e;
  }
  QuantizeOptions o{input(), output(), FileType::kQ4_K_M, 2, ProgressOptions::Mode::kOff};
  o.imatrix = &im;
  o.imatrix_name = "test.imatrix";
  auto summary = quantize_model(o);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  EXPECT_EQ(summary->imatrix_used, size_t(kLayers));
  // attn_q, attn_v, ffn_down_exps of each layer and output.weight are of a
  // weighted type without an entry (token_embd is never counted).
  EXPECT_EQ(summary->imatrix_missing, size_t(3 * kLayers + 1));
  const std::string weighted_path = (dir_ / "weighted.gguf").string();
  fs::rename(output(), weighted_path);
  ASSERT_TRUE(run(FileType::kQ4_K_M).is_ok());

  auto in = GgufFile::open(input());
  auto plain = GgufFile::open(output());
  auto weighted = GgufFile::open(weighted_path);
  ASSERT_TRUE(in.is_ok() && plain.is_ok() && weighted.is_ok());
  const std::string name = "blk.2.ffn_gate_exps.weight";
  const std::vector<float> x = values_of(*in->find_tensor(name));
  auto error = [&](const GgufFile& f, int64_t expert) {
    const std::vector<float> y = values_of(*f.find_tensor(name));
    const ImatrixEntry& e = im.entries.at(name);
    double err = 0.0;
    for (int64_t r = expert * kExpertFf; r < (expert + 1) * kExpertFf; ++r) {
      for (int64_t j = 0; j < kHidden; ++j) {
        const double d = double(x[size_t(r * kHidden + j)]) - y[size_t(r * kHidden + j)];
        err += e.in_sum2[size_t(expert * kHidden + j)] * d * d;
      }
    }
    return err;
  };
  EXPECT_LT(error(*weighted, 0), 0.8 * error(*plain, 0));
  EXPECT_EQ(error(*weighted, 1), error(*plain, 1));  // no data: the plain quantizer

  im.entries["blk.0.attn_q.weight"] = {
      .n_cols = 128, .n_mat = 1, .in_sum2 = std::vector<float>(128, 1.0f), .counts = {1.0f}};
  auto mismatch = quantize_model(o);
  ASSERT_FALSE(mismatch.is_ok());
  EXPECT_NE(mismatch.status().message().find("test.imatrix"), std::string::npos)
      << mismatch.status().to_string();
  EXPECT_NE(mismatch.status().message().find("blk.0.attn_q.weight"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::convert
