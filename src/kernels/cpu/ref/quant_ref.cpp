// Reference (plain C++) vec_dot, activation quantizers and dequantizers.
//
// Quantized dot products follow the block math literally: integer sums of
// code products per (sub-)block, then one float scaling per block. The
// K-quant min term uses the activations' bsums: Σ m_j*Σ_{i∈j} x_i = Σ m_j *
// (bsums[2j] + bsums[2j+1]) (two 16-sums per 32-element sub-block), and the
// Q6_K -32 offset likewise: Σ sc_j*Σ(q-32)*x = Σ sc_j*(Σq*x - 32*bsums[j]).
#include "core/half.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"

namespace moeserve::cpu::detail {
namespace {

float vec_dot_f32(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const float*>(wv);
  const auto* x = static_cast<const float*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += w[i] * x[i];
  return sum;
}

float vec_dot_f16(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const uint16_t*>(wv);
  const auto* x = static_cast<const float*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += fp16_to_fp32(w[i]) * x[i];
  return sum;
}

float vec_dot_bf16(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const uint16_t*>(wv);
  const auto* x = static_cast<const float*>(xv);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += bf16_to_fp32(w[i]) * x[i];
  return sum;
}

float vec_dot_q8_0(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ8_0*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int32_t isum = 0;
    for (int i = 0; i < kQK8_0; ++i) isum += int32_t(w[b].qs[i]) * x[b].qs[i];
    sum += fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d) * float(isum);
  }
  return sum;
}

float vec_dot_q4_0(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ4_0*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  constexpr int kHalf = kQK4_0 / 2;
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < kHalf; ++j) {
      isum += ((w[b].qs[j] & 15) - 8) * x[b].qs[j];
      isum += ((w[b].qs[j] >> 4) - 8) * x[b].qs[j + kHalf];
    }
    sum += fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d) * float(isum);
  }
  return sum;
}

// Q4_K / Q5_K: qh is null for Q4_K.
template <typename Block>
float affine_kquant_block_dot(const Block& w, const uint8_t* qh, const BlockQ8_K& x) {
  int32_t scaled = 0;  // Σ sc_j * Σ q*x
  int32_t mins = 0;    // Σ m_j * Σ x
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc = 0, m = 0;
    k_scale_min(j, w.scales, &sc, &m);
    const uint8_t* qs = w.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    int32_t isum = 0;
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> shift) & 15;
      if (qh != nullptr) q |= ((qh[l] >> j) & 1) << 4;
      isum += q * x.qs[32 * j + l];
    }
    scaled += int32_t(sc) * isum;
    mins += int32_t(m) * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
  }
  return x.d * (fp16_to_fp32(w.d) * float(scaled) - fp16_to_fp32(w.dmin) * float(mins));
}

float vec_dot_q4_k(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ4_K*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) sum += affine_kquant_block_dot(w[b], nullptr, x[b]);
  return sum;
}

float vec_dot_q5_k(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ5_K*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) sum += affine_kquant_block_dot(w[b], w[b].qh, x[b]);
  return sum;
}

float q6_k_block_dot(const BlockQ6_K& w, const BlockQ8_K& x) {
  int32_t total = 0;
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = w.ql + 64 * h;
    const uint8_t* qh = w.qh + 32 * h;
    const int8_t* xq = x.qs + 128 * h;
    int32_t isum[8] = {};  // per 16-element sub-block of this half
    for (int l = 0; l < 32; ++l) {
      const int q1 = (ql[l] & 15) | ((qh[l] & 3) << 4);
      const int q2 = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
      const int q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
      const int q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      const int is = l / 16;
      isum[is + 0] += q1 * xq[l];
      isum[is + 2] += q2 * xq[l + 32];
      isum[is + 4] += q3 * xq[l + 64];
      isum[is + 6] += q4 * xq[l + 96];
    }
    for (int j = 0; j < 8; ++j) {
      const int sub = 8 * h + j;
      total += int32_t(w.scales[sub]) * (isum[j] - 32 * x.bsums[sub]);
    }
  }
  return x.d * fp16_to_fp32(w.d) * float(total);
}

float vec_dot_q6_k(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) sum += q6_k_block_dot(w[b], x[b]);
  return sum;
}

}  // namespace

void register_quant_reference(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::F32)] = vec_dot_f32;
  k.vec_dot[dtype_slot(DType::F16)] = vec_dot_f16;
  k.vec_dot[dtype_slot(DType::BF16)] = vec_dot_bf16;
  k.vec_dot[dtype_slot(DType::Q8_0)] = vec_dot_q8_0;
  k.vec_dot[dtype_slot(DType::Q4_0)] = vec_dot_q4_0;
  k.vec_dot[dtype_slot(DType::Q4_K)] = vec_dot_q4_k;
  k.vec_dot[dtype_slot(DType::Q5_K)] = vec_dot_q5_k;
  k.vec_dot[dtype_slot(DType::Q6_K)] = vec_dot_q6_k;
  register_quant_reference_lowbit(k);
  register_quant_reference_iquants(k);
  // The tensor layer's reference conversions are the ground truth.
  k.quantize_row[dtype_slot(DType::Q8_0)] = quantize_row_fn(DType::Q8_0);
  k.quantize_row[dtype_slot(DType::Q8_K)] = quantize_row_fn(DType::Q8_K);
  k.quantize_row[dtype_slot(DType::F16)] = quantize_row_fn(DType::F16);
  for (DType t : kAllDTypes) k.dequantize_row[dtype_slot(t)] = dequantize_row_fn(t);
}

}  // namespace moeserve::cpu::detail
