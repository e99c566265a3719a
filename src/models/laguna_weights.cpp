#include "models/laguna_weights.h"

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

using keys::blk;

// The gate's width says whether it gates heads or elements (llama.cpp reads
// it the same way); every layer must agree with the first.
Status gate_kind(const GgufFile& f, LagunaHParams& hp, int il) {
  const std::string name = blk(il, keys::kAttnGate);
  const GgufTensorInfo* t = f.find_tensor(name);
  if (t == nullptr) {
    return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing (the attention output gate)",
                      f.name(), name);
  }
  const int64_t n_head = hp.n_head[size_t(il)];
  const int64_t width = t->n_dims == 2 ? t->ne[1] : -1;
  if (width != n_head && width != n_head * hp.head_dim) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: tensor '{}' has shape {}, expected [{}, {}] (per head) or [{}, {}] (per element)",
                      f.name(), name, t->shape_string(), hp.n_embd, n_head, hp.n_embd, n_head * hp.head_dim);
  }
  const bool per_element = width != n_head;
  if (il == 0) {
    hp.gate_per_element = per_element;
  } else if (per_element != hp.gate_per_element) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' gates per {}, layer 0 per {}", f.name(),
                      name, per_element ? "element" : "head", hp.gate_per_element ? "element" : "head");
  }
  return Status::ok();
}

Status load_attention(TensorLoader& ld, LagunaHParams& hp, int il, LagunaLayerWeights& l) {
  const int64_t H = hp.n_embd, hd = hp.head_dim, q = hp.q_dim(il);
  MOESERVE_RETURN_IF_ERROR(gate_kind(ld.file, hp, il));
  const int64_t gate_width = hp.gate_per_element ? q : hp.n_head[size_t(il)];
  MOESERVE_ASSIGN_OR_RETURN(l.attn_q, ld.get(blk(il, keys::kAttnQ), {H, q}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_k, ld.get(blk(il, keys::kAttnK), {H, hp.kv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_v, ld.get(blk(il, keys::kAttnV), {H, hp.kv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_output, ld.get(blk(il, keys::kAttnOutput), {q, H}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_gate, ld.get(blk(il, keys::kAttnGate), {H, gate_width}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_q_norm, ld.get(blk(il, keys::kAttnQNorm), {hd}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_k_norm, ld.get(blk(il, keys::kAttnKNorm), {hd}, true));
  return Status::ok();
}

Status load_ffn(TensorLoader& ld, const LagunaHParams& hp, int il, LagunaLayerWeights& l) {
  const int64_t H = hp.n_embd;
  if (!hp.moe_layer(il)) {
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate, ld.get(blk(il, keys::kFfnGate), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_up, ld.get(blk(il, keys::kFfnUp), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_down, ld.get(blk(il, keys::kFfnDown), {hp.n_ff, H}, false));
    return Status::ok();
  }
  const int64_t E = hp.n_expert, F = hp.n_ff_exp, S = hp.n_ff_shexp;
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_inp, ld.get(blk(il, keys::kFfnGateInp), {H, E}, false));
  if (ld.file.find_tensor(blk(il, keys::kFfnExpProbsB, "bias")) != nullptr || hp.sigmoid_gating) {
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_exp_probs_b, ld.get(blk(il, keys::kFfnExpProbsB, "bias"), {E}, true));
  }
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_exps, ld.get(blk(il, keys::kFfnGateExps), {H, F, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_up_exps, ld.get(blk(il, keys::kFfnUpExps), {H, F, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_down_exps, ld.get(blk(il, keys::kFfnDownExps), {F, H, E}, false));
  if (S == 0) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_shexp, ld.get(blk(il, keys::kFfnGateShexp), {H, S}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_up_shexp, ld.get(blk(il, keys::kFfnUpShexp), {H, S}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_down_shexp, ld.get(blk(il, keys::kFfnDownShexp), {S, H}, false));
  return Status::ok();
}

uint64_t active_bytes(const LagunaWeights& w, const LagunaHParams& hp) {
  uint64_t b = w.output_norm.row_bytes + w.output.matrix_stride + w.token_embd.row_bytes;
  for (const LagunaLayerWeights& l : w.layers) {
    for (const WeightView* v :
         {&l.attn_norm, &l.ffn_norm, &l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.attn_q_norm,
          &l.attn_k_norm, &l.attn_gate, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.ffn_gate_inp,
          &l.ffn_exp_probs_b, &l.ffn_gate_shexp, &l.ffn_up_shexp, &l.ffn_down_shexp}) {
      if (v->present()) b += v->matrix_stride;
    }
    if (l.ffn_gate_exps.present()) {
      b += uint64_t(hp.n_expert_used) *
           (l.ffn_gate_exps.matrix_stride + l.ffn_up_exps.matrix_stride + l.ffn_down_exps.matrix_stride);
    }
  }
  return b;
}

}  // namespace

Result<LagunaWeights> load_laguna_weights(const GgufFile& file, LagunaHParams& hp) {
  LagunaWeights w;
  TensorLoader ld{file};
  MOESERVE_RETURN_IF_ERROR(load_io_weights(ld, hp, w));
  w.layers.resize(size_t(hp.n_layer));
  for (int il = 0; il < int(hp.n_layer); ++il) {
    LagunaLayerWeights& l = w.layers[size_t(il)];
    MOESERVE_ASSIGN_OR_RETURN(l.attn_norm, ld.get(blk(il, keys::kAttnNorm), {hp.n_embd}, true));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_norm, ld.get(blk(il, keys::kFfnNorm), {hp.n_embd}, true));
    MOESERVE_RETURN_IF_ERROR(load_attention(ld, hp, il, l));
    MOESERVE_RETURN_IF_ERROR(load_ffn(ld, hp, il, l));
  }
  w.n_params = ld.n_params;
  w.n_bytes = ld.n_bytes;
  w.active_bytes_per_token = active_bytes(w, hp);
  return w;
}

}  // namespace moeserve::models
