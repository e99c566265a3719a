// A tiny Qwen3.5 / 3.6 hybrid Hugging Face checkpoint for the convert tests
// (qwen35moe, qwen35): n_k = 2 K heads and n_v = 4 V heads so the V-head
// reorder matters; the weights by their HF names ("truth", experts always per
// expert), the config, the files written from them, and the GGUF tensors
// expected after the spec's transforms (norm + 1, ssm_a = -exp(A_log), conv
// squeeze, the grouped -> tiled V-head order).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "hf_tokenizer_files.h"
#include "safetensors_values.h"
#include "tensor/quantize.h"
#include "tokenizer/byte_level.h"

namespace moeserve::convert::qwen35_test {

namespace fs = std::filesystem;
using nlohmann::json;
using Vec = std::vector<double>;

// Layers 0 and 2 are Gated DeltaNet, layer 1 gated full attention (interval 2).
constexpr int64_t kHidden = 32, kLayers = 3, kInterval = 2, kHeads = 2, kKvHeads = 1, kHeadDim = 16;
constexpr int64_t kRot = 8;  // head_dim * partial_rotary_factor 0.5
constexpr int64_t kNk = 2, kNv = 4, kDk = 8, kDv = 16, kConvK = 4;
constexpr int64_t kQkDim = 2 * kNk * kDk, kConvDim = kQkDim + kNv * kDv;
constexpr int64_t kExperts = 4, kTopK = 2, kExpertFf = 8, kSharedFf = 12, kDenseFf = 24, kVocab = 300;
constexpr double kTheta = 10000.0, kEps = 1e-6;
// GGUF V head h holds HF V head kTiled[h]: HF head g·r + j -> GGUF j·n_k + g
// with r = 2 (written out by hand, not computed like the converter does).
inline const std::vector<int64_t> kTiled = {0, 2, 1, 3};

inline bool full_layer(int64_t il) { return (il + 1) % kInterval == 0; }

enum class Experts { kPerExpert, kFused, kFusedTransposed };

struct Weights {
  std::vector<int64_t> shape;  // PyTorch order
  std::vector<float> values;
};

struct Options {
  bool moe = true;
  bool tied = false;
  Experts experts = Experts::kPerExpert;
  DType dtype = DType::F32;
  bool multimodal = false;  // composite config, model.language_model.*, vision and MTP tensors
};

// A tiny Qwen3.5 checkpoint: the weights by their HF names ("truth", experts
// always per expert), the config, and the files written from them.
class TinyQwen35 {
 public:
  explicit TinyQwen35(Options o) : o_(o) {
    json text = {{"model_type", o.moe ? "qwen3_5_moe_text" : "qwen3_5_text"},
                 {"hidden_size", kHidden},
                 {"num_hidden_layers", kLayers},
                 {"num_attention_heads", kHeads},
                 {"num_key_value_heads", kKvHeads},
                 {"head_dim", kHeadDim},
                 {"vocab_size", kVocab},
                 {"max_position_embeddings", 256},
                 {"rms_norm_eps", kEps},
                 {"hidden_act", "silu"},
                 {"tie_word_embeddings", o.tied},
                 {"attention_bias", false},
                 {"rope_parameters",
                  {{"rope_type", "default"},
                   {"rope_theta", kTheta},
                   {"partial_rotary_factor", 0.5},
                   {"mrope_section", {2, 1, 1}},
                   {"mrope_interleaved", true}}},
                 {"linear_conv_kernel_dim", kConvK},
                 {"linear_key_head_dim", kDk},
                 {"linear_value_head_dim", kDv},
                 {"linear_num_key_heads", kNk},
                 {"linear_num_value_heads", kNv},
                 {"layer_types", {"linear_attention", "full_attention", "linear_attention"}},
                 {"bos_token_id", nullptr},
                 {"eos_token_id", 258}};
    if (o.moe) {
      text.update({{"num_experts", kExperts},
                   {"num_experts_per_tok", kTopK},
                   {"moe_intermediate_size", kExpertFf},
                   {"shared_expert_intermediate_size", kSharedFf}});
    } else {
      text["intermediate_size"] = kDenseFf;
    }
    if (o.multimodal) {
      text["mtp_num_hidden_layers"] = 1;
      config_ = {{"architectures",
                  {o.moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"}},
                 {"model_type", o.moe ? "qwen3_5_moe" : "qwen3_5"},
                 {"text_config", text},
                 {"vision_config", {{"depth", 1}, {"hidden_size", 8}}},
                 {"image_token_id", 290},
                 {"tie_word_embeddings", o.tied}};
    } else {
      config_ = text;
      config_["architectures"] = {o.moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"};
    }
    build_truth();
  }

  json& config() { return config_; }
  // The language model's keys (text_config of a composite config).
  json& text_config() { return o_.multimodal ? config_["text_config"] : config_; }
  std::map<std::string, Weights>& truth() { return truth_; }
  const std::vector<float>& w(const std::string& name) const { return truth_.at(name).values; }

  void write(const fs::path& dir) const {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config_.dump(2);
    write_tokenizer(dir);
    std::vector<SafetensorsWriteTensor> tensors;
    for (const auto& [name, weights] : truth_) {
      if (o_.moe && o_.experts != Experts::kPerExpert && name.find(".mlp.experts.") != std::string::npos)
        continue;
      std::string file_name = name;
      if (o_.multimodal && name.starts_with("model.")) file_name = "model.language_model." + name.substr(6);
      tensors.push_back(encode(file_name, weights));
    }
    if (o_.moe && o_.experts != Experts::kPerExpert) {
      for (int l = 0; l < kLayers; ++l) add_fused(l, tensors);
    }
    if (o_.multimodal) {
      tensors.push_back(
          encode("model.visual.patch_embed.proj.weight", {{8, 12}, std::vector<float>(96, 0.5f)}));
      tensors.push_back(encode("model.visual.merger.norm.weight", {{8}, std::vector<float>(8, 1.0f)}));
      tensors.push_back(
          encode("mtp.fc.weight", {{kHidden, 2 * kHidden}, std::vector<float>(2 * kHidden * kHidden, 0.1f)}));
      tensors.push_back(
          encode("mtp.layers.0.input_layernorm.weight", {{kHidden}, std::vector<float>(kHidden, 0.0f)}));
    }
    auto bytes = write_safetensors(tensors, {{"format", "pt"}});
    ASSERT_TRUE(bytes.is_ok());
    std::ofstream(dir / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes->data()), long(bytes->size()));
  }

 private:
  void build_truth() {
    const double proj = 1.0 / std::sqrt(double(kHidden));
    add("model.embed_tokens.weight", {kVocab, kHidden}, 0.0, 1.0);
    add("model.norm.weight", {kHidden}, 0.0, 0.1);  // zero-centred: the scale is 1 + w
    if (!o_.tied) add("lm_head.weight", {kVocab, kHidden}, 0.0, proj);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {kHidden}, 0.0, 0.1);
      add(p + "post_attention_layernorm.weight", {kHidden}, 0.0, 0.1);
      if (full_layer(l)) {
        add(p + "self_attn.q_proj.weight", {2 * kHeads * kHeadDim, kHidden}, 0.0, proj);
        add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden}, 0.0, proj);
        add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden}, 0.0, proj);
        add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim}, 0.0,
            1.0 / std::sqrt(double(kHeads * kHeadDim)));
        add(p + "self_attn.q_norm.weight", {kHeadDim}, 0.0, 0.1);
        add(p + "self_attn.k_norm.weight", {kHeadDim}, 0.0, 0.1);
      } else {
        const std::string a = p + "linear_attn.";
        add(a + "in_proj_qkv.weight", {kConvDim, kHidden}, 0.0, proj);
        add(a + "in_proj_z.weight", {kNv * kDv, kHidden}, 0.0, proj);
        add(a + "in_proj_b.weight", {kNv, kHidden}, 0.0, proj);
        add(a + "in_proj_a.weight", {kNv, kHidden}, 0.0, proj);
        add(a + "conv1d.weight", {kConvDim, 1, kConvK}, 0.0, 0.5);
        add(a + "dt_bias", {kNv}, 1.0, 0.3);
        add(a + "A_log", {kNv}, 0.0, 0.0);
        std::uniform_real_distribution<float> u(1.0f, 16.0f);  // transformers' init: log U(0, 16)
        for (float& v : truth_[a + "A_log"].values) v = stored(std::log(u(rng_)));
        add(a + "norm.weight", {kDv}, 1.0, 0.1);  // RMSNormGated: plain weight, around 1
        add(a + "out_proj.weight", {kHidden, kNv * kDv}, 0.0, 1.0 / std::sqrt(double(kNv * kDv)));
      }
      if (!o_.moe) {
        add(p + "mlp.gate_proj.weight", {kDenseFf, kHidden}, 0.0, proj);
        add(p + "mlp.up_proj.weight", {kDenseFf, kHidden}, 0.0, proj);
        add(p + "mlp.down_proj.weight", {kHidden, kDenseFf}, 0.0, 1.0 / std::sqrt(double(kDenseFf)));
        continue;
      }
      add(p + "mlp.gate.weight", {kExperts, kHidden}, 0.0, 1.0);
      for (int e = 0; e < kExperts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {kExpertFf, kHidden}, 0.0, proj);
        add(x + "up_proj.weight", {kExpertFf, kHidden}, 0.0, proj);
        add(x + "down_proj.weight", {kHidden, kExpertFf}, 0.0, 1.0 / std::sqrt(double(kExpertFf)));
      }
      add(p + "mlp.shared_expert.gate_proj.weight", {kSharedFf, kHidden}, 0.0, proj);
      add(p + "mlp.shared_expert.up_proj.weight", {kSharedFf, kHidden}, 0.0, proj);
      add(p + "mlp.shared_expert.down_proj.weight", {kHidden, kSharedFf}, 0.0,
          1.0 / std::sqrt(double(kSharedFf)));
      add(p + "mlp.shared_expert_gate.weight", {1, kHidden}, 0.0, proj);
    }
  }

  float stored(float v) const {
    if (o_.dtype == DType::BF16) return bf16_to_fp32(fp32_to_bf16(v));
    return v;
  }

  void add(const std::string& name, std::vector<int64_t> shape, double mean, double stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<double> dist(mean, stddev > 0 ? stddev : 1e-9);
    Weights w{std::move(shape), {}};
    for (int64_t i = 0; i < n; ++i) w.values.push_back(stored(float(dist(rng_))));
    truth_[name] = std::move(w);
  }

  SafetensorsWriteTensor encode(const std::string& name, const Weights& w) const {
    return testing::safetensors_tensor(name, o_.dtype, w.shape, w.values);
  }

  // gate_up_proj [E, 2I, H] (gate rows, then up) or transposed [E, H, 2I];
  // down_proj [E, H, I] or transposed [E, I, H].
  void add_fused(int layer, std::vector<SafetensorsWriteTensor>& out) const {
    const bool transposed = o_.experts == Experts::kFusedTransposed;
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const int64_t E = kExperts, I = kExpertFf, H = kHidden;
    Weights gu{transposed ? std::vector<int64_t>{E, H, 2 * I} : std::vector<int64_t>{E, 2 * I, H},
               std::vector<float>(size_t(E * 2 * I * H))};
    Weights down{transposed ? std::vector<int64_t>{E, I, H} : std::vector<int64_t>{E, H, I},
                 std::vector<float>(size_t(E * H * I))};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      const auto &gate = w(x + "gate_proj.weight"), &up = w(x + "up_proj.weight"),
                 &dn = w(x + "down_proj.weight");
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
    const std::string prefix = o_.multimodal ? "model.language_model.layers." : "model.layers.";
    const std::string name = prefix + std::to_string(layer) + ".mlp.experts.";
    out.push_back(encode(name + "gate_up_proj", gu));
    out.push_back(encode(name + "down_proj", down));
  }

  // Byte-level BPE with Qwen3.5's pre-tokenizer regex.
  static void write_tokenizer(const fs::path& dir) {
    const char* regex =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    testing::write_byte_level_tokenizer(dir, regex);
  }

  Options o_;
  json config_;
  std::map<std::string, Weights> truth_;
  std::mt19937 rng_{4321};
};

