// End-to-end tests of `moeserve convert`: a tiny Hugging Face directory is
// written here (config.json, safetensors, tokenizer files), converted, and
// the GGUF read back and compared with the source weights.
#include "convert/hf_convert.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/half.h"
#include "format/gguf.h"
#include "format/model_keys.h"
#include "format/safetensors.h"
#include "hf_tokenizer_files.h"
#include "safetensors_values.h"
#include "tensor/quantize.h"
#include "tokenizer/byte_level.h"
#include "gguf_values.h"

namespace moeserve::convert {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kHidden = 32, kLayers = 2, kHeads = 2, kKvHeads = 1, kHeadDim = 16;
constexpr int64_t kExperts = 4, kExpertFf = 8, kDenseFf = 64, kVocab = 300;

enum class ExpertLayout { kPerExpert, kFused, kFusedTransposed };

struct Weights {
  std::vector<int64_t> shape;  // PyTorch order
  std::vector<float> values;
};

// The model's weights by HF per-expert name ("truth"), written in the chosen
// layout and dtype.
class TinyHfModel {
 public:
  TinyHfModel(bool moe, bool tied, DType dtype) : moe_(moe), dtype_(dtype) {
    config_ = {{"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
               {"hidden_size", kHidden},
               {"num_hidden_layers", kLayers},
               {"num_attention_heads", kHeads},
               {"num_key_value_heads", kKvHeads},
               {"head_dim", kHeadDim},
               {"intermediate_size", kDenseFf},
               {"vocab_size", kVocab},
               {"max_position_embeddings", 128},
               {"rope_theta", 1000000.0},
               {"rms_norm_eps", 1e-6},
               {"tie_word_embeddings", tied},
               {"attention_bias", false},
               {"use_sliding_window", false},
               {"sliding_window", nullptr},
               {"rope_scaling", nullptr}};
    if (moe) {
      config_.update({{"num_experts", kExperts},
                      {"num_experts_per_tok", 2},
                      {"moe_intermediate_size", kExpertFf},
                      {"norm_topk_prob", true},
                      {"decoder_sparse_step", 1},
                      {"mlp_only_layers", json::array()}});
    }
    add("model.embed_tokens.weight", {kVocab, kHidden});
    add("model.norm.weight", {kHidden});
    if (!tied) add("lm_head.weight", {kVocab, kHidden});
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {kHidden});
      add(p + "post_attention_layernorm.weight", {kHidden});
      add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
      add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
      add(p + "self_attn.q_norm.weight", {kHeadDim});
      add(p + "self_attn.k_norm.weight", {kHeadDim});
      if (!moe) {
        add(p + "mlp.gate_proj.weight", {kDenseFf, kHidden});
        add(p + "mlp.up_proj.weight", {kDenseFf, kHidden});
        add(p + "mlp.down_proj.weight", {kHidden, kDenseFf});
        continue;
      }
      add(p + "mlp.gate.weight", {kExperts, kHidden});
      for (int e = 0; e < kExperts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {kExpertFf, kHidden});
        add(x + "up_proj.weight", {kExpertFf, kHidden});
        add(x + "down_proj.weight", {kHidden, kExpertFf});
      }
    }
  }

  json& config() { return config_; }
  std::map<std::string, Weights>& truth() { return truth_; }

  // Writes config.json, model.safetensors and the tokenizer files.
  void write(const fs::path& dir, ExpertLayout layout) const {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config_.dump(2);
    write_tokenizer(dir);
    std::vector<SafetensorsWriteTensor> tensors;
    for (const auto& [name, w] : truth_) {
      if (layout != ExpertLayout::kPerExpert && name.find(".mlp.experts.") != std::string::npos) continue;
      tensors.push_back(encode(name, w));
    }
    if (moe_ && layout != ExpertLayout::kPerExpert) {
      for (int l = 0; l < kLayers; ++l) add_fused(l, layout == ExpertLayout::kFusedTransposed, tensors);
    }
    auto bytes = write_safetensors(tensors, {{"format", "pt"}});
    ASSERT_TRUE(bytes.is_ok());
    std::ofstream(dir / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes->data()), long(bytes->size()));
  }

  // Values of the source as stored (rounded to the source dtype).
  float stored(float v) const {
    if (dtype_ == DType::BF16) return bf16_to_fp32(fp32_to_bf16(v));
    if (dtype_ == DType::F16) return fp16_to_fp32(fp32_to_fp16(v));
    return v;
  }

 private:
  void add(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(0.0f, 0.5f);
    Weights w{std::move(shape), {}};
    for (int64_t i = 0; i < n; ++i) w.values.push_back(stored(dist(rng_)));
    truth_[name] = std::move(w);
  }

  SafetensorsWriteTensor encode(const std::string& name, const Weights& w) const {
    return testing::safetensors_tensor(name, dtype_, w.shape, w.values);
  }

  // gate_up_proj [E, 2I, H] (gate rows, then up rows) or transposed [E, H, 2I];
  // down_proj [E, H, I] or transposed [E, I, H].
  void add_fused(int layer, bool transposed, std::vector<SafetensorsWriteTensor>& out) const {
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const int64_t E = kExperts, I = kExpertFf, H = kHidden;
    Weights gu{transposed ? std::vector<int64_t>{E, H, 2 * I} : std::vector<int64_t>{E, 2 * I, H},
               std::vector<float>(size_t(E * 2 * I * H))};
    Weights down{transposed ? std::vector<int64_t>{E, I, H} : std::vector<int64_t>{E, H, I},
                 std::vector<float>(size_t(E * H * I))};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      const auto& gate = truth_.at(x + "gate_proj.weight").values;
      const auto& up = truth_.at(x + "up_proj.weight").values;
      const auto& dn = truth_.at(x + "down_proj.weight").values;
      for (int64_t j = 0; j < 2 * I; ++j) {
        for (int64_t h = 0; h < H; ++h) {
          const float v = j < I ? gate[size_t(j * H + h)] : up[size_t((j - I) * H + h)];
          gu.values[size_t(transposed ? (e * H + h) * 2 * I + j : (e * 2 * I + j) * H + h)] = v;
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < I; ++i) {
          down.values[size_t(transposed ? (e * I + i) * H + h : (e * H + h) * I + i)] = dn[size_t(h * I + i)];
        }
      }
    }
    out.push_back(encode(p + "gate_up_proj", gu));
    out.push_back(encode(p + "down_proj", down));
  }

  static void write_tokenizer(const fs::path& dir) {
    const char* regex =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    testing::write_byte_level_tokenizer(dir, regex);
    std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 257, "eos_token_id": [258, 257]})";
  }

  bool moe_;
  DType dtype_;
  json config_;
  std::map<std::string, Weights> truth_;
  std::mt19937 rng_{1234};
};

