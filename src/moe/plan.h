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

// What a placement costs decode on the host, per token: every layer with a
// cold selection pays a round trip to the host and its threads' start
// (layer_seconds), every cold selection reads one expert from host memory
// (its bytes at bytes_per_s). From each layer's share of selections that
// go to cold experts (statistics, or every expert alike), selections taken
// as independent. The defaults are what the H100 host of
// docs/BENCHMARKS.md measured (~40 us of the host's fixed work and ~15 us
// of the GPU taking the answer a layer, ~100 GB/s).
struct HostCostModel {
  double layer_seconds = 60e-6;
  double bytes_per_s = 100e9;
};
double host_seconds_per_token(const MoeShape& shape, const ExpertStats* stats, const ExpertPlacement& placement,
                              const HostCostModel& costs = {});

// The layer-wise split in the same expert budget: the fewest N such that
// every expert of layers N.. fits (what --n-cpu-moe N places).
int64_t layerwise_cpu_layers(const MoeShape& shape, uint64_t budget_bytes);
ExpertPlacement layerwise_placement(const MoeShape& shape, int64_t n_cpu_layers);

// Empty, or a line for the user when --n-cpu-moe in the same budget is
// expected to cost decode at least 5% less host time than `plan` (routing
// too even for per-expert choices to pay: every layer keeps a cold expert
// in reach and pays its round trip).
std::string layerwise_hint(const MoeShape& shape, const ExpertStats* stats, const PlacementPlan& plan,
                           uint64_t budget_bytes, const HostCostModel& costs = {});

// "24GiB", "24G", "1.5GB", "512MiB", "4096" (bytes): binary units for
// K/M/G/T with or without "i"/"iB", decimal for "KB"/"MB"/"GB"/"TB".
// kInvalidArgument naming `what` for anything else (signs, spaces, junk).
Result<uint64_t> parse_size(std::string_view text, std::string_view what);

}  // namespace moeserve::moe
