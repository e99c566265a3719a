// A look at the activations a forward multiplies by its weights, for tools
// that gather statistics about them (moeserve imatrix: the sum of x_j^2 per
// input column of every weight matrix). The CPU backend calls it for every
// dense product (Ops::matmul) and every expert product (the gate/up input,
// each (token, slot) pair's normed hidden row, and the down input, its
// SwiGLU output h); see CpuDevice::set_activation_observer. Nothing calls it
// unless one is installed, so the hot path pays one null check per op.
#pragma once

#include <cstdint>

#include "tensor/weight_view.h"

namespace moeserve::backend {

class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  // x: [n_rows][w.n_cols] f32, the rows about to be multiplied by matrix
  // `matrix` of w (an expert's index in its stack; 0 for a plain matrix).
  // w is the view the op was given (its data pointer identifies the
  // weight). Called from several threads at once (the expert pieces run on
  // the pool): implementations synchronise.
  virtual void observe(const WeightView& w, int64_t matrix, const float* x, int64_t n_rows) = 0;
};

}  // namespace moeserve::backend
