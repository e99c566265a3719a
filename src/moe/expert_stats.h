// How often each expert of each layer was selected, prefill and decode
// tokens counted apart: what `moeserve calibrate` writes and the server
// collects live, and what `moeserve place` chooses hot experts from.
//
// File (JSON): {"format": "moeserve-expert-stats", "version": 1,
//   "model": {"arch", "fingerprint", "n_layer", "n_expert", "n_expert_used"},
//   "prefill_tokens": N, "decode_tokens": N,
//   "layers": [{"layer": 0, "prefill": [count per expert], "decode": [...]}, ...]}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "moe/moe_shape.h"

namespace moeserve::moe {

struct ExpertStats {
  std::string arch, fingerprint;
  int64_t n_layer = 0, n_expert = 0, n_expert_used = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  std::vector<std::vector<int64_t>> prefill, decode;  // [layer][expert]

  // All zero, for this model.
  static ExpertStats zeros_for(const MoeShape& shape);
  // Selections of expert e in layer l, prefill and decode together.
  int64_t selections(int64_t l, int64_t e) const {
    return prefill[size_t(l)][size_t(e)] + decode[size_t(l)][size_t(e)];
  }
};

std::string to_json(const ExpertStats& stats);
// `source` names the input in errors (a path). Checks the format, the
// counts' shape and range; `model` (optional) must be the file they were
// counted on (fingerprint, layers, experts).
Result<ExpertStats> parse_expert_stats(std::string_view json, std::string_view source,
                                       const MoeShape* model = nullptr);
Result<ExpertStats> read_expert_stats(const std::string& path, const MoeShape* model = nullptr);

}  // namespace moeserve::moe
