// Cos/sin tables for NEOX RoPE (the layout CpuKernels::rope_neox expects).
#pragma once

#include <cstdint>

namespace moeserve::cpu {

// Fills cos_sin[0 .. n_rot) for one position: cos(theta_i) for i < n_rot/2,
// then sin(theta_i), with theta_i = pos * freq_base^(-2i / n_rot).
// Computed in double and rounded once: at positions ~1e6 a float angle would
// already be off by ~0.06 rad.
void rope_cos_sin(int64_t pos, int64_t n_rot, double freq_base, float* cos_sin);
// The same from given frequencies (inv_freq[n_rot / 2]), both scaled by
// attn_factor (YaRN's magnitude scaling).
void rope_cos_sin(int64_t pos, int64_t n_rot, const double* inv_freq, float attn_factor, float* cos_sin);

}  // namespace moeserve::cpu
