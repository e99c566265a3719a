#include "models/ffn_blocks.h"

#include "models/forward_common.h"

namespace moeserve::models {

Status swiglu_ffn(backend::Ops& ops, const SwigluFfnArgs& a) {
  const backend::MatmulOp gate_up[] = {{a.gate, a.xn, a.g, a.rows}, {a.up, a.xn, a.u, a.rows}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(gate_up));
  MOESERVE_RETURN_IF_ERROR(ops.swiglu(a.g, a.u, a.g, a.rows, a.n_ff));
  const backend::MatmulOp down[] = {{a.down, a.g, a.out, a.rows}};
  return ops.matmul(down);
}

Status add_residual(backend::Ops& ops, const ResidualArgs& a) {
  if (a.next_norm == nullptr) return ops.add(a.x, a.delta, a.rows, a.n_embd);
  return ops.add_rms_norm({.x = a.x,
                           .delta = a.delta,
                           .w = a.next_norm->f32(),
                           .out = a.xn,
                           .n_rows = a.rows,
                           .n_cols = a.n_embd,
                           .eps = a.eps});
}

Status route_rows(backend::Ops& ops, ForwardProfile* profile, const WeightView& gate_inp, const float* xn,
                  float* logits, backend::RouteOpArgs route) {
  ScopedTimer timer(profile, &ForwardProfile::router, ops);
  const backend::MatmulOp gate_inp_op[] = {{&gate_inp, xn, logits, route.n_tokens}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(gate_inp_op));
  route.logits = logits;
  return ops.route(route);
}

}  // namespace moeserve::models
