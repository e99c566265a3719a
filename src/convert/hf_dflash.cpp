#include "convert/hf_dflash.h"

#include <fmt/format.h>

#include "convert/hf_internal.h"
#include "format/model_keys.h"

namespace moeserve::convert {
namespace {

using nlohmann::json;

// A key of dflash_config, or of the top level (older and newer drafts differ).
const json* draft_key(const json& root, const char* key) {
  if (root.contains("dflash_config") && root["dflash_config"].is_object() &&
      root["dflash_config"].contains(key) && !root["dflash_config"][key].is_null()) {
    return &root["dflash_config"][key];
  }
  return root.contains(key) && !root[key].is_null() ? &root[key] : nullptr;
}

Status read_layer_kinds(const ConfigReader& r, HfModelConfig& c) {
  const json& root = r.root();
  DflashGgufParams& d = c.dflash;
  d.sliding.assign(size_t(c.n_layer), 0);
  if (r.has("layer_types")) {
    const json& t = root["layer_types"];
    if (!t.is_array() || int64_t(t.size()) != c.n_layer)
      return r.invalid(fmt::format("layer_types must list {} layers", c.n_layer));
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] == "sliding_attention") {
        d.sliding[i] = 1;
      } else if (t[i] != "full_attention") {
        return r.unsupported(fmt::format("layer_types entry {}", t[i].dump()));
      }
    }
  }
  const bool any_sliding = std::find(d.sliding.begin(), d.sliding.end(), 1) != d.sliding.end();
  if (any_sliding) {
    MOESERVE_ASSIGN_OR_RETURN(d.sliding_window, r.positive_int("sliding_window"));
  }
  // The block is non-causal on full-attention layers and causal on sliding
  // ones, unless the config says is_causal (DFlash's attention).
  d.causal = d.sliding;
  if (r.has("is_causal")) {
    MOESERVE_ASSIGN_OR_RETURN(bool causal, r.boolean_or("is_causal", false));
    d.causal.assign(size_t(c.n_layer), causal ? 1 : 0);
  }
  return Status::ok();
}

Status read_draft_params(const ConfigReader& r, HfModelConfig& c) {
  const json& root = r.root();
  DflashGgufParams& d = c.dflash;
  for (const char* key : {"conv_kernel_size", "selector_rank", "selector_top_k"}) {
    if (draft_key(root, key) != nullptr) {
      return r.unsupported(
          fmt::format("'{}' (a DFlash2 draft: its dynamic convolutions and candidate selector "
                      "are not implemented; use a DFlash draft)",
                      key));
    }
  }
  const json* layers = draft_key(root, "target_layer_ids");
  if (layers == nullptr || !layers->is_array() || layers->empty())
    return r.invalid("dflash_config.target_layer_ids is missing (the target layers the draft reads)");
  for (const json& l : *layers) {
    if (!l.is_number_integer() || l.get<int64_t>() < 0 ||
        (!d.target_layers.empty() && l.get<int64_t>() <= d.target_layers.back()))
      return r.invalid(fmt::format("target_layer_ids {} must be ascending layer ids", layers->dump()));
    d.target_layers.push_back(int32_t(l.get<int64_t>()));
  }
  const json* mask = draft_key(root, "mask_token_id");
  if (mask == nullptr || !mask->is_number_integer() || mask->get<int64_t>() < 0)
    return r.invalid("dflash_config.mask_token_id is missing or not a token id");
  d.mask_token_id = mask->get<int64_t>();
  if (const json* b = draft_key(root, "block_size")) {
    if (!b->is_number_integer() || b->get<int64_t>() < 2 || b->get<int64_t>() > 64)
      return r.invalid(fmt::format("block_size {} (2..64)", b->dump()));
    d.block_size = b->get<int64_t>();
  }
  if (const json* n = draft_key(root, "num_target_layers"); n != nullptr && n->is_number_integer())
    d.target_layer_count = n->get<int64_t>();
  if (const json* s = draft_key(root, "input_embedding_scale");
      s != nullptr && (!s->is_number() || s->get<double>() != 1.0))
    return r.unsupported(fmt::format("input_embedding_scale {} (only 1)", s->dump()));
  if (const json* m = draft_key(root, "output_multiplier")) {
    if (!m->is_number() || !(m->get<double>() > 0))
      return r.invalid("output_multiplier must be a positive number");
    d.output_multiplier = m->get<double>();
  }
  if (const json* s = draft_key(root, "final_logit_softcapping"); s != nullptr && s->is_number())
    d.logit_softcap = std::max(0.0, s->get<double>());
  return read_layer_kinds(r, c);
}

}  // namespace

