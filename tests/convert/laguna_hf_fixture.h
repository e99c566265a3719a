// A tiny Laguna (LagunaForCausalLM) Hugging Face checkpoint for the convert
// tests: 4 layers alternating full / sliding-window attention (period 2) with
// 2 / 4 query heads, layer 0 dense, layers 1-3 MoE with a selection bias and a
// shared expert, YaRN on the full layers. The weights are kept by their HF
// names ("truth", experts always per expert) and written as config.json,
// model.safetensors (per-expert or fused experts; in-memory or saved names)
// and a byte-level tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "gguf_values.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "safetensors_values.h"
#include "tensor/quantize.h"
#include "tokenizer/byte_level.h"

namespace moeserve::convert::laguna_test {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kHidden = 32, kLayers = 4, kPeriod = 2, kKvHeads = 2, kHeadDim = 8;
constexpr int64_t kFullHeads = 2, kSwaHeads = 4, kWindow = 16;
constexpr int64_t kExperts = 4, kTopK = 2, kExpertFf = 8, kSharedFf = 12, kDenseFf = 24, kVocab = 300;
// Token ids of the tokenizer: <|endoftext|> (bos and eos), <|im_end|> (pad),
// </assistant> (the turn end: eot).
constexpr int64_t kBos = 257, kPad = 258, kEot = 259;

inline int64_t layer_heads(int64_t il) { return il % kPeriod == 0 ? kFullHeads : kSwaHeads; }

enum class Experts { kPerExpert, kFused };

struct Weights {
  std::vector<int64_t> shape;  // PyTorch order
  std::vector<float> values;
};

struct Options {
  Experts experts = Experts::kPerExpert;
  DType dtype = DType::F32;
  bool per_element_gate = false;  // gating "per-element": g_proj [n_head * head_dim, H]
  bool tied = false;
  // The names transformers saves (mlp.experts.e_score_correction_bias,
  // mlp.shared_expert.*) instead of its in-memory ones (mlp.gate.*,
  // mlp.shared_experts.*); the truth keeps the in-memory names.
  bool saved_names = false;
};

class TinyLaguna {
 public:
  explicit TinyLaguna(Options o = {}) : o_(o) {
    json layer_types = json::array(), mlp_types = json::array(), heads = json::array();
    for (int64_t il = 0; il < kLayers; ++il) {
      layer_types.push_back(il % kPeriod == 0 ? "full_attention" : "sliding_attention");
      mlp_types.push_back(il == 0 ? "dense" : "sparse");
      heads.push_back(layer_heads(il));
    }
    config_ = {{"architectures", {"LagunaForCausalLM"}},
               {"model_type", "laguna"},
               {"hidden_size", kHidden},
               {"num_hidden_layers", kLayers},
               {"num_attention_heads", kFullHeads},
               {"num_attention_heads_per_layer", heads},
               {"num_key_value_heads", kKvHeads},
               {"head_dim", kHeadDim},
               {"intermediate_size", kDenseFf},
               {"vocab_size", kVocab},
               {"max_position_embeddings", 256},
               {"rms_norm_eps", 1e-6},
               {"hidden_act", "silu"},
               {"tie_word_embeddings", o.tied},
               {"attention_bias", false},
               {"gating", o.per_element_gate ? json("per-element") : json(true)},
               {"layer_types", layer_types},
               {"sliding_window", kWindow},
               {"rope_parameters",
                {{"full_attention",
                  {{"rope_type", "yarn"},
                   {"rope_theta", 500000.0},
                   {"partial_rotary_factor", 0.5},
                   {"factor", 4.0},
                   {"original_max_position_embeddings", 64},
                   {"beta_fast", 32.0},
                   {"beta_slow", 1.0}}},
                 {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}},
               {"mlp_layer_types", mlp_types},
               {"num_experts", kExperts},
               {"num_experts_per_tok", kTopK},
               {"moe_intermediate_size", kExpertFf},
               {"shared_expert_intermediate_size", kSharedFf},
               {"moe_routed_scaling_factor", 2.5},
               {"moe_apply_router_weight_on_input", false},
               {"moe_router_logit_softcapping", 0.0},
               {"bos_token_id", kBos},
               {"eos_token_id", {kBos, kEot}},
               {"pad_token_id", kPad}};
    build_truth();
  }

  json& config() { return config_; }
  std::map<std::string, Weights>& truth() { return truth_; }
  const std::vector<float>& w(const std::string& name) const { return truth_.at(name).values; }

  void write(const fs::path& dir) const {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config_.dump(2);
    write_tokenizer(dir);
    std::vector<SafetensorsWriteTensor> tensors;
    for (const auto& [name, weights] : truth_) {
      if (o_.experts == Experts::kFused && name.find(".mlp.experts.") != std::string::npos) continue;
      tensors.push_back(encode(file_name(name), weights));
    }
    if (o_.experts == Experts::kFused) {
      for (int64_t il = 1; il < kLayers; ++il) add_fused(il, tensors);
    }
    auto bytes = write_safetensors(tensors, {{"format", "pt"}});
    ASSERT_TRUE(bytes.is_ok());
    std::ofstream(dir / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes->data()), long(bytes->size()));
  }

