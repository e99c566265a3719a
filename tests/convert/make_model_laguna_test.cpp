// `moeserve make-model --arch laguna` and `quantize` on its files: the
// presets' shapes and parameter counts, the laguna.* keys of a tiny file, its
// tensors and types (Q4_K_M mix), and the quantizer keeping the keys.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>

#include "convert/make_model.h"
#include "convert/quantize_model.h"
#include "format/gguf.h"
#include "format/model_keys.h"
#include "tensor/quantize.h"

namespace moeserve::convert {
namespace {

namespace fs = std::filesystem;

std::string key(std::string_view suffix) { return keys::arch_key("laguna", suffix); }

class MakeModelLaguna : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("make_model_laguna_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string make(FileType type, const std::string& name) {
    MakeModelOptions o;
    o.shape = model_preset(ModelArch::kLaguna, "tiny").value();
    o.file_type = type;
    o.seed = 5;
    o.n_threads = 2;
    o.quick_quant = true;
    const std::string path = (dir_ / name).string();
    Result<MakeModelSummary> r = make_model(o, path);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (r.is_ok()) {
      EXPECT_EQ(r->n_params, o.shape.n_params());
    }
    return path;
  }
  fs::path dir_;
};

TEST_F(MakeModelLaguna, TinyFileHasTheLagunaKeysAndTensors) {
  Result<GgufFile> f = GgufFile::open(make(FileType::kF32, "t.gguf"));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->architecture(), "laguna");
  EXPECT_EQ(f->get_int(key(keys::kBlockCount)), 4);
  EXPECT_EQ(f->get_int(key(keys::kEmbeddingLength)), 256);
  EXPECT_EQ(f->get_int(key(keys::kContextLength)), 2048);
  EXPECT_EQ(f->get_int(key(keys::kFeedForwardLength)), 512);
  EXPECT_EQ(f->get_int_array(key(keys::kHeadCount)), (std::vector<int64_t>{4, 6, 6, 6}));
  EXPECT_EQ(f->get_int(key(keys::kHeadCountKv)), 2);
  EXPECT_EQ(f->get_int(key(keys::kKeyLength)), 64);
  EXPECT_EQ(f->get_int(key(keys::kValueLength)), 64);
  EXPECT_EQ(f->get_int(key(keys::kVocabSize)), 2048);
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kRmsEps)).value_or(0)), 1e-6f);
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kRopeFreqBase)).value_or(0)), 500000.0f);
  EXPECT_EQ(f->get_int(key(keys::kRopeDimensionCount)), 32);
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kRopeFreqBaseSwa)).value_or(0)), 10000.0f);
  EXPECT_EQ(f->get_int(key(keys::kRopeDimensionCountSwa)), 64);
  EXPECT_EQ(f->get_string(key(keys::kRopeScalingType)), "yarn");
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kRopeScalingFactor)).value_or(0)), 4.0f);
  EXPECT_EQ(f->get_int(key(keys::kRopeScalingOrigCtx)), 64);
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kRopeScalingYarnBetaFast)).value_or(0)), 64.0f);
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kRopeScalingYarnBetaSlow)).value_or(0)), 1.0f);
  EXPECT_FALSE(f->has(key(keys::kRopeScalingYarnAttnFactor)));
  EXPECT_EQ(f->get_int(key(keys::kSlidingWindow)), 16);
  EXPECT_EQ(f->get_int(key(keys::kSlidingWindowPattern)), 4);
  EXPECT_EQ(f->get_int(key(keys::kLeadingDenseBlockCount)), 1);
  EXPECT_EQ(f->get_int(key(keys::kExpertCount)), 8);
  EXPECT_EQ(f->get_int(key(keys::kExpertUsedCount)), 2);
  EXPECT_EQ(f->get_int(key(keys::kExpertFeedForwardLength)), 128);
  EXPECT_EQ(f->get_int(key(keys::kExpertSharedFeedForwardLength)), 128);
  EXPECT_FLOAT_EQ(float(f->get_float(key(keys::kExpertWeightsScale)).value_or(0)), 2.5f);
  EXPECT_EQ(f->get_bool(key(keys::kExpertWeightsNorm)), true);
  EXPECT_EQ(f->get_int(key(keys::kExpertGatingFunc)), keys::kExpertGatingSigmoid);
  EXPECT_TRUE(f->has(keys::kChatTemplate));

  const ModelShape s = model_preset(ModelArch::kLaguna, "tiny").value();
  ASSERT_EQ(f->tensors().size(), plan_tensors(s, FileType::kF32).size());
  const std::pair<const char*, const char*> shapes[] = {{"token_embd.weight", "[256, 2048]"},
                                                        {"output.weight", "[256, 2048]"},
                                                        {"blk.0.attn_q.weight", "[256, 256]"},
                                                        {"blk.1.attn_q.weight", "[256, 384]"},
                                                        {"blk.1.attn_k.weight", "[256, 128]"},
                                                        {"blk.1.attn_output.weight", "[384, 256]"},
                                                        {"blk.0.attn_gate.weight", "[256, 4]"},
                                                        {"blk.3.attn_gate.weight", "[256, 6]"},
                                                        {"blk.2.attn_q_norm.weight", "[64]"},
                                                        {"blk.0.ffn_gate.weight", "[256, 512]"},
                                                        {"blk.0.ffn_down.weight", "[512, 256]"},
                                                        {"blk.1.ffn_gate_inp.weight", "[256, 8]"},
                                                        {"blk.1.exp_probs_b.bias", "[8]"},
                                                        {"blk.2.ffn_gate_exps.weight", "[256, 128, 8]"},
                                                        {"blk.2.ffn_down_exps.weight", "[128, 256, 8]"},
                                                        {"blk.3.ffn_up_shexp.weight", "[256, 128]"},
                                                        {"blk.3.ffn_down_shexp.weight", "[128, 256]"},
                                                        {"blk.3.ffn_norm.weight", "[256]"}};
  for (auto [name, shape] : shapes) {
    const GgufTensorInfo* t = f->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape_string(), shape) << name;
  }
  for (const char* absent : {"blk.0.ffn_gate_inp.weight", "blk.0.exp_probs_b.bias", "blk.1.ffn_gate.weight",
                             "blk.1.ffn_gate_inp_shexp.weight", "blk.1.post_attention_norm.weight"}) {
    EXPECT_EQ(f->find_tensor(absent), nullptr) << absent;
  }
  // The selection bias: small values that differ between experts and layers.
  const GgufTensorInfo* bias = f->find_tensor("blk.1.exp_probs_b.bias");
  std::vector<float> b(8);
  dequantize_row(bias->type, bias->data, b.data(), 8);
  const float mean = std::accumulate(b.begin(), b.end(), 0.0f) / 8.0f;
  float var = 0;
  for (float v : b) var += (v - mean) * (v - mean) / 8.0f;
  EXPECT_GT(var, 0.001f);
  EXPECT_LT(var, 0.1f);
}

