// Which experts of each layer live on the GPU ("hot"); every other expert
// is computed on the CPU from the memory-mapped file. Data, not code: the
// model never sees it, the runtime builds its hot stacks from it.
//
// File (JSON): {"format": "moeserve-placement", "version": 1,
//   "model": {"arch", "fingerprint", "n_layer", "n_expert", "n_expert_used"},
//   "layers": [{"layer": 0, "hot": [expert ids]}, ...]}
// A layer without an entry has no hot experts. Reading checks everything
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
  std::vector<std::vector<int32_t>> hot;  // [layer]: expert ids, ascending, distinct

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

}  // namespace moeserve::moe