 private:
  void build_truth() {
    const double proj = 1.0 / std::sqrt(double(kHidden));
    add("model.embed_tokens.weight", {kVocab, kHidden}, 1.0);
    add("model.norm.weight", {kHidden}, 0.1, 1.0);
    if (!o_.tied) add("lm_head.weight", {kVocab, kHidden}, proj);
    for (int64_t il = 0; il < kLayers; ++il) {
      const std::string p = "model.layers." + std::to_string(il) + ".";
      const int64_t q = layer_heads(il) * kHeadDim;
      add(p + "input_layernorm.weight", {kHidden}, 0.1, 1.0);
      add(p + "post_attention_layernorm.weight", {kHidden}, 0.1, 1.0);
      add(p + "self_attn.q_proj.weight", {q, kHidden}, proj);
      add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden}, proj);
      add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden}, proj);
      add(p + "self_attn.o_proj.weight", {kHidden, q}, proj);
      add(p + "self_attn.q_norm.weight", {kHeadDim}, 0.1, 1.0);
      add(p + "self_attn.k_norm.weight", {kHeadDim}, 0.1, 1.0);
      add(p + "self_attn.g_proj.weight", {o_.per_element_gate ? q : layer_heads(il), kHidden}, proj);
      if (il == 0) {
        add(p + "mlp.gate_proj.weight", {kDenseFf, kHidden}, proj);
        add(p + "mlp.up_proj.weight", {kDenseFf, kHidden}, proj);
        add(p + "mlp.down_proj.weight", {kHidden, kDenseFf}, proj);
        continue;
      }
      add(p + "mlp.gate.weight", {kExperts, kHidden}, 1.0);
      add(p + "mlp.gate.e_score_correction_bias", {kExperts}, 0.1);
      for (int64_t e = 0; e < kExperts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {kExpertFf, kHidden}, proj);
        add(x + "up_proj.weight", {kExpertFf, kHidden}, proj);
        add(x + "down_proj.weight", {kHidden, kExpertFf}, proj);
      }
      add(p + "mlp.shared_experts.gate_proj.weight", {kSharedFf, kHidden}, proj);
      add(p + "mlp.shared_experts.up_proj.weight", {kSharedFf, kHidden}, proj);
      add(p + "mlp.shared_experts.down_proj.weight", {kHidden, kSharedFf}, proj);
    }
  }

  std::string file_name(std::string name) const {
    if (!o_.saved_names) return name;
    const std::pair<std::string, std::string> renames[] = {
        {".mlp.gate.e_score_correction_bias", ".mlp.experts.e_score_correction_bias"},
        {".mlp.shared_experts.", ".mlp.shared_expert."}};
    for (const auto& [from, to] : renames) {
      if (const size_t at = name.find(from); at != std::string::npos) name.replace(at, from.size(), to);
    }
    return name;
  }

  float stored(float v) const { return o_.dtype == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(v)) : v; }

  void add(const std::string& name, std::vector<int64_t> shape, double stddev, double mean = 0.0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<double> dist(mean, stddev);
    Weights w{std::move(shape), {}};
    for (int64_t i = 0; i < n; ++i) w.values.push_back(stored(float(dist(rng_))));
    truth_[name] = std::move(w);
  }

  SafetensorsWriteTensor encode(const std::string& name, const Weights& w) const {
    return testing::safetensors_tensor(name, o_.dtype, w.shape, w.values);
  }

  // transformers v5's fused experts: gate_up_proj [E, 2I, H] (each expert's
  // gate rows, then its up rows) and down_proj [E, H, I].
  void add_fused(int64_t il, std::vector<SafetensorsWriteTensor>& out) const {
    const std::string p = "model.layers." + std::to_string(il) + ".mlp.experts.";
    const int64_t E = kExperts, I = kExpertFf, H = kHidden;
    Weights gate_up{{E, 2 * I, H}, {}}, down{{E, H, I}, {}};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
        const std::vector<float>& v = w(x + part);
        gate_up.values.insert(gate_up.values.end(), v.begin(), v.end());
      }
      const std::vector<float>& d = w(x + "down_proj.weight");
      down.values.insert(down.values.end(), d.begin(), d.end());
    }
    out.push_back(encode(p + "gate_up_proj", gate_up));
    out.push_back(encode(p + "down_proj", down));
  }

  // Byte-level BPE (qwen2 regex); </assistant> is an added token that is not
  // special, as in Laguna's tokenizer.json. No eos_token: the eos comes from
  // config.json's eos_token_id list.
  static void write_tokenizer(const fs::path& dir) {
    const char* regex =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[tok::ByteLevelAlphabet::get().symbol(uint8_t(b))] = b;
    vocab["ab"] = 256;
    json tokenizer = {
        {"added_tokens", json::array({json{{"id", kBos}, {"content", "<|endoftext|>"}, {"special", true}},
                                      json{{"id", kPad}, {"content", "<|im_end|>"}, {"special", true}},
                                      json{{"id", kEot}, {"content", "</assistant>"}, {"special", false}}})},
        {"normalizer", json{{"type", "NFC"}}},
        {"pre_tokenizer", json{{"type", "Sequence"},
                               {"pretokenizers", json::array({json{{"type", "Split"},
                                                                   {"pattern", json{{"Regex", regex}}},
                                                                   {"behavior", "Isolated"},
                                                                   {"invert", false}},
                                                              json{{"type", "ByteLevel"},
                                                                   {"add_prefix_space", false},
                                                                   {"use_regex", false}}})}}},
        {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
    std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"pad_token": "<|im_end|>", "add_bos_token": false, "chat_template": "{{ messages }}"})";
  }

  Options o_;
  json config_;
  std::map<std::string, Weights> truth_;
  std::mt19937 rng_{2468};
};

using testing::gguf_values;

}  // namespace moeserve::convert::laguna_test
