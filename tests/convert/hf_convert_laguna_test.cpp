// `moeserve convert` on Laguna checkpoints (LagunaForCausalLM -> laguna): the
// tiny checkpoint of laguna_hf_fixture.h is converted and the GGUF checked for
// llama.cpp's laguna.* keys (per-layer head counts, window and its period,
// the two RoPEs with YaRN, sigmoid routing, the leading dense layer), the
// tokenizer's eot, and every tensor's name, shape, type and values (the
// fused experts split gate first). Config variants are read directly.
#include <gtest/gtest.h>

#include "convert/hf_config.h"
#include "convert/hf_convert.h"
#include "format/model_keys.h"
#include "laguna_hf_fixture.h"

namespace moeserve::convert::laguna_test {
namespace {

class HfConvertLaguna : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("moeserve_laguna_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `model`, converts it, and opens the output.
  Result<GgufFile> convert(const TinyLaguna& model, FileType type) {
    fs::remove_all(dir_ / "hf");
    model.write(dir_ / "hf");
    ConvertOptions options;
    options.hf_dir = (dir_ / "hf").string();
    options.output_path = (dir_ / "out.gguf").string();
    options.file_type = type;
    options.threads = 2;
    options.progress = ProgressOptions::Mode::kOff;
    MOESERVE_ASSIGN_OR_RETURN(ConvertSummary summary, convert_hf_model(options));
    EXPECT_EQ(summary.arch, "laguna");
    return GgufFile::open(options.output_path);
  }

  fs::path dir_;
};

std::string key(std::string_view suffix) { return keys::arch_key("laguna", suffix); }

std::vector<float> concat_experts(const TinyLaguna& m, int64_t il, const char* part) {
  std::vector<float> out;
  for (int64_t e = 0; e < kExperts; ++e) {
    const auto& v = m.w(fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", il, e, part));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Expected f32 contents of every GGUF tensor: the HF weights, renamed.
std::map<std::string, std::vector<float>> expected_tensors(const TinyLaguna& m, bool tied) {
  std::map<std::string, std::vector<float>> out = {{"token_embd.weight", m.w("model.embed_tokens.weight")},
                                                   {"output_norm.weight", m.w("model.norm.weight")}};
  if (!tied) out["output.weight"] = m.w("lm_head.weight");
  const std::pair<const char*, const char*> direct[] = {
      {"input_layernorm.weight", "attn_norm"},    {"post_attention_layernorm.weight", "ffn_norm"},
      {"self_attn.q_proj.weight", "attn_q"},      {"self_attn.k_proj.weight", "attn_k"},
      {"self_attn.v_proj.weight", "attn_v"},      {"self_attn.o_proj.weight", "attn_output"},
      {"self_attn.q_norm.weight", "attn_q_norm"}, {"self_attn.k_norm.weight", "attn_k_norm"},
      {"self_attn.g_proj.weight", "attn_gate"}};
  const std::pair<const char*, const char*> moe[] = {
      {"mlp.gate.weight", "ffn_gate_inp"},
      {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp"},
      {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp"},
      {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp"}};
  for (int64_t il = 0; il < kLayers; ++il) {
    const std::string p = fmt::format("model.layers.{}.", il);
    for (auto [hf, gguf] : direct) out[keys::blk(int(il), gguf)] = m.w(p + hf);
    if (il == 0) {
      for (const char* part : {"gate", "up", "down"}) {
        out[keys::blk(0, std::string("ffn_") + part)] = m.w(fmt::format("{}mlp.{}_proj.weight", p, part));
      }
      continue;
    }
    for (auto [hf, gguf] : moe) out[keys::blk(int(il), gguf)] = m.w(p + hf);
    out[keys::blk(int(il), "exp_probs_b", "bias")] = m.w(p + "mlp.gate.e_score_correction_bias");
    for (const char* part : {"gate", "up", "down"}) {
      out[keys::blk(int(il), fmt::format("ffn_{}_exps", part))] =
          concat_experts(m, il, (std::string(part) + "_proj").c_str());
    }
  }
  return out;
}

void expect_laguna_keys(const GgufFile& f) {
  EXPECT_EQ(f.architecture(), "laguna");
  EXPECT_EQ(f.get_int(key(keys::kBlockCount)), kLayers);
  EXPECT_EQ(f.get_int(key(keys::kEmbeddingLength)), kHidden);
  EXPECT_EQ(f.get_int(key(keys::kContextLength)), 256);
  EXPECT_EQ(f.get_int(key(keys::kFeedForwardLength)), kDenseFf);
  EXPECT_EQ(f.get_int_array(key(keys::kHeadCount)), (std::vector<int64_t>{2, 4, 2, 4}));
  EXPECT_EQ(f.find(key(keys::kHeadCount))->elem_type(), GgufType::kU32);
  EXPECT_EQ(f.get_int(key(keys::kHeadCountKv)), kKvHeads);
  EXPECT_EQ(f.get_int(key(keys::kKeyLength)), kHeadDim);
  EXPECT_EQ(f.get_int(key(keys::kValueLength)), kHeadDim);
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kRmsEps)).value_or(0)), 1e-6f);
  EXPECT_EQ(f.get_int(key(keys::kVocabSize)), kVocab);
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kRopeFreqBase)).value_or(0)), 500000.0f);
  EXPECT_EQ(f.get_int(key(keys::kRopeDimensionCount)), kHeadDim / 2);
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kRopeFreqBaseSwa)).value_or(0)), 10000.0f);
  EXPECT_EQ(f.get_int(key(keys::kRopeDimensionCountSwa)), kHeadDim);
  EXPECT_EQ(f.get_string(key(keys::kRopeScalingType)), "yarn");
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kRopeScalingFactor)).value_or(0)), 4.0f);
  EXPECT_EQ(f.get_int(key(keys::kRopeScalingOrigCtx)), 64);
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kRopeScalingYarnBetaFast)).value_or(0)), 32.0f);
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kRopeScalingYarnBetaSlow)).value_or(0)), 1.0f);
  EXPECT_FALSE(f.has(key(keys::kRopeScalingYarnAttnFactor)));  // no attention_factor in the config
  EXPECT_EQ(f.get_int(key(keys::kSlidingWindow)), kWindow);
  EXPECT_EQ(f.get_int(key(keys::kSlidingWindowPattern)), kPeriod);
  EXPECT_EQ(f.get_int(key(keys::kExpertCount)), kExperts);
  EXPECT_EQ(f.get_int(key(keys::kExpertUsedCount)), kTopK);
  EXPECT_EQ(f.get_int(key(keys::kExpertFeedForwardLength)), kExpertFf);
  EXPECT_EQ(f.get_int(key(keys::kExpertSharedFeedForwardLength)), kSharedFf);
  EXPECT_FLOAT_EQ(float(f.get_float(key(keys::kExpertWeightsScale)).value_or(0)), 2.5f);
  EXPECT_EQ(f.get_bool(key(keys::kExpertWeightsNorm)), true);
  EXPECT_EQ(f.get_int(key(keys::kExpertGatingFunc)), keys::kExpertGatingSigmoid);
  EXPECT_EQ(f.get_int(key(keys::kLeadingDenseBlockCount)), 1);
}

