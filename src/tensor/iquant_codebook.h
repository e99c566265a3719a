// The codebook search of the i-quant quantizers (quantize_iquants.cpp,
// quantize_iq1.cpp): a codebook of entries of G values (IQ2: 8 magnitudes,
// IQ3: 4, IQ1: 8 signed values of -1, 0, 1) and, for every point of the
// lattice of element-wise levels, the entry there or the kNear entries
// nearest to it, so that choosing an entry for G targets at a scale costs
// G roundings and at most kNear small dot products.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace moeserve::quant_detail {

inline constexpr int kNear = 12;  // candidate entries kept per lattice point off the codebook

// A codebook of entries of G values and its search tables.
struct Codebook {
  int G = 8;
  std::vector<float> levels;  // the distinct values, ascending
  std::vector<std::array<float, 8>> entries;
  std::vector<int32_t> exact;  // lattice point (element levels, base n_levels) -> entry, or -1
  std::vector<uint16_t> near;  // [point][kNear]: the entries nearest a point off the codebook
  float top = 0.0f;

  // is_signed: the bytes are int8 values (IQ1's -1, 0, 1), else magnitudes.
  template <class Grid>
  Codebook(const Grid* grid, int n_entries, int group, bool is_signed = false) : G(group) {
    auto value = [&](int e, int j) {
      const uint8_t byte = uint8_t(uint64_t(grid[e]) >> (8 * j));
      return is_signed ? float(int8_t(byte)) : float(byte);
    };
    std::vector<float> all;
    for (int e = 0; e < n_entries; ++e) {
      for (int j = 0; j < G; ++j) all.push_back(value(e, j));
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    levels = all;
    top = levels.back();
    const int nl = int(levels.size());
    int points = 1;
    for (int j = 0; j < G; ++j) points *= nl;
    exact.assign(size_t(points), -1);
    entries.resize(size_t(n_entries));
    for (int e = 0; e < n_entries; ++e) {
      int idx = 0, mul = 1;
      for (int j = 0; j < G; ++j) {
        const float v = value(e, j);
        entries[size_t(e)][size_t(j)] = v;
        idx += int(std::lower_bound(levels.begin(), levels.end(), v) - levels.begin()) * mul;
        mul *= nl;
      }
      exact[size_t(idx)] = e;
    }
    near.assign(size_t(points) * kNear, 0);
    std::vector<std::pair<float, int>> dist(static_cast<size_t>(n_entries));
    for (int p = 0; p < points; ++p) {
      if (exact[size_t(p)] >= 0) continue;
      float mag[8];
      for (int j = 0, q = p; j < G; ++j, q /= nl) mag[j] = levels[size_t(q % nl)];
      for (int e = 0; e < n_entries; ++e) {
        float d = 0.0f;
        for (int j = 0; j < G; ++j)
          d += (mag[j] - entries[size_t(e)][size_t(j)]) * (mag[j] - entries[size_t(e)][size_t(j)]);
        dist[size_t(e)] = {d, e};
      }
      std::partial_sort(dist.begin(), dist.begin() + kNear, dist.end());
      for (int k = 0; k < kNear; ++k) near[size_t(p) * kNear + size_t(k)] = uint16_t(dist[size_t(k)].second);
    }
  }

  // The lattice point of the element-wise nearest levels to t / s.
  int point(const float* t, float inv_s) const {
    const int nl = int(levels.size());
    int idx = 0, mul = 1;
    for (int j = 0; j < G; ++j) {
      const float v = t[j] * inv_s;
      const auto it = std::lower_bound(levels.begin(), levels.end(), v);
      int l = int(it - levels.begin());
      if (l == nl || (l > 0 && v - levels[size_t(l - 1)] < levels[size_t(l)] - v)) --l;
      idx += l * mul;
      mul *= nl;
    }
    return idx;
  }

  // The entry with the least weighted error sum w (t - s g)^2.
  int best(const float* t, const float* w, float s) const {
    const int p = point(t, 1.0f / s);
    if (exact[size_t(p)] >= 0) return exact[size_t(p)];
    int best_e = near[size_t(p) * kNear];
    float best_err = INFINITY;
    for (int k = 0; k < kNear; ++k) {
      const int e = near[size_t(p) * kNear + size_t(k)];
      float err = 0.0f;
      for (int j = 0; j < G; ++j) {
        const float d = t[j] - s * entries[size_t(e)][size_t(j)];
        err += w[j] * d * d;
      }
      if (err < best_err) best_err = err, best_e = e;
    }
    return best_e;
  }
};

}  // namespace moeserve::quant_detail
