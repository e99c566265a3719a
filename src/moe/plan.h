// Choosing the hot experts: the GPU memory left for experts once the dense
// weights, the KV cache and a reserve are counted, then the experts with
// the most selections per byte, with each layer first given its
// n_expert_used most selected experts when the budget allows it for every
// layer (so a step whose experts are all hot runs without the CPU).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "moe/expert_stats.h"
#include "moe/moe_shape.h"
#include "moe/placement.h"

namespace moeserve::moe {

struct BudgetOptions {
  uint64_t gpu_bytes = 0;                 // --gpu-mem: what the model may take on the GPU
  int64_t ctx_size = 4096, parallel = 1;  // the KV cache: ctx_size positions for each of parallel sequences
  uint64_t reserve_bytes = uint64_t(1) << 30;  // activations, scratch, logits, the CUDA context
};

struct ExpertBudget {
  uint64_t dense = 0, kv = 0, reserve = 0;
  uint64_t experts = 0;  // what is left for hot experts
};
// kOutOfRange with the arithmetic when the dense weights, KV cache and
// reserve alone exceed gpu_bytes.
Result<ExpertBudget> expert_budget(const MoeShape& shape, const BudgetOptions& o);

struct PlacementPlan {
  ExpertPlacement placement;
  uint64_t hot_bytes = 0;
  bool layer_floor = false;  // every layer got its n_expert_used most selected
  // The share of the counted selections that hit a hot expert (without
  // statistics: the share of experts that are hot).
  double expected_hit_ratio = 0.0;
};
// stats null: every expert counts the same, and the hot experts spread
// evenly over the layers. Deterministic: ties go to the expert ranked
// higher in its layer (more selections, then the lower id), then the lower layer.
PlacementPlan plan_placement(const MoeShape& shape, const ExpertStats* stats, uint64_t budget_bytes);

// "24GiB", "24G", "1.5GB", "512MiB", "4096" (bytes): binary units for
// K/M/G/T with or without "i"/"iB", decimal for "KB"/"MB"/"GB"/"TB".
// kInvalidArgument naming `what` for anything else (signs, spaces, junk).
Result<uint64_t> parse_size(std::string_view text, std::string_view what);

}  // namespace moeserve::moe