TEST_F(HfConvertLaguna, PerExpertF32RoundTripsExactly) {
  TinyLaguna model;
  Result<GgufFile> f = convert(model, FileType::kF32);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  expect_laguna_keys(*f);

  // Tokenizer: eos and bos from the list's first id, its extra entry is eot
  // and a control token (the HF tokenizer has </assistant> special = false).
  EXPECT_EQ(f->get_int(keys::kTokEos), kBos);
  EXPECT_EQ(f->get_int(keys::kTokBos), kBos);
  EXPECT_EQ(f->get_int(keys::kTokEot), kEot);
  EXPECT_EQ(f->get_int(keys::kTokPad), kPad);
  auto types = f->get_int_array(keys::kTokTypes);
  ASSERT_TRUE(types.has_value());
  EXPECT_EQ((*types)[size_t(kEot)], 3);
  EXPECT_EQ((*f->get_string_array(keys::kTokTokens))[size_t(kEot)], "</assistant>");

  const auto expected = expected_tensors(model, false);
  ASSERT_EQ(f->tensors().size(), expected.size());
  for (const auto& [name, values] : expected) {
    const GgufTensorInfo* t = f->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, DType::F32) << name;
    EXPECT_EQ(gguf_values(*t), values) << name;
  }
  auto shape = [&](const char* name) { return f->find_tensor(name)->shape_string(); };
  EXPECT_EQ(shape("blk.0.attn_q.weight"), "[32, 16]");
  EXPECT_EQ(shape("blk.1.attn_q.weight"), "[32, 32]");
  EXPECT_EQ(shape("blk.1.attn_output.weight"), "[32, 32]");
  EXPECT_EQ(shape("blk.0.attn_gate.weight"), "[32, 2]");
  EXPECT_EQ(shape("blk.1.attn_gate.weight"), "[32, 4]");
  EXPECT_EQ(shape("blk.0.ffn_gate.weight"), "[32, 24]");
  EXPECT_EQ(shape("blk.0.ffn_down.weight"), "[24, 32]");
  EXPECT_EQ(shape("blk.1.ffn_gate_inp.weight"), "[32, 4]");
  EXPECT_EQ(shape("blk.1.exp_probs_b.bias"), "[4]");
  EXPECT_EQ(shape("blk.2.ffn_gate_exps.weight"), "[32, 8, 4]");
  EXPECT_EQ(shape("blk.2.ffn_down_exps.weight"), "[8, 32, 4]");
  EXPECT_EQ(shape("blk.3.ffn_up_shexp.weight"), "[32, 12]");
  EXPECT_EQ(shape("blk.3.ffn_down_shexp.weight"), "[12, 32]");
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_inp.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_gate.weight"), nullptr);
}

