// Reference vec_dot of issue 43's weight types (plain C++), the block math
// literally: integer sums of code products per (sub-)block, one float
// scaling per block. The legacy affine types' offset term and Q2_K's
// minimum read the activations' sums (a Q8_0 block's codes summed; Q8_K's
// bsums), as the K-quants of quant_ref.cpp do.
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

int32_t q8_0_sum(const BlockQ8_0& x) {
  int32_t s = 0;
  for (int i = 0; i < kQK8_0; ++i) s += x.qs[i];
  return s;
}

uint32_t high_bits(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

// Q4_1 / Q5_1: Σ (d q + m) x = d dx Σ q qx + m dx Σ qx.
template <typename Block, bool kFiveBits>
float vec_dot_affine32(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const Block*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    uint32_t qh = 0;
    if constexpr (kFiveBits) qh = high_bits(w[b].qh);
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (w[b].qs[j] & 15) | int((qh >> j) & 1) << 4;
      const int hi = (w[b].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      isum += lo * x[b].qs[j] + hi * x[b].qs[j + 16];
    }
    const float dx = fp16_to_fp32(x[b].d);
    sum += fp16_to_fp32(w[b].d) * dx * float(isum) + fp16_to_fp32(w[b].m) * dx * float(q8_0_sum(x[b]));
  }
  return sum;
}

float vec_dot_q5_0(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ5_0*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint32_t qh = high_bits(w[b].qh);
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = ((w[b].qs[j] & 15) | int((qh >> j) & 1) << 4) - 16;
      const int hi = ((w[b].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4) - 16;
      isum += lo * x[b].qs[j] + hi * x[b].qs[j + 16];
    }
    sum += fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d) * float(isum);
  }
  return sum;
}

// IQ4_NL / MXFP4: Σ scale values[q] x.
template <typename Block>
float vec_dot_table32(int64_t n, const void* wv, const void* xv, const int8_t* values, float (*scale)(const Block&)) {
  const auto* w = static_cast<const Block*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += values[w[b].qs[j] & 15] * x[b].qs[j] + values[w[b].qs[j] >> 4] * x[b].qs[j + 16];
    }
    sum += scale(w[b]) * fp16_to_fp32(x[b].d) * float(isum);
  }
  return sum;
}

float vec_dot_iq4_nl(int64_t n, const void* w, const void* x) {
  return vec_dot_table32<BlockIQ4_NL>(n, w, x, kIq4nlValues, [](const BlockIQ4_NL& b) { return fp16_to_fp32(b.d); });
}
float vec_dot_mxfp4(int64_t n, const void* w, const void* x) {
  return vec_dot_table32<BlockMXFP4>(n, w, x, kMxfp4Values,
                                     [](const BlockMXFP4& b) { return mxfp4_scale(b.e); });
}

// Q2_K: x.d (d Σ sc_s Σ q x - dmin Σ m_s bsums[s]).
float vec_dot_q2_k(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t isum[16] = {};
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < 4; ++t) {
        for (int l = 0; l < 32; ++l) {
          const int q = (w[b].qs[32 * h + l] >> (2 * t)) & 3;
          isum[8 * h + 2 * t + l / 16] += q * x[b].qs[128 * h + 32 * t + l];
        }
      }
    }
    int32_t scaled = 0, mins = 0;
    for (int s = 0; s < 16; ++s) {
      scaled += int32_t(w[b].scales[s] & 15) * isum[s];
      mins += int32_t(w[b].scales[s] >> 4) * x[b].bsums[s];
    }
    sum += x[b].d * (fp16_to_fp32(w[b].d) * float(scaled) - fp16_to_fp32(w[b].dmin) * float(mins));
  }
  return sum;
}

// Q3_K: x.d d Σ (s - 32) Σ (q - 4 !hbit) x.
float vec_dot_q3_k(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int sc[16];
    q3_k_scales(w[b].scales, sc);
    int32_t isum[16] = {};
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < 4; ++t) {
        for (int l = 0; l < 32; ++l) {
          const int low = (w[b].qs[32 * h + l] >> (2 * t)) & 3;
          const int q = low - (((w[b].hmask[l] >> (4 * h + t)) & 1) ? 0 : 4);
          isum[8 * h + 2 * t + l / 16] += q * x[b].qs[128 * h + 32 * t + l];
        }
      }
    }
    int32_t total = 0;
    for (int s = 0; s < 16; ++s) total += (sc[s] - 32) * isum[s];
    sum += x[b].d * fp16_to_fp32(w[b].d) * float(total);
  }
  return sum;
}

// IQ4_XS: x.d d Σ (ls - 32) Σ values[q] x.
float vec_dot_iq4_xs(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t total = 0;
    for (int s = 0; s < 8; ++s) {
      const int ls = ((w[b].scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((w[b].scales_h >> (2 * s)) & 3) << 4);
      int32_t isum = 0;
      for (int j = 0; j < 16; ++j) {
        const uint8_t q = w[b].qs[16 * s + j];
        isum += kIq4nlValues[q & 15] * x[b].qs[32 * s + j] + kIq4nlValues[q >> 4] * x[b].qs[32 * s + j + 16];
      }
      total += (ls - 32) * isum;
    }
    sum += x[b].d * fp16_to_fp32(w[b].d) * float(total);
  }
  return sum;
}

}  // namespace

void register_quant_reference_lowbit(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::Q4_1)] = vec_dot_affine32<BlockQ4_1, false>;
  k.vec_dot[dtype_slot(DType::Q5_1)] = vec_dot_affine32<BlockQ5_1, true>;
  k.vec_dot[dtype_slot(DType::Q5_0)] = vec_dot_q5_0;
  k.vec_dot[dtype_slot(DType::IQ4_NL)] = vec_dot_iq4_nl;
  k.vec_dot[dtype_slot(DType::MXFP4)] = vec_dot_mxfp4;
  k.vec_dot[dtype_slot(DType::Q2_K)] = vec_dot_q2_k;
  k.vec_dot[dtype_slot(DType::Q3_K)] = vec_dot_q3_k;
  k.vec_dot[dtype_slot(DType::IQ4_XS)] = vec_dot_iq4_xs;
}

}  // namespace moeserve::cpu::detail
