#include "runtime/expert_promotion.h"

#include <algorithm>

namespace moeserve::runtime {

std::vector<ExpertSwap> plan_swaps(const backend::ExpertSplit& split, int layer, const PromotionOptions& o) {
  std::vector<ExpertSwap> out;
  const std::span<const int32_t> local = split.local();
  if (local.empty() || split.all_local()) return out;
  std::vector<int32_t> cold;
  for (int32_t e = 0; e < int32_t(split.n_expert()); ++e) {
    if (!split.is_local(e)) cold.push_back(e);
  }
  std::vector<size_t> slots(local.size());
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = i;
  // Busiest cold first, idlest hot first; ties to the lower id (deterministic).
  std::stable_sort(cold.begin(), cold.end(), [&](int32_t a, int32_t b) {
    return split.window_selections(a) > split.window_selections(b);
  });
  std::stable_sort(slots.begin(), slots.end(), [&](size_t a, size_t b) {
    const int64_t ca = split.window_selections(local[a]), cb = split.window_selections(local[b]);
    return ca != cb ? ca < cb : local[a] < local[b];
  });
  const size_t n = std::min({cold.size(), slots.size(), size_t(std::max(o.max_swaps_per_layer, 0))});
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = split.window_selections(cold[i]), out_count = split.window_selections(local[slots[i]]);
    if (in < o.min_selections || double(in) < (1.0 + o.margin) * double(out_count)) break;
    out.push_back({layer, slots[i], cold[i], local[slots[i]], in, out_count});
  }
  return out;
}

}  // namespace moeserve::runtime