// transformers v5's fused experts [E, 2I, H]: ffn_gate_exps is each expert's
// first I rows, ffn_up_exps the next I (bf16 -> bf16 is exact).
TEST_F(HfConvertLaguna, FusedBf16ExpertsSplitGateFirst) {
  TinyLaguna model({.experts = Experts::kFused, .dtype = DType::BF16});
  Result<GgufFile> f = convert(model, FileType::kBF16);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  expect_laguna_keys(*f);
  const auto expected = expected_tensors(model, false);
  ASSERT_EQ(f->tensors().size(), expected.size());
  for (const auto& [name, values] : expected) {
    const GgufTensorInfo* t = f->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const bool keep_f32 = t->n_dims == 1 || name.find("ffn_gate_inp") != std::string::npos;
    EXPECT_EQ(t->type, keep_f32 ? DType::F32 : DType::BF16) << name;
    EXPECT_EQ(gguf_values(*t), values) << name;
  }
  EXPECT_EQ(f->find_tensor("blk.1.exp_probs_b.bias")->type, DType::F32);
}

// Per-element gate ({H, n_head * head_dim}), tied embeddings (no output), the
// names transformers saves checkpoints with, and Q8_0: the gate gets attn_q's
// type, the selection bias and norms stay F32.
TEST_F(HfConvertLaguna, PerElementGateTiedSavedNamesQ8) {
  TinyLaguna model({.per_element_gate = true, .tied = true, .saved_names = true});
  Result<GgufFile> f = convert(model, FileType::kQ8_0);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.1.attn_gate.weight")->shape_string(), "[32, 32]");
  EXPECT_EQ(f->find_tensor("blk.0.attn_gate.weight")->shape_string(), "[32, 16]");
  for (int il = 0; il < kLayers; ++il) {
    EXPECT_EQ(f->find_tensor(keys::blk(il, keys::kAttnGate))->type,
              f->find_tensor(keys::blk(il, keys::kAttnQ))->type);
  }
  EXPECT_EQ(f->find_tensor("blk.1.attn_gate.weight")->type, DType::Q8_0);
  EXPECT_EQ(f->find_tensor("blk.1.exp_probs_b.bias")->type, DType::F32);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_gate_inp.weight")->type, DType::F32);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_norm.weight")->type, DType::F32);
  const std::vector<float> got = gguf_values(*f->find_tensor("blk.2.attn_gate.weight"));
  const std::vector<float>& want = model.w("model.layers.2.self_attn.g_proj.weight");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 0.02f) << i;
  EXPECT_EQ(gguf_values(*f->find_tensor("blk.3.exp_probs_b.bias")),
            model.w("model.layers.3.mlp.gate.e_score_correction_bias"));
  EXPECT_EQ(f->find_tensor("blk.3.ffn_down_shexp.weight")->shape_string(), "[12, 32]");
}

