// The FFN half of a layer as every architecture runs it: a SwiGLU FFN, the
// residual add that closes a block (fused with the next layer's attention
// norm where that layer runs on the same device), a MoE layer's router and
// its routed experts. Each model file keeps only what is its own (Laguna's
// sigmoid gating, Qwen3.5's gated shared expert).
#pragma once

#include <cstdint>
#include <span>

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

// A dense layer's FFN from an architecture's buffers (xn, x, o, ff_gate,
// ff_up, ops) and layer weights (ffn_gate, ffn_up, ffn_down): x += the
// SwiGLU FFN of xn; with next_norm, xn = the next layer's input norm.
template <typename HParams, typename LayerWeights, typename Buffers>
Status dense_swiglu_ffn(const HParams& hp, const LayerWeights& l, Buffers& d, int64_t rows,
                        const WeightView* next_norm) {
  float *xn = d.xn.template as<float>(), *o = d.o.template as<float>();
  MOESERVE_RETURN_IF_ERROR(swiglu_ffn(*d.ops, {.gate = &l.ffn_gate,
                                               .up = &l.ffn_up,
                                               .down = &l.ffn_down,
                                               .xn = xn,
                                               .g = d.ff_gate.template as<float>(),
                                               .u = d.ff_up.template as<float>(),
                                               .out = o,
                                               .rows = rows,
                                               .n_ff = hp.n_ff}));
  return add_residual(*d.ops, {.x = d.x.template as<float>(),
                               .delta = o,
                               .next_norm = next_norm,
                               .xn = xn,
                               .rows = rows,
                               .n_embd = hp.n_embd,
                               .eps = hp.rms_eps});
}

// The layer's routing counts in the batch's statistics (null: none asked).
inline int64_t* layer_counts(std::span<int64_t> counts, int layer, int64_t n_expert) {
  return counts.empty() ? nullptr : counts.data() + int64_t(layer) * n_expert;
}

// The routed experts: x += their weighted sum of xn's rows; with
// next_norm, xn = the next layer's input norm of the new x.
struct RoutedExpertsArgs {
  int layer = 0;
  float *xn = nullptr, *x = nullptr;
  int64_t rows = 0, n_embd = 0, n_ff = 0;
  const WeightView *gate = nullptr, *up = nullptr, *down = nullptr;
  const backend::ExpertSplit* split = nullptr;
  const WeightView* next_norm = nullptr;
  float eps = 1e-6f;
};
Status routed_experts(backend::Ops& ops, const RoutedExpertsArgs& a);

// Those arguments as every architecture fills them from its
// hyper-parameters (n_embd, n_ff_exp, rms_eps) and layer weights
// (ffn_gate_exps, ffn_up_exps, ffn_down_exps).
template <typename HParams, typename LayerWeights>
RoutedExpertsArgs routed_experts_args(const HParams& hp, const LayerWeights& l, int layer, float* xn,
                                      float* x, int64_t rows) {
  RoutedExpertsArgs a;
  a.layer = layer, a.xn = xn, a.x = x, a.rows = rows;
  a.n_embd = hp.n_embd, a.n_ff = hp.n_ff_exp, a.eps = hp.rms_eps;
  a.gate = &l.ffn_gate_exps, a.up = &l.ffn_up_exps, a.down = &l.ffn_down_exps;
  return a;
}

}  // namespace moeserve::models
