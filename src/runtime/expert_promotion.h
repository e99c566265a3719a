// Promotion of experts shared between the GPU and the CPU: over a window
// of traffic, a cold expert selected clearly more often than a hot one
// swaps places with it (its weights copied into the hot one's slot), so
// the GPU keeps the experts the current traffic uses. Runs between
// forwards, on the thread that runs them (the batch engine's, every N
// tokens or when it goes idle), so the stacks, maps and masks never change
// under a forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/expert_split.h"
#include "core/status.h"

namespace moeserve::runtime {

struct PromotionOptions {
  int64_t min_selections = 8;  // a cold expert needs at least this many selections in the window
  double margin = 0.5;         // ... and this much more than the hot expert it replaces (0.5: 1.5x)
  int max_swaps_per_layer = 4;
};

// When the batch engine promotes (EngineOptions::promotion); both triggers
// may be on. Either way a pass compares the counts since the last pass.
struct PromotionSchedule {
  // Every this many tokens served (prefill and decode): traffic that shifts
  // under a long-running load is followed without waiting for a pause.
  // 0: not by count.
  int64_t every_tokens = 0;
  // Once each time the engine goes idle (no request running or waiting)
  // after serving tokens: the swaps' copies then delay no running stream.
  bool between_requests = false;
  PromotionOptions thresholds;

  bool enabled() const { return every_tokens > 0 || between_requests; }
};

// `moeserve serve`'s promotion flags as typed on the command line:
// --expert-promotion N (tokens), idle or off (or 0); --expert-promotion-min
// and --expert-promotion-margin, whose defaults are PromotionOptions' (a
// test holds them equal).
struct PromotionFlags {
  std::string every = "4096";
  std::string min_selections = std::to_string(PromotionOptions{}.min_selections);
  std::string margin = "0.5";
};

// The schedule those flags ask for. Pure; kInvalidArgument naming the flag
// for a negative or non-numeric value, a minimum below 1 (a cold expert
// nobody selected would swap for nothing) or a margin that is not finite.
Result<PromotionSchedule> parse_promotion_flags(const PromotionFlags& flags);

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
