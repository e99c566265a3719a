// runtime::Model with packed weights (the default where the CPU has packed
// kernels) against the same file used in place: which tensors get packed,
// and that logits agree to float rounding and greedy tokens are identical.
#include "backend/cpu/weight_packing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "convert/make_model.h"
#include "convert/model_presets.h"
#include "kernels/cpu/packed_layout.h"
#include "runtime/kv_cache.h"
#include "models/qwen3.h"
#include "runtime/model.h"

namespace moeserve::runtime {
namespace {

bool cpu_can_pack() { return cpu::cpu_kernels().packed_dot[dtype_slot(DType::Q4_K)] != nullptr; }

// The tiny preset in Q4_K_M: every row length is a multiple of 256, so the
// attention, expert and output matrices are real Q4_K / Q6_K.
std::string make_tiny(convert::ModelArch arch) {
  auto shape = convert::model_preset(arch, "tiny");
  EXPECT_TRUE(shape.is_ok());
  convert::MakeModelOptions o;
  o.shape = shape.value();
  o.file_type = convert::FileType::kQ4_K_M;
  o.seed = 7;
  o.n_threads = 2;
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("moeserve_pack_" + std::string(convert::arch_name(arch)) + "_" + std::to_string(getpid()) + ".gguf"))
          .string();
  EXPECT_TRUE(convert::make_model(o, path).is_ok());
  return path;
}

// Greedy continuation of `prompt` and the logits of every step.
struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

GreedyRun greedy(Model& m, std::vector<int32_t> prompt, int n_new) {
  const auto& hp = m.info();
  const int64_t ctx = 128, kvd = hp.kv_dim;
  std::vector<std::vector<uint16_t>> k(size_t(hp.n_layer)), v(size_t(hp.n_layer));
  std::vector<models::KvLayerView> views;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    k[size_t(l)].resize(size_t(ctx * kvd));
    v[size_t(l)].resize(size_t(ctx * kvd));
    views.push_back({k[size_t(l)].data(), v[size_t(l)].data()});
  }
  GreedyRun r;
  auto workspace = m.new_workspace(1);
  EXPECT_TRUE(workspace.is_ok()) << workspace.status().to_string();
  if (!workspace.is_ok()) return r;
  models::Workspace* ws = workspace->get();
  std::vector<float> logits(size_t(hp.n_vocab));
  std::vector<int32_t> step = prompt;
  int64_t pos = 0;
  for (int i = 0; i < n_new; ++i) {
    const int64_t last = int64_t(step.size()) - 1;
    models::ForwardBatch b;
    b.tokens = step;
    b.pos0 = pos;
    b.kv = {views, ctx};
    b.logit_rows = std::span<const int64_t>(&last, 1);
    b.logits = logits.data();
    EXPECT_TRUE(m.net().forward(b, *ws).is_ok());
    pos += int64_t(step.size());
    const auto best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(best);
    r.logits.push_back(logits);
    step = {best};
  }
  return r;
}

class WeightPacking : public ::testing::TestWithParam<convert::ModelArch> {};

