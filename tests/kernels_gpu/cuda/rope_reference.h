// The RoPE angles the GPU tests check against: frequencies written as
// transformers writes them (not as backend::RopeSpec::inv_freq does, so a
// slip in that formula would show), cos and sin from the CPU's
// rope_cos_sin.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/rope_table.h"
#include "kernels/cuda/attention.h"

namespace moeserve::testing {

// The frequency of dim pair i: base^(-2i/n_rot), or with YaRN the
// interpolated (/ factor) and extrapolated frequencies blended by the
// linear ramp mask over the pairs ramp_low..ramp_high.
inline std::vector<double> reference_inv_freq(const cuda::RopeConfig& r) {
  std::vector<double> inv(size_t(r.n_rot / 2));
  for (int64_t i = 0; i < r.n_rot / 2; ++i) {
    const double extrapolation = 1.0 / std::pow(r.freq_base, double(2 * i) / double(r.n_rot));
    if (r.yarn_factor <= 1.0) {
      inv[size_t(i)] = extrapolation;
      continue;
    }
    const double interpolation = extrapolation / r.yarn_factor;
    // transformers' linear_ramp_factor widens an empty ramp by 0.001.
    const double high = r.yarn_ramp_high == r.yarn_ramp_low ? r.yarn_ramp_high + 0.001 : r.yarn_ramp_high;
    const double ramp = std::clamp((double(i) - r.yarn_ramp_low) / (high - r.yarn_ramp_low), 0.0, 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    inv[size_t(i)] = interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

// cos | sin of one position, scaled by attn_factor (kernels/cpu/rope_table.h).
inline std::vector<float> reference_cos_sin(const cuda::RopeConfig& r, int64_t pos) {
  std::vector<float> cs(size_t(std::max<int64_t>(r.n_rot, 1)));
  if (r.n_rot > 0) cpu::rope_cos_sin(pos, r.n_rot, reference_inv_freq(r).data(), r.attn_factor, cs.data());
  return cs;
}

}  // namespace moeserve::testing
