#include "convert/hf_qwen35.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "convert/hf_internal.h"
#include "format/model_keys.h"

namespace moeserve::convert {

namespace {

using nlohmann::json;

// RoPE: rope_parameters (transformers v5), else the legacy rope_scaling
// object and top-level rope_theta / partial_rotary_factor.
Status read_rope(const ConfigReader& r, HfModelConfig& c) {
  const json& root = r.root();
  const char* key = r.has("rope_parameters") ? "rope_parameters"
                    : r.has("rope_scaling")  ? "rope_scaling"
                                             : nullptr;
  json params = json::object();
  if (key != nullptr) {
    if (!root[key].is_object()) return r.unsupported(fmt::format("{} that is not an object", key));
    params = root[key];
  }
  for (const char* type_key : {"rope_type", "type"}) {
    if (params.contains(type_key) && !params[type_key].is_null() && params[type_key] != "default") {
      return r.unsupported(
          fmt::format("{}.{} {} (only \"default\")", key, type_key, params[type_key].dump()));
    }
  }
  MOESERVE_ASSIGN_OR_RETURN(c.rope_theta,
                            r.positive_number(params.contains("rope_theta") ? params : root, "rope_theta"));

  const json& prf_obj = params.contains("partial_rotary_factor") ? params : root;
  double factor = 0.25;  // transformers' default for these models
  if (prf_obj.contains("partial_rotary_factor") && !prf_obj["partial_rotary_factor"].is_null()) {
    MOESERVE_ASSIGN_OR_RETURN(factor, r.positive_number(prf_obj, "partial_rotary_factor"));
  }
  c.n_rot = int64_t(double(c.head_dim) * factor);  // int() as llama.cpp and transformers
  if (factor > 1.0 || c.n_rot < 2 || c.n_rot % 2 != 0) {
    return r.invalid(fmt::format(
        "'partial_rotary_factor' {} gives {} rotated dimensions of head_dim {} (must be even, 2..{})", factor,
        c.n_rot, c.head_dim, c.head_dim));
  }

  c.rope_sections = {11, 11, 10, 0};
  if (params.contains("mrope_section") && !params["mrope_section"].is_null()) {
    const json& s = params["mrope_section"];
    bool ok = s.is_array() && s.size() <= 4;
    for (size_t i = 0; ok && i < s.size(); ++i)
      ok = s[i].is_number_integer() && s[i].get<int64_t>() >= 0 && s[i].get<int64_t>() < (1 << 20);
    if (!ok)
      return r.invalid(
          fmt::format("'mrope_section' must be a list of at most 4 non-negative integers, got {}", s.dump()));
    c.rope_sections.assign(4, 0);
    for (size_t i = 0; i < s.size(); ++i) c.rope_sections[i] = int32_t(s[i].get<int64_t>());
  }
  // mrope_interleaved: text tokens have equal positions on every M-RoPE axis,
  // where interleaved and sectioned M-RoPE both are plain RoPE.
  return Status::ok();
}

// full_attention_interval, checked against layer_types when both are known.
Status read_layer_kinds(const ConfigReader& r, HfModelConfig& c) {
  std::optional<int64_t> interval;
  if (r.has("full_attention_interval")) {
    MOESERVE_ASSIGN_OR_RETURN(interval, r.positive_int("full_attention_interval"));
  }
  if (!r.has("layer_types")) {
    c.full_attention_interval = interval.value_or(4);
    return Status::ok();
  }
  const json& types = r.root()["layer_types"];
  if (!types.is_array() || int64_t(types.size()) != c.n_layer) {
    return r.invalid(fmt::format("'layer_types' must be a list of num_hidden_layers ({}) entries, got {}",
                                 c.n_layer,
                                 types.is_array() ? fmt::format("{} entries", types.size()) : types.dump()));
  }
  std::vector<bool> full;
  for (const json& t : types) {
    // transformers maps the legacy "attention" / "mamba" to these two.
    if (t == "full_attention" || t == "attention") {
      full.push_back(true);
    } else if (t == "linear_attention" || t == "mamba") {
      full.push_back(false);
    } else {
      return r.unsupported(
          fmt::format("layer_types entry {} (only \"linear_attention\" and \"full_attention\")", t.dump()));
    }
  }
  if (!interval) {
    const auto first = std::find(full.begin(), full.end(), true);
    // No full layer at all: an interval past the last layer (4 as transformers
    // writes it for models of fewer than 4 layers).
    interval = first != full.end() ? int64_t(first - full.begin()) + 1 : std::max<int64_t>(4, c.n_layer + 1);
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    if (full[size_t(i)] != ((i + 1) % *interval == 0)) {
      return r.unsupported(
          fmt::format("layer_types {} (layer {} is {}): GGUF stores the layer kinds only as "
                      "full_attention_interval, so every "
                      "{}th layer must be full_attention and the others linear_attention",
                      types.dump(), i, types[size_t(i)].dump(), *interval));
    }
  }
  c.full_attention_interval = *interval;
  return Status::ok();
}

Status read_ffn(const ConfigReader& r, HfModelConfig& c) {
  if (c.arch == "qwen35") {
    MOESERVE_ASSIGN_OR_RETURN(c.intermediate_size, r.positive_int("intermediate_size"));
    return Status::ok();
  }
  // qwen35moe: intermediate_size is not a field of the MoE text config;
  // like llama.cpp, feed_forward_length is written only when it is there.
  c.has_intermediate_size = r.has("intermediate_size");
  if (c.has_intermediate_size) {
    MOESERVE_ASSIGN_OR_RETURN(c.intermediate_size, r.positive_int("intermediate_size"));
  }
  const char* experts_key = r.has("num_experts") ? "num_experts" : "num_local_experts";
  MOESERVE_ASSIGN_OR_RETURN(c.n_expert, r.positive_int(experts_key));
  MOESERVE_ASSIGN_OR_RETURN(c.n_expert_used, r.positive_int("num_experts_per_tok"));
  MOESERVE_ASSIGN_OR_RETURN(c.expert_ff, r.positive_int("moe_intermediate_size"));
  MOESERVE_ASSIGN_OR_RETURN(c.shared_expert_ff, r.positive_int("shared_expert_intermediate_size"));
  if (c.n_expert_used > c.n_expert) {
    return r.invalid(
        fmt::format("num_experts_per_tok {} is more than {} {}", c.n_expert_used, experts_key, c.n_expert));
  }
  // Qwen3-Next's layout keys; the Qwen3.5 config has neither (every layer MoE).
  MOESERVE_ASSIGN_OR_RETURN(int64_t sparse_step, r.positive_int_or("decoder_sparse_step", 1));
  if (sparse_step != 1)
    return r.unsupported(fmt::format("decoder_sparse_step = {} (only 1: every layer MoE)", sparse_step));
  if (r.has("mlp_only_layers") &&
      !(r.root()["mlp_only_layers"].is_array() && r.root()["mlp_only_layers"].empty())) {
    return r.unsupported(fmt::format("mlp_only_layers {}", r.root()["mlp_only_layers"].dump()));
  }
  return Status::ok();
}

Status read_delta_net(const ConfigReader& r, HfModelConfig& c) {
  MOESERVE_ASSIGN_OR_RETURN(c.conv_kernel, r.positive_int("linear_conv_kernel_dim"));
  MOESERVE_ASSIGN_OR_RETURN(c.head_k_dim, r.positive_int("linear_key_head_dim"));
  MOESERVE_ASSIGN_OR_RETURN(c.head_v_dim, r.positive_int("linear_value_head_dim"));
  MOESERVE_ASSIGN_OR_RETURN(c.n_k_heads, r.positive_int("linear_num_key_heads"));
  MOESERVE_ASSIGN_OR_RETURN(c.n_v_heads, r.positive_int("linear_num_value_heads"));
  if (c.n_v_heads % c.n_k_heads != 0) {
    return r.unsupported(
        fmt::format("linear_num_value_heads {} that is not a multiple of linear_num_key_heads {}",
                    c.n_v_heads, c.n_k_heads));
  }
  return Status::ok();
}

Status check_unsupported(const ConfigReader& r) {
  MOESERVE_ASSIGN_OR_RETURN(bool attention_bias, r.boolean_or("attention_bias", false));
  if (attention_bias) return r.unsupported("attention_bias = true");
  MOESERVE_ASSIGN_OR_RETURN(bool output_gate, r.boolean_or("attn_output_gate", true));
  if (!output_gate) return r.unsupported("attn_output_gate = false (the hybrids' attention is gated)");
  MOESERVE_ASSIGN_OR_RETURN(bool sliding, r.boolean_or("use_sliding_window", false));
  if (sliding) return r.unsupported("use_sliding_window = true");
  if (r.has("hidden_act") && r.root()["hidden_act"] != "silu") {
    return r.unsupported(fmt::format("hidden_act {} (only \"silu\")", r.root()["hidden_act"].dump()));
  }
  return Status::ok();
}

// Identity for [0, offset), then `order`'s heads of `block` entries each.
std::vector<int64_t> head_index_map(int64_t offset, const std::vector<int64_t>& order, int64_t block) {
  std::vector<int64_t> map(size_t(offset + int64_t(order.size()) * block));
  for (int64_t i = 0; i < offset; ++i) map[size_t(i)] = i;
  for (size_t h = 0; h < order.size(); ++h) {
    for (int64_t i = 0; i < block; ++i)
      map[size_t(offset + int64_t(h) * block + i)] = offset + order[h] * block + i;
  }
  return map;
}

class LayerPlanner {
 public:
  LayerPlanner(HfTensorPlanner& pl, const std::string& root) : pl_(pl), c_(pl.config()), root_(root) {
    if (c_.n_v_heads != c_.n_k_heads) order_ = qwen35_v_head_order(c_.n_k_heads, c_.n_v_heads);
  }

