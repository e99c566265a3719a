#include "models/qwen3_weights.h"

#include <string>

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

struct Loader {
  TensorLoader tensors;
  Qwen3Weights& w;
  Result<WeightView> get(const std::string& name, std::vector<int64_t> expected, bool f32_only) {
    return tensors.get(name, std::move(expected), f32_only);
  }
};

Status load_layer(Loader& ld, const Qwen3HParams& hp, int il, Qwen3LayerWeights& l) {
  const int64_t H = hp.n_embd, hd = hp.head_dim;
  auto n = [&](std::string_view t) { return keys::blk(il, t); };
  MOESERVE_ASSIGN_OR_RETURN(l.attn_norm, ld.get(n(keys::kAttnNorm), {H}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_q, ld.get(n(keys::kAttnQ), {H, hp.q_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_k, ld.get(n(keys::kAttnK), {H, hp.kv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_v, ld.get(n(keys::kAttnV), {H, hp.kv_dim()}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_output, ld.get(n(keys::kAttnOutput), {hp.q_dim(), H}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_q_norm, ld.get(n(keys::kAttnQNorm), {hd}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.attn_k_norm, ld.get(n(keys::kAttnKNorm), {hd}, true));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_norm, ld.get(n(keys::kFfnNorm), {H}, true));
  if (!hp.is_moe()) {
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate, ld.get(n(keys::kFfnGate), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_up, ld.get(n(keys::kFfnUp), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_down, ld.get(n(keys::kFfnDown), {hp.n_ff, H}, false));
    return Status::ok();
  }
  const int64_t E = hp.n_expert, F = hp.n_ff_exp;
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_inp, ld.get(n(keys::kFfnGateInp), {H, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate_exps, ld.get(n(keys::kFfnGateExps), {H, F, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_up_exps, ld.get(n(keys::kFfnUpExps), {H, F, E}, false));
  MOESERVE_ASSIGN_OR_RETURN(l.ffn_down_exps, ld.get(n(keys::kFfnDownExps), {F, H, E}, false));
  return Status::ok();
}

uint64_t active_bytes(const Qwen3Weights& w, const Qwen3HParams& hp) {
  uint64_t b = w.output_norm.row_bytes + w.output.matrix_stride + w.token_embd.row_bytes;
  for (const Qwen3LayerWeights& l : w.layers) {
    for (const WeightView* v : {&l.attn_norm, &l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.attn_q_norm,
                                &l.attn_k_norm, &l.ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.ffn_gate_inp}) {
      if (v->present()) b += v->matrix_stride;
    }
    if (hp.is_moe()) {
      b += uint64_t(hp.n_expert_used) *
           (l.ffn_gate_exps.matrix_stride + l.ffn_up_exps.matrix_stride + l.ffn_down_exps.matrix_stride);
    }
  }
  return b;
}

}  // namespace

Result<Qwen3Weights> load_qwen3_weights(const GgufFile& file, Qwen3HParams& hp) {
  Qwen3Weights w;
  Loader ld{TensorLoader{file}, w};
  MOESERVE_RETURN_IF_ERROR(load_io_weights(ld.tensors, hp, w));
  w.layers.resize(size_t(hp.n_layer));
  for (int il = 0; il < int(hp.n_layer); ++il) {
    MOESERVE_RETURN_IF_ERROR(load_layer(ld, hp, il, w.layers[size_t(il)]));
  }
  w.active_bytes_per_token = active_bytes(w, hp);
  w.n_params = ld.tensors.n_params;
  w.n_bytes = ld.tensors.n_bytes;
  return w;
}

}  // namespace moeserve::models
