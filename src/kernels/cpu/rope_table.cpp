#include "kernels/cpu/rope_table.h"

#include <cmath>

namespace moeserve::cpu {

void rope_cos_sin(int64_t pos, int64_t n_rot, double freq_base, float* cos_sin) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(freq_base, -2.0 * double(i) / double(n_rot));
    const double theta = double(pos) * inv_freq;
    cos_sin[i] = float(std::cos(theta));
    cos_sin[half + i] = float(std::sin(theta));
  }
}

void rope_cos_sin(int64_t pos, int64_t n_rot, const double* inv_freq, float attn_factor, float* cos_sin) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = double(pos) * inv_freq[i];
    cos_sin[i] = float(std::cos(theta)) * attn_factor;
    cos_sin[half + i] = float(std::sin(theta)) * attn_factor;
  }
}

}  // namespace moeserve::cpu
