#include "models/qwen35_weights.h"

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

using keys::blk;

Status load_attention(TensorLoader& ld, const Qwen35HParams& hp, int il, Qwen35LayerWeights& l) {
  const int64_t H = hp.n_embd, hd = hp.head_dim;
  MOESERVE_ASSIGN_OR_RETURN(l.attn_q, ld.get(blk(il, keys::kAttnQ), {H, 2 * hp.q_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_k, ld.get(blk(il, keys::kAttnK), {H, hp.kv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_v, ld.get(blk(il, keys::kAttnV), {H, hp.kv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_output, ld.get(blk(il, keys::kAttnOutput), {hp.q_dim(), H}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_q_norm, ld.get(blk(il, keys::kAttnQNorm), {hd}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_k_norm, ld.get(blk(il, keys::kAttnKNorm), {hd}, true));
  return Status::ok();
}

Status load_delta_net(TensorLoader& ld, const Qwen35HParams& hp, int il, Qwen35LayerWeights& l) {
  const int64_t H = hp.n_embd, nv = hp.n_v_heads;
  MOESERVE_ASSIGN_OR_RETURN(l.attn_qkv, ld.get(blk(il, keys::kAttnQkv), {H, hp.conv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_gate, ld.get(blk(il, keys::kAttnGate), {H, hp.v_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_beta, ld.get(blk(il, keys::kSsmBeta), {H, nv}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_alpha, ld.get(blk(il, keys::kSsmAlpha), {H, nv}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_conv1d,
                            ld.get(blk(il, keys::kSsmConv1d), {hp.conv_kernel, hp.conv_dim()}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_dt, ld.get(blk(il, keys::kSsmDt, "bias"), {nv}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_a, ld.get(blk(il, keys::kSsmA, ""), {nv}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_norm, ld.get(blk(il, keys::kSsmNorm), {hp.head_v_dim}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.ssm_out, ld.get(blk(il, keys::kSsmOut), {hp.v_dim(), H}, false));
  return Status::ok();
}

Status load_ffn(TensorLoader& ld, const Qwen35HParams& hp, int il, Qwen35LayerWeights& l) {
  const int64_t H = hp.n_embd;
  if (!hp.moe) {
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate, ld.get(blk(il, keys::kFfnGate), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_up, ld.get(blk(il, keys::kFfnUp), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_down, ld.get(blk(il, keys::kFfnDown), {hp.n_ff, H}, false));
    return Status::ok();
  }
  const int64_t E = hp.n_expert, F = hp.n_ff_exp, S = hp.n_ff_shexp;
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_inp, ld.get(blk(il, keys::kFfnGateInp), {H, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_exps, ld.get(blk(il, keys::kFfnGateExps), {H, F, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_up_exps, ld.get(blk(il, keys::kFfnUpExps), {H, F, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_down_exps, ld.get(blk(il, keys::kFfnDownExps), {F, H, E}, false));
  if (S == 0) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_inp_shexp, ld.get(blk(il, keys::kFfnGateInpShexp), {H}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_shexp, ld.get(blk(il, keys::kFfnGateShexp), {H, S}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_up_shexp, ld.get(blk(il, keys::kFfnUpShexp), {H, S}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_down_shexp, ld.get(blk(il, keys::kFfnDownShexp), {S, H}, false));
  return Status::ok();
}

uint64_t active_bytes(const Qwen35Weights& w, const Qwen35HParams& hp) {
  uint64_t b = w.output_norm.row_bytes + w.output.matrix_stride + w.token_embd.row_bytes;
  for (const Qwen35LayerWeights& l : w.layers) {
    for (const WeightView* v : {&l.attn_norm,      &l.post_attention_norm,
                                &l.attn_q,         &l.attn_k,
                                &l.attn_v,         &l.attn_output,
                                &l.attn_q_norm,    &l.attn_k_norm,
                                &l.attn_qkv,       &l.attn_gate,
                                &l.ssm_beta,       &l.ssm_alpha,
                                &l.ssm_conv1d,     &l.ssm_dt,
                                &l.ssm_a,          &l.ssm_norm,
                                &l.ssm_out,        &l.ffn_gate,
                                &l.ffn_up,         &l.ffn_down,
                                &l.ffn_gate_inp,   &l.ffn_gate_inp_shexp,
                                &l.ffn_gate_shexp, &l.ffn_up_shexp,
                                &l.ffn_down_shexp}) {
      if (v->present()) b += v->matrix_stride;
    }
    if (hp.moe) {
      b += uint64_t(hp.n_expert_used) *
           (l.ffn_gate_exps.matrix_stride + l.ffn_up_exps.matrix_stride + l.ffn_down_exps.matrix_stride);
    }
  }
  return b;
}

}  // namespace

Result<Qwen35Weights> load_qwen35_weights(const GgufFile& file, Qwen35HParams& hp) {
  Qwen35Weights w;
  TensorLoader ld{file};
  MOESERVE_RETURN_IF_ERROR(load_io_weights(ld, hp, w));
  w.layers.resize(size_t(hp.n_layer));
  for (int il = 0; il < int(hp.n_layer); ++il) {
    Qwen35LayerWeights& l = w.layers[size_t(il)];
    MOESERVE_ASSIGN_OR_RETURN(l.attn_norm, ld.get(blk(il, keys::kAttnNorm), {hp.n_embd}, true));
    MOESERVE_ASSIGN_OR_RETURN(l.post_attention_norm,
                              ld.get(blk(il, keys::kPostAttentionNorm), {hp.n_embd}, true));
    MOESERVE_RETURN_IF_ERROR(hp.recurrent[size_t(il)] ? load_delta_net(ld, hp, il, l)
                                                      : load_attention(ld, hp, il, l));
    MOESERVE_RETURN_IF_ERROR(load_ffn(ld, hp, il, l));
  }
  w.n_params = ld.n_params;
  w.n_bytes = ld.n_bytes;
  w.active_bytes_per_token = active_bytes(w, hp);
  return w;
}

}  // namespace moeserve::models