// Config variants, read without weights.
HfModelConfig parse(const json& config) {
  Result<HfModelConfig> c = parse_hf_config(config.dump(), "config.json");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? *c : HfModelConfig{};
}

TEST(HfLagunaConfig, TransformersDefaultsApply) {
  TinyLaguna model;
  json& c = model.config();
  for (const char* k : {"layer_types", "rope_parameters", "mlp_layer_types", "num_attention_heads_per_layer",
                        "gating", "moe_routed_scaling_factor"}) {
    c.erase(k);
  }
  const HfModelConfig h = parse(c);
  EXPECT_EQ(h.arch, "laguna");
  EXPECT_EQ(h.laguna.head_count, (std::vector<int64_t>(kLayers, kFullHeads)));
  EXPECT_EQ(h.laguna.sliding_window, 0);  // every layer full attention: no window keys
  EXPECT_EQ(h.laguna.rope_theta, 500000.0);
  EXPECT_EQ(h.laguna.n_rot, kHeadDim / 2);
  EXPECT_EQ(h.laguna.yarn_factor, 0.0);
  EXPECT_TRUE(h.laguna.has_swa_rope);
  EXPECT_EQ(h.laguna.rope_theta_swa, 10000.0);
  EXPECT_EQ(h.laguna.n_rot_swa, kHeadDim);
  EXPECT_EQ(h.laguna.leading_dense, 1);
  EXPECT_EQ(h.laguna.expert_weights_scale, 1.0);
  EXPECT_EQ(h.gate_per_element, std::vector<bool>(kLayers, false));
}

TEST(HfLagunaConfig, WindowPatternYarnAndGateVariants) {
  {
    TinyLaguna model;
    json& c = model.config();
    c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention", "sliding_attention"};
    c["rope_parameters"]["full_attention"]["attention_factor"] = 1.25;
    c["mlp_layer_types"] = {"dense", "dense", "sparse", "sparse"};
    const HfModelConfig h = parse(c);
    EXPECT_EQ(h.laguna.sliding_window_pattern, kLayers);  // only layer 0 is full
    EXPECT_EQ(h.laguna.sliding_window, kWindow);
    EXPECT_EQ(h.laguna.yarn_attn_factor, 1.25);
    EXPECT_EQ(h.laguna.leading_dense, 2);
  }
  {
    TinyLaguna model;
    json& c = model.config();
    c["layer_types"] = std::vector<std::string>(kLayers, "full_attention");
    c["rope_parameters"]["full_attention"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
    c["gating"] = "per-element";
    c["gating_types"] = {"per-head", "per-element", "per_head", "per_element"};
    const HfModelConfig h = parse(c);
    EXPECT_EQ(h.laguna.sliding_window, 0);
    EXPECT_EQ(h.laguna.sliding_window_pattern, 0);
    EXPECT_EQ(h.laguna.yarn_factor, 0.0);
    EXPECT_EQ(h.laguna.n_rot, kHeadDim);  // partial_rotary_factor defaults to 1
    EXPECT_EQ(h.gate_per_element, (std::vector<bool>{false, true, false, true}));
  }
  {
    TinyLaguna model;
    model.config()["eos_token_id"] = 2;  // a single eos: no eot
    model.config()["gating"] = "per-head";
    const HfModelConfig h = parse(model.config());
    EXPECT_TRUE(h.eos_token_ids.empty());
    EXPECT_EQ(h.gate_per_element, std::vector<bool>(kLayers, false));
  }
}

}  // namespace
}  // namespace moeserve::convert::laguna_test