// Q4_K_M: the output gate like attn_q, the selection bias and router F32, the
// shared expert's down like the experts' (use_more_bits), attn_v Q8_0 with 8
// experts; `quantize` back to Q8_0 keeps every laguna.* key.
TEST_F(MakeModelLaguna, QuantMixAndQuantizeKeepTheKeys) {
  const std::string path = make(FileType::kQ4_K_M, "q.gguf");
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto type_of = [&](const GgufFile& g, const std::string& name) { return g.find_tensor(name)->type; };
  for (int il = 0; il < 4; ++il) {
    EXPECT_EQ(type_of(*f, keys::blk(il, keys::kAttnGate)), type_of(*f, keys::blk(il, keys::kAttnQ))) << il;
    EXPECT_EQ(type_of(*f, keys::blk(il, keys::kAttnV)), DType::Q8_0) << il;
  }
  EXPECT_EQ(type_of(*f, "blk.0.attn_q.weight"), DType::Q4_K);
  EXPECT_EQ(type_of(*f, "blk.1.exp_probs_b.bias"), DType::F32);
  EXPECT_EQ(type_of(*f, "blk.1.ffn_gate_inp.weight"), DType::F32);
  EXPECT_EQ(type_of(*f, "blk.3.ffn_down_shexp.weight"), type_of(*f, "blk.3.ffn_down_exps.weight"));
  EXPECT_EQ(type_of(*f, "output.weight"), DType::Q6_K);

  QuantizeOptions q;
  q.input_path = path;
  q.output_path = (dir_ / "q8.gguf").string();
  q.file_type = FileType::kQ8_0;
  q.threads = 2;
  q.progress = ProgressOptions::Mode::kOff;
  ASSERT_TRUE(quantize_model(q).is_ok());
  Result<GgufFile> g = GgufFile::open(q.output_path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->get_int_array(key(keys::kHeadCount)), (std::vector<int64_t>{4, 6, 6, 6}));
  for (const GgufKV& kv : f->kvs()) {
    if (kv.key.starts_with("laguna.")) {
      EXPECT_TRUE(g->has(kv.key)) << kv.key;
    }
  }
  EXPECT_EQ(type_of(*g, "blk.1.attn_gate.weight"), DType::Q8_0);
  EXPECT_EQ(type_of(*g, "blk.1.exp_probs_b.bias"), DType::F32);
  EXPECT_EQ(g->get_uint(keys::kFileType), uint64_t(FileType::kQ8_0));
}

