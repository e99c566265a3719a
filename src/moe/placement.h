// Which executor computes which experts of each layer: the GPU keeps its
// "hot" experts, an expert worker process (ipc/) computes the "worker"
// ones, and every other expert is computed on the CPU from the
// memory-mapped file. Data, not code: the model never sees it, the runtime
// builds its hot stacks and worker splits from it.
//
// File (JSON): {"format": "moeserve-placement", "version": 1,
//   "model": {"arch", "fingerprint", "n_layer", "n_expert", "n_expert_used"},
//   "layers": [{"layer": 0, "hot": [expert ids], "worker": [expert ids]}, ...]}
// A layer without an entry has no hot experts; "worker" is optional (none).
// An expert is hot or the worker's, not both. Reading checks everything
// against the model it is for, and an error names the file and the entry.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "moe/moe_shape.h"

namespace moeserve::moe {

struct ExpertPlacement {
  std::vector<std::vector<int32_t>> hot;     // [layer]: expert ids, ascending, distinct
  std::vector<std::vector<int32_t>> worker;  // [layer]: the expert worker's ids, ascending, distinct
  // Some layer lists "worker" experts.
  bool has_worker() const;

  // Bytes of the hot experts on the GPU.
  uint64_t hot_bytes(const MoeShape& shape) const;
  int64_t n_hot() const;
};

std::string to_json(const ExpertPlacement& placement, const MoeShape& shape);
// Checks: format and version, the model's fingerprint (a placement made for
// another file is refused), every layer in 0..n_layer-1 at most once, every
// id an integer in 0..n_expert-1 at most once per layer.
Result<ExpertPlacement> parse_placement(std::string_view json, std::string_view source,
                                        const MoeShape& model);
Result<ExpertPlacement> read_placement(const std::string& path, const MoeShape& model);

// The experts an expert worker computes: the placement file's "worker"
// lists, or every expert of every layer without a file ("" path). A file
// that gives the worker nothing is refused (nothing to serve).
Result<std::vector<std::vector<int32_t>>> worker_experts(const std::string& placement_path,
                                                         const MoeShape& model);
// A 64-bit FNV-1a hash of the per-layer lists (layer count, then each
// layer's count and ids): a worker and its parent agree on what the worker
// computes only when theirs match.
uint64_t experts_fingerprint(const std::vector<std::vector<int32_t>>& experts);

}  // namespace moeserve::moe
