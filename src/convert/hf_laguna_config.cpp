// config.json of LagunaForCausalLM -> HfModelConfig (hf_laguna.h).
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "convert/hf_internal.h"
#include "convert/hf_laguna.h"

namespace moeserve::convert {

namespace {

using nlohmann::json;

// `key` as a list of num_hidden_layers entries, or an error naming it.
Status check_layer_list(const ConfigReader& r, const char* key, int64_t n_layer, std::string_view what) {
  const json& v = r.root()[key];
  if (!v.is_array() || int64_t(v.size()) != n_layer) {
    return r.invalid(fmt::format("'{}' must be a list of num_hidden_layers ({}) {}, got {}", key, n_layer,
                                 what, v.dump()));
  }
  return Status::ok();
}

Status read_heads(const ConfigReader& r, HfModelConfig& c) {
  std::vector<int64_t>& heads = c.laguna.head_count;
  heads.assign(size_t(c.n_layer), c.n_head);
  constexpr const char* kKey = "num_attention_heads_per_layer";
  if (r.has(kKey)) {
    MOESERVE_RETURN_IF_ERROR(check_layer_list(r, kKey, c.n_layer, "positive integers"));
    const json& v = r.root()[kKey];
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() <= 0 || v[i].get<int64_t>() > (1 << 20)) {
        return r.invalid(
            fmt::format("'{}' entry {} must be a positive integer, got {}", kKey, i, v[i].dump()));
      }
      heads[i] = v[i].get<int64_t>();
    }
  }
  for (size_t i = 0; i < heads.size(); ++i) {
    if (heads[i] % c.n_head_kv != 0) {
      return r.invalid(fmt::format("'{}' entry {} ({} heads) is not a multiple of num_key_value_heads {}",
                                   kKey, i, heads[i], c.n_head_kv));
    }
  }
  return Status::ok();
}

// true / "per-head" -> false (one gate per head), "per-element" -> true.
std::optional<bool> gate_is_per_element(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? std::optional<bool>(false) : std::nullopt;
  if (!v.is_string()) return std::nullopt;
  const std::string s = v.get<std::string>();
  if (s == "per-head" || s == "per_head") return false;
  if (s == "per-element" || s == "per_element") return true;
  return std::nullopt;
}

// gating, and gating_types per layer (llama.cpp's reading: per-element layers
// need gating = "per-element", which transformers and vLLM read).
Status read_gating(const ConfigReader& r, HfModelConfig& c) {
  const json gating = r.has("gating") ? r.root()["gating"] : json(true);
  const std::optional<bool> per_element = gate_is_per_element(gating);
  if (!per_element) {
    return r.unsupported(
        fmt::format("gating {} (only true, \"per-head\" or \"per-element\")", gating.dump()));
  }
  c.gate_per_element.assign(size_t(c.n_layer), *per_element);
  if (!r.has("gating_types")) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(check_layer_list(r, "gating_types", c.n_layer, "gate kinds"));
  const json& types = r.root()["gating_types"];
  for (size_t i = 0; i < types.size(); ++i) {
    const std::optional<bool> kind = types[i].is_string() ? gate_is_per_element(types[i]) : std::nullopt;
    if (!kind) {
      return r.unsupported(
          fmt::format("gating_types entry {} (only \"per-head\" or \"per-element\")", types[i].dump()));
    }
    if (*kind && !*per_element) {
      return r.unsupported(
          fmt::format("gating_types with per-element layers while gating is {} (transformers reads 'gating': "
                      "set it to \"per-element\")",
                      gating.dump()));
    }
    c.gate_per_element[i] = *kind;
  }
  return Status::ok();
}

// layer_types -> sliding_window and its period P (layer i full iff i % P == 0).
Status read_layer_kinds(const ConfigReader& r, HfModelConfig& c) {
  if (!r.has("layer_types")) return Status::ok();  // transformers: every layer full attention
  MOESERVE_RETURN_IF_ERROR(check_layer_list(r, "layer_types", c.n_layer, "layer kinds"));
  const json& types = r.root()["layer_types"];
  std::vector<bool> full;
  for (const json& t : types) {
    if (t != "full_attention" && t != "sliding_attention") {
      return r.unsupported(
          fmt::format("layer_types entry {} (only \"full_attention\" and \"sliding_attention\")", t.dump()));
    }
    full.push_back(t == "full_attention");
  }
  if (std::all_of(full.begin(), full.end(), [](bool f) { return f; })) return Status::ok();
  const auto second = std::find(full.begin() + 1, full.end(), true);
  const int64_t period = second == full.end() ? c.n_layer : int64_t(second - full.begin());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    if (full[size_t(i)] != (i % period == 0)) {
      return r.unsupported(
          fmt::format("layer_types {} (layer {} is {}): GGUF stores the layer kinds only as "
                      "attention.sliding_window_pattern, so layer i must be full_attention iff i % {} == 0",
                      types.dump(), i, types[size_t(i)].dump(), period));
    }
  }
  if (!r.has("sliding_window")) {
    return r.invalid("'sliding_window' is missing, but layer_types has sliding_attention layers");
  }
  MOESERVE_ASSIGN_OR_RETURN(c.laguna.sliding_window, r.positive_int("sliding_window"));
  c.laguna.sliding_window_pattern = period;
  return Status::ok();
}

