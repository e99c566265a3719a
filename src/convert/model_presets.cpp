#include "convert/model_presets.h"

#include <fmt/format.h>

namespace moeserve::convert {

std::string_view arch_name(ModelArch arch) {
  return arch == ModelArch::kQwen3Moe ? "qwen3moe" : "qwen3";
}

std::optional<ModelArch> arch_from_name(std::string_view name) {
  if (name == "qwen3moe") return ModelArch::kQwen3Moe;
  if (name == "qwen3") return ModelArch::kQwen3;
  return std::nullopt;
}

int64_t ModelShape::n_params() const {
  const int64_t attn = n_embd * q_dim() * 2 + n_embd * kv_dim() * 2 + 2 * head_dim;
  const int64_t ffn = is_moe() ? n_embd * n_expert + 3 * n_embd * n_ff_exp * n_expert : 3 * n_embd * n_ff;
  const int64_t per_layer = attn + ffn + 2 * n_embd;  // + attn_norm, ffn_norm
  return n_layer * per_layer + 2 * n_vocab * n_embd + n_embd;  // token_embd, output, output_norm
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> kNames = {"tiny", "small", "30b-a3b"};
  return kNames;
}

namespace {

// The MoE shapes; dense variants replace the experts by one FFN of n_ff.
ModelShape moe_shape(std::string_view preset) {
  ModelShape s;
  s.preset = std::string(preset);
  if (preset == "tiny") {
    s.n_layer = 2, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 256, s.n_vocab = 2048, s.n_ctx = 2048, s.n_ff = 512;
  } else if (preset == "small") {
    s.n_layer = 16, s.n_embd = 1024, s.n_head = 16, s.n_head_kv = 4, s.head_dim = 64;
    s.n_expert = 64, s.n_expert_used = 8, s.n_ff_exp = 512, s.n_vocab = 151936, s.n_ctx = 40960, s.n_ff = 3072;
  } else {  // 30b-a3b
    s.n_layer = 48, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 4, s.head_dim = 128;
    s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 768, s.n_vocab = 151936, s.n_ctx = 40960, s.n_ff = 6144;
  }
  return s;
}

void make_dense(ModelShape& s) {
  s.arch = ModelArch::kQwen3;
  s.n_expert = s.n_expert_used = s.n_ff_exp = 0;
  if (s.preset == "30b-a3b") {  // Qwen3-32B; tiny and small keep their n_ff
    s.n_layer = 64, s.n_embd = 5120, s.n_head = 64, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = 25600;
  }
}

}  // namespace

Result<ModelShape> model_preset(ModelArch arch, std::string_view preset) {
  bool known = false;
  for (const std::string& name : preset_names()) known = known || name == preset;
  if (!known) {
    return make_error(StatusCode::kInvalidArgument, "unknown preset '{}' (known: {})", preset, kPresetNames);
  }
  ModelShape s = moe_shape(preset);
  if (arch == ModelArch::kQwen3) make_dense(s);
  s.model_name = fmt::format("moeserve-synthetic-{}-{}", arch_name(arch), preset);
  return s;
}

}  // namespace moeserve::convert
