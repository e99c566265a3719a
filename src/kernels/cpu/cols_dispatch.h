// The plumbing of multi-column dot kernels (CpuKernels::vec_dot_cols), shared
// by the AVX2 and AVX-512 files: a kernel is a template over the column count
// NC, dispatch_cols picks the instance for a call's n_x, and vec_dot is the
// one-column instance (so a column's result never depends on its batch).
// No instructions here; everything sits in an anonymous namespace, so each
// SIMD translation unit instantiates its own copy with its own flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// The NC activation rows of a multi-column call, x_stride bytes apart.
template <int NC>
void activation_rows(const void* x, size_t x_stride, const BlockQ8_K* (&rows)[NC]) {
  for (int c = 0; c < NC; ++c) {
    rows[c] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(x) + c * x_stride);
  }
}

using ColsKernel = void (*)(int64_t n, const void* w, const void* x, size_t x_stride, float* out,
                            int64_t out_stride);

// Table<NC>::fn is the kernel for NC columns, NC = 1..kMaxDotColumns.
template <template <int> class Table>
void dispatch_cols(int64_t n, const void* w, const void* x, size_t x_stride, int n_x, float* out,
                   int64_t out_stride) {
  static_assert(kMaxDotColumns == 8, "dispatch_cols lists one kernel per column count");
  static constexpr ColsKernel kByCount[kMaxDotColumns] = {Table<1>::fn, Table<2>::fn, Table<3>::fn,
                                                          Table<4>::fn, Table<5>::fn, Table<6>::fn,
                                                          Table<7>::fn, Table<8>::fn};
  kByCount[n_x - 1](n, w, x, x_stride, out, out_stride);
}

template <template <int> class Table>
float one_column_dot(int64_t n, const void* w, const void* x) {
  float r;
  Table<1>::fn(n, w, x, 0, &r, 0);
  return r;
}

}  // namespace
}  // namespace moeserve::cpu::detail