Status read_yarn(const ConfigReader& r, LagunaGgufParams& p) {
  MOESERVE_ASSIGN_OR_RETURN(p.yarn_factor, r.positive_number(r.root(), "factor"));
  MOESERVE_ASSIGN_OR_RETURN(p.yarn_orig_ctx, r.positive_int("original_max_position_embeddings"));
  const std::pair<const char*, std::optional<double>*> optional[] = {
      {"beta_fast", &p.yarn_beta_fast},
      {"beta_slow", &p.yarn_beta_slow},
      {"attention_factor", &p.yarn_attn_factor}};
  for (auto [key, out] : optional) {
    if (!r.has(key)) continue;
    MOESERVE_ASSIGN_OR_RETURN(double v, r.positive_number(r.root(), key));
    *out = v;
  }
  for (const char* key : {"mscale", "mscale_all_dim"}) {
    if (r.has(key)) return r.unsupported(fmt::format("'{}' {}", key, r.root()[key].dump()));
  }
  return Status::ok();
}

// rope_parameters[kind] ("full_attention" or "sliding_attention").
Status read_rope_kind(const json& params, const std::string& kind, std::string_view file, HfModelConfig& c) {
  const std::string name = fmt::format("{}: rope_parameters.{}", file, kind);
  const json& obj = params[kind];
  if (!obj.is_object())
    return make_error(StatusCode::kInvalidFormat, "{} must be an object, got {}", name, obj.dump());
  const ConfigReader r(obj, name);
  const bool full = kind == "full_attention";
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (!r.has(key)) continue;
    if (!obj[key].is_string())
      return r.invalid(fmt::format("'{}' must be a string, got {}", key, obj[key].dump()));
    type = obj[key].get<std::string>();
  }
  if (type != "default" && !(full && type == "yarn")) {
    return r.unsupported(fmt::format("rope_type \"{}\" ({})", type,
                                     full ? "only \"default\" or \"yarn\""
                                          : "only \"default\": the sliding-window layers are never scaled"));
  }
  MOESERVE_ASSIGN_OR_RETURN(double theta, r.positive_number(obj, "rope_theta"));
  double factor = 1.0;  // transformers' default for Laguna
  if (r.has("partial_rotary_factor")) {
    MOESERVE_ASSIGN_OR_RETURN(factor, r.positive_number(obj, "partial_rotary_factor"));
  }
  const int64_t n_rot = int64_t(double(c.head_dim) * factor);  // int() as transformers
  if (factor > 1.0 || n_rot < 2 || n_rot % 2 != 0) {
    return r.invalid(fmt::format(
        "'partial_rotary_factor' {} gives {} rotated dimensions of head_dim {} (must be even, 2..{})", factor,
        n_rot, c.head_dim, c.head_dim));
  }
  LagunaGgufParams& p = c.laguna;
  if (!full) {
    p.has_swa_rope = true, p.rope_theta_swa = theta, p.n_rot_swa = n_rot;
    return Status::ok();
  }
  p.rope_theta = c.rope_theta = theta;
  p.n_rot = c.n_rot = n_rot;
  return type == "yarn" ? read_yarn(r, p) : Status::ok();
}

Status read_ropes(const ConfigReader& r, HfModelConfig& c) {
  if (r.has("rope_scaling")) {
    return r.unsupported(fmt::format("rope_scaling {} (Laguna keeps RoPE in rope_parameters)",
                                     r.root()["rope_scaling"].dump()));
  }
  // transformers' defaults when rope_parameters is absent.
  json params = {{"full_attention",
                  {{"rope_type", "default"}, {"rope_theta", 500000.0}, {"partial_rotary_factor", 0.5}}},
                 {"sliding_attention",
                  {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 1.0}}}};
  if (r.has("rope_parameters")) params = r.root()["rope_parameters"];
  if (!params.is_object() || !params.contains("full_attention")) {
    return r.invalid(
        fmt::format("'rope_parameters' must be an object with a \"full_attention\" entry (and "
                    "\"sliding_attention\"), got {}",
                    params.dump()));
  }
  MOESERVE_RETURN_IF_ERROR(read_rope_kind(params, "full_attention", r.name(), c));
  if (params.contains("sliding_attention") && !params["sliding_attention"].is_null()) {
    MOESERVE_RETURN_IF_ERROR(read_rope_kind(params, "sliding_attention", r.name(), c));
  } else if (c.laguna.sliding_window > 0) {
    return r.invalid(
        "'rope_parameters' has no \"sliding_attention\" entry, but layer_types has sliding_attention layers");
  }
  return Status::ok();
}

