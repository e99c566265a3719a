// Laguna tensors and vocabulary (hf_laguna.h); the config is read by
// hf_laguna_config.cpp.
#include "convert/hf_laguna.h"

#include <fmt/format.h>

#include "convert/hf_internal.h"
#include "format/model_keys.h"

namespace moeserve::convert {

namespace {

class LagunaLayerPlanner {
 public:
  explicit LagunaLayerPlanner(HfTensorPlanner& pl) : pl_(pl), c_(pl.config()) {}

  Status layer(int il) {
    const std::string p = fmt::format("model.layers.{}.", il);
    const int64_t H = c_.hidden_size;
    MOESERVE_RETURN_IF_ERROR(pl_.direct(p + "input_layernorm.weight", keys::blk(il, keys::kAttnNorm), {H}));
    MOESERVE_RETURN_IF_ERROR(attention(il, p + "self_attn."));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(p + "post_attention_layernorm.weight", keys::blk(il, keys::kFfnNorm), {H}));
    return il < c_.laguna.leading_dense ? dense(il, p + "mlp.") : moe(il, p + "mlp.");
  }

 private:
  Status attention(int il, const std::string& s) {
    const int64_t H = c_.hidden_size, D = c_.head_dim, q = c_.laguna.head_count[size_t(il)] * D;
    MOESERVE_RETURN_IF_ERROR(pl_.direct(s + "q_proj.weight", keys::blk(il, keys::kAttnQ), {q, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(s + "k_proj.weight", keys::blk(il, keys::kAttnK), {c_.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(
        pl_.direct(s + "v_proj.weight", keys::blk(il, keys::kAttnV), {c_.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(s + "o_proj.weight", keys::blk(il, keys::kAttnOutput), {H, q}));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(s + "q_norm.weight", keys::blk(il, keys::kAttnQNorm), {D}));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(s + "k_norm.weight", keys::blk(il, keys::kAttnKNorm), {D}));
    return output_gate(il, s + "g_proj.weight");
  }

  // g_proj [n_head, H] (per head) or [n_head * head_dim, H] (per element).
  Status output_gate(int il, const std::string& name) {
    const int64_t H = c_.hidden_size, n_head = c_.laguna.head_count[size_t(il)];
    const bool per_element = c_.gate_per_element[size_t(il)];
    const int64_t width = per_element ? n_head * c_.head_dim : n_head;
    const SafetensorsTensor* t = pl_.find(name);
    if (t != nullptr && t->shape.size() == 2 && t->shape[1] == H && t->shape[0] != width) {
      return make_error(
          StatusCode::kInvalidFormat,
          "{}: tensor '{}' has shape {}: {} outputs contradict the {} output gate of gating (expected "
          "[{}, {}]: layer {} has {} heads of {})",
          t->file, name, t->shape_string(), t->shape[0], per_element ? "per-element" : "per-head", width, H,
          il, n_head, c_.head_dim);
    }
    return pl_.direct(name, keys::blk(il, keys::kAttnGate), {width, H});
  }

  Status dense(int il, const std::string& m) {
    const int64_t H = c_.hidden_size, I = c_.intermediate_size;
    MOESERVE_RETURN_IF_ERROR(pl_.direct(m + "gate_proj.weight", keys::blk(il, keys::kFfnGate), {I, H}));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(m + "up_proj.weight", keys::blk(il, keys::kFfnUp), {I, H}));
    return pl_.direct(m + "down_proj.weight", keys::blk(il, keys::kFfnDown), {H, I});
  }

  // The first of two spellings that the checkpoint has (for the error: both).
  Result<std::string> either(const std::string& a, const std::string& b) const {
    if (pl_.find(a) != nullptr) return a;
    if (pl_.find(b) != nullptr) return b;
    return make_error(StatusCode::kNotFound, "{}: tensor '{}' (or '{}') is missing", c_.source, a, b);
  }

  // The selection bias and the shared expert as transformers names them in
  // memory (mlp.gate.e_score_correction_bias, mlp.shared_experts.*) or as
  // the checkpoints store them (mlp.experts.e_score_correction_bias,
  // mlp.shared_expert.*).
  Status moe(int il, const std::string& m) {
    const int64_t H = c_.hidden_size, E = c_.n_expert, S = c_.shared_expert_ff;
    MOESERVE_RETURN_IF_ERROR(pl_.direct(m + "gate.weight", keys::blk(il, keys::kFfnGateInp), {E, H}));
    MOESERVE_ASSIGN_OR_RETURN(
        std::string bias, either(m + "gate.e_score_correction_bias", m + "experts.e_score_correction_bias"));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(bias, keys::blk(il, keys::kFfnExpProbsB, "bias"), {E}));
    MOESERVE_RETURN_IF_ERROR(pl_.experts(il, m + "experts.", E, c_.expert_ff));
    const std::string x = pl_.find(m + "shared_expert.gate_proj.weight") != nullptr ? m + "shared_expert."
                                                                                    : m + "shared_experts.";
    MOESERVE_RETURN_IF_ERROR(pl_.direct(x + "gate_proj.weight", keys::blk(il, keys::kFfnGateShexp), {S, H}));
    MOESERVE_RETURN_IF_ERROR(pl_.direct(x + "up_proj.weight", keys::blk(il, keys::kFfnUpShexp), {S, H}));
    return pl_.direct(x + "down_proj.weight", keys::blk(il, keys::kFfnDownShexp), {H, S});
  }

  HfTensorPlanner& pl_;
  const HfModelConfig& c_;
};

}  // namespace

Status plan_laguna_tensors(HfTensorPlanner& pl) {
  MOESERVE_RETURN_IF_ERROR(pl.globals("model."));
  LagunaLayerPlanner layers(pl);
  for (int il = 0; il < int(pl.config().n_layer); ++il) MOESERVE_RETURN_IF_ERROR(layers.layer(il));
  return pl.check_all_used();
}

void apply_laguna_vocab(const HfModelConfig& c, tok::VocabData& vocab) {
  const int64_t n = int64_t(vocab.tokens.size());
  if (!vocab.eot_id) {
    for (size_t i = 1; i < c.eos_token_ids.size(); ++i) {
      const int64_t id = c.eos_token_ids[i];
      const bool is_bos = (vocab.bos_id && id == *vocab.bos_id) || (c.bos_token_id && id == *c.bos_token_id);
      const bool is_eos = (vocab.eos_id && id == *vocab.eos_id) || id == c.eos_token_ids[0];
      if (id >= 0 && id < n && !is_bos && !is_eos) {
        vocab.eot_id = int32_t(id);
        break;
      }
    }
  }
  if (!vocab.eot_id) return;
  // The turn end is a control token: never rendered in generated text (the
  // HF tokenizer marks Laguna's </assistant> special = false).
  vocab.token_types.resize(size_t(n), int32_t(tok::TokenType::kNormal));
  int32_t& type = vocab.token_types[size_t(*vocab.eot_id)];
  if (type == int32_t(tok::TokenType::kNormal) || type == int32_t(tok::TokenType::kUserDefined)) {
    type = int32_t(tok::TokenType::kControl);
  }
}

}  // namespace moeserve::convert
