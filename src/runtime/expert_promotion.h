// Promotion of experts shared between the GPU and the CPU: over a window
// of traffic, a cold expert selected clearly more often than a hot one
// swaps places with it (its weights copied into the hot one's slot), so
// the GPU keeps the experts the current traffic uses. Runs between
// forwards, on the thread that runs them (the batch engine's, every N
// tokens), so the stacks, maps and masks never change under a forward.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/expert_split.h"

namespace moeserve::runtime {

struct PromotionOptions {
  int64_t min_selections = 8;  // a cold expert needs at least this many selections in the window
  double margin = 0.5;         // ... and this much more than the hot expert it replaces (0.5: 1.5x)
  int max_swaps_per_layer = 4;
};

struct ExpertSwap {
  int layer = 0;
  size_t slot = 0;
  int32_t expert_in = 0, expert_out = 0;
  int64_t selections_in = 0, selections_out = 0;  // in the window
};

// The swaps one layer's window counts call for: the busiest cold experts
// against the idlest hot ones, pair by pair while the gain clears the
// margin. Pure: nothing changes.
std::vector<ExpertSwap> plan_swaps(const backend::ExpertSplit& split, int layer, const PromotionOptions& o);

}  // namespace moeserve::runtime
