#include "models/qwen3_weights.h"

#include <string>

#include "format/model_keys.h"

namespace moeserve::models {
namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

struct Loader {
  const GgufFile& file;
  Qwen3Weights& w;

  // `expected` in ne order; f32_only for norms (used elementwise, never via matmul).
  Result<WeightView> get(const std::string& name, std::vector<int64_t> expected, bool f32_only) {
    const GgufTensorInfo* t = file.find_tensor(name);
    if (t == nullptr) {
      return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing (expected shape {})", file.name(), name,
                        shape_str(expected));
    }
    bool same = t->n_dims == expected.size();
    for (size_t i = 0; same && i < expected.size(); ++i) same = t->ne[i] == expected[i];
    if (!same) {
      return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, expected {}", file.name(), name,
                        t->shape_string(), shape_str(expected));
    }
    if (f32_only && t->type != DType::F32) {
      return make_error(StatusCode::kUnsupported, "{}: tensor '{}' has type {}, expected f32", file.name(), name,
                        dtype_name(t->type));
    }
    if (t->type == DType::Q8_K) {
      return make_error(StatusCode::kUnsupported, "{}: tensor '{}' has activation-only type q8_K", file.name(), name);
    }
    WeightView v;
    v.data = t->data;
    v.type = t->type;
    v.n_cols = t->ne[0];
    v.n_rows = t->ne[1];
    v.row_bytes = t->row_bytes();
    v.matrix_stride = v.row_bytes * size_t(v.n_rows);
    w.n_params += uint64_t(t->n_elements());
    w.n_bytes += t->nbytes;
    return v;
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
  Loader ld{file, w};
  const GgufTensorInfo* embd = file.find_tensor(keys::kTokenEmbd);
  if (embd == nullptr) {
    return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing", file.name(), keys::kTokenEmbd);
  }
  if (embd->n_dims != 2 || embd->ne[1] < 1) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, expected [{}, n_vocab]",
                      file.name(), keys::kTokenEmbd, embd->shape_string(), hp.n_embd);
  }
  hp.n_vocab = embd->ne[1];
  MOESERVE_ASSIGN_OR_RETURN(w.token_embd, ld.get(std::string(keys::kTokenEmbd), {hp.n_embd, hp.n_vocab}, false));
  MOESERVE_ASSIGN_OR_RETURN(w.output_norm, ld.get(std::string(keys::kOutputNorm), {hp.n_embd}, true));
  if (file.find_tensor(keys::kOutput) != nullptr) {
    MOESERVE_ASSIGN_OR_RETURN(w.output, ld.get(std::string(keys::kOutput), {hp.n_embd, hp.n_vocab}, false));
  } else {
    w.output = w.token_embd;
    w.tied_output = true;
  }
  w.layers.resize(size_t(hp.n_layer));
  for (int il = 0; il < int(hp.n_layer); ++il) {
    MOESERVE_RETURN_IF_ERROR(load_layer(ld, hp, il, w.layers[size_t(il)]));
  }
  w.active_bytes_per_token = active_bytes(w, hp);
  return w;
}

}  // namespace moeserve::models