// ---- expected GGUF contents, from the HF weights and the spec's transforms ----

inline std::vector<float> plus_one(std::vector<float> v) {
  for (float& x : v) x += 1.0f;
  return v;
}

// Rows of `row_len` values: the first `before` rows stay, then V heads of
// `block` rows each go to kTiled order.
inline std::vector<float> tile_rows(const std::vector<float>& v, int64_t row_len, int64_t before, int64_t block) {
  std::vector<float> out(v.begin(), v.begin() + before * row_len);
  for (int64_t h = 0; h < kNv; ++h) {
    const auto first = v.begin() + (before + kTiled[size_t(h)] * block) * row_len;
    out.insert(out.end(), first, first + block * row_len);
  }
  return out;
}

// Columns of every row (rows of n_v * block values) to kTiled head order.
inline std::vector<float> tile_columns(const std::vector<float>& v, int64_t block) {
  const int64_t row_len = kNv * block;
  std::vector<float> out;
  for (size_t r = 0; r < v.size() / size_t(row_len); ++r) {
    for (int64_t h = 0; h < kNv; ++h) {
      const auto first = v.begin() + int64_t(r) * row_len + kTiled[size_t(h)] * block;
      out.insert(out.end(), first, first + block);
    }
  }
  return out;
}

struct Expected {
  std::vector<int64_t> ne;
  std::vector<float> values;
};