TEST(LagunaPresets, ShapesAndParamCounts) {
  EXPECT_EQ(arch_from_name("laguna"), ModelArch::kLaguna);
  EXPECT_EQ(preset_names(ModelArch::kLaguna), (std::vector<std::string>{"tiny", "small", "laguna-xs"}));
  for (const std::string& preset : preset_names(ModelArch::kLaguna)) {
    const ModelShape s = model_preset(ModelArch::kLaguna, preset).value();
    int64_t sum = 0;
    uint64_t bytes = 0;
    for (const SyntheticTensor& t : plan_tensors(s, FileType::kQ4_K_M)) {
      sum += t.n_elements();
      bytes += t.nbytes();
    }
    EXPECT_EQ(sum, s.n_params()) << preset;
    EXPECT_EQ(s.model_name, "moeserve-synthetic-laguna-" + preset);
    std::printf("laguna    %-9s %7.3f B params, %6.2f GiB in q4_k_m\n", preset.c_str(), double(sum) / 1e9,
                double(bytes) / double(1ull << 30));
  }
  const ModelShape xs = model_preset(ModelArch::kLaguna, "laguna-xs").value();
  EXPECT_EQ(xs.n_layer, 40);
  EXPECT_EQ(xs.n_vocab, 100352);
  for (int64_t il = 0; il < 8; ++il) EXPECT_EQ(xs.n_head_layer(il), il % 4 == 0 ? 48 : 64) << il;
  EXPECT_FALSE(xs.is_sliding_layer(0));
  EXPECT_TRUE(xs.is_sliding_layer(39));
  EXPECT_GT(xs.n_params(), int64_t(30e9));  // ~33 B in all (Laguna-XS.2: ~30 B total, 3 B active)
  EXPECT_LT(xs.n_params(), int64_t(36e9));

  Result<ModelShape> wrong = model_preset(ModelArch::kLaguna, "27b");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("laguna has: tiny, small, laguna-xs"), std::string::npos)
      << wrong.status().message();
  EXPECT_FALSE(model_preset(ModelArch::kQwen3Moe, "laguna-xs").is_ok());
}

TEST(LagunaPresets, BadShapesAreErrors) {
  fs::path dir = fs::temp_directory_path() / ("make_model_laguna_bad_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::pair<const char*, std::function<void(ModelShape&)>> edits[] = {
      {"sliding-window head count", [](ModelShape& s) { s.n_head_swa = 5; }},
      {"bad FFN widths", [](ModelShape& s) { s.n_ff_shexp = 0; }},
      {"sliding-window rope dimension", [](ModelShape& s) { s.n_rot_swa = 66; }},
      {"bad window", [](ModelShape& s) { s.swa_period = 0; }},
  };
  for (const auto& [message, edit] : edits) {
    MakeModelOptions o;
    o.shape = model_preset(ModelArch::kLaguna, "tiny").value();
    edit(o.shape);
    Result<MakeModelSummary> r = make_model(o, (dir / "bad.gguf").string());
    ASSERT_FALSE(r.is_ok()) << message;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::convert
