// Importance matrix files (format/imatrix.h): the GGUF format written and
// read back, llama.cpp's legacy .dat read, and broken or hostile files of
// both kinds refused with an error (never a crash; run under ASan/UBSan too).
#include "format/imatrix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "format/gguf_writer.h"

namespace moeserve {
namespace {

Imatrix sample_imatrix() {
  Imatrix m;
  m.datasets = {"calib.txt"};
  m.chunk_count = 3;
  m.chunk_size = 512;
  m.entries["blk.0.attn_q.weight"] = {.n_cols = 4, .n_mat = 1, .in_sum2 = {1, 2, 3, 4}, .counts = {10}};
  // Two experts, the second never routed to.
  m.entries["blk.0.ffn_up_exps.weight"] = {
      .n_cols = 2, .n_mat = 2, .in_sum2 = {6, 8, 0, 0}, .counts = {2, 0}};
  return m;
}

// ---- legacy .dat bytes, written as llama.cpp's legacy writer lays them out ----

struct LegacyBytes {
  std::vector<uint8_t> b;
  LegacyBytes& i32(int32_t v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + 4);
    return *this;
  }
  LegacyBytes& str(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  LegacyBytes& f32s(const std::vector<float>& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    b.insert(b.end(), p, p + v.size() * 4);
    return *this;
  }
  LegacyBytes& entry(const std::string& name, int32_t ncall, const std::vector<float>& values) {
    return i32(int32_t(name.size())).str(name).i32(ncall).i32(int32_t(values.size())).f32s(values);
  }
};

std::vector<uint8_t> legacy_sample() {
  LegacyBytes l;
  l.i32(2).entry("blk.0.attn_q.weight", 4, {4, 8, 12, 16}).entry("blk.0.ffn_up_exps.weight", 2, {2, 4, 6, 8});
  l.i32(4).i32(9).str("calib.txt");
  return l.b;
}

TEST(ImatrixGguf, RoundTrip) {
  const Imatrix m = sample_imatrix();
  auto bytes = imatrix_to_gguf(m);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto file = GgufFile::parse_bytes(*bytes, "m.imatrix.gguf");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  // llama.cpp's names, types and shapes.
  EXPECT_EQ(file->get_string("general.type"), "imatrix");
  EXPECT_EQ(file->get_uint("imatrix.chunk_count"), 3u);
  EXPECT_EQ(file->get_uint("imatrix.chunk_size"), 512u);
  const GgufTensorInfo* sums = file->find_tensor("blk.0.ffn_up_exps.weight.in_sum2");
  const GgufTensorInfo* counts = file->find_tensor("blk.0.ffn_up_exps.weight.counts");
  ASSERT_NE(sums, nullptr);
  ASSERT_NE(counts, nullptr);
  EXPECT_EQ(sums->type, DType::F32);
  EXPECT_EQ(sums->shape_string(), "[2, 2]");
  EXPECT_EQ(counts->shape_string(), "[1, 2]");

  auto back = parse_imatrix(*bytes, "m.imatrix.gguf");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->datasets, m.datasets);
  EXPECT_EQ(back->chunk_count, 3u);
  EXPECT_EQ(back->chunk_size, 512u);
  ASSERT_EQ(back->entries.size(), 2u);
  for (const auto& [name, e] : m.entries) {
    const ImatrixEntry& r = back->entries.at(name);
    EXPECT_EQ(r.n_cols, e.n_cols) << name;
    EXPECT_EQ(r.n_mat, e.n_mat) << name;
    EXPECT_EQ(r.in_sum2, e.in_sum2) << name;
    EXPECT_EQ(r.counts, e.counts) << name;
  }
}

TEST(ImatrixGguf, WritesAFile) {
  const std::string path = ::testing::TempDir() + "imatrix_test.gguf";
  ASSERT_TRUE(write_imatrix(sample_imatrix(), path).is_ok());
  auto back = read_imatrix(path);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->entries.size(), 2u);
  std::remove(path.c_str());
}

TEST(ImatrixImportance, MeanPerExpertAndMissingExperts) {
  const Imatrix m = sample_imatrix();
  auto imp = tensor_importance(m, "blk.0.ffn_up_exps.weight", 2, 2);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  EXPECT_EQ(imp->values, (std::vector<float>{3, 4, 0, 0}));
  EXPECT_EQ(imp->present, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(tensor_importance(m, "blk.9.attn_q.weight", 4, 1).status().code(), StatusCode::kNotFound);
  auto wrong = tensor_importance(m, "blk.0.attn_q.weight", 8, 1);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("another model"), std::string::npos) << wrong.status().to_string();
}