Status parse_dflash_config(const json& root, std::string_view name, HfModelConfig& c) {
  ConfigReader r(root, name);
  MOESERVE_RETURN_IF_ERROR(read_common_hparams(r, c));
  MOESERVE_ASSIGN_OR_RETURN(c.intermediate_size, r.positive_int("intermediate_size"));
  if (r.has("rope_scaling"))
    return r.unsupported(fmt::format("rope_scaling {}", root["rope_scaling"].dump()));
  if (r.has("rope_parameters")) {
    const json& p = root["rope_parameters"];
    if (!p.is_object() || (p.contains("rope_type") && p["rope_type"] != "default"))
      return r.unsupported(fmt::format("rope_parameters {}", p.dump()));
    MOESERVE_ASSIGN_OR_RETURN(c.rope_theta, r.positive_number(p, "rope_theta"));
  } else {
    MOESERVE_ASSIGN_OR_RETURN(c.rope_theta, r.positive_number(root, "rope_theta"));
  }
  MOESERVE_ASSIGN_OR_RETURN(bool bias, r.boolean_or("attention_bias", false));
  if (bias) return r.unsupported("attention_bias = true");
  return read_draft_params(r, c);
}

void write_dflash_hparams(const HfModelConfig& c, GgufWriter& w) {
  const DflashGgufParams& d = c.dflash;
  auto key = [](std::string_view suffix) { return fmt::format("dflash.{}", suffix); };
  w.set_string(keys::kArchitecture, "dflash");
  w.set_u32(key(keys::kBlockCount), uint32_t(c.n_layer));
  w.set_u32(key(keys::kEmbeddingLength), uint32_t(c.hidden_size));
  w.set_u32(key(keys::kFeedForwardLength), uint32_t(c.intermediate_size));
  w.set_u32(key(keys::kHeadCount), uint32_t(c.n_head));
  w.set_u32(key(keys::kHeadCountKv), uint32_t(c.n_head_kv));
  w.set_u32(key(keys::kKeyLength), uint32_t(c.head_dim));
  w.set_u32(key(keys::kContextLength), uint32_t(c.context_length));
  w.set_f32(key(keys::kRmsEps), float(c.rms_eps));
  w.set_f32(key(keys::kRopeFreqBase), float(c.rope_theta));
  w.set_u32(key(keys::kVocabSize), uint32_t(c.vocab_size));
  w.set_u32(key("block_size"), uint32_t(d.block_size));
  w.set_u32(key("mask_token_id"), uint32_t(d.mask_token_id));
  w.set_i32_array(key("target_layers"), d.target_layers);
  if (d.target_layer_count > 0) w.set_u32(key("target_layer_count"), uint32_t(d.target_layer_count));
  if (d.sliding_window > 0) w.set_u32(key(keys::kSlidingWindow), uint32_t(d.sliding_window));
  w.set_i32_array(key("attention.sliding_layers"), d.sliding);
  w.set_i32_array(key("attention.causal_layers"), d.causal);
  if (d.output_multiplier != 1.0) w.set_f32(key("output_multiplier"), float(d.output_multiplier));
  if (d.logit_softcap > 0.0) w.set_f32(key("final_logit_softcapping"), float(d.logit_softcap));
}

Status plan_dflash_tensors(HfTensorPlanner& pl) {
  const HfModelConfig& c = pl.config();
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t F = int64_t(c.dflash.target_layers.size()) * H;
  // Names as z-lab's checkpoints write them, or under "model." / "encoder.".
  auto source = [&](const std::string& name, const std::string& alt) {
    for (const std::string& n : {name, "model." + name, alt}) {
      if (!n.empty() && pl.find(n) != nullptr) return n;
    }
    return name;  // the planner's error names it
  };
  MOESERVE_RETURN_IF_ERROR(pl.direct(source("fc.weight", "encoder.fc.weight"), "fc.weight", {H, F}));
  MOESERVE_RETURN_IF_ERROR(pl.direct(source("hidden_norm.weight", "encoder.output_norm_enc.weight"),
                                     "enc.output_norm.weight", {H}));
  MOESERVE_RETURN_IF_ERROR(pl.direct(source("norm.weight", ""), keys::kOutputNorm, {H}));
  for (int il = 0; il < int(c.n_layer); ++il) {
    const std::string p = source(fmt::format("layers.{}.input_layernorm.weight", il), "") ==
                                  fmt::format("layers.{}.input_layernorm.weight", il)
                              ? fmt::format("layers.{}.", il)
                              : fmt::format("model.layers.{}.", il);
    auto blk = [&](std::string_view t) { return keys::blk(il, t); };
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "input_layernorm.weight", blk(keys::kAttnNorm), {H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.q_proj.weight", blk(keys::kAttnQ), {c.n_head * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl.direct(p + "self_attn.k_proj.weight", blk(keys::kAttnK), {c.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl.direct(p + "self_attn.v_proj.weight", blk(keys::kAttnV), {c.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl.direct(p + "self_attn.o_proj.weight", blk(keys::kAttnOutput), {H, c.n_head * D}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.q_norm.weight", blk(keys::kAttnQNorm), {D}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.k_norm.weight", blk(keys::kAttnKNorm), {D}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "post_attention_layernorm.weight", blk(keys::kFfnNorm), {H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.gate_proj.weight", blk(keys::kFfnGate), {I, H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.up_proj.weight", blk(keys::kFfnUp), {I, H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.down_proj.weight", blk(keys::kFfnDown), {H, I}));
  }
  return pl.check_all_used();
}

}  // namespace moeserve::convert