  Status layer(int il) {
    const std::string p = fmt::format("{}layers.{}.", root_, il);
    const int64_t H = c_.hidden_size;
    MOESERVE_RETURN_IF_ERROR(norm(p + "input_layernorm.weight", keys::blk(il, keys::kAttnNorm), H));
    MOESERVE_RETURN_IF_ERROR(c_.is_full_attention_layer(il) ? attention(il, p + "self_attn.")
                                                            : delta_net(il, p + "linear_attn."));
    MOESERVE_RETURN_IF_ERROR(
        norm(p + "post_attention_layernorm.weight", keys::blk(il, keys::kPostAttentionNorm), H));
    return c_.is_moe() ? moe(il, p + "mlp.") : dense(il, p + "mlp.");
  }

 private:
  // A zero-centred RMSNorm weight, stored as w + 1.
  Status norm(const std::string& hf, const std::string& gguf, int64_t n) {
    MOESERVE_RETURN_IF_ERROR(pl_.direct(hf, gguf, {n}));
    pl_.last().transform = ValueTransform::kPlusOne;
    return Status::ok();
  }

  Status attention(int il, const std::string& s) {
    const int64_t H = c_.hidden_size, D = c_.head_dim;
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(s + "q_proj.weight", keys::blk(il, keys::kAttnQ), {2 * c_.n_head * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(s + "k_proj.weight", keys::blk(il, keys::kAttnK), {c_.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(s + "v_proj.weight", keys::blk(il, keys::kAttnV), {c_.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(s + "o_proj.weight", keys::blk(il, keys::kAttnOutput), {H, c_.n_head * D}));
    MOESERVE_RETURN_IF_ERROR(norm(s + "q_norm.weight", keys::blk(il, keys::kAttnQNorm), D));
    return norm(s + "k_norm.weight", keys::blk(il, keys::kAttnKNorm), D);
  }

  // V-head reorder map (transform 4): empty when n_v == n_k.
  std::vector<int64_t> v_heads(int64_t offset, int64_t block) const {
    return order_.empty() ? std::vector<int64_t>() : head_index_map(offset, order_, block);
  }

  Status delta_net(int il, const std::string& a) {
    const int64_t H = c_.hidden_size, nv = c_.n_v_heads, dv = c_.head_v_dim;
    const int64_t qk = 2 * c_.n_k_heads * c_.head_k_dim, conv_dim = qk + nv * dv;
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(a + "in_proj_qkv.weight", keys::blk(il, keys::kAttnQkv), {conv_dim, H}));
    pl_.last().row_map = v_heads(qk, dv);  // rows [q | k | v]: only v moves
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(a + "in_proj_z.weight", keys::blk(il, keys::kAttnGate), {nv * dv, H}));
    pl_.last().row_map = v_heads(0, dv);
    MOESERVE_RETURN_IF_ERROR(pl_.direct(a + "in_proj_b.weight", keys::blk(il, keys::kSsmBeta), {nv, H}));
    pl_.last().row_map = v_heads(0, 1);
    MOESERVE_RETURN_IF_ERROR(pl_.direct(a + "in_proj_a.weight", keys::blk(il, keys::kSsmAlpha), {nv, H}));
    pl_.last().row_map = v_heads(0, 1);
    MOESERVE_RETURN_IF_ERROR(pl_.direct(a + "conv1d.weight", keys::blk(il, keys::kSsmConv1d),
                                        {conv_dim, 1, c_.conv_kernel}, {c_.conv_kernel, conv_dim}));
    pl_.last().row_map = v_heads(qk, dv);  // one row per channel
    MOESERVE_RETURN_IF_ERROR(pl_.direct(a + "dt_bias", keys::blk(il, keys::kSsmDt, "bias"), {nv}));
    pl_.last().col_map = v_heads(0, 1);  // 1-D: one row of n_v
    MOESERVE_RETURN_IF_ERROR(pl_.direct(a + "A_log", keys::blk(il, keys::kSsmA, ""), {nv}));
    pl_.last().col_map = v_heads(0, 1);
    pl_.last().transform = ValueTransform::kNegExp;
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(a + "norm.weight", keys::blk(il, keys::kSsmNorm), {dv}));  // not zero-centred
    MOESERVE_RETURN_IF_ERROR(pl_.direct(a + "out_proj.weight", keys::blk(il, keys::kSsmOut), {H, nv * dv}));
    pl_.last().col_map = v_heads(0, dv);
    return Status::ok();
  }

  Status moe(int il, const std::string& m) {
    const int64_t H = c_.hidden_size, S = c_.shared_expert_ff;
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(m + "gate.weight", keys::blk(il, keys::kFfnGateInp), {c_.n_expert, H}));
    MOESERVE_RETURN_IF_ERROR(pl_.experts(il, m + "experts.", c_.n_expert, c_.expert_ff));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(m + "shared_expert_gate.weight", keys::blk(il, keys::kFfnGateInpShexp), {1, H}, {H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(m + "shared_expert.gate_proj.weight", keys::blk(il, keys::kFfnGateShexp), {S, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(m + "shared_expert.up_proj.weight", keys::blk(il, keys::kFfnUpShexp), {S, H}));
    return pl_.direct(m + "shared_expert.down_proj.weight", keys::blk(il, keys::kFfnDownShexp), {H, S});
  }

  Status dense(int il, const std::string& m) {
    const int64_t H = c_.hidden_size, I = c_.intermediate_size;
    MOESERVE_RETURN_IF_ERROR(pl_.direct(m + "gate_proj.weight", keys::blk(il, keys::kFfnGate), {I, H}));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(m + "up_proj.weight", keys::blk(il, keys::kFfnUp), {I, H}));
    return pl_.direct(m + "down_proj.weight", keys::blk(il, keys::kFfnDown), {H, I});
  }

  HfTensorPlanner& pl_;
  const HfModelConfig& c_;
  std::string root_;
  std::vector<int64_t> order_;
};

}  // namespace

std::vector<int64_t> qwen35_v_head_order(int64_t n_k_heads, int64_t n_v_heads) {
  const int64_t r = n_v_heads / n_k_heads;
  std::vector<int64_t> order(static_cast<size_t>(n_v_heads));
  for (int64_t h = 0; h < n_v_heads; ++h) {
    const int64_t j = h / n_k_heads, g = h % n_k_heads;  // GGUF head j·n_k + g
    order[size_t(h)] = g * r + j;                        // was HF head g·r + j
  }
  return order;
}

Status parse_qwen35_config(const json& top, std::string_view name, HfModelConfig& c) {
  // A composite (multimodal) config keeps the language model's keys in
  // text_config; they win over the top level's, as in llama.cpp.
  json merged = top;
  if (top.contains("text_config") && !top["text_config"].is_null()) {
    if (!top["text_config"].is_object()) {
      return make_error(StatusCode::kInvalidFormat, "{}: 'text_config' must be an object", name);
    }
    for (const auto& [key, value] : top["text_config"].items()) merged[key] = value;
  }
  const ConfigReader r(merged, name);
  c.hybrid = true;
  MOESERVE_RETURN_IF_ERROR(read_common_hparams(r, c));
  MOESERVE_RETURN_IF_ERROR(read_ffn(r, c));
  MOESERVE_RETURN_IF_ERROR(read_rope(r, c));
  MOESERVE_RETURN_IF_ERROR(read_delta_net(r, c));
  MOESERVE_RETURN_IF_ERROR(read_layer_kinds(r, c));
  MOESERVE_RETURN_IF_ERROR(check_unsupported(r));
  if (r.has("mtp_num_hidden_layers") && merged["mtp_num_hidden_layers"] != 0) {
    c.notes.push_back(
        fmt::format("mtp_num_hidden_layers = {}: the multi-token-prediction layers are not converted",
                    merged["mtp_num_hidden_layers"].dump()));
  }
  return Status::ok();
}

void write_qwen35_hparams(const HfModelConfig& c, GgufWriter& w) {
  auto key = [&](std::string_view suffix) { return keys::arch_key(c.arch, suffix); };
  w.set_string(keys::kArchitecture, c.arch);
  w.set_u32(key(keys::kContextLength), uint32_t(c.context_length));
  w.set_u32(key(keys::kEmbeddingLength), uint32_t(c.hidden_size));
  w.set_u32(key(keys::kBlockCount), uint32_t(c.n_layer));
  if (c.has_intermediate_size) w.set_u32(key(keys::kFeedForwardLength), uint32_t(c.intermediate_size));
  w.set_u32(key(keys::kHeadCount), uint32_t(c.n_head));
  w.set_u32(key(keys::kHeadCountKv), uint32_t(c.n_head_kv));
  w.set_u32(key(keys::kKeyLength), uint32_t(c.head_dim));
  w.set_u32(key(keys::kValueLength), uint32_t(c.head_dim));
  w.set_f32(key(keys::kRmsEps), float(c.rms_eps));
  w.set_f32(key(keys::kRopeFreqBase), float(c.rope_theta));
  w.set_u32(key(keys::kRopeDimensionCount), uint32_t(c.n_rot));
  w.set_i32_array(key(keys::kRopeDimensionSections), c.rope_sections);
  w.set_u32(key(keys::kSsmConvKernel), uint32_t(c.conv_kernel));
  w.set_u32(key(keys::kSsmStateSize), uint32_t(c.head_k_dim));
  w.set_u32(key(keys::kSsmGroupCount), uint32_t(c.n_k_heads));
  w.set_u32(key(keys::kSsmTimeStepRank), uint32_t(c.n_v_heads));
  w.set_u32(key(keys::kSsmInnerSize), uint32_t(c.n_v_heads * c.head_v_dim));
  w.set_u32(key(keys::kFullAttentionInterval), uint32_t(c.full_attention_interval));
  if (c.is_moe()) {
    w.set_u32(key(keys::kExpertCount), uint32_t(c.n_expert));
    w.set_u32(key(keys::kExpertUsedCount), uint32_t(c.n_expert_used));
    w.set_u32(key(keys::kExpertFeedForwardLength), uint32_t(c.expert_ff));
    w.set_u32(key(keys::kExpertSharedFeedForwardLength), uint32_t(c.shared_expert_ff));
  }
}

Status plan_qwen35_tensors(HfTensorPlanner& pl) {
  const HfModelConfig& c = pl.config();
  // The released multimodal checkpoints nest the language model.
  const std::string root =
      pl.find("model.language_model.embed_tokens.weight") != nullptr ? "model.language_model." : "model.";
  MOESERVE_RETURN_IF_ERROR(pl.globals(root));
  LayerPlanner layers(pl, root);
  for (int il = 0; il < int(c.n_layer); ++il) MOESERVE_RETURN_IF_ERROR(layers.layer(il));
  int64_t n_visual = 0, n_mtp = 0;
  MOESERVE_RETURN_IF_ERROR(pl.check_all_used([&](const std::string& name) {
    int64_t* count = name.starts_with("model.visual.") || name.starts_with("visual.") ? &n_visual
                     : name.starts_with("mtp.") || name.starts_with("model.mtp.")     ? &n_mtp
                                                                                      : nullptr;
    if (count != nullptr) ++*count;
    return count != nullptr;
  }));
  if (n_visual > 0) {
    pl.notes().push_back(fmt::format(
        "skipped {} vision-tower tensors (model.visual.*): only the language model is converted", n_visual));
  }
  if (n_mtp > 0) {
    pl.notes().push_back(
        fmt::format("skipped {} multi-token-prediction tensors (mtp.*): the engine does not run MTP", n_mtp));
  }
  return Status::ok();
}

}  // namespace moeserve::convert
