// moeserve imatrix's collection (runtime/imatrix.h) on the tiny MoE model:
// every token of every chunk reaches each layer's experts top_k times, and a
// dense weight's sums match the inputs computed directly from the file.
#include "runtime/imatrix.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensor/quantize.h"

namespace moeserve::runtime {
namespace {

constexpr int64_t kCtx = 64;
constexpr int64_t kChunks = 3;

std::unique_ptr<Model> load_tiny_moe() {
  // CPU with the weights in place: what the collector needs (imatrix.h).
  auto m = Model::load(fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR),
                       {.n_threads = 2, .pack_weights = false, .device = "cpu"});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> text_tokens(const Model& m, int64_t at_least) {
  std::string text;
  std::vector<int32_t> t;
  for (int i = 0; int64_t(t.size()) < at_least; ++i) {
    text += fmt::format("The {} quick foxes jump over {} lazy dogs, said line {}.\n", i * 3, i % 5, i);
    t = m.tokenizer().encode(text);
  }
  return t;
}

// The chunks as the collector runs them: BOS first when the vocabulary adds it.
std::vector<int32_t> evaluated_tokens(const Model& m, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> out(tokens.begin(), tokens.begin() + kChunks * kCtx);
  if (m.tokenizer().add_bos()) {
    for (int64_t c = 0; c < kChunks; ++c) out[size_t(c * kCtx)] = *m.tokenizer().bos_id();
  }
  return out;
}

class ImatrixCollect : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load_tiny_moe();
    ASSERT_NE(model_, nullptr);
    tokens_ = text_tokens(*model_, kChunks * kCtx + 10);
    auto m = collect_imatrix(*model_, tokens_,
                             {.n_ctx = kCtx, .n_batch = 32, .max_chunks = kChunks, .dataset = "t"});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    imatrix_ = std::move(m.value());
  }
  int64_t arch_int(std::string_view suffix) const {
    return model_->file().get_int(model_->file().arch_key(suffix)).value_or(-1);
  }
  std::unique_ptr<Model> model_;
  std::vector<int32_t> tokens_;
  Imatrix imatrix_;
};

TEST_F(ImatrixCollect, MetadataAndEntries) {
  EXPECT_EQ(imatrix_.chunk_count, uint32_t(kChunks));
  EXPECT_EQ(imatrix_.chunk_size, uint32_t(kCtx));
  EXPECT_EQ(imatrix_.datasets, std::vector<std::string>{"t"});
  // Every layer weight that multiplies activations, nothing else.
  const int64_t n_layer = arch_int("block_count");
  for (int64_t l = 0; l < n_layer; ++l) {
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                          "ffn_up_exps", "ffn_down_exps"}) {
      EXPECT_TRUE(imatrix_.entries.contains(fmt::format("blk.{}.{}.weight", l, w))) << l << " " << w;
    }
  }
  EXPECT_FALSE(imatrix_.entries.contains("output.weight"));
  EXPECT_FALSE(imatrix_.entries.contains("token_embd.weight"));
}

TEST_F(ImatrixCollect, ExpertCountsAddUpToTokensTimesTopK) {
  const int64_t n_layer = arch_int("block_count"), n_expert = arch_int("expert_count");
  const int64_t top_k = arch_int("expert_used_count");
  ASSERT_GT(top_k, 0);
  for (int64_t l = 0; l < n_layer; ++l) {
    for (const char* w : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const ImatrixEntry& e = imatrix_.entries.at(fmt::format("blk.{}.{}.weight", l, w));
      ASSERT_EQ(e.n_mat, n_expert);
      double total = 0.0;
      for (float c : e.counts) total += c;
      EXPECT_EQ(total, double(kChunks * kCtx * top_k)) << "layer " << l << " " << w;
      // Each expert's sums come only from its own rows: none without rows.
      for (int64_t x = 0; x < n_expert; ++x) {
        if (e.counts[size_t(x)] != 0.0f) continue;
        for (int64_t j = 0; j < e.n_cols; ++j) EXPECT_EQ(e.in_sum2[size_t(x * e.n_cols + j)], 0.0f);
      }
    }
    const ImatrixEntry& q = imatrix_.entries.at(fmt::format("blk.{}.attn_q.weight", l));
    EXPECT_EQ(q.counts, std::vector<float>{float(kChunks * kCtx)});
  }
}

// blk.0.attn_q's input is rmsnorm(embedding) * attn_norm, from the file.
TEST_F(ImatrixCollect, DenseSumsMatchADirectComputation) {
  const GgufFile& f = model_->file();
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  const GgufTensorInfo* norm = f.find_tensor("blk.0.attn_norm.weight");
  ASSERT_NE(embd, nullptr);
  ASSERT_NE(norm, nullptr);
  ASSERT_EQ(norm->type, DType::F32);
  const double eps = f.get_float(f.arch_key("attention.layer_norm_rms_epsilon")).value_or(1e-6);
  const int64_t H = embd->ne[0];
  std::vector<double> expect(size_t(H), 0.0);
  std::vector<float> row(static_cast<size_t>(H));
  const auto* w = reinterpret_cast<const float*>(norm->data);
  for (int32_t tok : evaluated_tokens(*model_, tokens_)) {
    dequantize_row(embd->type, embd->data + size_t(tok) * embd->row_bytes(), row.data(), H);
    double ss = 0.0;
    for (float v : row) ss += double(v) * v;
    const double scale = 1.0 / std::sqrt(ss / double(H) + eps);
    for (int64_t j = 0; j < H; ++j) {
      const double x = row[size_t(j)] * scale * w[j];
      expect[size_t(j)] += x * x;
    }
  }
  const ImatrixEntry& q = imatrix_.entries.at("blk.0.attn_q.weight");
  ASSERT_EQ(q.n_cols, H);
  for (int64_t j = 0; j < H; ++j) {
    EXPECT_NEAR(q.in_sum2[size_t(j)], expect[size_t(j)], 1e-3 * expect[size_t(j)] + 1e-6) << "column " << j;
  }
}

TEST(ImatrixCollectErrors, TextTooShort) {
  std::unique_ptr<Model> m = load_tiny_moe();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> few(10, 1);
  ImatrixOptions o;
  o.n_ctx = kCtx;
  EXPECT_EQ(collect_imatrix(*m, few, o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve::runtime