// mlp_layer_types -> leading_dense_block_count.
Status read_layer_mlps(const ConfigReader& r, HfModelConfig& c) {
  if (!r.has("mlp_layer_types")) {
    if (r.has("mlp_only_layers") &&
        !(r.root()["mlp_only_layers"].is_array() && r.root()["mlp_only_layers"].empty())) {
      return r.unsupported(fmt::format("mlp_only_layers {} without mlp_layer_types (transformers ignores it)",
                                       r.root()["mlp_only_layers"].dump()));
    }
    c.laguna.leading_dense = 1;  // transformers: ["dense"] + ["sparse"] * (n - 1)
    return Status::ok();
  }
  MOESERVE_RETURN_IF_ERROR(
      check_layer_list(r, "mlp_layer_types", c.n_layer, "\"dense\" / \"sparse\" entries"));
  const json& types = r.root()["mlp_layer_types"];
  int64_t leading = 0;
  while (leading < c.n_layer && types[size_t(leading)] == "dense") ++leading;
  for (int64_t i = leading; i < c.n_layer; ++i) {
    if (types[size_t(i)] == "sparse") continue;
    if (types[size_t(i)] != "dense") {
      return r.unsupported(
          fmt::format("mlp_layer_types entry {} (only \"dense\" and \"sparse\")", types[size_t(i)].dump()));
    }
    return r.unsupported(
        fmt::format("mlp_layer_types {} (layer {} is dense after a sparse layer): GGUF stores only "
                    "leading_dense_block_count",
                    types.dump(), i));
  }
  c.laguna.leading_dense = leading;
  return Status::ok();
}

Status read_ffn(const ConfigReader& r, HfModelConfig& c) {
  MOESERVE_RETURN_IF_ERROR(read_layer_mlps(r, c));
  c.has_intermediate_size = c.laguna.leading_dense > 0 || r.has("intermediate_size");
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
  c.laguna.expert_weights_scale = 1.0;
  if (r.has("moe_routed_scaling_factor")) {
    MOESERVE_ASSIGN_OR_RETURN(c.laguna.expert_weights_scale,
                              r.positive_number(r.root(), "moe_routed_scaling_factor"));
  }
  return Status::ok();
}

Status check_unsupported(const ConfigReader& r) {
  MOESERVE_ASSIGN_OR_RETURN(bool attention_bias, r.boolean_or("attention_bias", false));
  if (attention_bias) return r.unsupported("attention_bias = true");
  if (r.has("hidden_act") && r.root()["hidden_act"] != "silu") {
    return r.unsupported(fmt::format("hidden_act {} (only \"silu\")", r.root()["hidden_act"].dump()));
  }
  MOESERVE_ASSIGN_OR_RETURN(bool on_input, r.boolean_or("moe_apply_router_weight_on_input", false));
  if (on_input) return r.unsupported("moe_apply_router_weight_on_input = true");
  if (r.has("moe_router_logit_softcapping")) {
    const json& cap = r.root()["moe_router_logit_softcapping"];
    if (!cap.is_number() || cap.get<double>() < 0) {
      return r.invalid(
          fmt::format("'moe_router_logit_softcapping' must be a number >= 0, got {}", cap.dump()));
    }
    if (cap.get<double>() > 0) {
      return r.unsupported(fmt::format("moe_router_logit_softcapping = {} (not supported yet)", cap.dump()));
    }
  }
  return Status::ok();
}

// The keys read_common_hparams and read_ffn filled, copied to c.laguna.
void fill_common_params(HfModelConfig& c) {
  LagunaGgufParams& p = c.laguna;
  p.context_length = c.context_length;
  p.embedding_length = c.hidden_size;
  p.block_count = c.n_layer;
  p.feed_forward_length = c.has_intermediate_size ? c.intermediate_size : 0;
  p.head_count_kv = c.n_head_kv;
  p.head_dim = c.head_dim;
  p.rms_eps = c.rms_eps;
  p.vocab_size = c.vocab_size;
  p.n_expert = c.n_expert;
  p.n_expert_used = c.n_expert_used;
  p.expert_ff = c.expert_ff;
  p.shared_expert_ff = c.shared_expert_ff;
}

}  // namespace

Status parse_laguna_config(const json& root, std::string_view name, HfModelConfig& c) {
  const ConfigReader r(root, name);
  MOESERVE_RETURN_IF_ERROR(read_common_hparams(r, c));
  MOESERVE_RETURN_IF_ERROR(read_heads(r, c));
  MOESERVE_RETURN_IF_ERROR(read_gating(r, c));
  MOESERVE_RETURN_IF_ERROR(read_layer_kinds(r, c));
  MOESERVE_RETURN_IF_ERROR(read_ropes(r, c));
  MOESERVE_RETURN_IF_ERROR(read_ffn(r, c));
  MOESERVE_RETURN_IF_ERROR(check_unsupported(r));
  if (r.has("eos_token_id") && root["eos_token_id"].is_array()) {
    for (const json& id : root["eos_token_id"]) {
      if (id.is_number_integer()) c.eos_token_ids.push_back(id.get<int64_t>());
    }
  }
  fill_common_params(c);
  return Status::ok();
}

}  // namespace moeserve::convert
