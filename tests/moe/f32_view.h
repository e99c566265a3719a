// The MoE tests' weights: a view of made-up f32 expert stacks (matrix e =
// rows x cols floats at w + e * rows * cols).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/weight_view.h"

namespace moeserve::testing {

inline WeightView f32_stack_view(const std::vector<float>& w, int64_t rows, int64_t cols) {
  WeightView v;
  v.data = reinterpret_cast<const uint8_t*>(w.data()), v.type = DType::F32;
  v.n_cols = cols, v.n_rows = rows, v.row_bytes = size_t(cols) * 4;
  v.matrix_stride = size_t(rows * cols) * 4;
  return v;
}

}  // namespace moeserve::testing
