// Live routing statistics of a model whose experts are shared between the
// GPU and the CPU (runtime Model::expert_splits): per layer, the selections
// served by each side (the hot-hit ratio), those copied to the GPU for a
// prefill chunk, and the selections of each expert. GET /stats/experts
// answers the JSON; /metrics carries the per-layer series.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "runtime/model.h"

namespace moeserve::server {

nlohmann::json expert_stats_json(const runtime::Model& model);
// Prometheus text (empty when the experts are not split).
std::string expert_stats_prometheus(const runtime::Model& model);

}  // namespace moeserve::server