TEST(ImatrixLegacy, Parses) {
  const std::vector<uint8_t> bytes = legacy_sample();
  auto m = parse_imatrix(bytes, "old.dat");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->chunk_count, 4u);
  EXPECT_EQ(m->datasets, (std::vector<std::string>{"calib.txt"}));
  ASSERT_EQ(m->entries.size(), 2u);
  // Stored values are mean(x^2) * ncall: the importance is value / ncall.
  auto q = tensor_importance(*m, "blk.0.attn_q.weight", 4, 1);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->values, (std::vector<float>{1, 2, 3, 4}));
  // One flat row for all experts (2 experts of 2 columns), one count.
  auto up = tensor_importance(*m, "blk.0.ffn_up_exps.weight", 2, 2);
  ASSERT_TRUE(up.is_ok()) << up.status().to_string();
  EXPECT_EQ(up->values, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(up->present, (std::vector<uint8_t>{1, 1}));
}

TEST(ImatrixLegacy, WithoutTrailer) {
  LegacyBytes l;
  l.i32(1).entry("blk.0.attn_k.weight", 1, {1, 1});
  auto m = parse_imatrix_legacy(l.b, "old.dat");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->chunk_count, 0u);
  EXPECT_TRUE(m->datasets.empty());
}

// Every prefix of a valid file is an error (or, for the legacy format, a
// valid file that ends before its optional trailer), never a crash.
TEST(ImatrixHostile, TruncatedFiles) {
  auto gguf = imatrix_to_gguf(sample_imatrix());
  ASSERT_TRUE(gguf.is_ok());
  auto whole = GgufFile::parse_bytes(*gguf, "whole.gguf");
  ASSERT_TRUE(whole.is_ok());
  size_t data_end = 0;  // the padding after the last tensor's data is optional
  for (const GgufTensorInfo& t : whole->tensors()) data_end = std::max(data_end, size_t(t.offset + t.nbytes));
  for (size_t n = 0; n < gguf->size(); ++n) {
    auto m = parse_imatrix(std::span<const uint8_t>(gguf->data(), n), "cut.gguf");
    EXPECT_EQ(m.is_ok(), n >= data_end) << "prefix " << n << ": " << m.status().to_string();
  }
  const std::vector<uint8_t> legacy = legacy_sample();
  const size_t entries_end = legacy.size() - 4 - 4 - 9;  // before the trailer
  for (size_t n = 0; n < legacy.size(); ++n) {
    auto m = parse_imatrix_legacy(std::span<const uint8_t>(legacy.data(), n), "cut.dat");
    const bool complete = n == entries_end || n == entries_end + 4;
    EXPECT_EQ(m.is_ok(), complete) << "prefix " << n << ": " << m.status().to_string();
  }
}

TEST(ImatrixHostile, LegacyFieldsOutOfRange) {
  const std::string name = "blk.0.attn_q.weight";
  auto fails = [](const LegacyBytes& l, const char* what) {
    auto m = parse_imatrix_legacy(l.b, "bad.dat");
    EXPECT_FALSE(m.is_ok()) << what;
    if (!m.is_ok()) {
      EXPECT_EQ(m.status().code(), StatusCode::kInvalidFormat) << what;
      EXPECT_NE(m.status().message().find("bad.dat"), std::string::npos) << m.status().to_string();
    }
  };
  fails(LegacyBytes().i32(0), "no entries");
  fails(LegacyBytes().i32(-5), "negative entry count");
  fails(LegacyBytes().i32(INT32_MAX).entry(name, 1, {1}), "huge entry count");
  fails(LegacyBytes().i32(1).i32(INT32_MAX).str(name), "huge name length");
  fails(LegacyBytes().i32(1).i32(-1), "negative name length");
  fails(LegacyBytes().i32(1).i32(int32_t(name.size())).str(name).i32(1).i32(INT32_MAX).f32s({1}),
        "huge nval");
  fails(LegacyBytes().i32(1).i32(int32_t(name.size())).str(name).i32(1).i32(-3), "negative nval");
  fails(LegacyBytes().i32(1).entry(name, 0, {1}), "zero ncall");
  fails(LegacyBytes().i32(1).entry(name, 1, {NAN}), "NaN value");
  fails(LegacyBytes().i32(1).entry(name, 1, {-1.0f}), "negative value");
  fails(LegacyBytes().i32(2).entry(name, 1, {1}).entry(name, 1, {1}), "duplicate entry");
  fails(LegacyBytes().i32(1).entry(name, 1, {1}).i32(1).i32(1000).str("x"), "dataset name past the end");
  fails(LegacyBytes().i32(1).entry(name, 1, {1}).i32(1).i32(1).str("xy"), "trailing bytes");
}

