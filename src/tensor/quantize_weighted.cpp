// Importance-weighted quantization (quantize.h): the per-element weights an
// imatrix gives, and the dispatch to each type's weighted quantizer.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"
#include "tensor/quantize_internal.h"

namespace moeserve {
namespace quant_detail {

namespace {
constexpr std::array<float, kUnitWeightCount> unit_weights() {
  std::array<float, kUnitWeightCount> a{};
  for (float& v : a) v = 1.0f;
  return a;
}
constexpr std::array<float, kUnitWeightCount> kUnitWeightArray = unit_weights();
}  // namespace

const float* const kUnitWeights = kUnitWeightArray.data();

}  // namespace quant_detail

namespace {

using quant_detail::QuantizeRowWeightedFn;

// The element weights are the importances themselves. sum_j imp_j * (x_j -
// y_j)^2 is, to first order (the activations' cross terms dropped), the
// expected squared error of the matrix's outputs, which is what the
// quantizer should minimise. ggml instead weights by imp_j * sqrt(sigma2 +
// x_j^2), sigma2 a multiple of the block's mean square; on the tiny trained
// model (qwen3moe-tiny, two held-out texts) that left the perplexity of every
// type at or above the importance-only weights', and Q4_K_M's above the
// unweighted quantizer's.
QuantizeRowWeightedFn weighted_fn(DType t) {
  using namespace quant_detail;
  switch (t) {
    case DType::Q2_K:
      return quantize_q2_k_weighted;
    case DType::Q3_K:
      return quantize_q3_k_weighted;
    case DType::Q4_K:
      return quantize_q4_k_weighted;
    case DType::Q5_K:
      return quantize_q5_k_weighted;
    case DType::Q6_K:
      return quantize_q6_k_weighted;
    case DType::IQ4_XS:
      return quantize_iq4_xs_weighted;
    case DType::IQ4_NL:
      return quantize_iq4_nl_weighted;
    case DType::IQ2_XXS:
      return quantize_iq2_xxs_weighted;
    case DType::IQ2_XS:
      return quantize_iq2_xs_weighted;
    case DType::IQ3_XXS:
      return quantize_iq3_xxs_weighted;
    case DType::IQ2_S:
      return quantize_iq2_s_weighted;
    case DType::IQ3_S:
      return quantize_iq3_s_weighted;
    case DType::IQ1_S:
      return quantize_iq1_s_weighted;
    case DType::IQ1_M:
      return quantize_iq1_m_weighted;
    case DType::Q4_0:
      return quantize_q4_0_weighted;
    case DType::Q4_1:
      return quantize_q4_1_weighted;
    case DType::Q5_0:
      return quantize_q5_0_weighted;
    case DType::Q5_1:
      return quantize_q5_1_weighted;
    default:
      return nullptr;
  }
}

float clean_importance(float v) { return std::isfinite(v) && v > 0.0f ? v : 0.0f; }

// The weights of a row of n elements into w: each column's importance, plus
// a floor of a thousandth of the row's mean importance so that a block of
// never-activated columns still has a well-posed fit. Rows are quantized
// with the same weights, so they are computed once per call.
void element_weights(const float* importance, int64_t n, float* w) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (w[i] = clean_importance(importance[i]));
  const float base = float(1e-3 * sum / double(n));
  for (int64_t i = 0; i < n; ++i) w[i] += base;
}

}  // namespace

bool dtype_has_weighted_quantizer(DType t) { return weighted_fn(t) != nullptr; }

size_t quantize_rows_weighted(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                              const float* importance) {
  const QuantizeRowWeightedFn fn = weighted_fn(t);
  if (fn == nullptr || importance == nullptr) return quantize_rows(t, src, dst, n_rows, n_per_row);
  const size_t row_bytes = dtype_row_bytes(t, n_per_row);
  std::vector<float> w(static_cast<size_t>(n_per_row));
  element_weights(importance, n_per_row, w.data());
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < n_rows; ++r)
    fn(src + r * n_per_row, w.data(), out + size_t(r) * row_bytes, n_per_row);
  return size_t(n_rows) * row_bytes;
}

}  // namespace moeserve