TEST_P(WeightPacking, PackedModelMatchesTheFileUsedInPlace) {
  if (!cpu_can_pack()) GTEST_SKIP() << "this CPU has no packed kernels (AVX-512 VNNI)";
  const std::string path = make_tiny(GetParam());
  auto packed = Model::load(path, {.n_threads = 2});
  auto plain = Model::load(path, {.n_threads = 2, .pack_weights = false});
  ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  std::filesystem::remove(path);
  Model& a = *packed.value();
  Model& b = *plain.value();

  // Every Q4_K / Q6_K matrix is packed (all have rows in multiples of 16);
  // the embedding never is.
  EXPECT_EQ(b.packed().tensors, 0);
  EXPECT_GT(a.packed().tensors, 0);
  const models::Qwen3Weights& w = dynamic_cast<models::Qwen3Model&>(a.net()).weights();
  EXPECT_FALSE(w.token_embd.packed);
  EXPECT_TRUE(w.output.packed);
  int expected = 1;  // output
  for (const models::Qwen3LayerWeights& l : w.layers) {
    for (const models::WeightView* v :
         {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate, &l.ffn_up, &l.ffn_down,
          &l.ffn_gate_exps, &l.ffn_up_exps, &l.ffn_down_exps}) {
      if (!v->present()) continue;
      EXPECT_EQ(v->packed, cpu::has_packed_layout(v->type)) << dtype_name(v->type);
      expected += v->packed ? 1 : 0;
    }
  }
  EXPECT_EQ(a.packed().tensors, expected);

  const std::vector<int32_t> prompt = {1, 17, 230, 5, 99, 42, 8, 300, 12, 77, 64, 3};
  const GreedyRun ra = greedy(a, prompt, 12), rb = greedy(b, prompt, 12);
  EXPECT_EQ(ra.tokens, rb.tokens);
  double worst = 0.0, scale = 0.0;
  for (size_t s = 0; s < ra.logits.size(); ++s) {
    for (size_t i = 0; i < ra.logits[s].size(); ++i) {
      worst = std::max(worst, double(std::abs(ra.logits[s][i] - rb.logits[s][i])));
      scale = std::max(scale, double(std::abs(rb.logits[s][i])));
    }
  }
  // Each matrix product agrees to ~1e-6 relative (kernels tests), but the
  // activations are re-quantized to 8 bits before every product, so a
  // rounding difference can move an activation by one quantization step,
  // and that compounds over the layers. Measured: 0.0075 / 0.009 of the
  // largest logit (qwen3moe / qwen3); bound 0.02.
  EXPECT_LT(worst, 0.02 * scale) << "max |logit difference|, largest |logit| " << scale;
  std::printf(
      "[ packing ] %s: %d tensors, %.1f MiB packed; max |logit diff| vs in place %.3g (largest |logit| "
      "%.3g)\n",
      std::string(convert::arch_name(GetParam())).c_str(), a.packed().tensors,
      double(a.packed().bytes) / (1 << 20), worst, scale);
}

INSTANTIATE_TEST_SUITE_P(Arches, WeightPacking,
                         ::testing::Values(convert::ModelArch::kQwen3Moe, convert::ModelArch::kQwen3),
                         [](const auto& info) { return std::string(convert::arch_name(info.param)); });

TEST(WeightPacking, LeavesUnpackableViewsAlone) {
  // Rows not a multiple of 16 or a type without a packed layout: unchanged.
  std::vector<uint8_t> bytes(dtype_row_bytes(DType::Q4_K, 256) * 24);
  models::Qwen3Weights w;
  w.output = {bytes.data(), DType::Q4_K, 256, 24, dtype_row_bytes(DType::Q4_K, 256), 0, false};
  const backend::WeightRef refs[] = {{&w.output, 1, backend::WeightUse::kMatrix, false}};
  auto r = backend::pack_weights(refs, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().tensors, 0);
  EXPECT_EQ(w.output.data, bytes.data());
  EXPECT_FALSE(w.output.packed);
}

TEST(WeightPacking, TiedOutputGetsItsOwnPackedCopy) {
  if (!cpu_can_pack()) GTEST_SKIP() << "this CPU has no packed kernels (AVX-512 VNNI)";
  const size_t rb = dtype_row_bytes(DType::Q4_K, 256);
  std::vector<uint8_t> bytes(rb * 32);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7 + 3);
  const std::vector<uint8_t> original = bytes;
  models::Qwen3Weights w;
  w.token_embd = {bytes.data(), DType::Q4_K, 256, 32, rb, 0, false};
  w.output = w.token_embd;
  w.tied_output = true;
  const backend::WeightRef refs[] = {{&w.token_embd, 1, backend::WeightUse::kLookup, true},
                                     {&w.output, 1, backend::WeightUse::kMatrix, true}};
  auto r = backend::pack_weights(refs, {.release_source = true});  // must not release the embedding's rows
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().tensors, 1);
  EXPECT_TRUE(w.output.packed);
  EXPECT_NE(w.output.data, bytes.data());
  EXPECT_EQ(w.token_embd.data, bytes.data());
  EXPECT_FALSE(w.token_embd.packed);
  EXPECT_EQ(bytes, original);
  std::vector<uint8_t> back(bytes.size());
  cpu::unpack_rows(DType::Q4_K, w.output.data, back.data(), 32, 256);
  EXPECT_EQ(back, original);
}

}  // namespace
}  // namespace moeserve::runtime