class HfConvert : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moeserve_hf_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result<ConvertSummary> convert(FileType type) {
    ConvertOptions options;
    options.hf_dir = (dir_ / "hf").string();
    options.output_path = (dir_ / "out.gguf").string();
    options.file_type = type;
    options.threads = 2;
    options.progress = ProgressOptions::Mode::kOff;
    return convert_hf_model(options);
  }

  fs::path dir_;
};

using testing::gguf_values;

std::vector<float> concat_experts(std::map<std::string, Weights>& truth, int layer, const char* part) {
  std::vector<float> out;
  for (int e = 0; e < kExperts; ++e) {
    const auto& v = truth.at(fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, e, part)).values;
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Expected f32 contents of every GGUF tensor, from the HF truth.
std::map<std::string, std::vector<float>> expected_tensors(TinyHfModel& m, bool moe, bool tied) {
  auto& t = m.truth();
  std::map<std::string, std::vector<float>> out = {
      {"token_embd.weight", t.at("model.embed_tokens.weight").values},
      {"output_norm.weight", t.at("model.norm.weight").values}};
  if (!tied) out["output.weight"] = t.at("lm_head.weight").values;
  const std::pair<const char*, const char*> direct[] = {
      {"input_layernorm", "attn_norm"},    {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"}};
  for (int l = 0; l < kLayers; ++l) {
    for (auto [hf, gguf] : direct)
      out[keys::blk(l, gguf)] = t.at(fmt::format("model.layers.{}.{}.weight", l, hf)).values;
    if (moe) {
      out[keys::blk(l, "ffn_gate_inp")] = t.at(fmt::format("model.layers.{}.mlp.gate.weight", l)).values;
      out[keys::blk(l, "ffn_gate_exps")] = concat_experts(t, l, "gate_proj");
      out[keys::blk(l, "ffn_up_exps")] = concat_experts(t, l, "up_proj");
      out[keys::blk(l, "ffn_down_exps")] = concat_experts(t, l, "down_proj");
    } else {
      for (const char* part : {"gate", "up", "down"}) {
        out[keys::blk(l, std::string("ffn_") + part)] =
            t.at(fmt::format("model.layers.{}.mlp.{}_proj.weight", l, part)).values;
      }
    }
  }
  return out;
}

TEST_F(HfConvert, MoePerExpertF32RoundTripsExactly) {
  TinyHfModel model(/*moe=*/true, /*tied=*/false, DType::F32);
  model.write(dir_ / "hf", ExpertLayout::kPerExpert);
  auto summary = convert(FileType::kF32);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  EXPECT_EQ(summary->arch, "qwen3moe");

  auto gguf = GgufFile::open((dir_ / "out.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ(gguf->architecture(), "qwen3moe");
  EXPECT_EQ(gguf->get_int("qwen3moe.block_count"), kLayers);
  EXPECT_EQ(gguf->get_int("qwen3moe.embedding_length"), kHidden);
  EXPECT_EQ(gguf->get_int("qwen3moe.context_length"), 128);
  EXPECT_EQ(gguf->get_int("qwen3moe.attention.head_count"), kHeads);
  EXPECT_EQ(gguf->get_int("qwen3moe.attention.head_count_kv"), kKvHeads);
  EXPECT_EQ(gguf->get_int("qwen3moe.attention.key_length"), kHeadDim);
  EXPECT_EQ(gguf->get_int("qwen3moe.attention.value_length"), kHeadDim);
  EXPECT_EQ(gguf->get_int("qwen3moe.expert_count"), kExperts);
  EXPECT_EQ(gguf->get_int("qwen3moe.expert_used_count"), 2);
  EXPECT_EQ(gguf->get_int("qwen3moe.expert_feed_forward_length"), kExpertFf);
  EXPECT_FLOAT_EQ(float(gguf->get_float("qwen3moe.rope.freq_base").value_or(0)), 1e6f);
  EXPECT_FLOAT_EQ(float(gguf->get_float("qwen3moe.attention.layer_norm_rms_epsilon").value_or(0)), 1e-6f);
  EXPECT_EQ(gguf->get_int("general.file_type"), 0);

  EXPECT_EQ(gguf->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(gguf->get_string("tokenizer.ggml.pre"), "qwen2");
  const auto* tokens = gguf->get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->size(), size_t(kVocab));  // padded to the embedding rows
  EXPECT_EQ((*tokens)[256], "ab");
  EXPECT_EQ((*tokens)[299], "[PAD299]");
  auto types = gguf->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.has_value());
  EXPECT_EQ((*types)[0], 1);
  EXPECT_EQ((*types)[258], 3);
  EXPECT_EQ((*types)[299], 5);
  const auto* merges = gguf->get_string_array("tokenizer.ggml.merges");
  ASSERT_NE(merges, nullptr);
  EXPECT_EQ(*merges, std::vector<std::string>{"a b"});
  EXPECT_EQ(gguf->get_int("tokenizer.ggml.eos_token_id"), 258);
  EXPECT_EQ(gguf->get_int("tokenizer.ggml.bos_token_id"), 257);  // from generation_config.json
  EXPECT_EQ(gguf->get_int("tokenizer.ggml.padding_token_id"), 257);
  EXPECT_EQ(gguf->get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(gguf->get_string("tokenizer.chat_template"), "{{ messages }}");

  const auto expected = expected_tensors(model, true, false);
  ASSERT_EQ(gguf->tensors().size(), expected.size());
  for (const auto& [name, values] : expected) {
    const GgufTensorInfo* t = gguf->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, DType::F32) << name;
    EXPECT_EQ(gguf_values(*t), values) << name;
  }
  EXPECT_EQ(gguf->find_tensor("blk.1.ffn_gate_exps.weight")->shape_string(), "[32, 8, 4]");
  EXPECT_EQ(gguf->find_tensor("blk.1.ffn_down_exps.weight")->shape_string(), "[8, 32, 4]");
  EXPECT_EQ(gguf->find_tensor("blk.0.ffn_gate_inp.weight")->shape_string(), "[32, 4]");
  EXPECT_EQ(gguf->find_tensor("token_embd.weight")->shape_string(), "[32, 300]");
  EXPECT_EQ(gguf->find_tensor("blk.0.attn_q.weight")->shape_string(), "[32, 32]");
  EXPECT_EQ(gguf->find_tensor("blk.0.attn_k.weight")->shape_string(), "[32, 16]");
}

class HfConvertFused : public HfConvert, public ::testing::WithParamInterface<ExpertLayout> {};

// Checkpoints saved by transformers v5 keep the template in
// chat_template.jinja (older ones in chat_template.json): those win over
// tokenizer_config.json's; a malformed chat_template.json is an error naming it.
TEST_F(HfConvert, ChatTemplateFromItsOwnFiles) {
  TinyHfModel model(/*moe=*/true, /*tied=*/false, DType::F32);
  model.write(dir_ / "hf", ExpertLayout::kPerExpert);
  auto template_of_output = [&]() -> std::string {
    auto summary = convert(FileType::kF32);
    EXPECT_TRUE(summary.is_ok()) << summary.status().to_string();
    auto gguf = GgufFile::open((dir_ / "out.gguf").string());
    return gguf.is_ok() ? std::string(gguf->get_string("tokenizer.chat_template").value_or(""))
                        : std::string();
  };
  std::ofstream(dir_ / "hf" / "chat_template.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ json }}"}]})";
  EXPECT_EQ(template_of_output(), "{{ json }}");
  std::ofstream(dir_ / "hf" / "chat_template.jinja") << "{{ jinja }}\n";
  EXPECT_EQ(template_of_output(), "{{ jinja }}\n");
  fs::remove(dir_ / "hf" / "chat_template.jinja");
  std::ofstream(dir_ / "hf" / "chat_template.json") << R"({"template": 5})";
  auto bad = convert(FileType::kF32);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("chat_template.json"), std::string::npos) << bad.status().to_string();
}

