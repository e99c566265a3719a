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

// How a type's weights are formed: importance_j * sqrt(sigma2 + x_j^2), with
// sigma2 = `sigma_factor` * the mean of x^2 over `scope` elements around x_j
// (0: the whole row), or importance_j alone (`importance_only`). The
// factors are ggml's for each type.
struct WeightRule {
  QuantizeRowWeightedFn fn = nullptr;
  int64_t scope = 0;
  float sigma_factor = 1.0f;
  bool importance_only = false;
};

WeightRule weight_rule(DType t) {
  using namespace quant_detail;
  switch (t) {
    case DType::Q2_K:
      return {quantize_q2_k_weighted, kQK_K, 1.0f};
    case DType::Q3_K:
      return {quantize_q3_k_weighted, kQK_K, 2.0f};
    case DType::Q4_K:
      return {quantize_q4_k_weighted, kQK_K, 2.0f};
    case DType::Q5_K:
      return {quantize_q5_k_weighted, kQK_K, 2.0f};
    case DType::Q6_K:
      return {quantize_q6_k_weighted, kQK_K, 1.0f, true};
    case DType::IQ4_XS:
      return {quantize_iq4_xs_weighted, kQK_K, 2.0f};
    case DType::IQ4_NL:
      return {quantize_iq4_nl_weighted, 32, 2.0f};
    case DType::Q4_0:
      return {quantize_q4_0_weighted, 0, 1.0f};
    case DType::Q4_1:
      return {quantize_q4_1_weighted, 0, 1.0f};
    case DType::Q5_0:
      return {quantize_q5_0_weighted, 0, 1.0f};
    case DType::Q5_1:
      return {quantize_q5_1_weighted, 0, 1.0f};
    default:
      return {};
  }
}

float clean_importance(float v) { return std::isfinite(v) && v > 0.0f ? v : 0.0f; }

// The weights of one row x of n elements into w.
void element_weights(const WeightRule& rule, const float* x, const float* importance, int64_t n, float* w) {
  if (rule.importance_only) {
    for (int64_t i = 0; i < n; ++i) w[i] = clean_importance(importance[i]);
    return;
  }
  const int64_t scope = rule.scope > 0 ? std::min(rule.scope, n) : n;
  for (int64_t b = 0; b < n; b += scope) {
    double sum2 = 0.0;
    for (int64_t i = b; i < b + scope; ++i) sum2 += double(x[i]) * x[i];
    const float sigma2 = float(rule.sigma_factor * sum2 / double(scope));
    for (int64_t i = b; i < b + scope; ++i) {
      w[i] = clean_importance(importance[i]) * std::sqrt(sigma2 + x[i] * x[i]);
    }
  }
}

}  // namespace

bool dtype_has_weighted_quantizer(DType t) { return weight_rule(t).fn != nullptr; }

size_t quantize_rows_weighted(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                              const float* importance) {
  const WeightRule rule = weight_rule(t);
  if (rule.fn == nullptr || importance == nullptr) return quantize_rows(t, src, dst, n_rows, n_per_row);
  const size_t row_bytes = dtype_row_bytes(t, n_per_row);
  std::vector<float> w(static_cast<size_t>(n_per_row));
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* x = src + r * n_per_row;
    element_weights(rule, x, importance, n_per_row, w.data());
    rule.fn(x, w.data(), out + size_t(r) * row_bytes, n_per_row);
  }
  return size_t(n_rows) * row_bytes;
}

}  // namespace moeserve
