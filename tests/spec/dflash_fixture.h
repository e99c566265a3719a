// A DFlash draft checkpoint for the tests, the way z-lab publishes one:
// config.json (DFlashDraftModel, dflash_config.{target_layer_ids,
// mask_token_id}, block_size) and model.safetensors (fc, hidden_norm, norm,
// layers.N.*) with random weights, sized for a given target; converted to
// GGUF with `moeserve convert`'s code. Options break it in the ways the
// error tests need.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "convert/hf_convert.h"
#include "convert/safetensors_values.h"
#include "format/safetensors.h"

namespace moeserve::spec::testing {

namespace fs = std::filesystem;

struct DraftShape {
  int64_t hidden = 0;  // the target's n_embd unless a test breaks it
  int64_t layers = 2, heads = 4, kv_heads = 2, head_dim = 32,
          ff = 48;  // heads of 32: a size CUDA's attention takes
  int64_t block_size = 8;
  std::vector<int32_t> target_layers{0, 1};
  int64_t mask_token_id = 0;
  int64_t vocab = 0;                // the target's
  int64_t num_target_layers = 0;    // 0: not written
  bool sliding_last_layer = false;  // layer_types: the last one sliding_attention (window 4)
  bool dflash2 = false;             // a DFlash2 config key
  float scale = 0.08f;              // weights ~ U(-scale, scale)
  uint32_t seed = 7;
};

inline Status write_draft_checkpoint(const fs::path& dir, const DraftShape& s) {
  using nlohmann::json;
  fs::create_directories(dir);
  json c;
  c["architectures"] = {"DFlashDraftModel"};
  c["hidden_size"] = s.hidden;
  c["num_hidden_layers"] = s.layers;
  c["num_attention_heads"] = s.heads;
  c["num_key_value_heads"] = s.kv_heads;
  c["head_dim"] = s.head_dim;
  c["intermediate_size"] = s.ff;
  c["vocab_size"] = s.vocab;
  c["max_position_embeddings"] = 4096;
  c["rms_norm_eps"] = 1e-6;
  c["rope_theta"] = 1000000.0;
  c["block_size"] = s.block_size;
  c["dflash_config"] = {{"target_layer_ids", s.target_layers}, {"mask_token_id", s.mask_token_id}};
  if (s.num_target_layers > 0) c["num_target_layers"] = s.num_target_layers;
  if (s.dflash2) c["dflash_config"]["conv_kernel_size"] = 4;
  if (s.sliding_last_layer) {
    std::vector<std::string> types(size_t(s.layers), "full_attention");
    types.back() = "sliding_attention";
    c["layer_types"] = types;
    c["sliding_window"] = 4;
  }
  std::ofstream(dir / "config.json") << c.dump(2);

  std::mt19937 rng(s.seed);
  std::uniform_real_distribution<float> u(-s.scale, s.scale);
  std::vector<SafetensorsWriteTensor> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = norm ? 1.0f + u(rng) : u(rng);
    tensors.push_back(convert::testing::safetensors_tensor(name, DType::F32, shape, v));
  };
  const int64_t H = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  add("fc.weight", {H, int64_t(s.target_layers.size()) * H}, false);
  add("hidden_norm.weight", {H}, true);
  add("norm.weight", {H}, true);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, true);
    add(p + "post_attention_layernorm.weight", {H}, true);
    add(p + "self_attn.q_proj.weight", {q, H}, false);
    add(p + "self_attn.k_proj.weight", {kv, H}, false);
    add(p + "self_attn.v_proj.weight", {kv, H}, false);
    add(p + "self_attn.o_proj.weight", {H, q}, false);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, true);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, true);
    add(p + "mlp.gate_proj.weight", {s.ff, H}, false);
    add(p + "mlp.up_proj.weight", {s.ff, H}, false);
    add(p + "mlp.down_proj.weight", {H, s.ff}, false);
  }
  MOESERVE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, write_safetensors(tensors, {{"format", "pt"}}));
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return Status::ok();
}

// The checkpoint converted to `gguf` (F32, so a reference can read it exactly).
inline Status convert_draft(const fs::path& dir, const fs::path& gguf) {
  convert::ConvertOptions o;
  o.hf_dir = dir.string();
  o.output_path = gguf.string();
  o.file_type = convert::FileType::kF32;
  o.threads = 2;
  o.progress = ProgressOptions::Mode::kOff;
  return convert::convert_hf_model(o).status();
}

}  // namespace moeserve::spec::testing
