// The FFN half of a layer as every architecture runs it: a SwiGLU FFN, the
// residual add that closes a block (fused with the next layer's attention
// norm where that layer runs on the same device), a MoE layer's router and
// the arguments of its routed experts. Each model file keeps only what is its own (Laguna's
// sigmoid gating, Qwen3.5's gated shared expert).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "models/language_model.h"

namespace moeserve::models {

// out = down(silu(gate xn) * up xn), through g and u ([rows][n_ff] each).
struct SwigluFfnArgs {
  const WeightView *gate = nullptr, *up = nullptr, *down = nullptr;
  const float* xn = nullptr;
  float *g = nullptr, *u = nullptr, *out = nullptr;
  int64_t rows = 0, n_ff = 0;
};
Status swiglu_ffn(backend::Ops& ops, const SwigluFfnArgs& a);

// x += delta; with next_norm, also xn = rmsnorm(x) * next_norm (a GPU fuses
// the two), so the next layer skips its own input norm.
struct ResidualArgs {
  float* x = nullptr;
  const float* delta = nullptr;
  const WeightView* next_norm = nullptr;  // null: the add alone
  float* xn = nullptr;
  int64_t rows = 0, n_embd = 0;
  float eps = 1e-6f;
};
Status add_residual(backend::Ops& ops, const ResidualArgs& a);

// The router (timed as ForwardProfile::router): logits = gate_inp xn
// ([rows][n_expert]), then the selection `route` describes on them.
Status route_rows(backend::Ops& ops, ForwardProfile* profile, const WeightView& gate_inp, const float* xn,
                  float* logits, backend::RouteOpArgs route);

// The routed experts' call as every architecture fills it from its
// hyper-parameters (n_embd, n_ff_exp, rms_eps) and layer weights
// (ffn_gate_exps, ffn_up_exps, ffn_down_exps): x += their weighted sum of
// xn's rows; with next_norm, xn = the next layer's input norm of the new x.
template <typename HParams, typename LayerWeights>
backend::ExpertFfnArgs routed_experts_args(const HParams& hp, const LayerWeights& l, int layer, float* xn,
                                           float* x, int64_t rows, const WeightView* next_norm) {
  backend::ExpertFfnArgs e;
  e.layer = layer, e.xn = xn, e.x = x, e.n_tokens = rows;
  e.n_embd = hp.n_embd, e.n_ff = hp.n_ff_exp;
  e.gate = &l.ffn_gate_exps, e.up = &l.ffn_up_exps, e.down = &l.ffn_down_exps;
  if (next_norm != nullptr) e.norm_w = next_norm->f32(), e.norm_out = xn, e.norm_eps = hp.rms_eps;
  return e;
}

}  // namespace moeserve::models
