#include "convert/model_presets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace moeserve::convert {

std::string_view arch_name(ModelArch arch) {
  switch (arch) {
    case ModelArch::kQwen3Moe:
      return "qwen3moe";
    case ModelArch::kQwen3:
      return "qwen3";
    case ModelArch::kQwen35Moe:
      return "qwen35moe";
    case ModelArch::kQwen35:
      return "qwen35";
    case ModelArch::kLaguna:
      return "laguna";
  }
  return "qwen3moe";
}

std::optional<ModelArch> arch_from_name(std::string_view name) {
  for (ModelArch arch : {ModelArch::kQwen3Moe, ModelArch::kQwen3, ModelArch::kQwen35Moe, ModelArch::kQwen35,
                         ModelArch::kLaguna}) {
    if (name == arch_name(arch)) return arch;
  }
  return std::nullopt;
}

std::vector<int32_t> ModelShape::rope_sections() const {
  const int64_t half = rope_dim() / 2;
  const int64_t s = half * 11 / 32;  // 11 for n_rot 64: [11, 11, 10, 0] as in Qwen3.5's mrope_section
  return {int32_t(s), int32_t(s), int32_t(half - 2 * s), 0};
}

namespace {

// attn_norm, q/k/v/output, q/k norms, attn_gate, ffn_norm, then the dense FFN
// or router, selection bias, experts and shared expert.
int64_t laguna_layer_params(const ModelShape& s, int64_t il) {
  const int64_t H = s.n_embd, q = s.n_head_layer(il) * s.head_dim;
  const int64_t attn = H * q * 2 + H * s.kv_dim() * 2 + 2 * s.head_dim + H * s.n_head_layer(il);
  const int64_t ffn = s.is_dense_layer(il) ? 3 * H * s.n_ff
                                           : H * s.n_expert + s.n_expert + 3 * H * s.n_ff_exp * s.n_expert +
                                                 3 * H * s.n_ff_shexp;
  return 2 * H + attn + ffn;
}

}  // namespace

int64_t ModelShape::n_params() const {
  const int64_t H = n_embd;
  if (is_laguna()) {
    int64_t total = 2 * n_vocab * H + H;  // token_embd, output, output_norm
    for (int64_t il = 0; il < n_layer; ++il) total += laguna_layer_params(*this, il);
    return total;
  }
  if (!is_hybrid()) {
    const int64_t attn = H * q_dim() * 2 + H * kv_dim() * 2 + 2 * head_dim;
    const int64_t ffn = is_moe() ? H * n_expert + 3 * H * n_ff_exp * n_expert : 3 * H * n_ff;
    const int64_t per_layer = attn + ffn + 2 * H;      // + attn_norm, ffn_norm
    return n_layer * per_layer + 2 * n_vocab * H + H;  // token_embd, output, output_norm
  }
  // attn_q holds [q | gate] per head; attn_k, attn_v, attn_output, q/k norms.
  const int64_t full_attn = H * q_dim() * 2 + H * kv_dim() * 2 + q_dim() * H + 2 * head_dim;
  // attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_conv1d, ssm_dt, ssm_a, ssm_norm, ssm_out.
  const int64_t n_v = ssm_n_v_heads;
  const int64_t delta_net = H * conv_dim() + H * ssm_inner_size() + 2 * H * n_v +
                            ssm_conv_kernel * conv_dim() + 2 * n_v + ssm_head_v_dim + ssm_inner_size() * H;
  // Router, experts, shared expert gate and FFN; or the dense FFN.
  const int64_t ffn =
      is_moe() ? H * n_expert + 3 * H * n_ff_exp * n_expert + H + 3 * H * n_ff_shexp : 3 * H * n_ff;
  int64_t total = 2 * n_vocab * H + H;  // token_embd, output, output_norm
  for (int64_t il = 0; il < n_layer; ++il) {
    total += 2 * H + ffn +
             (is_full_attention_layer(il) ? full_attn : delta_net);  // + attn_norm, post_attention_norm
  }
  return total;
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> kNames = {"tiny", "small", "30b-a3b", "35b-a3b", "27b", "laguna-xs"};
  return kNames;
}

const std::vector<std::string>& preset_names(ModelArch arch) {
  static const std::vector<std::string> kQwen3 = {"tiny", "small", "30b-a3b"};
  static const std::vector<std::string> kQwen35Moe = {"tiny", "small", "35b-a3b"};
  static const std::vector<std::string> kQwen35 = {"tiny", "small", "27b"};
  static const std::vector<std::string> kLaguna = {"tiny", "small", "laguna-xs"};
  switch (arch) {
    case ModelArch::kQwen3Moe:
    case ModelArch::kQwen3:
      return kQwen3;
    case ModelArch::kQwen35Moe:
      return kQwen35Moe;
    case ModelArch::kQwen35:
      return kQwen35;
    case ModelArch::kLaguna:
      return kLaguna;
  }
  return kQwen3;
}

