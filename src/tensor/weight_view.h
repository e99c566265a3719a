// A weight matrix (or a stack of them, for experts) somewhere in memory: the
// mapped file, packed CPU copies, or a GPU's memory. Which memory is the
// business of the backend that placed it (backend/backend.h); the view only
// says where the rows are and how they are stored.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace moeserve {

// A 2-D matrix (or a stack of them for experts): n_rows rows of n_cols
// elements; matrix m starts at data + m * matrix_stride.
struct WeightView {
  const uint8_t* data = nullptr;
  DType type = DType::F32;
  int64_t n_cols = 0;         // ne[0]
  int64_t n_rows = 0;         // ne[1]
  size_t row_bytes = 0;
  size_t matrix_stride = 0;   // bytes between experts (stacked tensors)
  // Rows in the packed layout of the CPU kernels (kernels/cpu/packed_layout.h)
  // instead of row-major; same size, so the offsets above still hold.
  bool packed = false;

  const uint8_t* matrix(int64_t m) const { return data + size_t(m) * matrix_stride; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  bool present() const { return data != nullptr; }
};

}  // namespace moeserve