// transformers 5 writes the expert count as num_local_experts (and the RoPE
// base inside rope_parameters): both spellings must convert.
TEST_F(HfConvert, TransformersV5ConfigSpellings) {
  TinyHfModel model(/*moe=*/true, /*tied=*/false, DType::F32);
  model.config().erase("num_experts");
  model.config()["num_local_experts"] = kExperts;
  model.config().erase("rope_theta");
  model.config()["rope_parameters"] = {{"rope_theta", 5000.0}, {"rope_type", "default"}};
  model.write(dir_ / "hf", ExpertLayout::kPerExpert);
  auto summary = convert(FileType::kF32);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  auto gguf = GgufFile::open((dir_ / "out.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ(gguf->get_int("qwen3moe.expert_count"), kExperts);
  EXPECT_FLOAT_EQ(float(gguf->get_float("qwen3moe.rope.freq_base").value_or(0)), 5000.0f);
}

TEST_P(HfConvertFused, Bf16FusedExpertLayoutsRoundTripExactly) {
  TinyHfModel model(/*moe=*/true, /*tied=*/false, DType::BF16);
  model.write(dir_ / "hf", GetParam());
  auto summary = convert(FileType::kBF16);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  auto gguf = GgufFile::open((dir_ / "out.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ(gguf->get_int("general.file_type"), 32);
  for (const auto& [name, values] : expected_tensors(model, true, false)) {
    const GgufTensorInfo* t = gguf->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const bool keep_f32 = t->n_dims == 1 || name.find("ffn_gate_inp") != std::string::npos;
    EXPECT_EQ(t->type, keep_f32 ? DType::F32 : DType::BF16) << name;
    EXPECT_EQ(gguf_values(*t), values) << name;  // bf16 -> bf16 (or f32) is exact
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HfConvertFused,
                         ::testing::Values(ExpertLayout::kPerExpert, ExpertLayout::kFused,
                                           ExpertLayout::kFusedTransposed));

TEST_F(HfConvert, DenseTiedQ8HasNoOutputAndStaysClose) {
  TinyHfModel model(/*moe=*/false, /*tied=*/true, DType::F16);
  model.write(dir_ / "hf", ExpertLayout::kPerExpert);
  auto summary = convert(FileType::kQ8_0);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  auto gguf = GgufFile::open((dir_ / "out.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ(gguf->architecture(), "qwen3");
  EXPECT_EQ(gguf->find_tensor("output.weight"), nullptr);
  EXPECT_FALSE(gguf->has("qwen3.expert_count"));
  EXPECT_EQ(gguf->get_int("qwen3.feed_forward_length"), kDenseFf);
  EXPECT_EQ(gguf->get_int("general.quantization_version"), 2);
  for (const auto& [name, values] : expected_tensors(model, false, true)) {
    const GgufTensorInfo* t = gguf->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, t->n_dims == 1 ? DType::F32 : DType::Q8_0) << name;
    const std::vector<float> got = gguf_values(*t);
    ASSERT_EQ(got.size(), values.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], values[i], 0.02f) << name << "[" << i << "]";
  }
}

struct ErrorCase {
  const char* what;
  std::function<void(TinyHfModel&, const fs::path&)> damage;
  const char* message_part;
};

TEST_F(HfConvert, BadInputsGiveClearErrors) {
  const std::vector<ErrorCase> cases = {
      {"unsupported arch",
       [](TinyHfModel& m, const fs::path&) { m.config()["architectures"] = {"LlamaForCausalLM"}; },
       "'LlamaForCausalLM' is not supported (supported: Qwen3MoeForCausalLM (qwen3moe), Qwen3ForCausalLM "
       "(qwen3), Qwen3_5MoeForCausalLM (qwen35moe), Qwen3_5ForCausalLM (qwen35), "
       "Qwen3_5MoeForConditionalGeneration (qwen35moe), Qwen3_5ForConditionalGeneration (qwen35), "
       "LagunaForCausalLM (laguna), DFlashDraftModel (dflash))"},
      {"bad config type", [](TinyHfModel& m, const fs::path&) { m.config()["hidden_size"] = "32"; },
       "'hidden_size' must be a positive integer"},
      {"missing key", [](TinyHfModel& m, const fs::path&) { m.config().erase("num_hidden_layers"); },
       "'num_hidden_layers' is missing"},
      {"norm_topk_prob", [](TinyHfModel& m, const fs::path&) { m.config()["norm_topk_prob"] = false; },
       "norm_topk_prob"},
      {"yarn",
       [](TinyHfModel& m, const fs::path&) {
         m.config()["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
       },
       "rope_scaling"},
      {"sparse step", [](TinyHfModel& m, const fs::path&) { m.config()["decoder_sparse_step"] = 2; },
       "decoder_sparse_step"},
      {"mlp_only", [](TinyHfModel& m, const fs::path&) { m.config()["mlp_only_layers"] = {1}; },
       "mlp_only_layers"},
      {"bias", [](TinyHfModel& m, const fs::path&) { m.config()["attention_bias"] = true; },
       "attention_bias"},
      {"sliding", [](TinyHfModel& m, const fs::path&) { m.config()["use_sliding_window"] = true; },
       "use_sliding_window"},
      {"missing tensor",
       [](TinyHfModel& m, const fs::path&) { m.truth().erase("model.layers.1.self_attn.k_norm.weight"); },
       "tensor 'model.layers.1.self_attn.k_norm.weight' is missing"},
      {"unknown tensor",
       [](TinyHfModel& m, const fs::path&) {
         m.truth()["model.layers.0.mystery.weight"] = {{2}, {1, 2}};
       },
       "not used by the qwen3moe conversion: model.layers.0.mystery.weight"},
      {"wrong shape",
       [](TinyHfModel& m, const fs::path&) {
         m.truth()["model.norm.weight"] = {{2}, {1, 2}};
       },
       "tensor 'model.norm.weight' has shape [2], config.json implies [32]"},
  };
  for (const ErrorCase& c : cases) {
    TinyHfModel model(true, false, DType::F32);
    c.damage(model, dir_);
    fs::remove_all(dir_ / "hf");
    model.write(dir_ / "hf", ExpertLayout::kPerExpert);
    auto summary = convert(FileType::kF16);
    ASSERT_FALSE(summary.is_ok()) << c.what;
    EXPECT_NE(summary.status().message().find(c.message_part), std::string::npos)
        << c.what << ": " << summary.status().to_string();
    EXPECT_FALSE(fs::exists(dir_ / "out.gguf")) << c.what;
  }
}

}  // namespace
}  // namespace moeserve::convert