std::string preset_names_string(ModelArch arch) {
  return fmt::format("{}", fmt::join(preset_names(arch), ", "));
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

// The hybrid Gated DeltaNet shapes (qwen35moe, qwen35); `preset` is one of
// preset_names(arch).
ModelShape hybrid_shape(ModelArch arch, std::string_view preset) {
  ModelShape s;
  s.arch = arch;
  s.preset = std::string(preset);
  s.rope_theta = 1e7, s.rms_eps = 1e-6;
  s.ssm_conv_kernel = 4, s.full_attention_interval = 4;
  if (preset == "tiny") {
    s.n_layer = 4, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_rot = 16;
    s.ssm_n_k_heads = 2, s.ssm_n_v_heads = 4, s.ssm_head_k_dim = 64, s.ssm_head_v_dim = 64;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 256, s.n_ff_shexp = 256, s.n_ff = 512;
    s.n_vocab = 2048, s.n_ctx = 2048;
  } else if (preset == "small") {
    s.n_layer = 16, s.n_embd = 1024, s.n_head = 8, s.n_head_kv = 2, s.head_dim = 128, s.n_rot = 32;
    s.ssm_n_k_heads = 8, s.ssm_n_v_heads = 16, s.ssm_head_k_dim = 64, s.ssm_head_v_dim = 64;
    s.n_expert = 64, s.n_expert_used = 8, s.n_ff_exp = 512, s.n_ff_shexp = 512, s.n_ff = 3072;
    s.n_vocab = 151936, s.n_ctx = 40960;
  } else if (preset == "35b-a3b") {  // Qwen3.6-35B-A3B
    s.n_layer = 40, s.n_embd = 2048, s.n_head = 16, s.n_head_kv = 2, s.head_dim = 256, s.n_rot = 64;
    s.ssm_n_k_heads = 16, s.ssm_n_v_heads = 32, s.ssm_head_k_dim = 128, s.ssm_head_v_dim = 128;
    s.n_expert = 256, s.n_expert_used = 8, s.n_ff_exp = 512, s.n_ff_shexp = 512;
    s.n_vocab = 248320, s.n_ctx = 262144;
  } else {  // 27b: Qwen3.6-27B
    s.n_layer = 64, s.n_embd = 5120, s.n_head = 24, s.n_head_kv = 4, s.head_dim = 256, s.n_rot = 64;
    s.ssm_n_k_heads = 16, s.ssm_n_v_heads = 48, s.ssm_head_k_dim = 128, s.ssm_head_v_dim = 128;
    s.n_ff = 17408;
    s.n_vocab = 248320, s.n_ctx = 262144;
  }
  if (arch == ModelArch::kQwen35Moe) {
    s.n_ff = s.n_ff_shexp;  // feed_forward_length: the shared expert, the only dense FFN of a layer
  } else {
    s.n_expert = s.n_expert_used = s.n_ff_exp = s.n_ff_shexp = 0;
  }
  return s;
}

// Laguna; `preset` is one of preset_names(kLaguna).
ModelShape laguna_shape(std::string_view preset) {
  ModelShape s;
  s.arch = ModelArch::kLaguna;
  s.preset = std::string(preset);
  s.rms_eps = 1e-6, s.rope_theta = 500000.0, s.rope_theta_swa = 10000.0;
  s.swa_period = 4, s.n_dense_lead = 1, s.expert_weights_scale = 2.5;
  s.yarn_beta_fast = 64.0, s.yarn_beta_slow = 1.0;
  if (preset == "tiny") {
    s.n_layer = 4, s.n_embd = 256, s.head_dim = 64, s.n_head = 4, s.n_head_swa = 6, s.n_head_kv = 2;
    s.n_rot = 32, s.n_rot_swa = 64, s.sliding_window = 16, s.yarn_factor = 4.0, s.yarn_orig_ctx = 64;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 128, s.n_ff_shexp = 128, s.n_ff = 512;
    s.n_vocab = 2048, s.n_ctx = 2048;
  } else if (preset == "small") {
    s.n_layer = 8, s.n_embd = 1024, s.head_dim = 128, s.n_head = 8, s.n_head_swa = 16, s.n_head_kv = 4;
    s.n_rot = 64, s.n_rot_swa = 128, s.sliding_window = 128, s.yarn_factor = 8.0, s.yarn_orig_ctx = 4096;
    s.n_expert = 64, s.n_expert_used = 8, s.n_ff_exp = 512, s.n_ff_shexp = 512, s.n_ff = 2048;
    s.n_vocab = 151936, s.n_ctx = 32768;
  } else {  // laguna-xs: Laguna-XS.2
    s.n_layer = 40, s.n_embd = 2048, s.head_dim = 128, s.n_head = 48, s.n_head_swa = 64, s.n_head_kv = 8;
    s.n_rot = 64, s.n_rot_swa = 128, s.sliding_window = 512, s.yarn_factor = 32.0, s.yarn_orig_ctx = 4096;
    s.n_expert = 256, s.n_expert_used = 8, s.n_ff_exp = 512, s.n_ff_shexp = 512, s.n_ff = 8192;
    s.n_vocab = 100352, s.n_ctx = 131072;
  }
  return s;
}

}  // namespace

Result<ModelShape> model_preset(ModelArch arch, std::string_view preset) {
  const std::vector<std::string>& all = preset_names();
  if (std::find(all.begin(), all.end(), preset) == all.end()) {
    return make_error(StatusCode::kInvalidArgument, "unknown preset '{}' (known: {})", preset, kPresetNames);
  }
  const std::vector<std::string>& own = preset_names(arch);
  if (std::find(own.begin(), own.end(), preset) == own.end()) {
    return make_error(StatusCode::kInvalidArgument, "preset '{}' is not a {} preset ({} has: {})", preset,
                      arch_name(arch), arch_name(arch), preset_names_string(arch));
  }
  ModelShape s;
  if (arch == ModelArch::kLaguna) {
    s = laguna_shape(preset);
  } else if (arch == ModelArch::kQwen35Moe || arch == ModelArch::kQwen35) {
    s = hybrid_shape(arch, preset);
  } else {
    s = moe_shape(preset);
    if (arch == ModelArch::kQwen3) make_dense(s);
  }
  s.model_name = fmt::format("moeserve-synthetic-{}-{}", arch_name(arch), preset);
  return s;
}

}  // namespace moeserve::convert
