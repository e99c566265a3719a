// Every element of a GGUF tensor as f32 (dequantized row by row), for the
// convert tests' comparisons with the weights they wrote.
#pragma once

#include <vector>

#include "format/gguf.h"
#include "tensor/quantize.h"

namespace moeserve::convert::testing {

inline std::vector<float> gguf_values(const GgufTensorInfo& t) {
  std::vector<float> out(size_t(t.n_elements()));
  for (int64_t r = 0; r < t.n_rows(); ++r) {
    dequantize_row(t.type, t.data + size_t(r) * t.row_bytes(), out.data() + r * t.ne[0], t.ne[0]);
  }
  return out;
}

}  // namespace moeserve::convert::testing