inline std::map<std::string, Expected> expected_tensors(const TinyQwen35& m, const Options& o) {
  std::map<std::string, Expected> out;
  const int64_t H = kHidden;
  out["token_embd.weight"] = {{H, kVocab}, m.w("model.embed_tokens.weight")};
  out["output_norm.weight"] = {{H}, plus_one(m.w("model.norm.weight"))};
  if (!o.tied) out["output.weight"] = {{H, kVocab}, m.w("lm_head.weight")};
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l), b = fmt::format("blk.{}.", l);
    out[b + "attn_norm.weight"] = {{H}, plus_one(m.w(p + "input_layernorm.weight"))};
    out[b + "post_attention_norm.weight"] = {{H}, plus_one(m.w(p + "post_attention_layernorm.weight"))};
    if (full_layer(l)) {
      const std::string s = p + "self_attn.";
      out[b + "attn_q.weight"] = {{H, 2 * kHeads * kHeadDim}, m.w(s + "q_proj.weight")};
      out[b + "attn_k.weight"] = {{H, kKvHeads * kHeadDim}, m.w(s + "k_proj.weight")};
      out[b + "attn_v.weight"] = {{H, kKvHeads * kHeadDim}, m.w(s + "v_proj.weight")};
      out[b + "attn_output.weight"] = {{kHeads * kHeadDim, H}, m.w(s + "o_proj.weight")};
      out[b + "attn_q_norm.weight"] = {{kHeadDim}, plus_one(m.w(s + "q_norm.weight"))};
      out[b + "attn_k_norm.weight"] = {{kHeadDim}, plus_one(m.w(s + "k_norm.weight"))};
    } else {
      const std::string a = p + "linear_attn.";
      out[b + "attn_qkv.weight"] = {{H, kConvDim}, tile_rows(m.w(a + "in_proj_qkv.weight"), H, kQkDim, kDv)};
      out[b + "attn_gate.weight"] = {{H, kNv * kDv}, tile_rows(m.w(a + "in_proj_z.weight"), H, 0, kDv)};
      out[b + "ssm_beta.weight"] = {{H, kNv}, tile_rows(m.w(a + "in_proj_b.weight"), H, 0, 1)};
      out[b + "ssm_alpha.weight"] = {{H, kNv}, tile_rows(m.w(a + "in_proj_a.weight"), H, 0, 1)};
      out[b + "ssm_conv1d.weight"] = {{kConvK, kConvDim},
                                      tile_rows(m.w(a + "conv1d.weight"), kConvK, kQkDim, kDv)};
      out[b + "ssm_dt.bias"] = {{kNv}, tile_columns(m.w(a + "dt_bias"), 1)};
      std::vector<float> a_neg = tile_columns(m.w(a + "A_log"), 1);
      for (float& x : a_neg) x = -std::exp(x);
      out[b + "ssm_a"] = {{kNv}, a_neg};
      out[b + "ssm_norm.weight"] = {{kDv}, m.w(a + "norm.weight")};  // no + 1
      out[b + "ssm_out.weight"] = {{kNv * kDv, H}, tile_columns(m.w(a + "out_proj.weight"), kDv)};
    }
    if (!o.moe) {
      out[b + "ffn_gate.weight"] = {{H, kDenseFf}, m.w(p + "mlp.gate_proj.weight")};
      out[b + "ffn_up.weight"] = {{H, kDenseFf}, m.w(p + "mlp.up_proj.weight")};
      out[b + "ffn_down.weight"] = {{kDenseFf, H}, m.w(p + "mlp.down_proj.weight")};
      continue;
    }
    out[b + "ffn_gate_inp.weight"] = {{H, kExperts}, m.w(p + "mlp.gate.weight")};
    for (const char* part : {"gate", "up", "down"}) {
      Expected e{std::string(part) == "down" ? std::vector<int64_t>{kExpertFf, H, kExperts}
                                             : std::vector<int64_t>{H, kExpertFf, kExperts},
                 {}};
      for (int x = 0; x < kExperts; ++x) {
        const auto& v = m.w(fmt::format("{}mlp.experts.{}.{}_proj.weight", p, x, part));
        e.values.insert(e.values.end(), v.begin(), v.end());
      }
      out[b + "ffn_" + part + "_exps.weight"] = e;
      out[b + "ffn_" + part + "_shexp.weight"] = {
          std::string(part) == "down" ? std::vector<int64_t>{kSharedFf, H}
                                      : std::vector<int64_t>{H, kSharedFf},
          m.w(fmt::format("{}mlp.shared_expert.{}_proj.weight", p, part))};
    }
    out[b + "ffn_gate_inp_shexp.weight"] = {{H}, m.w(p + "mlp.shared_expert_gate.weight")};
  }
  return out;
}


}  // namespace moeserve::convert::qwen35_test
