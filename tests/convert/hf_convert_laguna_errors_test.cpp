// What `moeserve convert` refuses in Laguna checkpoints: every config.json
// feature the GGUF (or the engine) cannot represent gives an error naming the
// key, and mismatched weights an error naming the tensor; no file is written.
#include <gtest/gtest.h>

#include <functional>

#include "convert/hf_config.h"
#include "convert/hf_convert.h"
#include "laguna_hf_fixture.h"

namespace moeserve::convert::laguna_test {
namespace {

struct ConfigCase {
  const char* what;
  std::function<void(json&)> edit;
  std::vector<const char*> message_parts;
};

TEST(HfLagunaConfig, RefusedFeaturesNameTheKey) {
  const std::vector<ConfigCase> cases = {
      {"router weight on input",
       [](json& c) { c["moe_apply_router_weight_on_input"] = true; },
       {"moe_apply_router_weight_on_input = true is not supported"}},
      {"softcapping",
       [](json& c) { c["moe_router_logit_softcapping"] = 30.0; },
       {"moe_router_logit_softcapping = 30.0 (not supported yet)"}},
      {"attention bias", [](json& c) { c["attention_bias"] = true; }, {"attention_bias = true"}},
      {"gelu", [](json& c) { c["hidden_act"] = "gelu"; }, {"hidden_act \"gelu\""}},
      {"gating false", [](json& c) { c["gating"] = false; }, {"gating false"}},
      {"gating string", [](json& c) { c["gating"] = "per-channel"; }, {"gating \"per-channel\""}},
      {"per-element gating_types under a per-head gating",
       [](json& c) {
         c["gating_types"] = {"per-head", "per-element", "per-head", "per-head"};
       },
       {"gating_types", "gating is true"}},
      {"linear rope",
       [](json& c) { c["rope_parameters"]["full_attention"]["rope_type"] = "linear"; },
       {"rope_parameters.full_attention", "rope_type \"linear\""}},
      {"yarn on sliding layers",
       [](json& c) {
         c["rope_parameters"]["sliding_attention"] = {{"rope_type", "yarn"},
                                                      {"rope_theta", 1e4},
                                                      {"factor", 2.0},
                                                      {"original_max_position_embeddings", 64}};
       },
       {"rope_parameters.sliding_attention", "rope_type \"yarn\""}},
      {"yarn without factor",
       [](json& c) { c["rope_parameters"]["full_attention"].erase("factor"); },
       {"rope_parameters.full_attention", "'factor' is missing"}},
      {"yarn without original context",
       [](json& c) { c["rope_parameters"]["full_attention"].erase("original_max_position_embeddings"); },
       {"'original_max_position_embeddings' is missing"}},
      {"no sliding rope",
       [](json& c) { c["rope_parameters"].erase("sliding_attention"); },
       {"'rope_parameters' has no \"sliding_attention\" entry"}},
      {"flat rope_parameters",
       [](json& c) {
         c["rope_parameters"] = {{"rope_theta", 1e4}};
       },
       {"'rope_parameters' must be an object with a \"full_attention\" entry"}},
      {"legacy rope_scaling",
       [](json& c) {
         c["rope_scaling"] = {{"type", "yarn"}};
       },
       {"rope_scaling"}},
      {"aperiodic layer_types",
       [](json& c) {
         c["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
       },
       {"layer_types", "(layer 3 is \"full_attention\")", "i % 2 == 0"}},
      {"sliding first layer",
       [](json& c) {
         c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
       },
       {"layer_types", "(layer 0 is \"sliding_attention\")"}},
      {"unknown layer type",
       [](json& c) { c["layer_types"][1] = "chunked_attention"; },
       {"layer_types entry \"chunked_attention\""}},
      {"layer_types length",
       [](json& c) { c["layer_types"] = {"full_attention"}; },
       {"'layer_types' must be a list of num_hidden_layers (4)"}},
      {"no window", [](json& c) { c.erase("sliding_window"); }, {"'sliding_window' is missing"}},
      {"zero window",
       [](json& c) { c["sliding_window"] = 0; },
       {"'sliding_window' must be a positive integer"}},
      {"dense after sparse",
       [](json& c) {
         c["mlp_layer_types"] = {"dense", "sparse", "dense", "sparse"};
       },
       {"mlp_layer_types", "layer 2 is dense after a sparse layer"}},
      {"unknown mlp type",
       [](json& c) { c["mlp_layer_types"][3] = "moe"; },
       {"mlp_layer_types entry \"moe\""}},
      {"mlp_only_layers alone",
       [](json& c) {
         c.erase("mlp_layer_types");
         c["mlp_only_layers"] = {0, 1};
       },
       {"mlp_only_layers [0,1]"}},
      {"heads per layer length",
       [](json& c) {
         c["num_attention_heads_per_layer"] = {2, 4};
       },
       {"'num_attention_heads_per_layer' must be a list of num_hidden_layers (4)"}},
      {"heads not a multiple of kv",
       [](json& c) { c["num_attention_heads_per_layer"][1] = 3; },
       {"'num_attention_heads_per_layer' entry 1 (3 heads) is not a multiple of num_key_value_heads 2"}},
      {"missing shared expert",
       [](json& c) { c.erase("shared_expert_intermediate_size"); },
       {"'shared_expert_intermediate_size' is missing"}},
      {"too many experts per token",
       [](json& c) { c["num_experts_per_tok"] = 5; },
       {"num_experts_per_tok 5 is more than num_experts 4"}},
      {"dense layer without intermediate_size",
       [](json& c) { c.erase("intermediate_size"); },
       {"'intermediate_size' is missing"}},
  };
  for (const ConfigCase& c : cases) {
    TinyLaguna model;
    c.edit(model.config());
    Result<HfModelConfig> r = parse_hf_config(model.config().dump(), "dir/config.json");
    ASSERT_FALSE(r.is_ok()) << c.what;
    EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos) << c.what;
    for (const char* part : c.message_parts) {
      EXPECT_NE(r.status().message().find(part), std::string::npos)
          << c.what << ": '" << part << "' not in: " << r.status().to_string();
    }
  }
}

struct TensorCase {
  const char* what;
  std::function<void(TinyLaguna&)> damage;
  const char* message_part;
};

// Weights that do not match config.json: the error names the tensor.
TEST(HfLagunaTensors, MismatchedWeightsNameTheTensor) {
  const fs::path dir = fs::temp_directory_path() / "moeserve_laguna_tensor_errors";
  const std::vector<TensorCase> cases = {
      {"per-element g_proj under gating true",
       [](TinyLaguna& m) {
         m.truth()["model.layers.1.self_attn.g_proj.weight"] = {
             {kSwaHeads * kHeadDim, kHidden}, std::vector<float>(kSwaHeads * kHeadDim * kHidden)};
       },
       "tensor 'model.layers.1.self_attn.g_proj.weight' has shape [32, 32]: 32 outputs contradict the "
       "per-head "
       "output gate of gating (expected [4, 32]"},
      {"per-head g_proj under gating per-element",
       [](TinyLaguna& m) { m.config()["gating"] = "per-element"; },
       "tensor 'model.layers.0.self_attn.g_proj.weight' has shape [2, 32]: 2 outputs contradict the "
       "per-element"},
      {"missing selection bias",
       [](TinyLaguna& m) { m.truth().erase("model.layers.2.mlp.gate.e_score_correction_bias"); },
       "tensor 'model.layers.2.mlp.gate.e_score_correction_bias' (or "
       "'model.layers.2.mlp.experts.e_score_correction_bias') is missing"},
      {"missing shared expert",
       [](TinyLaguna& m) { m.truth().erase("model.layers.3.mlp.shared_experts.up_proj.weight"); },
       "tensor 'model.layers.3.mlp.shared_experts.up_proj.weight' is missing"},
      {"q_proj of the wrong head count",
       [](TinyLaguna& m) {
         m.truth()["model.layers.2.self_attn.q_proj.weight"] = {
             {kSwaHeads * kHeadDim, kHidden}, std::vector<float>(kSwaHeads * kHeadDim * kHidden)};
       },
       "tensor 'model.layers.2.self_attn.q_proj.weight' has shape [32, 32], config.json implies [16, 32]"},
      {"dense weights on a MoE layer",
       [](TinyLaguna& m) {
         m.truth()["model.layers.1.mlp.gate_proj.weight"] = {{2}, {1, 2}};
       },
       "not used by the laguna conversion: model.layers.1.mlp.gate_proj.weight"},
  };
  for (const TensorCase& c : cases) {
    TinyLaguna model;
    c.damage(model);
    fs::remove_all(dir);
    model.write(dir / "hf");
    ConvertOptions options;
    options.hf_dir = (dir / "hf").string();
    options.output_path = (dir / "out.gguf").string();
    options.threads = 1;
    options.progress = ProgressOptions::Mode::kOff;
    Result<ConvertSummary> r = convert_hf_model(options);
    ASSERT_FALSE(r.is_ok()) << c.what;
    EXPECT_NE(r.status().message().find(c.message_part), std::string::npos)
        << c.what << ": " << r.status().to_string();
    EXPECT_FALSE(fs::exists(dir / "out.gguf")) << c.what;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::convert::laguna_test