// GGUF files that parse as GGUF but are not sound imatrices.
TEST(ImatrixHostile, GgufContents) {
  auto fails = [](const GgufWriter& w, const char* what, const char* needle) {
    auto bytes = w.write_to_buffer();
    ASSERT_TRUE(bytes.is_ok()) << what;
    auto m = parse_imatrix(*bytes, "bad.gguf");
    ASSERT_FALSE(m.is_ok()) << what;
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << what << ": " << m.status().to_string();
  };
  const std::vector<float> four = {1, 2, 3, 4}, one = {1}, two = {1, 1};
  auto f32 = [](const std::vector<float>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4);
  };
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_tensor("a.weight.in_sum2", DType::F32, {4, 1}, f32(four)).is_ok());
    fails(w, "sums without counts", "no .counts");
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_tensor("a.weight.in_sum2", DType::F32, {4, 1}, f32(four)).is_ok());
    ASSERT_TRUE(w.add_tensor("a.weight.counts", DType::F32, {1, 2}, f32(two)).is_ok());
    fails(w, "counts of the wrong shape", "must be [1, 1]");
  }
  {
    GgufWriter w;
    std::vector<uint16_t> h(4, 0x3c00);
    ASSERT_TRUE(w.add_tensor("a.weight.in_sum2", DType::F16, {4, 1},
                             std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(h.data()), 8))
                    .is_ok());
    ASSERT_TRUE(w.add_tensor("a.weight.counts", DType::F32, {1, 1}, f32(one)).is_ok());
    fails(w, "f16 sums", "f32");
  }
  {
    GgufWriter w;
    const std::vector<float> bad = {1, NAN, 3, 4};
    ASSERT_TRUE(w.add_tensor("a.weight.in_sum2", DType::F32, {4, 1}, f32(bad)).is_ok());
    ASSERT_TRUE(w.add_tensor("a.weight.counts", DType::F32, {1, 1}, f32(one)).is_ok());
    fails(w, "NaN sum", "value 1");
  }
  {
    GgufWriter w;
    w.set_string("general.type", "model");
    ASSERT_TRUE(w.add_tensor("a.weight.in_sum2", DType::F32, {4, 1}, f32(four)).is_ok());
    ASSERT_TRUE(w.add_tensor("a.weight.counts", DType::F32, {1, 1}, f32(one)).is_ok());
    fails(w, "a model's general.type", "not an imatrix");
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.add_tensor("token_embd.weight", DType::F32, {4, 1}, f32(four)).is_ok());
    fails(w, "a model file", "not an imatrix tensor");
  }
  {
    GgufWriter w;
    w.set_string("general.type", "imatrix");
    fails(w, "no tensors", "no importance data");
  }
}

// Garbled bytes (a fixed pseudo-random walk over flips of a valid file):
// whatever comes back, nothing may crash or read out of bounds.
TEST(ImatrixHostile, FlippedBytes) {
  auto gguf = imatrix_to_gguf(sample_imatrix());
  ASSERT_TRUE(gguf.is_ok());
  for (std::vector<uint8_t> good : {*gguf, legacy_sample()}) {
    uint32_t state = 12345;
    for (int round = 0; round < 2000; ++round) {
      std::vector<uint8_t> b = good;
      for (int k = 0; k < 3; ++k) {
        state = state * 1664525u + 1013904223u;
        b[(state >> 8) % b.size()] ^= uint8_t(state >> 24 | 1);
      }
      auto m = parse_imatrix(b, "flipped");
      if (m.is_ok()) {
        for (const auto& [name, e] : m->entries) {
          EXPECT_EQ(e.in_sum2.size(), size_t(e.n_cols * e.n_mat)) << name;
          EXPECT_EQ(e.counts.size(), size_t(e.n_mat)) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
